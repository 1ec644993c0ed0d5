"""Issue 14, the second line of defence: every role template quotes, escapes or refuses what
it writes, so a description value that got past validation still cannot add a line, a rule,
a directive or a key to a file on a node.

Validation (gpupool/spec/loader.py, rules.py) is the first line: it rejects control
characters and constrains names with patterns. This test bypasses it on purpose: it builds
the lab stack's Description, then rebuilds it with `model_construct` (no validation) with a
hostile suffix appended to every string the description holds, derives the inventory from
it with gpupool's own code (so slurm.conf records, firewall allowances and every other
derived value carry the suffix as they would), loads that inventory the way the playbooks
do (the YAML file `gpupool inventory` writes, through Ansible's inventory and variable
managers, with each role's defaults and vars) and renders every template under
roles/*/templates with Ansible's own Templar, once benign and once hostile. Per format it
then asserts that nothing extra appeared.

A template may also refuse a value (raise while rendering): then nothing reaches the node.
"""

from __future__ import annotations

import configparser
import functools
import json
import re
import shlex
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gpupool.render import ansible_yaml, inventory
from gpupool.spec import loader
from gpupool.spec.model import Description, Role
from tests.conftest import ROOT, raw_stack

pytest.importorskip("ansible")

# Appended to every description string. Each part targets a format: a newline with a
# directive after it (systemd, slurm.conf, sshd, sudoers, nftables, shell), quotes, shell
# metacharacters, a systemd specifier, braces (nftables blocks, YAML flow mappings), a
# Jinja expression (evaluated it would read INJECTED), a tab and a NUL. No ':' or '[': with
# them Ansible's inventory reads a host name as a host:port or a host range.
# Two payloads: one within a line (quotes, shell, braces, a specifier, spaces), one that
# starts new lines; a template must survive both.
INLINE = " x\"'`id`$(id);#\\ %n%%{}} {{ 'INJ' ~ 'ECTED' }}\t"
LINES = (INLINE + "\x00\nExecStartPre=/bin/sh -c id\nALL ALL=(ALL) NOPASSWD ALL"
         "\nPermitRootLogin yes\nSlurmUser=root\n}\naccept\n- injected\n")
SUFFIXES = {"inline": INLINE, "lines": LINES}
# What a template refusing a value raises with (roles/*/templates, the gpupool_refuse
# macro): any other error while rendering the hostile description is a failure.
# Templates no host of the lab stack uses, and why: these are not exercised here.
NOT_IN_LAB = {
    "manifests.yaml.j2": "the GPU Operator's manifests: the lab declares no Kubernetes",
    "kubelet.j2": "kubelet arguments: the lab declares no Kubernetes",
    "gpupool-mig.service.j2": "the MIG boot unit: no lab class is MIG-partitioned",
    "burst-aws.sh.j2": "the burst program's AWS wrapper: lab burst nodes run the relay",
    "lustre.sources.j2": "the Lustre client's source: the lab mounts no Lustre "
                         "(tests/test_lustre_client.py renders it with hostile values)",
}
REFUSAL = "gpupool refuses"

# The facts the templates read, as on a Debian 12 node.
FACTS = {"distribution": "Debian", "distribution_release": "bookworm", "os_family": "Debian",
         "distribution_major_version": "12", "virtualization_role": "guest",
         "virtualization_type": "podman"}

TEMPLATES = sorted(ROOT.glob("roles/*/templates/*.j2"))
_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


# --- a hostile description, validation bypassed -------------------------------------------

def _hostile(value: Any, strings: set[str], suffix: str) -> Any:
    """value with suffix appended to each str in strings (keys included), rebuilt without
    validation; enumerations stay (they hold no text of the author's)."""
    if isinstance(value, BaseModel):
        fields = {k: _hostile(getattr(value, k), strings, suffix) for k in type(value).model_fields}
        built = type(value).model_construct(_fields_set=value.model_fields_set, **fields)
        if value.__pydantic_private__:
            object.__setattr__(built, "__pydantic_private__", dict(value.__pydantic_private__))
        return built
    if isinstance(value, dict):
        return {_hostile(k, strings, suffix): _hostile(v, strings, suffix)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_hostile(v, strings, suffix) for v in value)
    if isinstance(value, str) and not isinstance(value, Enum) and value in strings:
        return value + suffix
    return value


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, BaseModel):
        for k in type(value).model_fields:
            yield from _strings(getattr(value, k))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str) and not isinstance(value, Enum):
        yield value


@dataclass
class Hostile:
    desc: Description
    # Values gpupool's own derivation refuses (it raises when one carries the suffix): they
    # never reach an inventory, so no template sees them.
    refused_upstream: dict[str, str]


@functools.cache
def benign() -> Description:
    """The lab stack, with the pool's registry declared on its controller: the stack
    declares none (the Debian 13 lane's lab does), and role image_registry's templates
    must meet the hostile values too."""
    raw = raw_stack("lab")
    raw["image_registry"] = {"host": "lab-ctl", "tier": "checkpoints", "size_gib": 20}
    return loader.parse(raw, "lab")


@functools.cache
def hostile(suffix: str) -> Hostile:
    desc = benign()
    refused: dict[str, str] = {}
    # Each distinct string is made hostile everywhere it occurs, so references (a node's
    # class, a flow's segments) still resolve; one at a time first, to set apart those the
    # derivation refuses.
    candidates = sorted(set(_strings(desc)))
    for s in candidates:
        try:
            inventory.build(_hostile(desc, {s}, suffix))
        except Exception as e:  # any refusal keeps the value out of every inventory
            refused[s] = f"{type(e).__name__}: {e}"[:120]
    chosen = {s for s in candidates if s not in refused}
    return Hostile(_hostile(desc, chosen, suffix), refused)


# --- rendering with Ansible's engine ------------------------------------------------------

@dataclass
class Render:
    host: str
    item: Any
    text: str | None
    error: str | None


# The role files are read once per session (parsing them per template and host took most of
# the test's time); callers only read what these return.
@functools.cache
def _tasks(role: Path) -> tuple[dict[str, Any], ...]:
    found: list[dict[str, Any]] = []
    for f in sorted((role / "tasks").glob("*.yml")):
        for t in yaml.load(f.read_text(), Loader=_LOADER) or []:  # noqa: S506 - a SafeLoader
            found += [t, *t.get("block", []), *t.get("rescue", []), *t.get("always", [])]
    return tuple(found)


def _module(task: dict[str, Any], name: str) -> Any:
    return task.get(f"ansible.builtin.{name}", task.get(name))


@functools.cache
def _loops(role: Path, template: Path) -> list[tuple[str, Any, dict[str, Any]]]:
    """(src, loop, task vars) of each task of the role rendering this template (a src with
    {{ }} matches any name; render() keeps the items whose src is this template)."""
    found = []
    for t in _tasks(role):
        if not isinstance(module := _module(t, "template"), dict):
            continue
        pattern = re.sub(r"\\\{\\\{.*?\\\}\\\}", ".+", re.escape(module["src"]))
        if re.fullmatch(pattern, template.name):
            found.append((module["src"], t.get("loop"), t.get("vars", {})))
    assert found, f"no task of {role.name} renders {template.name}"
    return found


@functools.cache
def _contexts(role: Path) -> list[tuple[str, dict[str, Any]]]:
    """The plays a role's templates render in: its own, and for a role other roles include
    (nvidia_repo's pin step), each including role's with the include's vars."""
    found = [(role.name, {})]
    for other in sorted(ROOT.glob("roles/*")):
        for t in _tasks(other) if (other / "tasks").is_dir() else ():
            inc = _module(t, "include_role")
            if isinstance(inc, dict) and inc.get("name") == role.name:
                found.append((other.name, t.get("vars", {})))
    return found


@functools.cache
def _role_facts(role: Path) -> dict[str, Any]:
    """What the role's set_fact tasks compute (storage's list of network tiers): as
    templates, evaluated when a template reads them."""
    facts: dict[str, Any] = {}
    for t in _tasks(role):
        if isinstance(module := _module(t, "set_fact"), dict):
            facts.update(module)
    return facts


class Renderer:
    """Ansible's inventory and variable managers over an inventory file, as a play that
    applies one role sees them."""

    def __init__(self, desc: Description, workdir: Path) -> None:
        from ansible.inventory.manager import InventoryManager  # noqa: PLC0415
        from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415
        from ansible.plugins.loader import init_plugin_loader  # noqa: PLC0415
        from ansible.vars.hostvars import HostVars  # noqa: PLC0415
        from ansible.vars.manager import VariableManager  # noqa: PLC0415

        init_plugin_loader()
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / "inventory.yml"
        # As `gpupool inventory -o` and `gpupool lab up` write it: strings holding `{` are
        # tagged !unsafe, so Ansible never evaluates template syntax from the description.
        path.write_text(ansible_yaml.dump(inventory.build(desc)))
        self.loader = DataLoader()
        self.loader.set_basedir(str(ROOT / "playbooks"))
        self.inventory = InventoryManager(loader=self.loader, sources=[str(path)])
        self.variables = VariableManager(loader=self.loader, inventory=self.inventory)
        # As a run's task queue sets it: the pool-wide variables are read through hostvars
        # (gpupool/render/inventory.py, POOL_WIDE).
        self.variables._hostvars = HostVars(  # what TaskQueueManager sets
            inventory=self.inventory, variable_manager=self.variables, loader=self.loader)
        self.hosts = list(desc.nodes)

    @functools.cache  # noqa: B019 - one per role per test session
    def _play(self, role: str) -> Any:
        from ansible.playbook.play import Play  # noqa: PLC0415

        # The target is Debian: the roles include vars/Debian.yml (include_vars by OS).
        os_vars = ROOT / "roles" / role / "vars" / "Debian.yml"
        return Play.load({"hosts": "all", "gather_facts": False, "roles": [role],
                          "vars_files": [str(os_vars)] if os_vars.is_file() else []},
                         variable_manager=self.variables, loader=self.loader)

    @functools.cache  # noqa: B019 - one per role and host per test session
    def _vars(self, context: str, host: str) -> dict[str, Any]:
        return dict(self.variables.get_vars(play=self._play(context),
                                            host=self.inventory.get_host(host)))

    def render(self, template: Path) -> list[Render]:
        from ansible.template import Templar, generate_ansible_template_vars, trust_as_template  # noqa: PLC0415

        def trusted(value: Any) -> Any:
            if isinstance(value, str):
                return trust_as_template(value)
            if isinstance(value, dict):
                return {k: trusted(v) for k, v in value.items()}
            if isinstance(value, list):
                return [trusted(v) for v in value]
            return value

        role = template.parent.parent
        source = trust_as_template(template.read_text())
        out = []
        for context, include_vars in _contexts(role):
            for host in self.hosts:
                base = self._vars(context, host)
                hv = {**base, **trusted(_role_facts(ROOT / "roles" / context)),
                      **trusted(include_vars),
                      "ansible_facts": {**base.get("ansible_facts", {}), **FACTS},
                      **generate_ansible_template_vars(str(template), str(template), "/dest")}
                for src, loop, task_vars in _loops(role, template):
                    tv = {**hv, **trusted(task_vars)}
                    try:
                        items = [None] if loop is None else list(
                            Templar(loader=self.loader, variables=tv).template(trusted(loop)))
                    except Exception:  # noqa: S112 - a loop this host cannot evaluate
                        continue
                    for item in items:
                        t = Templar(loader=self.loader, variables={**tv, "item": item})
                        try:
                            if t.template(trust_as_template(src)) != template.name:
                                continue
                            text = t.template(source, escape_backslashes=False)
                            out.append(Render(host, item, str(text), None))
                        except Exception as e:  # a refusal, or a host it is not for
                            out.append(Render(host, item, None, f"{type(e).__name__}: {e}"))
        return out


@functools.cache
def renders(payload: str | None) -> dict[Path, list[Render]]:
    """Every template rendered for the lab stack: benign (None) or with a payload of
    SUFFIXES in every string."""
    desc = benign() if payload is None else hostile(SUFFIXES[payload]).desc
    with tempfile.TemporaryDirectory() as d:
        r = Renderer(desc, Path(d))
        return {t: r.render(t) for t in TEMPLATES}




# --- per format: nothing extra appeared ---------------------------------------------------

def _strip(value: Any, suffix: str) -> Any:
    """A parsed hostile document with the suffix taken off every string: equal to the benign
    one when every value stayed a value."""
    if isinstance(value, dict):
        return {_strip(k, suffix): _strip(v, suffix) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, suffix) for v in value]
    if isinstance(value, str):
        return value.replace(suffix, "")
    return value


def _tokens(line: str) -> int | str:
    try:
        return len(shlex.split(line, comments=False))
    except ValueError:
        return "unbalanced quotes"


def _specifiers(text: str) -> int:
    return len(re.findall(r"%[A-Za-z]", text.replace("%%", "")))


def _sections(text: str) -> dict[str, list[str]]:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return {s: list(parser[s]) for s in parser.sections()}


def _compare(template: Path, good: str, bad: str, suffix: str) -> list[str]:
    """What is wrong with bad, the hostile rendering, beside good, the benign one."""
    problems = []
    if "INJECTED" in bad:
        problems.append("a Jinja expression from the description was evaluated")
    kind = template.name.removesuffix(".j2").rsplit(".", 1)[-1]
    if kind in ("yml", "yaml", "json"):
        load: Callable[[str], Any] = json.loads if kind == "json" else yaml.safe_load
        try:
            if _strip(load(bad), suffix) != load(good):
                problems.append(f"the {kind} document's structure changed")
        except (ValueError, yaml.YAMLError) as e:
            problems.append(f"no longer parses as {kind}: {e}")
        return problems
    g, b = good.splitlines(), bad.splitlines()
    if len(g) != len(b):
        return [*problems, f"{len(b)} lines instead of {len(g)}"]
    code = [(x, y) for x, y in zip(g, b, strict=True)
            if not x.lstrip().startswith(("#", "//"))]
    for x, y in code:
        hx, hy = re.match(r"\s*[^\s=]*", x), re.match(r"\s*[^\s=]*", y)
        if hx and hy and hx.group() != hy.group():
            problems.append(f"line {y!r} starts differently from {x!r}")
        elif _tokens(x) != _tokens(y):
            problems.append(f"line {y!r} splits into {_tokens(y)} words, not {_tokens(x)}")
        elif x.count("{") - x.count("}") != y.count("{") - y.count("}"):
            problems.append(f"line {y!r} opens or closes a block")
    if "\n[Unit]" in good or "\n[Service]" in good or "\n[Mount]" in good:
        if _sections(good) != _sections(bad):
            problems.append("the unit's keys changed")
        if _specifiers(good) != _specifiers(bad):
            problems.append("a systemd specifier (%x) appeared")
    return problems


@pytest.fixture(scope="module", params=sorted(SUFFIXES))
def pair(request: pytest.FixtureRequest) -> tuple[str, dict[Path, list[Render]],
                                                  dict[Path, list[Render]]]:
    suffix = SUFFIXES[request.param]
    return suffix, renders(None), renders(request.param)


@pytest.mark.parametrize("template", [pytest.param(t, id=str(t.relative_to(ROOT)))
                                      for t in TEMPLATES])
def test_hostile_values_add_nothing(template: Path, pair: Any) -> None:
    suffix, good, bad = pair
    rendered = [(g, b) for g, b in zip(good[template], bad[template], strict=False)
                if g.text is not None]
    if not rendered:
        # Not a skip: that it renders for no lab host is itself checked, so a template
        # that silently stops applying fails here.
        assert template.name in NOT_IN_LAB, f"{template.name} applies to no host of the lab"
        return
    assert len(good[template]) == len(bad[template])
    problems = []
    for g, b in rendered:
        if b.text is None:
            if REFUSAL not in (b.error or ""):
                problems.append(f"{g.host}: failed without refusing: {b.error}")
            continue
        problems += [f"{g.host}: {p}" for p in _compare(template, g.text, b.text, suffix)]
    assert not problems, "\n".join(problems[:10])


def test_unprivileged_containers_cannot_pick_gpus_by_environment() -> None:
    """Issue 14: the container toolkit's configuration, as rendered for every lab GPU node,
    refuses NVIDIA_VISIBLE_DEVICES from unprivileged containers."""
    import tomllib  # noqa: PLC0415

    template = ROOT / "roles/nvidia_container_toolkit/templates/config.toml.j2"
    rendered = [r for r in renders(None)[template] if r.text is not None]
    assert rendered
    for r in rendered:
        config = tomllib.loads(r.text or "")
        assert config["accept-nvidia-visible-devices-envvar-when-unprivileged"] is False
        assert config["accept-nvidia-visible-devices-as-volume-mounts"] is True


def test_team_admins_administer_their_teams_nodes_not_the_pool() -> None:
    """Issue 50: sudo ALL goes to the pool's operators everywhere and to a team's admins
    only on the nodes their team owns: the lab's vision admin on vision's nodes, not on
    nlp's node nor the controllers (the lab declares no operators). A member name that got
    past validation is refused, never written into sudoers."""
    desc = benign()
    template = ROOT / "roles/common/templates/sudoers.j2"
    admins = {team: t.members.get(Role.ADMIN, []) for team, t in desc.teams.items()}
    seen = set()
    for r in renders(None)[template]:
        assert r.text is not None, r.error
        owner = desc.nodes[r.host].owner_team
        expected = sorted({*desc.pool.operators, *(admins[owner] if owner else [])})
        granted = [ln for ln in r.text.splitlines() if "ALL=(ALL:ALL) ALL" in ln]
        alias = [ln for ln in r.text.splitlines() if ln.startswith("User_Alias ")]
        if expected:
            assert alias == [f"User_Alias GPUPOOL_ADMINS = {', '.join(expected)}"], r.host
            assert granted == ["GPUPOOL_ADMINS ALL=(ALL:ALL) ALL"], r.host
        else:
            assert (alias, granted) == ([], []), r.host
        assert not any(ln.startswith("%gpupool-admin") for ln in r.text.splitlines())
        seen.add((r.host, bool(expected)))
    assert {("lab-gpu1", True), ("lab-gpu3", False), ("lab-ctl", False)} <= seen
    for r in renders("lines")[template]:
        if (r.host, True) in seen:
            assert r.text is None and REFUSAL in (r.error or ""), r.host
        else:
            assert r.text is not None and "User_Alias" not in r.text, r.host
