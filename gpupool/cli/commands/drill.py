"""`gpupool drill NAME...`: failure drills on the lab's real Slurm."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from gpupool.cli.output import (
    EXIT_INVALID,
    EXIT_OK,
    OutputRefused,
    cell,
    emit_json,
    err,
    out,
    project_cache,
)
from gpupool.cli.registry import command
from gpupool.exercise import drills
from gpupool.lab import hosts, slurm_cluster
from gpupool.spec.model import Description

REPORT = "drills.json"  # in the project's .cache unless --report says where


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("names", nargs="+", choices=[*drills.DRILLS, "all"], metavar="NAME",
                   help=f"drills to run: {', '.join(drills.DRILLS)}, or all")
    p.add_argument("--report", type=Path,
                   help=f"where the figures go (default: .cache/{REPORT} in the project)")
    p.add_argument("--down", action="store_true", help="take the lab down afterwards")


def _previous(path: Path) -> dict[str, Any]:
    """The figures the report already holds (a later run adds its drills to them). Anything
    at path but a drills report gpupool wrote is refused before the lab is touched: drills
    take minutes, and --report /etc/passwd must not be read or replaced."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise OutputRefused(f"{path}: [output-not-a-file] a link or not a regular file; "
                            "nothing was run")
    if not path.exists():
        return {}
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:  # not JSON, or not UTF-8
        previous = None
    if not isinstance(previous, dict) or not set(previous) <= {*drills.DRILLS, "bring_up"}:
        raise OutputRefused(f"{path}: [output-exists] exists and is not a drills report; "
                            "pass another --report; nothing was run")
    return previous


@command("drill", _setup)
def cmd_drill(args: argparse.Namespace, desc: Description) -> int:
    names = list(drills.DRILLS) if "all" in args.names else args.names
    args.report = args.report or project_cache(args, REPORT)
    previous = _previous(args.report)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()

    def report(msg: str) -> None:
        err.print(f"[dim]{time.monotonic() - start:6.1f}s[/] {escape(msg)}", highlight=False)

    with hosts.lab_lock():
        try:
            report("bringing up the lab with its roles and Slurm")
            s, bring_up = slurm_cluster.bring_up(desc, site=True, report=report)
            results = {}
            for name in names:
                report(f"drill {name}")
                results.update(drills.run(desc, s, [name]))
                report(f"drill {name}: {'passed' if results[name]['passed'] else 'FAILED'}")
        finally:
            if args.down:
                hosts.down(desc)
    args.report.write_text(json.dumps({**previous, **results, "bring_up": bring_up},
                                      indent=2, sort_keys=True) + "\n")
    if args.json:
        emit_json(results)
    else:
        table = Table(title="Drills", title_justify="left")
        for c in ("drill", "passed", "time to resume (s)", "steps lost", "parity", "seconds"):
            table.add_column(c)
        for name, r in results.items():
            lost = r.get("steps_lost", r.get("steps_redone_at_most", 0))
            table.add_row(name, cell(r["passed"]), cell(r.get("time_to_resume_s")),
                          cell(lost), cell(r["result_parity"]), cell(r["drill_s"]))
        out.print(table)
        out.print(f"figures: {escape(str(args.report))}")
    return EXIT_OK if all(r["passed"] for r in results.values()) else EXIT_INVALID
