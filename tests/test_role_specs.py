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
    "/etc/slurm": ({"slurm", "slurm_containers"},
                   "Debian's slurm packages' configuration directory, where Slurm reads oci.conf "
                   "beside slurm.conf: a fact of the OS family"),
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


class _AnyName(dict):  # type: ignore[type-arg]
    """A filter or test table that has every name (Ansible's and the collections')."""

    def get(self, key: object, default: object = None) -> object:
        return str


def _environment() -> Any:
    """A Jinja environment with the extensions Ansible loads, and any filter or test."""
    from jinja2 import Environment  # noqa: PLC0415

    env = Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])  # noqa: S701 - parsed, never rendered
    env.filters = _AnyName(env.filters)
    env.tests = _AnyName(env.tests)
    return env


def _parsed(source: str) -> Any:
    """The Jinja syntax tree of a template, parsed with the extensions Ansible loads."""
    return _environment().parse(source)


def _inventory_reads(source: str) -> set[str]:
    """The gpupool_* variables a Jinja template reads: by name, as another host's attribute
    or item (hostvars[h].gpupool_node), or as an attribute named to a filter or test
    (selectattr('gpupool_node'), map(attribute='gpupool_node'))."""
    from jinja2 import nodes  # noqa: PLC0415

    found: set[str] = set()
    for node in _parsed(source).find_all((nodes.Name, nodes.Getattr, nodes.Const)):
        if isinstance(node, nodes.Name):
            name = node.name
        elif isinstance(node, nodes.Getattr):
            name = node.attr
        else:
            name = node.value if isinstance(node.value, str) else ""
        if _INVENTORY_NAME.fullmatch(name) and name not in NOT_INVENTORY:
            found.add(name)
    return found


def _jinja_sources(value: object, key: object = None) -> list[str]:
    """The Jinja templates in a task, handler or vars file: its templated strings, and the
    bare expressions of its conditionals (each wrapped in {{ }})."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _jinja_sources(k) + _jinja_sources(v, k)]
    if isinstance(value, list):
        return [s for v in value for s in _jinja_sources(v, key)]
    if not isinstance(value, str):
        return []
    if _templated(value):
        return [value]
    return ["{{ " + value + " }}"] if key in _CONDITIONALS else []


def _yaml_reads(value: object, key: object = None) -> set[str]:
    """The gpupool_* variables read by the templated strings of a task, handler or vars file."""
    return {n for source in _jinja_sources(value, key) for n in _inventory_reads(source)}


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


# --- every name a role reads has a source --------------------------------------------------
# A role's defaults (besides the inventory's gpupool_*), tasks, handlers, vars and templates
# read only names that can come from somewhere:
# its defaults and vars, the names it registers or sets (set_fact) itself, the vars: of its
# tasks and blocks and its loop variables, the defaults of the roles its meta/main.yml
# depends on, Ansible's own variables, and the few listed below, each with why. A misspelt
# or renamed name, undefined at run time, fails here (issue 55).
MAGIC = {
    "item", "hostvars", "groups", "group_names", "inventory_hostname",
    "inventory_hostname_short", "inventory_dir", "play_hosts", "role_path", "role_name",
    "playbook_dir", "omit",
    # What the template module adds to a template's variables.
    "template_host", "template_path", "template_fullpath", "template_destpath",
    "template_uid", "template_run_date",
    # Ansible's global Jinja functions and Jinja's own.
    "lookup", "query", "q", "now", "undef", "range", "loop", "namespace", "dict", "lipsum",
    "cycler", "joiner",
}
# Names a role reads that the playbook running it supplies (set there, or in its vars
# files), by (reading role, name). None today: the playbooks' values (upgrade_*,
# acceptance_gate_bundle) reach the roles through options with a default.
PLAYBOOK_SUPPLIED: dict[tuple[str, str], str] = {}
# A name another role defines that a role reads, by (reading role, name). Not its defaults:
# include_role exposes none of them, so a role reads another's host fact, set once it ran.
_NVIDIA_SOURCE = "roles/nvidia_repo's host fact: the package source is configured once a host"
CROSS_ROLE: dict[tuple[str, str], str] = {
    ("dcgm", "nvidia_repo__configured"): _NVIDIA_SOURCE,
    ("nvidia_container_toolkit", "nvidia_repo__configured"): _NVIDIA_SOURCE,
    ("nvidia_driver", "nvidia_repo__configured"): _NVIDIA_SOURCE,
    ("nvidia_driver", "nvidia_repo__source"):
        "roles/nvidia_repo's host fact: which source it configured decides the packages",
    # Read by a default, with default([]) where roles/common did not run on the host.
    ("hardening", "common__ssh_groups"):
        "roles/common's host fact: the groups sshd lets in (AllowGroups)",
    ("slurm", "common__operator_groups"):
        "roles/common's host fact: the operators' groups pam_slurm_adopt lets through",
}
_SET_FACT = {"set_fact", "ansible.builtin.set_fact", "ansible.legacy.set_fact"}
_INCLUDE_VARS = {"include_vars", "ansible.builtin.include_vars"}
_INCLUDE_ROLE = {"include_role", "import_role", "ansible.builtin.include_role",
                 "ansible.builtin.import_role"}


def _yaml_keys(path: Path) -> set[str]:
    return set(yaml.safe_load(path.read_text()) or {}) if path.is_file() else set()


def _internal_names(value: object) -> set[str]:
    """The names a task list registers or sets (set_fact keys)."""
    found: set[str] = set()
    if isinstance(value, list):
        for v in value:
            found |= _internal_names(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k == "register" and isinstance(v, str):
                found.add(v)
            elif k in _SET_FACT and isinstance(v, dict):
                found |= set(v) - {"cacheable"}
            found |= _internal_names(v)
    return found


def _defined_in(value: object) -> set[str]:
    """The names a task list defines: registered, set (set_fact keys), given as vars: of a
    task, block or include, named as a loop variable or by include_vars."""
    found = _internal_names(value)
    if isinstance(value, list):
        for v in value:
            found |= _defined_in(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k == "vars" and isinstance(v, dict):
                found |= set(v)
            elif k == "loop_var" and isinstance(v, str):
                found.add(v)
            elif k in _INCLUDE_VARS and isinstance(v, dict) and isinstance(v.get("name"), str):
                found.add(v["name"])
            found |= _defined_in(v)
    return found


def _caller_vars(value: object, role: str) -> set[str]:
    """The vars: a task list gives an include_role or import_role of `role` (the parameters
    of its entry point, tasks_from: pin of nvidia_repo)."""
    found: set[str] = set()
    if isinstance(value, list):
        for v in value:
            found |= _caller_vars(v, role)
    elif isinstance(value, dict):
        for key in _INCLUDE_ROLE & set(value):
            if isinstance(value[key], dict) and value[key].get("name") == role:
                found |= set(value.get("vars") or {})
        for v in value.values():
            found |= _caller_vars(v, role)
    return found


def _dependencies(role: Path) -> list[str]:
    meta = yaml.safe_load((role / "meta" / "main.yml").read_text()) or {}
    return [d["role"] if isinstance(d, dict) else d for d in meta.get("dependencies") or []]


def _task_files(role: Path) -> list[Path]:
    return [p for sub in ("tasks", "handlers") for p in sorted((role / sub).glob("**/*.yml"))]


def _role_defined(role: Path) -> set[str]:
    names = _yaml_keys(role / "defaults" / "main.yml")
    for path in sorted((role / "vars").glob("**/*.yml")):
        names |= _yaml_keys(path)
    for dep in _dependencies(role):
        names |= _yaml_keys(role.parent / dep / "defaults" / "main.yml")
    for path in _task_files(role):
        names |= _defined_in(yaml.safe_load(path.read_text()))
    for other in sorted(role.parent.iterdir()):
        for path in _task_files(other):
            names |= _caller_vars(yaml.safe_load(path.read_text()), role.name)
    return names


def _undeclared(source: str) -> set[str]:
    """The names a template reads from its context: less those it assigns itself ({% set %},
    {% for %}), which Jinja counts as read from it where assigned in one branch only."""
    from jinja2 import meta, nodes  # noqa: PLC0415

    tree = _parsed(source)
    local: set[str] = set()
    for node in tree.find_all((nodes.Assign, nodes.For, nodes.AssignBlock)):
        targets = [node.target, *node.target.find_all(nodes.Name)]
        local |= {t.name for t in targets if isinstance(t, nodes.Name)}
    return set(meta.find_undeclared_variables(tree)) - local


def _role_reads(role: Path) -> dict[str, set[str]]:
    """The names each of the role's defaults, tasks, handlers, vars files and templates
    reads."""
    found: dict[str, set[str]] = {}
    for path in [role / "defaults" / "main.yml", *_task_files(role),
                 *sorted((role / "vars").glob("**/*.yml"))]:
        sources = _jinja_sources(yaml.safe_load(path.read_text()))
        found[str(path.relative_to(role))] = {n for s in sources for n in _undeclared(s)}
    for path in sorted((role / "templates").glob("**/*.j2")):
        found[str(path.relative_to(role))] = _undeclared(path.read_text())
    return found


def _unsourced(role: Path) -> dict[str, list[str]]:
    defined = _role_defined(role) | MAGIC
    allowed = {n for (r, n) in [*PLAYBOOK_SUPPLIED, *CROSS_ROLE] if r == role.name}
    out: dict[str, list[str]] = {}
    for where, names in _role_reads(role).items():
        # The defaults read the inventory's gpupool_* (the options' sources), nothing else.
        inventory = where == "defaults/main.yml"
        missing = sorted(n for n in names - defined - allowed
                         if not n.startswith("ansible_") and n not in NOT_INVENTORY
                         and not (inventory and _INVENTORY_NAME.fullmatch(n)))
        if missing:
            out[where] = missing
    return out


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_name_a_role_reads_has_a_source(role: Path) -> None:
    assert _unsourced(role) == {}, \
        "undefined: define it (defaults, vars, register, set_fact) or list its source here"


def test_every_listed_source_is_read() -> None:
    read = {(role.name, n) for role in ROLES for names in _role_reads(role).values()
            for n in names}
    assert sorted(set(PLAYBOOK_SUPPLIED) | set(CROSS_ROLE)) == sorted(
        (set(PLAYBOOK_SUPPLIED) | set(CROSS_ROLE)) & read), "listed but never read"


def _planted(tmp_path: Path, tasks: list[dict[str, Any]], template: str = "",
             defaults: str = "planted_option: 1\n") -> Path:
    """A role under tmp_path/roles: option planted_option, depending on pool_defaults."""
    role = tmp_path / "roles" / "planted"
    for sub in ("defaults", "meta", "tasks", "templates"):
        (role / sub).mkdir(parents=True)
    (tmp_path / "roles" / "pool_defaults" / "defaults").mkdir(parents=True)
    (tmp_path / "roles" / "pool_defaults" / "defaults" / "main.yml").write_text("pool_x: 1\n")
    (role / "defaults" / "main.yml").write_text(defaults)
    (role / "meta" / "main.yml").write_text("dependencies:\n  - role: pool_defaults\n")
    (role / "tasks" / "main.yml").write_text(yaml.safe_dump(tasks))
    (role / "templates" / "t.j2").write_text(template)
    return role


def test_the_source_check_fails_on_an_undefined_name(tmp_path: Path) -> None:
    role = _planted(tmp_path, [
        {"name": "r", "ansible.builtin.command": "true", "register": "planted__out"},
        {"name": "u", "ansible.builtin.debug": {"msg": "{{ planted__outt.stdout }}"},
         "when": "planted_optoin | bool"}],
        "{{ planted_missing }}{% for h in groups.all %}{{ h }}{% endfor %}",
        "planted_option: 1\nplanted_node: '{{ gpupool_node | default(other_role__fact) }}'\n")
    assert _unsourced(role) == {"defaults/main.yml": ["other_role__fact"],
                                "tasks/main.yml": ["planted__outt", "planted_optoin"],
                                "templates/t.j2": ["planted_missing"]}


def test_the_source_check_passes_every_kind_of_source(tmp_path: Path) -> None:
    role = _planted(tmp_path, [
        {"name": "r", "ansible.builtin.command": "true", "register": "planted__out"},
        {"name": "f", "ansible.builtin.set_fact": {"planted__fact": "{{ planted_option }}"}},
        {"name": "v", "ansible.builtin.include_vars": {"file": "x.yml", "name": "planted__v"}},
        {"name": "b", "vars": {"planted__local": 1}, "block": [
            {"name": "l", "ansible.builtin.debug": {"msg": "{{ planted__x ~ planted__local }}"},
             "loop": "{{ range(pool_x) | list }}", "loop_control": {"loop_var": "planted__x"},
             "when": ["planted__out is changed", "planted__fact", "planted__v.k",
                      "ansible_check_mode", "inventory_hostname in groups.all"]}]}],
        "{% set n = namespace(k=1) %}{% if item %}{% set a = 1 %}{% endif %}{{ a }}"
        "{{ hostvars[inventory_hostname].x | default(omit) }}{{ lookup('env', 'X') }}",
        "planted_option: 1\nplanted_node: '{{ gpupool_node }}'\n")
    assert _unsourced(role) == {}


# --- internal names carry the role's double prefix -----------------------------------------
# A role's public API is `<role>_...` in defaults/main.yml; the names it registers or sets
# for itself are `<role>__...` (the convention of Ansible's community roles), so an internal
# name never reads as an option, nor shadows one (issue 55).
def _unprefixed(role: Path) -> list[str]:
    names = {n for path in _task_files(role) for n in _internal_names(
        yaml.safe_load(path.read_text()))}
    return sorted(n for n in names if not n.startswith(role.name + "__"))


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_registered_or_set_name_has_the_role_prefix(role: Path) -> None:
    assert _unprefixed(role) == [], f"name it {role.name}__<rest>"


def test_the_prefix_check_fails_on_an_unprefixed_name(tmp_path: Path) -> None:
    role = _planted(tmp_path, [
        {"name": "r", "ansible.builtin.command": "true", "register": "planted_out"},
        {"name": "b", "block": [{"name": "f", "ansible.builtin.set_fact": {
            "planted__ok": 1, "planted_fact": 2, "cacheable": False}}]},
        {"name": "k", "ansible.builtin.command": "true", "register": "planted__kept"}])
    assert _unprefixed(role) == ["planted_fact", "planted_out"]
