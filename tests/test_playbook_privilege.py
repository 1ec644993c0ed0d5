"""Privilege in the roles that mix the operator's machine and the pool: a step that runs
where Ansible runs (delegate_to: localhost, such as the acceptance gate) says become: false,
so that no play's become turns into sudo on the operator's own machine, and each step on a
pool host (scontrol on the Slurm controller, the verdict record) asks for root itself, so
that plays without become (gate.yml, node_drain.yml, ...) drain, resume and record when the
site connects as an unprivileged user with sudo; one that needs no root (the firewall
probes from a peer) says become: false, so it is a choice, not an inheritance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = ("block", "rescue", "always")


INHERITED = ("delegate_to", "become")


def tasks(items: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Every task of a task list, blocks flattened (their tasks inherit where they run and
    their become, as in Ansible)."""
    found = []
    for t in items or []:
        if any(k in t for k in BLOCKS):
            keep = {k: t[k] for k in INHERITED if k in t}
            for k in BLOCKS:
                found += [keep | inner for inner in tasks(t.get(k))]
        else:
            found.append(t)
    return found


def role_tasks(role: Path) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{p.name}: {t.get('name')}", t) for p in sorted((role / "tasks").glob("*.yml"))
            for t in tasks(yaml.safe_load(p.read_text()))]


def local(task: dict[str, Any]) -> bool:
    return task.get("delegate_to") == "localhost"


MIXED = sorted(r for r in (ROOT / "roles").iterdir()
               if (r / "tasks").is_dir() and any(local(t) for _, t in role_tasks(r)))


def test_the_admission_role_is_among_the_mixed_ones() -> None:
    assert "admission" in {r.name for r in MIXED}


@pytest.mark.parametrize("role", MIXED, ids=[r.name for r in MIXED])
def test_pool_steps_ask_for_root_and_local_ones_never(role: Path) -> None:
    for where, t in role_tasks(role):
        if local(t):
            assert t.get("become") is False, f"{role.name}/{where}: may become locally"
        elif "delegate_to" in t:  # root asked for, or declined where none is needed
            assert t.get("become") in (True, False), f"{role.name}/{where}: delegated " \
                                                     "without saying become"
