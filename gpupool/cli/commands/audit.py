"""`gpupool audit`: read job history and write the workload audit: sizing, demand against
the description's capacity per GPU model, and the rows of history it did not count."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape

from gpupool.cli.numbers import non_negative_float, percentile
from gpupool.cli.output import EXIT_OK, UsageError, emit_json, out, project_cache
from gpupool.cli.registry import command
from gpupool.render import scheduling
from gpupool.spec.facts import gpu_capacity
from gpupool.spec.model import Description
from gpupool.workload import audit


def _setup(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--sacct", type=Path, help=f"output of: {audit.SACCT_COMMAND}")
    src.add_argument("--alibaba", type=Path, help="an Alibaba openb_pod_list_*.csv trace")
    p.add_argument("--wait-target", type=non_negative_float, default=600.0,
                   help="queue wait to size the pool for, in seconds (default 600)")
    p.add_argument("--wait-percentile", type=percentile, default=95.0,
                   help="the percentile of waits the target bounds (default 95)")
    p.add_argument("--class-map", default="", metavar="QOS=CLASS[,...]",
                   help="with --alibaba: map its QoS classes onto the description's task "
                        "classes (default " + ",".join(
                            f"{k}={v}" for k, v in audit.ALIBABA_CLASS.items()) + ")")
    p.add_argument("--out", type=Path,
                   help="report directory (default: .cache/audit in the project)")


def _class_map(text: str, desc: Description) -> dict[str, str]:
    """QOS=CLASS pairs over the default mapping; each class must be the description's."""
    classes = dict(audit.ALIBABA_CLASS)
    for pair in filter(None, (p.strip() for p in text.split(","))):
        qos, sep, cls = pair.partition("=")
        if not sep or not qos or cls not in desc.task_classes:
            raise ValueError(f"{pair!r}: want QOS=CLASS with CLASS one of "
                             f"{', '.join(desc.task_classes)}")
        classes[qos] = cls
    return classes


def _against_description(history: audit.History, desc: Description) -> dict[str, object]:
    """The trace's teams and classes, and which of them the description does not have (a
    history's unknown accounts are dropped, and named here too)."""
    jobs = history.jobs
    dropped_teams = history.dropped_names.get("unknown_team", {})
    teams = sorted({j.team for j in jobs} | set(dropped_teams))
    classes = sorted({j.task_class for j in jobs})
    return {"trace_teams": teams, "trace_classes": classes,
            "teams_not_in_description": [t for t in teams if t not in desc.teams],
            "classes_not_in_description": [c for c in classes if c not in desc.task_classes]}


def _dropped_lines(report: dict[str, Any]) -> list[str]:
    """The rows not counted, one line per reason that has any, unknown names beside."""
    if not report["dropped_total"]:
        return []
    lines = [f"{report['dropped_total']} rows dropped:"]
    for reason, count in report["dropped"].items():
        if count:
            names = report["dropped_names"].get(reason, {})
            named = f" ({', '.join(names)})" if names else ""
            lines.append(f"  {reason}: {count}{named} - {report['drop_reasons'][reason]}")
    lines += [f"  e.g. {where}" for where in report["unparsable_examples"]]
    return lines


@command("audit", _setup)
def cmd_audit(args: argparse.Namespace, desc: Description) -> int:
    # The report extra's plots, imported when the verb runs (registry.VERBS).
    from gpupool.workload import audit_report  # noqa: PLC0415

    args.out = args.out or project_cache(args, "audit")
    if not (args.sacct or args.alibaba):
        raise UsageError("pass --sacct FILE or --alibaba FILE")
    try:
        classes = _class_map(args.class_map, desc)
    except ValueError as exc:
        raise UsageError(f"--class-map: {exc}") from None
    unmapped: set[str] = set()
    capacity = gpu_capacity(desc)
    with out.status("reading job history"):
        history = (audit.read_sacct(args.sacct, teams=desc.teams, models=capacity)
                   if args.sacct
                   else audit.read_alibaba(args.alibaba, classes=classes, unmapped=unmapped))
    jobs = history.jobs
    summary = history.summary()
    if not jobs:
        raise UsageError(" ".join(["no GPU jobs in the input;", *_dropped_lines(summary)]))
    total_quota = {t: share.nominal for t, share in scheduling.team_shares(desc).items()}
    with out.status(f"auditing {len(jobs)} jobs"):
        report = audit.audit(jobs, args.wait_target, total_quota, args.wait_percentile,
                             capacity)
        report |= _against_description(history, desc) | summary
        if args.alibaba:
            report["class_mapping"] = {
                qos: {"class": cls, "why": audit.ALIBABA_CLASS_WHY.get(qos, "given")}
                for qos, cls in classes.items()} | {
                qos: {"class": audit.UNMAPPED_CLASS, "why": audit.UNMAPPED_WHY}
                for qos in sorted(unmapped)}
        path = audit_report.write(report, jobs, args.out, str(args.sacct or args.alibaba))
    if args.json:
        emit_json(report)
    else:
        for qos, m in report.get("class_mapping", {}).items():
            out.print(escape(f"class {qos} -> {m['class']}: {m['why']}"), highlight=False)
        for key in ("teams_not_in_description", "classes_not_in_description"):
            if report[key]:
                out.print(f"[yellow]{key.replace('_', ' ')}[/]: "
                          f"{escape(', '.join(report[key]))}", highlight=False)
        for line in _dropped_lines(report):
            out.print(escape(line), highlight=False)
        for row in report["capacity_by_model"]:
            style = "red" if row["exceeded"] else "green"
            out.print(f"[{style}]{escape(audit.capacity_text(row))}[/]", highlight=False)
        out.print(f"{len(jobs)} jobs; GPUs needed for p{args.wait_percentile:g} wait <= "
                  f"{args.wait_target:g} s: [bold]{report['gpus_needed_for_target']}[/]; "
                  f"report: {escape(str(path))}")
    return EXIT_OK
