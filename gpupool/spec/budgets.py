"""The merge gate's budget grammar: FIGURE=LIMIT, as the description's replay_budgets
and `gpupool replay --compare --budget` write it.

LIMIT is one of `+N%` (the figure may not grow by more than N percent of its value before),
`-N%` (may not shrink by more than that), `+N` / `-N` (the same in the figure's own unit).
FIGURE is a pool-wide replay figure (SCALARS) or CLASS.wait_p50 / CLASS.wait_p95 (the
class's wait in wall seconds). Here, at the bottom, so validation refuses a malformed
budget when the description is read; gpupool/workload/replay_compare.py judges them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

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
