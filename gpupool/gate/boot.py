"""A burst node's acceptance gate at boot: the quick tier on this machine, before slurmd
takes any work.

The launch template's user-data (gpupool.render.cloud.launch.user_data) runs, from the gate's
virtual environment in the image (roles/acceptance_gate),

    python -m gpupool.gate.boot FACTS NODE REPORT_DIR

with the facts it wrote (gpupool.render.cloud.launch.burst_facts). Exit 0 admits the node: the
user-data starts slurmd. Anything else keeps it out, and the one line printed on stdout is
the drain reason the user-data gives Slurm: the failed checks, or why the gate could not
run. The full report stays in REPORT_DIR/NODE.json.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from gpupool.gate import runner
from gpupool.gate.expect import FactsError, burst_expect
from gpupool.gate.plugin import COULD_NOT_RUN, FAIL
from gpupool.spec.model import NAME_RE

TIER = "quick"
REASON_MAX = 200  # a Slurm reason is read in `sinfo -R`: the report has the rest
USAGE = "usage: python -m gpupool.gate.boot FACTS NODE REPORT_DIR"


def reason(report: dict[str, Any]) -> str:
    """The drain reason for a report that did not pass, in one bounded line."""
    if report["verdict"] == FAIL:
        text = "gpupool gate failed: " + ", ".join(map(str, report["failed"]))
    else:
        error = " ".join(str(report.get("error") or "no checks ran").split())
        text = f"gpupool gate could not run: {error[-120:]}"
    return text[:REASON_MAX]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(USAGE, file=sys.stderr)
        return 2
    facts_path, node, out_dir = Path(argv[0]), argv[1], Path(argv[2])
    if not re.fullmatch(NAME_RE, node):
        print(f"gpupool gate could not run: invalid node name {node!r}"[:REASON_MAX])
        return runner.EXIT[COULD_NOT_RUN]
    try:
        expect = burst_expect(json.loads(facts_path.read_text()), node)
        report = runner.gate_here(expect, TIER, out_dir)
    except (OSError, ValueError, FactsError) as exc:  # JSONDecodeError is a ValueError
        print(f"gpupool gate could not run: {exc}"[:REASON_MAX])
        return runner.EXIT[COULD_NOT_RUN]
    if report["verdict"] != runner.PASS:
        print(reason(report))
    return runner.EXIT[report["verdict"]]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
