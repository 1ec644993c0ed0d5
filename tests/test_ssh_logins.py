"""Who logs in over SSH where, as the common role works it out (roles/common/tasks/logins.yml)
for the hardening role's AllowGroups and the slurm role's pam_access file: the operators on
every host, the teams only on login and compute nodes, and group names that sshd or
pam_access would misread refused. Run by Ansible itself on this machine (connection local,
no host touched); the lab proves the result on real sshd (tests/integration/test_roles.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from gpupool.render import inventory
from gpupool.spec import loader
from tests.conftest import BIN, ROOT

pytest.importorskip("ansible")
LAB = loader.load_stack("lab", ROOT)
TEAMS = sorted(f"team-{t}" for t in LAB.teams)
OPERATORS = ["gpupool-admin", "gpupool-oncall"]


def logins(tmp_path: Path, roles: list[str], **extra: object) -> subprocess.CompletedProcess[str]:
    """The role's login facts on a host with these roles, with the lab's teams."""
    out = tmp_path / "logins.json"
    play = [{
        "name": "logins", "hosts": "localhost", "gather_facts": False,
        "vars": {"gpupool_teams": inventory.pool_vars(LAB)["gpupool_teams"],
                 "gpupool_node": {"roles": roles}, **extra},
        "tasks": [
            {"ansible.builtin.include_role": {"name": "common", "tasks_from": "logins"}},
            {"ansible.builtin.copy": {
                "dest": str(out), "mode": "0600",
                "content": "{{ {'ssh': common__ssh_groups, 'operators': common__operator_groups}"
                           " | to_json }}"}},
        ]}]
    # Plain YAML: the play's own template must be evaluated (the inventory's dumper marks
    # such strings !unsafe).
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    proc = subprocess.run(
        [BIN / "ansible-playbook", "-c", "local", "-i", "localhost,", "play.yml",
         "-e", f"ansible_python_interpreter={BIN / 'python'}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
        env={"ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "PATH": str(BIN) + ":/usr/bin:/bin",
             "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "HOME": str(tmp_path)})
    if proc.returncode == 0:
        proc.stdout = out.read_text()
    return proc


@pytest.mark.parametrize(("roles", "teams"), [
    (["controller"], False), (["controller", "login"], True), (["compute"], True),
    (["login"], True)])
def test_teams_log_in_only_on_login_and_compute_nodes(tmp_path: Path, roles: list[str],
                                                      teams: bool) -> None:
    proc = logins(tmp_path, roles)
    assert proc.returncode == 0, proc.stdout[-3000:]
    got = json.loads(proc.stdout)
    assert got["operators"] == OPERATORS
    assert got["ssh"] == OPERATORS + (TEAMS if teams else [])


@pytest.mark.parametrize("group", ["ops admins", "ops,admins", "ops\nAllowUsers x", "(ops)"])
def test_group_names_sshd_would_misread_are_refused(tmp_path: Path, group: str) -> None:
    proc = logins(tmp_path, ["compute"], common_ssh_extra_groups=[group])
    assert proc.returncode != 0
    assert "Unix group names only" in proc.stdout, proc.stdout[-3000:]


def test_an_extra_group_logs_in_everywhere(tmp_path: Path) -> None:
    proc = logins(tmp_path, ["controller"], common_ssh_extra_groups=["infra-ops"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert json.loads(proc.stdout) == {"ssh": [*OPERATORS, "infra-ops"],
                                       "operators": [*OPERATORS, "infra-ops"]}


def test_the_defaults_name_the_roles_the_model_knows() -> None:
    defaults = yaml.safe_load((ROOT / "roles/common/defaults/main.yml").read_text())
    from gpupool.spec.model import NodeRole, Role  # noqa: PLC0415
    assert set(defaults["common_ssh_operator_roles"]) <= {r.value for r in Role}
    assert set(defaults["common_ssh_team_node_roles"]) <= {r.value for r in NodeRole}
