"""Each role's public API is its defaults/main.yml, and meta/argument_specs.yml documents
it as `ansible-doc -t role` shows it: every default variable is an option there, with the
same default (unless it is required) and a description of its own (not the variable's name
spelled out)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p.parent.parent for p in (ROOT / "roles").glob("*/defaults/main.yml"))


def options(role: Path) -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    found: dict[str, dict[str, Any]] = {}
    for entry in spec["argument_specs"].values():
        found |= entry.get("options") or {}
    return found


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_default_is_documented_with_its_value(role: Path) -> None:
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    spec = options(role)
    assert sorted(set(defaults) - set(spec)) == [], "defaults without an argument spec"
    for name, value in defaults.items():
        opt = spec[name]
        # Ansible refuses a default beside required: true (the caller must set it).
        if not opt.get("required"):
            assert opt.get("default") == value, (name, opt.get("default"), value)
        text = opt.get("description")
        text = " ".join(text) if isinstance(text, list) else (text or "")
        assert text.strip() and text.strip().lower() != name.replace("_", " "), name


# --- one owner per shared value ----------------------------------------------------------
# A path or a port typed as a literal in more than one role is one host fact with several
# owners (issue 55). Such a value belongs to role pool_defaults, the roles reading it
# default their own option to it (tests/test_pool_defaults.py). Listed here, with the roles
# typing it, are the values still typed more than once, and why.
SHARED_LITERALS: dict[object, tuple[set[str], str]] = {
    "/var/lib/prometheus/node-exporter": (
        {"node_exporter", "pool_defaults"},
        "tests/test_burst_boot.py reads node_exporter's literal into the image's ARGS line"),
    9090: ({"monitoring", "pool_defaults"},
           "tests/test_monitoring_web.py renders prometheus.yml from monitoring's literals"),
    9815: ({"monitoring", "pool_defaults"},
           "tests/test_monitoring_web.py renders prometheus.yml from monitoring's literals"),
    9100: ({"monitoring", "node_exporter"},
           "tests/test_dcgm.py compares both literals with gpupool.spec.catalog's port"),
    9400: ({"dcgm", "monitoring"},
           "tests/test_dcgm.py compares both literals with gpupool.spec.catalog's port"),
    "/etc/prometheus/web/password": (
        {"idle_reclaim", "monitoring"},
        "tests/test_monitoring.py and test_monitoring_web.py read both roles' literals"),
    "/etc/prometheus/web/tls.crt": (
        {"idle_reclaim", "monitoring"},
        "tests/test_monitoring.py and test_monitoring_web.py read both roles' literals"),
    # Debian's own layout, not a choice of the pool: each role names it beside the other
    # facts of the OS family it loads (vars/Debian.yml).
    "/usr/bin/python3": (
        {"acceptance_gate", "controller_backup", "idle_reclaim", "slurm", "slurm_exporter"},
        "Debian's python3, a fact of the OS family"),
    "/etc/systemd/system": (
        {"acceptance_gate", "controller_backup", "idle_reclaim", "slurm_exporter", "storage",
         "storage_sync"},
        "systemd's unit directory, a fact of the OS family"),
    "/etc/tmpfiles.d": ({"dcgm", "slurm"},
                        "systemd's tmpfiles directory, a fact of the OS family"),
    "/etc/apt/keyrings": ({"nvidia_repo", "storage"},
                          "APT's keyring directory, a fact of the OS family"),
}


def _literals(role: Path) -> dict[object, set[str]]:
    """The role's path-like (absolute, untemplated) and port-like (an int named *_port)
    values in its defaults and vars, each with the variables typing it."""
    found: dict[object, set[str]] = {}
    for path in [role / "defaults" / "main.yml", *sorted((role / "vars").glob("*.yml"))]:
        if not path.is_file():
            continue
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            path_like = isinstance(value, str) and value.startswith("/") and "{{" not in value
            port_like = type(value) is int and name.endswith("_port")
            if path_like or port_like:
                found.setdefault(value, set()).add(name)
    return found


def test_a_path_or_port_is_typed_in_one_role() -> None:
    typed: dict[object, set[str]] = {}
    for role in sorted((ROOT / "roles").iterdir()):
        for value in _literals(role):
            typed.setdefault(value, set()).add(role.name)
    shared = {value: roles for value, roles in typed.items() if len(roles) > 1}
    listed = {value: roles for value, (roles, _) in SHARED_LITERALS.items()}
    assert {v: sorted(r) for v, r in shared.items() if listed.get(v) != r} == {}, \
        "typed in several roles: give it one owner (role pool_defaults) or list it, with why"
    assert sorted(map(str, set(listed) - set(shared))) == [], "listed but no longer shared"


# --- options as checked units --------------------------------------------------------------
# An option is typed raw only where no one type holds its values, and says why here.
# Ansible's validator refuses none for a dict whose default is not none (a templated
# default), so an inventory value that is a dict or none stays raw.
_SWITCH = "a switch: auto, or a bool that forces it"
_DICT_OR_NONE = "a dict, or none where the pool declares none (refused as a dict)"
RAW: dict[str, str] = {
    "nvidia_container_toolkit_cdi": _SWITCH,
    "nvidia_driver_kernel_module": _SWITCH,
    "nvidia_driver_fabricmanager": _SWITCH,
    "storage_mount_now": _SWITCH,
    "controller_backup_plan": _DICT_OR_NONE + ": gpupool_backup, none without a backup",
    "storage_lustre_client": _DICT_OR_NONE + ": gpupool_lustre_client, none without Lustre",
    "kubernetes_node_registration": _DICT_OR_NONE + ": gpupool_node.kubernetes",
    "nvidia_driver_gpu": _DICT_OR_NONE + ": gpupool_node.gpu, none on a CPU node",
    "nvidia_container_toolkit_gpu": _DICT_OR_NONE + ": gpupool_node.gpu, none on a CPU node",
}
SWITCH = ["auto", True, False]


def _entry_points(role: Path) -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    return {name: entry.get("options") or {} for name, entry in spec["argument_specs"].items()}


def _templated(value: object) -> bool:
    """A value Ansible templates at run time (a "{{ }}" or "{% %}" anywhere in it): its
    type is known only then, so the static check leaves it out."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, list):
        return any(_templated(v) for v in value)
    if isinstance(value, dict):
        return any(_templated(k) or _templated(v) for k, v in value.items())
    return False


def _checkable(options: dict[str, Any]) -> dict[str, Any]:
    """The spec of the options checked, as Ansible's validator reads it, less required
    (the caller's to set). The defaults stay: the validator lets none through only where
    the default is none too."""
    def strip(opt: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in opt.items() if k != "required"}
        if isinstance(opt.get("options"), dict):
            out["options"] = {k: strip(v) for k, v in opt["options"].items()}
        return out
    return {name: strip(opt) for name, opt in options.items()}


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_literal_default_passes_its_own_argument_spec(role: Path) -> None:
    """Ansible's own validator (the one a role's validation task runs) on the role's
    untemplated defaults: a default that contradicts its declared type or choices fails."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator  # noqa: PLC0415

    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    for entry, opts in _entry_points(role).items():
        values = {k: v for k, v in defaults.items() if k in opts and not _templated(v)}
        checked = _checkable({k: opts[k] for k in values})
        result = ArgumentSpecValidator(checked).validate(
            values, validate_role_argument_spec=True)
        assert result.error_messages == [], (entry, result.error_messages)
        # Ansible converts where it can (an int for a str): the literal must need none.
        for name, value in values.items():
            assert result.validated_parameters[name] == value, (entry, name, value)


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_no_option_is_raw_without_a_reason_and_every_switch_has_its_choices(role: Path) -> None:
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    for entry, opts in _entry_points(role).items():
        for name, opt in opts.items():
            if opt.get("type", "str") == "raw":
                assert name in RAW, f"{entry}: {name} is typed raw: give it a type or a reason"
            # A switch: an option whose default is "auto".
            if defaults.get(name, opt.get("default")) == "auto":
                assert opt.get("choices") == SWITCH, (entry, name, opt.get("choices"))
            if opt.get("type") == "list":
                assert "elements" in opt, f"{entry}: {name} is a list of what?"


def test_every_reasoned_raw_option_exists() -> None:
    names = {n for role in ROLES for opts in _entry_points(role).values() for n in opts
             if opts[n].get("type", "str") == "raw"}
    assert sorted(set(RAW) - names) == []


# --- inventory values through the role's options ------------------------------------------
# A role reads gpupool inventory's variables (gpupool_*) in its defaults only: each becomes
# an option `<role>_...: "{{ gpupool_... }}"`, documented in meta/argument_specs.yml, so a
# caller without gpupool's inventory sets the option and the role's interface is its
# defaults (issue 55). Its tasks, handlers, vars and templates read the options.
# gpupool_refused is no inventory variable: templates name it, never defined, for
# mandatory() to raise their refusal.
NOT_INVENTORY = {"gpupool_refused"}
# The keys whose strings Ansible evaluates as bare Jinja expressions.
_CONDITIONALS = {"when", "changed_when", "failed_when", "until", "that"}
_INVENTORY_NAME = re.compile(r"gpupool_\w+")


def _inventory_reads(source: str) -> set[str]:
    """The gpupool_* variables a Jinja template reads: by name, as another host's attribute
    or item (hostvars[h].gpupool_node), or as an attribute named to a filter or test
    (selectattr('gpupool_node'), map(attribute='gpupool_node'))."""
    from jinja2 import Environment, nodes  # noqa: PLC0415

    env = Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])  # noqa: S701 - parsed, never rendered
    found: set[str] = set()
    for node in env.parse(source).find_all((nodes.Name, nodes.Getattr, nodes.Const)):
        if isinstance(node, nodes.Name):
            name = node.name
        elif isinstance(node, nodes.Getattr):
            name = node.attr
        else:
            name = node.value if isinstance(node.value, str) else ""
        if _INVENTORY_NAME.fullmatch(name) and name not in NOT_INVENTORY:
            found.add(name)
    return found


def _yaml_reads(value: object, key: object = None) -> set[str]:
    """The gpupool_* variables read by the templated strings of a task, handler or vars file."""
    if isinstance(value, dict):
        return {n for k, v in value.items() for n in _yaml_reads(k) | _yaml_reads(v, k)}
    if isinstance(value, list):
        return {n for v in value for n in _yaml_reads(v, key)}
    if not isinstance(value, str):
        return set()
    if _templated(value):
        return _inventory_reads(value)
    return _inventory_reads("{{ " + value + " }}") if key in _CONDITIONALS else set()


def _reads_outside_defaults(role: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for sub in ("tasks", "handlers", "vars"):
        for path in sorted((role / sub).glob("**/*.yml")):
            found[str(path.relative_to(role))] = _yaml_reads(yaml.safe_load(path.read_text()))
    for path in sorted((role / "templates").glob("**/*.j2")):
        found[str(path.relative_to(role))] = _inventory_reads(path.read_text())
    return {name: reads for name, reads in found.items() if reads}


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_inventory_variables_are_read_through_the_roles_defaults(role: Path) -> None:
    assert _reads_outside_defaults(role) == {}, \
        "give each an option in defaults/main.yml and meta/argument_specs.yml, and read that"


def test_the_inventory_check_finds_every_kind_of_read() -> None:
    """What the check above must catch, and the strings it must leave alone."""
    assert _yaml_reads({"when": "gpupool_node.gpu is not none"}) == {"gpupool_node"}
    assert _yaml_reads({"x": "{{ hostvars[h].gpupool_pool.name }}"}) == {"gpupool_pool"}
    extract = "{{ hs | map('extract', hostvars) | selectattr('gpupool_node', 'defined') }}"
    assert _yaml_reads([extract, "{{ hs | map(attribute='gpupool_health') }}"]) \
        == {"gpupool_node", "gpupool_health"}
    assert _inventory_reads("{% set n = gpupool_teams %}{{ x | mandatory(gpupool_refused) }}") \
        == {"gpupool_teams"}
    assert _yaml_reads({"dest": "{{ d }}/gpupool_backup.prom", "name": "gpupool_node",
                        "msg": "{{ 'gpupool refuses ' ~ x }}"}) == set()
    assert _inventory_reads("prom=gpupool_dcgm_health.prom {# gpupool_node #}") == set()
