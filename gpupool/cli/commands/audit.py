"""`gpupool audit`: read job history and write the workload audit."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpupool.cli.output import EXIT_OK, EXIT_USAGE, emit_json, err, out
from gpupool.cli.registry import command
from gpupool.spec.model import Description
from gpupool.workload import audit, audit_report


def _setup(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--sacct", type=Path, help=f"output of: {audit.SACCT_COMMAND}")
    src.add_argument("--alibaba", type=Path, help="an Alibaba openb_pod_list_*.csv trace")
    p.add_argument("--wait-target", type=float, default=600.0,
                   help="p95 queue wait to size the pool for, in seconds (default 600)")
    p.add_argument("--out", type=Path, default=Path(".cache/audit"), help="report directory")


@command("audit", "workload audit from job history: durations, demand, GPUs needed", _setup)
def cmd_audit(args: argparse.Namespace, desc: Description) -> int:
    if not (args.sacct or args.alibaba):
        err.print("pass --sacct FILE or --alibaba FILE")
        return EXIT_USAGE
    with out.status("reading job history"):
        jobs = audit.read_sacct(args.sacct) if args.sacct else audit.read_alibaba(args.alibaba)
    if not jobs:
        err.print("no GPU jobs in the input")
        return EXIT_USAGE
    total_quota = {t: sum(team.quota.values()) for t, team in desc.teams.items()}
    with out.status(f"auditing {len(jobs)} jobs"):
        report = audit.audit(jobs, args.wait_target, total_quota)
        path = audit_report.write(report, jobs, args.out, str(args.sacct or args.alibaba))
    if args.json:
        emit_json(report)
    else:
        out.print(f"{len(jobs)} jobs; GPUs needed for p95 wait <= {args.wait_target:.0f} s: "
                  f"[bold]{report['gpus_needed_for_target']}[/]; report: {path}")
    return EXIT_OK
