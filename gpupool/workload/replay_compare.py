"""Replay comparison: the change in each replay figure between two revisions of a
description, and the declared budgets those changes must stay within.

Pure functions over `replay.metrics` dicts, so they are tested without Slurm;
`gpupool replay --compare` runs the two replays (gpupool/exercise/replay_run.py).

Budgets are read by gpupool/spec/budgets.py (their grammar, checked when the description
is loaded); here each is judged against the two runs' figures.
"""

from __future__ import annotations

from typing import Any

from gpupool.spec.budgets import SCALARS, WAITS, Budget


def merge(declared: list[Budget], given: list[Budget]) -> list[Budget]:
    """The description's budgets with the command line's over them: a figure and direction
    given on the command line replaces the declared one (a stricter or looser check for one
    run), the rest stand."""
    over = {(b.figure, b.direction) for b in given}
    return [*(b for b in declared if (b.figure, b.direction) not in over), *given]


def figures(m: dict[str, Any]) -> dict[str, float | None]:
    """One run's figures by budget name (None: the run gives none, e.g. no job of a class,
    or no saturated second)."""
    out: dict[str, float | None] = {k: m.get(k) for k in SCALARS}
    for cls, q in m.get("wait_s", {}).items():
        for w in WAITS:
            out[f"{cls}.wait_{w}"] = q.get(w)
    return out


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Each figure either run has: its value before and after, the change (after - before)
    and the relative change (of before; None where before is 0 or either is missing)."""
    a, b = figures(before), figures(after)
    out = []
    for name in [*a, *(k for k in b if k not in a)]:
        x, y = a.get(name), b.get(name)
        delta = None if x is None or y is None else round(y - x, 4)
        rel = None if delta is None or not x else round(delta / abs(x), 4)
        out.append({"figure": name, "before": x, "after": y, "change": delta,
                    "relative": rel})
    return out


def check(budget: Budget, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """A budget's verdict: broken True/False, or None when either run has no value for the
    figure (no evidence either way)."""
    x, y = figures(before).get(budget.figure), figures(after).get(budget.figure)
    base = {"budget": budget.text(), "source": budget.source, "before": x, "after": y}
    if x is None or y is None:
        return {**base, "broken": None, "why": "no evidence: "
                f"{'neither run' if x is None and y is None else 'one run'} has this figure"}
    moved = (y - x) * budget.direction  # growth for a + budget, shrinkage for a -
    # A relative budget on a figure that was 0 allows no move at all: N% of nothing.
    allowed = abs(x) * budget.amount / 100 if budget.relative else budget.amount
    broken = moved > allowed + 1e-9
    moved_how = (f"unchanged at {x:g}" if y == x else
                 f"{'grew' if y > x else 'shrank'} from {x:g} to {y:g}")
    return {**base, "broken": broken,
            "why": moved_how + (f", more than the {allowed:g} allowed" if broken else "")}


def verdict(results: list[dict[str, Any]], strict: bool) -> list[dict[str, Any]]:
    """The budgets that fail the gate: broken ones, and with strict those without
    evidence too (a gate that must see the figure to pass it)."""
    return [r for r in results if r["broken"] or (strict and r["broken"] is None)]
