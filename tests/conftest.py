"""Shared fixtures: the shipped stacks and helpers to mutate a description; a guard that
fails any test reading a file beside the repository (a user's clone has only the
repository: what the project reads must be in it); and the folder the suite's figures go to."""

from __future__ import annotations

import copy
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from gpupool.lab import hosts
from gpupool.spec import loader
from gpupool.spec.model import Description

ROOT = Path(__file__).resolve().parent.parent
# The environment running the tests (the checkout's .venv, or tests/integration/
# test_newer_python.py's): its tools, and gpupool run as a module of it.
BIN = Path(sys.executable).parent
GPUPOOL = (sys.executable, "-m", "gpupool")


class BesideTheRepository(RuntimeError):
    """A test (or the code it runs) opened a file next to the repository, not in it."""


# Folders beside the repository that a test may still read: the interpreter and its
# packages, the temporary directory, the user's home (caches). Each is allowed with its
# own subtree.
_ALLOWED = tuple(str(Path(p).resolve()) for p in (
    sys.prefix, sys.base_prefix, tempfile.gettempdir(), Path.home()))


def render_role_template(role: str, name: str, **variables: object) -> str:
    """A role's template rendered as Ansible's template module does (trim_blocks), with the
    filters the templates use that Jinja lacks, for templates that need no other."""
    env = jinja2.Environment(  # YAML, units, shell: no HTML escaping  # noqa: S701
        loader=jinja2.FileSystemLoader(ROOT / "roles" / role / "templates"),
        trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["quote"] = shlex.quote
    env.filters["to_json"] = json.dumps
    return env.get_template(name).render(ansible_managed="test", **variables)


def beside_repository(path: str | os.PathLike[str]) -> bool:
    """True for a path in the repository's parent folder but outside the repository
    (a notes folder, a sibling checkout), unless it lies in an allowed folder."""
    p = os.path.abspath(path)
    parent, root = str(ROOT.parent), str(ROOT)

    def under(base: str) -> bool:
        return p == base or p.startswith(base.rstrip(os.sep) + os.sep)

    # With the repository at the top of the file system, every system file is "beside"
    # it: there is no sibling folder to guard then.
    if parent == os.path.abspath(os.sep) or not under(parent) or under(root):
        return False
    # An allowed folder exempts what lies in it only when it is itself inside the parent
    # (a checkout in /tmp/x keeps /tmp/x/shared guarded though /tmp is the temp folder).
    return not any(under(a) for a in _ALLOWED if a == parent or a.startswith(parent + os.sep))


def _refuse_reads_beside_the_repository(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and args and isinstance(args[0], str | os.PathLike) \
            and beside_repository(args[0]):
        raise BesideTheRepository(f"opened {args[0]}: outside the repository; vendor what "
                                  "the project needs into it (with a SOURCE.md)")


sys.addaudithook(_refuse_reads_beside_the_repository)

# The suite measures as it proves (the Slurm proofs, the drills, the gate); its figures go
# under .cache/figures/, leaving the committed bench/results/ to benchmark runs
# (`python -m bench` sets this to bench/results/ for the tests it runs). Only under pytest
# (which sets PYTEST_VERSION): bench.onboard imports the suite's helpers, and its figures
# went to .cache/figures/ instead of bench/results/.
if os.environ.get("PYTEST_VERSION"):
    os.environ.setdefault("GPUPOOL_FIGURES_DIR", str(ROOT / ".cache" / "figures"))


# The suite's own lab: the `lab` stack under another pool name and 10 higher in the second
# octet of every address, so its containers, networks, lab folder and address ranges are
# all apart from the lab `make lab` builds: running the suite never touches a user's lab.
SUITE_POOL = "labtest"
SUITE_ADDRESS_SHIFT = 10  # in the second octet: 10.231.30.11 -> 10.241.30.11


def suite_lab_raw() -> dict[str, Any]:
    """The suite lab's description, derived from the `lab` stack."""
    return hosts.relocate(raw_stack("lab"), SUITE_POOL, SUITE_ADDRESS_SHIFT)


# The suite's Debian 13 lab: the lab stack's primary controller and one GPU node, their
# classes on Debian 13 with the stack's Debian 13 lock (software.per_release), 20 higher in
# the second octet, beside the suite's Debian 12 lab.
DEBIAN13_POOL = "labtest13"
DEBIAN13_ADDRESS_SHIFT = 20
DEBIAN13_NODES = ("lab-ctl", "lab-gpu1")
DEBIAN13_CONTROLLER = DEBIAN13_NODES[0]
# The environment image the Debian 13 lane declares, pushes to the registry and runs in.
DEBIAN13_IMAGE = ("lane-proof", "1.0.0")


def debian13_lab_raw() -> dict[str, Any]:
    """The suite's Debian 13 lab's description, derived from the `lab` stack."""
    raw = hosts.relocate(raw_stack("lab"), DEBIAN13_POOL, DEBIAN13_ADDRESS_SHIFT)
    for node_class in raw["node_classes"].values():
        node_class["os"] = "debian-13"
    raw["nodes"] = {n: raw["nodes"][n] for n in DEBIAN13_NODES}
    raw.pop("failover")  # its backup controller is not in this lab
    # One GPU node is left of the stack's: no team's quota of a model exceeds what that
    # node holds, so that quota and borrowing still fit the smaller pool.
    gpus = {n["class"]: raw["node_classes"][n["class"]].get("gpu") for n in raw["nodes"].values()}
    held = {g["model"]: g["count"] for g in gpus.values() if g}
    for team in raw["teams"].values():
        team["quota"] = {m: min(q, held.get(m, 0)) for m, q in team["quota"].items()}
    # The pool's registry on the controller (role image_registry), keeping its images on
    # the checkpoints tier, and the image the lane pushes there and runs a job in.
    raw["image_registry"] = {"host": DEBIAN13_CONTROLLER, "tier": "checkpoints",
                             "size_gib": 20}
    raw["environment_images"] = {DEBIAN13_IMAGE[0]: {
        "version": DEBIAN13_IMAGE[1], "base": "docker.io/library/debian:trixie-slim",
        "cuda": "12.4", "teams": sorted(raw["teams"])[:1]}}
    return raw


def write_suite_description(pool: str, raw: dict[str, Any]) -> Path:
    """A suite lab's description under .cache/suite-lab/ (rewritten only when it changed)."""
    path = ROOT / ".cache" / "suite-lab" / f"{pool}.yaml"
    text = ("# Written by tests/conftest.py from pools/lab.yaml: a test suite's own lab.\n"
            + yaml.safe_dump(raw, sort_keys=False))
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def lab_description_path() -> Path:
    """The file the integration tests' lab is described by: GPUPOOL_LAB_DESCRIPTION, or the
    suite's own lab written under .cache/ (rewritten only when the lab stack changed)."""
    if os.environ.get("GPUPOOL_LAB_DESCRIPTION"):
        return Path(os.environ["GPUPOOL_LAB_DESCRIPTION"])
    return write_suite_description(SUITE_POOL, suite_lab_raw())


def lab_description() -> Description:
    """The lab the integration tests run on (see lab_description_path)."""
    return loader.load_file(lab_description_path())


def raw_stack(stack: str) -> dict[str, Any]:
    return yaml.safe_load(loader.description_path(stack, ROOT).read_text())


def _split(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for part in path.split("."):
        name, _, idx = part.partition("[")
        if name:
            parts.append(name)
        if idx:
            parts.append(int(idx.rstrip("]")))
    return parts


def mutate(data: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply {set: path, value: v} / {delete: path} / {rename: path, to: key} operations
    to a copy of data.

    Paths use the same notation as error paths: `nodes.lab-gpu1.addresses.training`,
    `network.flows[0].ports`.
    """
    data = copy.deepcopy(data)
    for op in ops:
        key = next(k for k in ("set", "delete", "rename") if k in op)
        *parents, last = _split(op[key])
        target: Any = data
        for p in parents:
            target = target[p]
        if key == "set":
            target[last] = op["value"]
        elif key == "rename":
            target[op["to"]] = target.pop(last)
        else:
            del target[last]
    return data


@pytest.fixture
def lab_raw() -> dict[str, Any]:
    return raw_stack("lab")
