"""`gpupool show`: a readable summary of the pool: capacity, segments, quotas and classes."""

from __future__ import annotations

import argparse

from gpupool.cli.output import EXIT_OK, emit_json, out, table
from gpupool.cli.registry import command
from gpupool.render import summary
from gpupool.spec.model import Description


@command("show")
def cmd_show(args: argparse.Namespace, desc: Description) -> int:
    s = summary.summarize(desc)
    if args.json:
        emit_json(s)
        return EXIT_OK
    cap_cols = ["on-prem", "on-demand", "spot", "total"]
    out.print(table(
        f"GPU capacity of pool {s['pool']} ({s['environment']})", ["model", *cap_cols],
        [[r["model"], *(r[c] for c in cap_cols)] for r in s["capacity"]],
        ["total", *(s["capacity_totals"][c] for c in cap_cols)]))
    out.print(table(
        "Network segments", ["segment", "cidr", "vlan", "mtu", "nodes", "gpus"],
        [[r["segment"], r["cidr"], r["vlan"], r["mtu"], r["nodes"], r["gpus"]]
         for r in s["segments"]],
        ["total", "", "", "", len(desc.nodes), sum(r["gpus"] for r in s["segments"]
                                                   if r["segment"] == "training")]))
    models = [r["model"] for r in s["capacity"]]
    out.print(table(
        "Team quotas (GPUs; + borrowing limit)", ["team", "cost centre", *models, "members"],
        [[q["team"], q["cost_centre"],
          *(f"{q['quota'][m]} +{q['borrowing_limit'][m]}" for m in models), q["members"]]
         for q in s["quotas"]],
        ["total", "", *(s["quota_totals"][m] for m in models), ""]))
    out.print(table(
        "Task classes", ["class", "priority", "max\nruntime", "pre-\nemptible", "requeue",
                         "grace", "preempts"],
        [[c["class"], c["priority"], c["max_runtime"], c["preemptible"], c["requeue"],
          c["grace_time"], ", ".join(c["preempts"]) or "-"] for c in s["task_classes"]],
        None))
    return EXIT_OK
