"""The acceptance gate run on the node it admits, with its input on stdin: how role
admission gates a node.

    PYTHONPATH=<gate dir>/lib python3 -m gpupool.gate.onnode NODE TIER REPORT_DIR [--admit] < INPUT

INPUT is one JSON object: "expect", the node's entry in what `gpupool gate --print-expect`
prints on the control host (locks applied), so the node needs no description; and
"probes", what each peer's firewall probe printed (`gpupool gate --print-probes`, run on the
peers by the role), absent at a tier that reads none. The report is printed on stdout as
one JSON object, and kept in REPORT_DIR/NODE.json beside its input; the exit status is the
verdict's (0 pass, 1 fail, 3 could not run). Input the gate cannot use is a could-not-run
report, never a traceback. With --admit (the admission role's run, never in check mode) a
pass also records the admission in the XID check's cursor (gpupool/gate/xid.py), so the
XIDs logged before it are history; the report's "xid_cursor" says whether it was written.

Why on the node: gated from the control host, every check is an SSH round trip and every
node a pytest process there, which made the gate the largest per-node share of the
control host's onboarding work (bench/onboard.py). On the node the suites run as the
health loop's and the burst boot's do (the `local://` backend), from the archive role
acceptance_gate unpacked, and the control host starts one command per node and one per
peer that probes it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gpupool.gate import runner, xid
from gpupool.gate.expect import NodeExpect
from gpupool.gate.plugin import COULD_NOT_RUN, PASS, TIERS
from gpupool.spec.model import NAME_RE

USAGE = "usage: python -m gpupool.gate.onnode NODE TIER REPORT_DIR [--admit] < INPUT.json"
ADMIT = "--admit"  # roles/admission, not in check mode: a pass admits the node
MAX_INPUT = 1 << 20  # bytes read from stdin: a node's input is a few kilobytes
PLAIN_DIR = re.compile(r"(/[A-Za-z0-9_][A-Za-z0-9_.-]*)+")


def _given(text: str, node: str) -> tuple[NodeExpect, dict[str, str] | None] | str:
    """The expectation and the peers' probe output, or why they cannot be used."""
    try:
        given = json.loads(text)
        if not isinstance(given, dict) or set(given) - {"expect", "probes"}:
            raise ValueError('want {"expect": ..., "probes": {peer: output}}')
        expect = NodeExpect.from_json(json.dumps(given["expect"]))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return f"the input on stdin is not gpupool's: {type(exc).__name__}: {exc}"[:300]
    if expect.node != node:
        return f"the expectation is for {expect.node!r}, not {node!r}"[:300]
    probed = given.get("probes")
    if probed is not None and not (isinstance(probed, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in probed.items())):
        return "probes must map each peer to its probe command's output"
    return expect, probed


def gate(node: str, tier: str, out_dir: str, stdin: TextIO) -> dict[str, Any]:
    """The report for this machine as node: gated, or could not run and why."""
    if not re.fullmatch(NAME_RE, node):
        return runner.could_not_run(node[:64], tier[:32], f"invalid node name {node[:64]!r}")
    if tier not in TIERS:
        return runner.could_not_run(node, tier[:32], f"unknown tier; one of {', '.join(TIERS)}")
    if not PLAIN_DIR.fullmatch(out_dir):  # no component may start with a dot: no ..
        return runner.could_not_run(node, tier, "REPORT_DIR must be a plain absolute path")
    given = _given(stdin.read(MAX_INPUT), node)
    if isinstance(given, str):
        return runner.could_not_run(node, tier, given)
    expect, probed = given
    try:
        return runner.gate_here(expect, tier, Path(out_dir), probed=probed)
    except (OSError, ValueError) as exc:  # the report directory, or a report that is no JSON
        return runner.could_not_run(node, tier, f"{type(exc).__name__}: {exc}"[:300])


def admit(report: dict[str, Any], record: Callable[[str], Path] = xid.record) -> None:
    """A node the gate passed is admitted: the XIDs its kernel logged so far become history
    for the XID check (gpupool/gate/xid.py). A cursor that could not be written leaves them
    counted, and the report says so; the verdict stands."""
    if report["verdict"] != PASS:
        return
    try:
        report["xid_cursor"] = f"{record('admitted')}: admission recorded"
    except OSError as exc:
        report["xid_cursor"] = f"not recorded: {exc}"[:300]


def main(argv: list[str], stdin: TextIO = sys.stdin,
         record: Callable[[str], Path] = xid.record) -> int:
    admitting = argv[3:] == [ADMIT]
    if len(argv) != 3 and not (len(argv) == 4 and admitting):
        print(USAGE, file=sys.stderr)
        return 2
    report = gate(*argv[:3], stdin=stdin)
    if admitting:
        admit(report, record)
    print(json.dumps(report, sort_keys=True))
    return runner.EXIT.get(report["verdict"], runner.EXIT[COULD_NOT_RUN])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
