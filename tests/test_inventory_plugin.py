"""The gpupool inventory plugin (inventory_plugins/gpupool.py) gives Ansible what `gpupool
inventory -o FILE` writes; connection settings from the stack config reach both; errors
are the description's problems, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gpupool import cli
from gpupool.spec import connection, loader
from gpupool.spec.errors import DescriptionError
from tests.conftest import BIN, ROOT

ANSIBLE_INVENTORY = BIN / "ansible-inventory"


def _run(args: list[str], cwd: Path, config: Path | None = ROOT / "ansible.cfg",
         tool: Path = ANSIBLE_INVENTORY, *, strict: bool = True
         ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    if config is not None:
        env["ANSIBLE_CONFIG"] = str(config)
    if strict:
        # An unparsable source fails the run, so that a test sees it (the checkout's
        # ansible.cfg only warns; a project's fails: test_a_project_s_ansible_fails_loudly).
        env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "true"
    return subprocess.run([str(tool), *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120, check=False)


def _plain(value: Any) -> Any:
    """--list output without Ansible's marks: the plugin's strings come out marked unsafe
    (plugin data is never templated; gpupool's own data holds no templates)."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _list(source: Path, cwd: Path, config: Path | None = ROOT / "ansible.cfg") -> Any:
    proc = _run(["-i", str(source), "--list"], cwd, config)
    assert proc.returncode == 0, proc.stderr
    return _plain(json.loads(proc.stdout))


def _source(folder: Path, stack: str, project: Path | None = None,
            name: str = "gpupool.yml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump({"plugin": "gpupool", "stack": stack,
                                    **({"project": str(project)} if project else {})}))
    return path


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_the_plugin_lists_what_the_generated_file_does(stack: str, tmp_path: Path) -> None:
    generated = tmp_path / "inventory.yml"
    assert cli.main(["inventory", "--stack", stack, "--project", str(ROOT),
                     "-o", str(generated)]) == cli.EXIT_OK
    from_file = _list(generated, tmp_path)
    from_plugin = _list(_source(tmp_path, stack, ROOT), tmp_path)
    assert from_plugin == from_file
    assert set(from_plugin["_meta"]["hostvars"]) == set(loader.load_stack(stack, ROOT).nodes)


def _project(tmp_path: Path, connection_section: dict[str, Any] | None = None) -> Path:
    project = tmp_path / "pool"
    assert cli.main(["init", str(project), "--from", "lab", "--stack", "dev"]) == cli.EXIT_OK
    if connection_section is not None:
        cfg_path = project / "Pulumi.dev.yaml"
        cfg = yaml.safe_load(cfg_path.read_text())
        cfg["config"][connection.CONFIG_KEY] = connection_section
        cfg_path.write_text(yaml.safe_dump(cfg))
    return project


CONNECTION = {
    "all": {"user": "ops", "become": True, "ssh_args": "-o ServerAliveInterval=30"},
    "sites": {"lab": {"bastion": "ops@jump.example.com:2222", "user": "admin"}},
}


def test_an_init_project_uses_the_plugin_with_its_connection_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = _project(tmp_path, CONNECTION)
    # The project's ansible.cfg names the plugin and gpupool.yml: no -i, no ANSIBLE_CONFIG.
    listed = _list(project / "gpupool.yml", project, config=None)
    host = listed["_meta"]["hostvars"]["lab-gpu1"]
    assert host["ansible_user"] == "admin"  # the site's, over all's
    assert host["ansible_become"] is True
    assert host["ansible_ssh_common_args"] == (
        "-o ProxyJump=ops@jump.example.com:2222 -o ServerAliveInterval=30")
    monkeypatch.chdir(project)
    generated = project / "inventory.yml"
    assert cli.main(["inventory", "--stack", "dev", "-o", str(generated)]) == cli.EXIT_OK
    assert _list(generated, project, config=None) == listed
    no_source = _run(["--list"], project, config=None)  # ansible.cfg's inventory
    assert _plain(json.loads(no_source.stdout)) == listed


def test_connection_settings_render_as_ansible_variables() -> None:
    conn = connection.Connection.model_validate(CONNECTION)
    assert conn.all.ansible_vars() == {
        "ansible_user": "ops", "ansible_become": True,
        "ansible_ssh_common_args": "-o ServerAliveInterval=30"}
    assert conn.site_vars("lab") == {
        "ansible_user": "admin", "ansible_become": True,
        "ansible_ssh_common_args": "-o ProxyJump=ops@jump.example.com:2222 "
                                   "-o ServerAliveInterval=30"}
    assert conn.site_vars("elsewhere") == {}
    # No section: the inventory is exactly what it was before connection settings existed.
    desc = loader.load_stack("lab", ROOT)
    assert connection.for_stack("lab", desc, ROOT) == connection.Connection()


def test_bad_connection_settings_are_problems(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    project = _project(tmp_path, {
        "all": {"usr": "ops", "port": 70000},
        "sites": {"nowhere": {"bastion": "jump host"}, "lab": {"user": "a b"}},
    })
    with pytest.raises(DescriptionError) as exc:
        connection.load("dev", project)
    found = {(p.path, p.rule) for p in exc.value.problems}
    where = f"config.{connection.CONFIG_KEY}"
    assert found == {
        (f"{where}.all.usr", "extra-forbidden"),
        (f"{where}.all.port", "less-than-equal"),
        (f"{where}.sites.nowhere.bastion", "value-error"),
        (f"{where}.sites.lab.user", "value-error"),
    }
    # Every verb on the stack reports them, as it reports the description's.
    capsys.readouterr()
    assert cli.main(["validate", "--stack", "dev", "--project", str(project),
                     "--json"]) == cli.EXIT_INVALID
    report = json.loads(capsys.readouterr().out)
    assert report["source"].endswith("Pulumi.dev.yaml")
    unknown_site = _project(tmp_path / "2", {"sites": {"nowhere": {"user": "ops"}}})
    with pytest.raises(DescriptionError, match=r"\[site-exists\] no site nowhere"):
        connection.load("dev", unknown_site)


@pytest.mark.parametrize("settings", [
    {"ssh_args": "-o ProxyCommand=nc"}, {"ssh_args": "-oLocalCommand=id"},
    {"ssh_args": "-F /tmp/options"}, {"ssh_args": "-o KnownHostsCommand=/bin/id"},
    {"ssh_args": "-o ConnectTimeout=5;id"}, {"bastion": "-oProxyCommand"},
    {"bastion": "ops@-v"}, {"python_interpreter": "$(id)"}, {"become_method": "sh"},
    {"become_user": "Root"}, {"private_key_file": "a key"},
    # ... nor skip host key checks (issue 50).
    {"ssh_args": "-o StrictHostKeyChecking=no"}, {"ssh_args": "-oStrictHostKeyChecking=off"},
    {"ssh_args": "-o UserKnownHostsFile=/dev/null"}, {"ssh_args": "-o userknownhostsfile=none"}])
def test_connection_settings_cannot_run_commands_here(settings: dict[str, str]) -> None:
    """A cloned project's stack config reaches ssh's and Ansible's command lines: nothing in
    it may make them run a command on the operator's machine or read other options."""
    with pytest.raises(ValidationError):
        connection.Settings.model_validate(settings)
    accepted = {"ssh_args": "-oConnectTimeout=5 -o StrictHostKeyChecking=accept-new",
                "bastion": "ops@jump.example.com:2222,jump2",
                "python_interpreter": "/usr/bin/python3", "become_method": "sudo"}
    assert connection.Settings.model_validate(accepted).ssh_args == accepted["ssh_args"]


def _fails_cleanly(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    for text in expected:
        assert text in proc.stderr, proc.stderr


def test_an_unknown_stack_is_a_clean_error(tmp_path: Path) -> None:
    source = _source(tmp_path, "nope", ROOT)
    _fails_cleanly(_run(["-i", str(source), "--list"], tmp_path),
                   "stack: [stack-exists] no stack config Pulumi.nope.yaml (stacks: ")
    lost = _source(tmp_path, "lab", name="lost.gpupool.yml")  # no Pulumi.yaml above tmp
    _fails_cleanly(_run(["-i", str(lost), "--list"], tmp_path), "[project-exists]")


def test_an_invalid_description_is_a_clean_error(tmp_path: Path) -> None:
    project = _project(tmp_path)
    pool = project / "pools" / "dev.yaml"
    data = yaml.safe_load(pool.read_text())
    data["nodes"]["lab-gpu1"]["rack"] = "r9"
    pool.write_text(yaml.safe_dump(data))
    _fails_cleanly(_run(["--list"], project, config=None),
                   "invalid: ", "nodes.lab-gpu1.rack: [")


def test_every_ansible_run_verifies_host_keys() -> None:
    """Issue 50: the checkout's ansible.cfg and every project `gpupool init` writes check
    host keys. With the check off, Mitogen passes StrictHostKeyChecking=no and
    UserKnownHostsFile=/dev/null ahead of any ssh_args a stack sets."""
    import configparser  # noqa: PLC0415

    from gpupool.cli.commands import init  # noqa: PLC0415

    for text in ((ROOT / "ansible.cfg").read_text(),
                 init.files("pool", "prod", "example")["ansible.cfg"]):
        cfg = configparser.ConfigParser(interpolation=None)
        cfg.read_string(text)
        assert cfg.getboolean("defaults", "host_key_checking") is True


def _break(project: Path) -> None:
    """Put node lab-gpu1 in a rack the description does not have."""
    pool = project / "pools" / "dev.yaml"
    data = yaml.safe_load(pool.read_text())
    data["nodes"]["lab-gpu1"]["rack"] = "r9"
    pool.write_text(yaml.safe_dump(data))


def test_a_project_s_ansible_fails_loudly_on_an_invalid_description(tmp_path: Path) -> None:
    """Issue 52: with the project's own ansible.cfg (unparsed_is_failed) and nothing else,
    ansible-inventory and ansible-playbook stop on the plugin's AnsibleParserError instead
    of warning and going on with no hosts."""
    project = _project(tmp_path)
    play = project / "ping.yml"
    play.write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False,
                                     "tasks": [{"ansible.builtin.ping": None}]}]))
    listed = _run(["--list-hosts", str(play)], project, None, BIN / "ansible-playbook",
                  strict=False)
    assert listed.returncode == 0 and "lab-gpu1" in listed.stdout, listed.stderr
    _break(project)
    for tool, args in ((ANSIBLE_INVENTORY, ["--list"]), (ANSIBLE_INVENTORY, ["--graph"]),
                       (BIN / "ansible-playbook", ["--list-hosts", str(play)]),
                       (BIN / "ansible-playbook", [str(play)])):
        proc = _run(args, project, None, tool, strict=False)
        _fails_cleanly(proc, "nodes.lab-gpu1.rack: [")
        assert "lab-gpu1" not in proc.stdout


def test_the_plugin_works_from_a_subfolder_of_the_project(tmp_path: Path) -> None:
    project = _project(tmp_path)
    deep = project / "inventories" / "dev"
    deep.mkdir(parents=True)
    # A source in a subfolder finds the project above it; Ansible run from there with the
    # project's ansible.cfg (as `gpupool playbook` runs it) reads the project's source.
    source = _source(deep, "dev", name="dev.gpupool.yml")
    for cwd, args in ((project, ["-i", str(source), "--graph"]),
                      (deep, ["-i", source.name, "--graph"]), (deep, ["--graph"])):
        proc = _run(args, cwd, project / "ansible.cfg", strict=False)
        assert proc.returncode == 0 and "lab-gpu1" in proc.stdout, f"{cwd} {args}: " \
            + proc.stderr
    hosts = subprocess.run([sys.executable, "-m", "gpupool", "playbook", "site", "--list-hosts"],
                           cwd=deep, capture_output=True, text=True, timeout=120, check=False,
                           env={k: v for k, v in os.environ.items()
                                if not k.startswith("ANSIBLE_")})
    assert hosts.returncode == 0 and "lab-gpu1" in hosts.stdout, hosts.stderr
    _break(project)
    for cwd, args in ((project, ["-i", str(source), "--list"]), (deep, ["--list"])):
        _fails_cleanly(_run(args, cwd, project / "ansible.cfg", strict=False),
                       "nodes.lab-gpu1.rack: [")
    hosts = subprocess.run([sys.executable, "-m", "gpupool", "playbook", "site", "--list-hosts"],
                           cwd=deep, capture_output=True, text=True, timeout=120, check=False,
                           env={k: v for k, v in os.environ.items()
                                if not k.startswith("ANSIBLE_")})
    _fails_cleanly(hosts, "nodes.lab-gpu1.rack: [")
