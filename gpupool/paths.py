"""Where gpupool's own files are: the checkout or installed package, the Ansible content and
project templates it ships, its Ansible settings and vendored data.

A leaf module (stdlib only), so that the lab, the gate and the previews can find the
checkout without importing the description's loader.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# gpupool's roles, playbooks, Ansible settings and inventory plugin, the on-host programs
# the roles install, the monitoring rules, the starter descriptions and the Pulumi project
# file. A checkout holds them at its root; an installed wheel carries them under
# gpupool/share (pyproject.toml's force-include), in the same layout so that the roles'
# paths relative to themselves still hold.
_SHIPPED = Path(__file__).resolve().parent / "share"
SHARE = _SHIPPED if _SHIPPED.is_dir() else PROJECT_ROOT
# The Ansible settings every playbook run and the gate's testinfra use.
ANSIBLE_CONFIG = SHARE / "ansible.cfg"
# Third-party data files gpupool reads (schemas, a public trace), each with its SOURCE.md.
DATA = Path(__file__).resolve().parent / "data"
# A pool project is a folder holding a Pulumi.yaml (and Pulumi.<stack>.yaml per stack).
PROJECT_FILE = "Pulumi.yaml"


# Python's byte-code caches: never packed into anything gpupool ships to a host.
CACHES = ("__pycache__", ".pyc")


def files_under(top: Path, skip: tuple[str, ...] = CACHES) -> list[Path]:
    """The files under top (or top itself, a file), sorted, without those whose name or a
    folder of whose path holds one of skip."""
    found = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
    return [p for p in found if not any(s in p.name or s in p.parts for s in skip)]


def find_project(start: Path) -> Path | None:
    """The nearest folder from start upwards that holds a Pulumi.yaml, if any."""
    start = start.resolve()
    return next((d for d in (start, *start.parents) if (d / PROJECT_FILE).is_file()), None)


def pulumi_project() -> Path:
    """The pool project a Pulumi program or policy pack serves, whose stack config's
    description path is relative to it: $GPUPOOL_PROJECT where set, else the nearest project
    from the working directory up, else this checkout. Pulumi runs a program in its project's
    folder, but a Python policy pack in the pack's own folder and tells it only the project's
    name, so a project outside the checkout names itself (`gpupool init` writes how)."""
    named = os.environ.get("GPUPOOL_PROJECT")
    return Path(named).resolve() if named else find_project(Path.cwd()) or PROJECT_ROOT
