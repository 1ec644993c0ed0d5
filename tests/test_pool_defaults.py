"""Role pool_defaults owns the host facts several roles share (kubespray's
kubespray_defaults pattern) and the one "Reload systemd" handler. The roles that read it
declare it as a dependency, and every option that now defaults to it resolves, through
Ansible's own templar, to the literal value the role typed itself before: what the roles
put on hosts is unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = ROOT / "roles"
OWNER = "pool_defaults"

# Each option that defaults to the owner, with the literal its role typed before it did
# (issue 55: the textfile directory in six roles, the prolog directories twice, Prometheus'
# port inside idle reclaim's URL, ...). Keep these literal: they are the proof.
BEFORE: dict[tuple[str, str], object] = {
    ("acceptance_gate", "acceptance_gate_dir"): "/opt/gpupool/gate",
    ("acceptance_gate", "acceptance_gate_textfile_dir"): "/var/lib/prometheus/node-exporter",
    ("admission", "admission_gate_dir"): "/opt/gpupool/gate",
    ("controller_backup", "controller_backup_textfile_dir"): "/var/lib/prometheus/node-exporter",
    ("controller_backup", "controller_backup_database"): "slurm_acct_db",
    ("controller_backup", "controller_backup_munge_key"): "/etc/munge/munge.key",
    ("dcgm", "dcgm_health_textfile_dir"): "/var/lib/prometheus/node-exporter",
    ("dcgm", "dcgm_slurm_prolog_dir"): "/etc/slurm/prolog.d",
    ("dcgm", "dcgm_slurm_epilog_dir"): "/etc/slurm/epilog.d",
    ("idle_reclaim", "idle_reclaim_textfile_dir"): "/var/lib/prometheus/node-exporter",
    ("slurm", "slurm_db_name"): "slurm_acct_db",
    ("slurm", "slurm_prolog_dir"): "/etc/slurm/prolog.d",
    ("slurm", "slurm_epilog_dir"): "/etc/slurm/epilog.d",
    ("slurm", "slurm_munge_key"): "/etc/munge/munge.key",  # vars/Debian.yml
    ("slurm_exporter", "slurm_exporter_port"): 9815,
    ("storage", "storage_checkpoint_age_textfile_dir"): "/var/lib/prometheus/node-exporter",
    ("storage", "storage_team_group_prefix"): "team-",
}


def _load(path: Path) -> dict[str, Any]:
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def _role_vars(role: str) -> dict[str, Any]:
    """The role's defaults, then its vars (main and per OS family), as Ansible layers them."""
    found = _load(ROLES / role / "defaults" / "main.yml")
    for path in sorted((ROLES / role / "vars").glob("*.yml")):
        found |= _load(path)
    return found


def _dependencies(role: str) -> list[str]:
    deps = _load(ROLES / role / "meta" / "main.yml").get("dependencies") or []
    return [d if isinstance(d, str) else d.get("role") or d.get("name") for d in deps]


def resolve(role: str, name: str, **extra: object) -> object:
    """`name` as Ansible resolves it in `role`: the dependency's defaults, the role's own
    defaults and vars, every string trusted as a template (as a role's files are)."""
    from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415
    from ansible.template import Templar, trust_as_template  # noqa: PLC0415

    def trusted(value: object) -> object:
        if isinstance(value, str):
            return trust_as_template(value)
        if isinstance(value, list):
            return [trusted(v) for v in value]
        if isinstance(value, dict):
            return {k: trusted(v) for k, v in value.items()}
        return value

    variables = {**_load(ROLES / OWNER / "defaults" / "main.yml"), **_role_vars(role), **extra}
    templar = Templar(loader=DataLoader(), variables=trusted(variables))  # type: ignore[arg-type]
    return templar.template(trusted("{{ " + name + " }}"))


@pytest.mark.parametrize(("role", "name"), sorted(BEFORE), ids=[n for _, n in sorted(BEFORE)])
def test_an_option_on_the_owner_resolves_to_its_former_literal(role: str, name: str) -> None:
    assert OWNER in _dependencies(role), f"{role} reads {OWNER} without depending on it"
    value = resolve(role, name)
    before = BEFORE[role, name]
    assert value == before and isinstance(value, type(before)) and not isinstance(value, bool)
    # ... and it is the owner's, not a literal of the role's own any more.
    assert "pool_defaults_" in str(_role_vars(role)[name])


@pytest.mark.parametrize(("address", "url"), [
    ({"addresses": {"management": "10.0.0.5"}}, "https://10.0.0.5:9090"),
    ({}, "https://127.0.0.1:9090"),
])
def test_idle_reclaims_url_carries_the_owners_prometheus_port(address: object, url: str) -> None:
    assert resolve("idle_reclaim", "idle_reclaim_prometheus_url", gpupool_node=address) == url


def test_the_owner_is_defaults_and_a_handler_only() -> None:
    owner = ROLES / OWNER
    assert not (owner / "tasks").exists() and not (owner / "vars").exists()
    assert _dependencies(OWNER) == []
    assert all(name.startswith(OWNER + "_") for name in _role_vars(OWNER))


def _reads_the_owner(role: Path) -> bool:
    return any("pool_defaults_" in p.read_text() for p in role.rglob("*")
               if p.is_file() and p.suffix in {".yml", ".j2"} and p.parent.name != "meta")


def _handlers(role: Path) -> list[dict[str, Any]]:
    return [h for p in sorted((role / "handlers").glob("*.yml")) for h in _load_list(p)]


def _load_list(path: Path) -> list[dict[str, Any]]:
    return yaml.safe_load(path.read_text()) or []


def _notified(role: Path) -> set[str]:
    names: set[str] = set()
    for path in sorted((role / "tasks").glob("*.yml")):
        for task in _load_list(path):
            parts = [task, *(task.get(k, []) for k in ("block", "rescue", "always"))]
            for t in [p for part in parts for p in (part if isinstance(part, list) else [part])]:
                notify = t.get("notify") or []
                names |= {notify} if isinstance(notify, str) else set(notify)
    return names


@pytest.mark.parametrize("role", sorted(p for p in ROLES.iterdir() if p.name != OWNER),
                         ids=lambda p: p.name)
def test_a_role_that_reads_the_owner_depends_on_it(role: Path) -> None:
    """Reading a pool_defaults_* variable, or notifying its handler, without the dependency
    works only where another role of the same play happens to pull it in."""
    if _reads_the_owner(role) or "Reload systemd" in _notified(role):
        assert OWNER in _dependencies(role.name)


def test_one_reload_systemd_handler() -> None:
    owners = [role.name for role in sorted(ROLES.iterdir())
              for h in _handlers(role) if h.get("name") == "Reload systemd"
              or "Reload systemd" in (h.get("listen") or [])]
    assert owners == [OWNER]
    (handler,) = _handlers(ROLES / OWNER)
    assert handler["ansible.builtin.systemd_service"] == {"daemon_reload": True}


# Literals a role still types beside the owner, because a test outside this one reads them
# from the role's defaults as literals: until those tests read through the owner, each must
# equal the owner's value.
PINNED = {
    # tests/test_burst_boot.py puts it into the burst image's exporter ARGS line.
    ("node_exporter", "node_exporter_textfile_dir"): "pool_defaults_textfile_dir",
    # tests/test_monitoring_web.py renders prometheus.yml from monitoring's literal defaults.
    ("monitoring", "monitoring_prometheus_port"): "pool_defaults_prometheus_port",
    ("monitoring", "monitoring_slurm_exporter_port"): "pool_defaults_slurm_exporter_port",
}


@pytest.mark.parametrize(("role", "name"), sorted(PINNED), ids=[n for _, n in sorted(PINNED)])
def test_a_literal_still_typed_beside_the_owner_is_the_owners(role: str, name: str) -> None:
    assert _role_vars(role)[name] == _role_vars(OWNER)[PINNED[role, name]]


# The plays that apply roles to the lab's hosts, as `make lab` runs them.
PLAYBOOKS = ["site.yml", "slurm.yml", "gate.yml"]
# What fact gathering gives a lab host that an option reads (acceptance_gate's archive is
# named for the node's Python).
GATHERED = {"python": {"version": {"major": 3, "minor": 11}}}


def test_every_roles_options_resolve_and_pass_its_spec_on_the_lab(tmp_path: Path) -> None:
    """The lab's inventory (as `gpupool inventory` writes it), the playbooks as Ansible
    loads them, and per host each role's options resolved through Ansible's variable manager
    (role dependencies' defaults included): the owner's facts resolve to their former
    literals, and Ansible's validator (the role's validation task) passes every role's main
    entry point on them, with the types and choices the specs declare."""
    from ansible.inventory.manager import InventoryManager  # noqa: PLC0415
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator  # noqa: PLC0415
    from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415
    from ansible.playbook import Playbook  # noqa: PLC0415
    from ansible.plugins.loader import init_plugin_loader  # noqa: PLC0415
    from ansible.template import Templar  # noqa: PLC0415
    from ansible.vars.hostvars import HostVars  # noqa: PLC0415
    from ansible.vars.manager import VariableManager  # noqa: PLC0415

    from gpupool.render import ansible_yaml, inventory  # noqa: PLC0415
    from gpupool.spec import loader as spec_loader  # noqa: PLC0415

    init_plugin_loader()
    path = tmp_path / "inventory.yml"
    path.write_text(ansible_yaml.dump(inventory.build(spec_loader.load_stack("lab"))))
    loader = DataLoader()
    hosts = InventoryManager(loader=loader, sources=[str(path)])
    manager = VariableManager(loader=loader, inventory=hosts)
    manager._hostvars = HostVars(  # what TaskQueueManager sets
        inventory=hosts, variable_manager=manager, loader=loader)
    errors, resolved, seen = [], {}, set()
    for name in PLAYBOOKS:
        book = Playbook.load(str(ROOT / "playbooks" / name), variable_manager=manager,
                             loader=loader)
        for play in book.get_plays():
            for role in play.get_roles():
                spec = _load(ROLES / role.get_name() / "meta" / "argument_specs.yml")
                options = spec["argument_specs"]["main"].get("options") or {}
                tasks = [t for b in role.compile(play=play) for t in b.block]
                for host in hosts.get_hosts(play.hosts):
                    found = manager.get_vars(play=play, host=host, task=tasks[0])
                    found["ansible_facts"] = {**found.get("ansible_facts", {}), **GATHERED}
                    templar = Templar(loader=loader, variables=found)
                    values = {k: templar.template(found[k]) for k in options if k in found}
                    result = ArgumentSpecValidator(options).validate(
                        values, validate_role_argument_spec=True)
                    errors += [(name, role.get_name(), host.name, e)
                               for e in result.error_messages]
                    seen.add(role.get_name())
                    resolved |= {(role.get_name(), k): v for k, v in values.items()
                                 if (role.get_name(), k) in BEFORE}
    assert errors == []
    assert seen >= {role for role, _ in BEFORE}
    assert {k: v for k, v in resolved.items() if v != BEFORE[k]} == {}
    # slurm_munge_key is the slurm role's vars/Debian.yml (loaded by its tasks), not an option.
    assert set(resolved) == set(BEFORE) - {("slurm", "slurm_munge_key")}
