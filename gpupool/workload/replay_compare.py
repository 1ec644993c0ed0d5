"""Replay comparison: the change in each replay figure between two revisions of a
description, and the declared budgets those changes must stay within.

Pure functions over `replay.metrics` dicts, so they are tested without Slurm;
`gpupool replay --compare` runs the two replays (gpupool/exercise/replay_run.py).

A budget reads FIGURE=LIMIT, LIMIT one of `+N%` (may not grow by more than N percent of
its value before), `-N%` (may not shrink by more than that), `+N` / `-N` (the same in the
figure's own unit). FIGURE is a pool-wide figure (SCALARS) or CLASS.wait_p50 /
CLASS.wait_p95 (the class's wait in wall seconds).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# Pool-wide figures of replay.metrics a budget may name, with what growing means.
SCALARS = {
    "gpu_utilization_saturated": "GPU utilization while demand exceeds the pool",
    "makespan_s": "seconds from the first arrival to the last end",
    "work_lost_gpu_s": "GPU-seconds redone after preemptions",
    "work_lost_share": "share of all work redone",
    "completed": "jobs completed",
    "failed_share": "share of jobs that failed",
    "preemptions_and_requeues": "preemptions and requeues",
    "not_runnable": "jobs wider than the policy can ever run",
}
WAITS = ("p50", "p95")
# Above this a relative budget allows any change a replay can show: a typo, refused.
MAX_PERCENT = 1000.0
MAX_ABSOLUTE = 1e9
_LIMIT = re.compile(r"^([+-])\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(%?)$")
_FIGURE = re.compile(r"^(?:(?P<scalar>[a-z_]+)|(?P<cls>[A-Za-z0-9][A-Za-z0-9_-]*)"
                     r"\.wait_(?P<q>p50|p95))$")


class BudgetError(ValueError):
    """A malformed budget; the message names where it came from (`field`)."""


@dataclass(frozen=True)
class Budget:
    """FIGURE may not grow (direction +1) or shrink (-1) by more than amount (percent of
    its value before when relative, else in its own unit)."""

    figure: str
    direction: int
    amount: float
    relative: bool
    source: str  # where it was declared: the description's field or --budget

    def text(self) -> str:
        sign = "+" if self.direction > 0 else "-"
        return f"{self.figure}={sign}{self.amount:g}{'%' if self.relative else ''}"


def parse_budget(figure: str, limit: str, classes: set[str], field: str) -> Budget:
    """One budget; BudgetError naming `field` when the figure is not one a replay reports
    (for `classes`) or the limit is not a finite, non-negative, sensible amount."""
    m = _FIGURE.match(figure.strip())
    name = figure.strip()
    if m is None or (m["scalar"] and m["scalar"] not in SCALARS) or (
            m["cls"] and m["cls"] not in classes):
        known = [*SCALARS, *(f"{c}.wait_{q}" for c in sorted(classes) for q in WAITS)]
        raise BudgetError(f"{field}: unknown figure {name[:80]!r}; known: {', '.join(known)}")
    lim = _LIMIT.match(limit.strip())
    if lim is None:
        raise BudgetError(f"{field}: limit {limit[:40]!r} is not +N%, -N%, +N or -N "
                          "(N a non-negative number)")
    amount = float(lim[2])
    relative = lim[3] == "%"
    if not math.isfinite(amount) or amount > (MAX_PERCENT if relative else MAX_ABSOLUTE):
        raise BudgetError(f"{field}: limit {limit.strip()!r} is beyond "
                          f"{MAX_PERCENT:g}% / {MAX_ABSOLUTE:g}: no budget at all")
    return Budget(name, 1 if lim[1] == "+" else -1, amount, relative, field)


def parse_option(text: str, classes: set[str]) -> Budget:
    """A --budget FIGURE=LIMIT."""
    figure, sep, limit = text.partition("=")
    if not sep:
        raise BudgetError(f"--budget {text[:80]!r}: expected FIGURE=LIMIT, e.g. "
                          "interactive.wait_p95=+10%")
    return parse_budget(figure, limit, classes, f"--budget {figure.strip()[:80]}")


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
