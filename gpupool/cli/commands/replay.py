"""`gpupool replay`: a job trace replayed on the lab's Slurm under gpupool's policy and
under the manual-allocation baseline, in one run; with --compare, under the description's
policy and another revision's, checking the declared budgets (the merge gate)."""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from gpupool.cli.numbers import positive_float, positive_int
from gpupool.cli.output import (
    EXIT_BUDGET,
    EXIT_INVALID,
    EXIT_OK,
    UsageError,
    cell,
    emit_json,
    err,
    out,
    project_cache,
)
from gpupool.cli.registry import command
from gpupool.exercise import replay_run
from gpupool.exercise.context import Context
from gpupool.lab import hosts, slurm_cluster
from gpupool.render import slurm
from gpupool.render.scheduling import class_policies
from gpupool.spec import budgets, loader
from gpupool.spec.model import Description
from gpupool.workload import replay, replay_compare, trace


def _setup(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", type=Path, help=f"a trace file ({','.join(trace.HEADER)})")
    src.add_argument("--alibaba", type=Path, help="sample the Alibaba GPU trace (pod list)")
    p.add_argument("--jobs", type=_jobs, default=60,
                   help=f"synthetic or sampled jobs (1 to {MAX_JOBS})")
    p.add_argument("--horizon", type=positive_float, default=120.0,
                   help="seconds over which the jobs arrive (trace time)")
    p.add_argument("--load", type=positive_float, default=None,
                   help="offered load while the jobs arrive; above 1 saturates the pool "
                        "(synthetic default 1.6; a trace sample keeps its own pace unless "
                        "given)")
    p.add_argument("--preemptible-first", action="store_true",
                   help="re-time the jobs so the preemptible classes' arrive in the first "
                        f"{trace.PREEMPTIBLE_FIRST_SHARE * 100:.0f}%% of the horizon (less, "
                        "where that would not fill the pool) and the others after (same jobs, "
                        "same load): the pool fills with work that later work must take "
                        "back")
    p.add_argument("--seed", type=int, default=1,
                   help="random seed of the synthetic trace or the trace sample")
    p.add_argument("--speedup", type=positive_float, default=1.0,
                   help="trace seconds per wall second")
    p.add_argument("--policies", type=_policies, default=None,
                   help="the policies to replay under, comma-separated, of "
                        f"{', '.join(replay_run.POLICIES)} (default: both)")
    p.add_argument("--compare", type=Path, metavar="OTHER",
                   help="the merge gate: the trace under this description's policy, then "
                        "OTHER's (a revision: quotas, classes, fewer nodes); each figure's "
                        "change, and exit 4 when a budget (replay_budgets, --budget) broke")
    p.add_argument("--budget", action="append", default=[], metavar="FIGURE=LIMIT",
                   help="with --compare, a budget over the declared ones, e.g. "
                        "interactive.wait_p95=+10%% (may not grow by more than 10%%), "
                        "makespan_s=+0, gpu_utilization_saturated=-5%%")
    p.add_argument("--strict", action="store_true",
                   help="with --compare, a budget whose figure a run does not give (no "
                        "interactive job, no saturated second: no evidence) fails the gate "
                        "too")
    p.add_argument("--timeout", type=positive_float, default=900.0,
                   help="seconds to wait for each policy's jobs to finish")
    p.add_argument("--out", type=Path,
                   help="the report's folder: replay.md, replay.json and the plots "
                        "(with --compare: compare.md, compare.json) "
                        "(default: .cache/replay in the project)")


# Each job is one sbatch on the lab's controller: more than this is not a replay the lab
# can run inside the policy timeout.
MAX_JOBS = 10_000


def _jobs(text: str) -> int:
    jobs = positive_int(text)
    if jobs > MAX_JOBS:
        raise argparse.ArgumentTypeError(f"at most {MAX_JOBS} jobs: {jobs}")
    return jobs


def _policies(text: str) -> list[str]:
    """Policies by name, each once: an unknown one is a usage error, never run as if it
    were the baseline."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in replay_run.POLICIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or '(none)'}; choose from "
            f"{', '.join(replay_run.POLICIES)}")
    return list(dict.fromkeys(names))


def _capacity(desc: Description) -> tuple[int, int]:
    """The on-prem GPUs a replay saturates, and the most GPUs one node has."""
    nodes = replay_run.slurm.nodes(desc)
    return sum(n.gpus for n in nodes if not n.cloud), max(n.gpus for n in nodes)


def _trace(args: argparse.Namespace, desc: Description) -> tuple[str, list[trace.TraceJob]]:
    name, jobs = _jobs_of(args, desc)
    if not args.preemptible_first:
        return name, jobs
    preemptible = {n for n, c in desc.task_classes.items() if c.preemptible}
    return (f"{name}, preemptible first",
            trace.preemptible_first(jobs, preemptible, args.horizon, _capacity(desc)[0]))


def _jobs_of(args: argparse.Namespace, desc: Description) -> tuple[str, list[trace.TraceJob]]:
    capacity, per_node = _capacity(desc)
    if args.trace:
        return str(args.trace), trace.read(args.trace)
    if args.alibaba:
        paced = "" if args.load is None else f", load {args.load}"
        return f"alibaba sample of {args.jobs}{paced}", trace.sample_alibaba(
            args.alibaba, list(desc.teams), jobs=args.jobs, horizon_s=args.horizon,
            max_gpus=per_node, seed=args.seed, load=args.load, capacity_gpus=capacity)
    load = 1.6 if args.load is None else args.load
    knobs = trace.Knobs(jobs=args.jobs, horizon_s=args.horizon, load=load,
                        capacity_gpus=capacity, teams=dict.fromkeys(desc.teams, 1.0),
                        seed=args.seed)
    return f"synthetic (load {load}, seed {args.seed})", trace.synthetic(knobs)


@command("replay", _setup)
def cmd_replay(args: argparse.Namespace, desc: Description) -> int:
    # The report extra's plots, imported before the lab runs for minutes (registry.VERBS).
    from gpupool.workload import replay_report  # noqa: PLC0415

    args.out = args.out or project_cache(args, "replay")
    if args.compare is None and (args.budget or args.strict):
        raise UsageError("--budget and --strict go with --compare")
    if args.compare is not None:
        if args.policies not in (None, ["gpupool"]):
            raise UsageError("--compare replays gpupool's policy of both descriptions: "
                             "leave out --policies (the baseline is not compared)")
        return _compare(args, desc)
    name, jobs = _trace(args, desc)
    replay_run.check_trace(desc, jobs)
    capacity, _ = _capacity(desc)
    start = time.monotonic()

    def report(msg: str) -> None:
        err.print(f"[dim]{time.monotonic() - start:6.1f}s[/] {escape(msg)}", highlight=False)

    policies = args.policies or list(replay_run.POLICIES)
    runs, metrics, waits, t0 = {}, {}, {}, {}
    with hosts.lab_lock():
        s, _ = slurm_cluster.bring_up(desc, report=report)
        ctx = Context(desc, s)
        run = replay_run.run_key()
        saved = replay_run.gpupool_conf(s)
        for policy in policies:
            can, cannot = replay_run.runnable(desc, policy, jobs)
            report(f"replaying {len(can)} jobs under {policy}"
                   + (f" ({len(cannot)} wider than it can ever run: not submitted)"
                      if cannot else ""))
            rs, demands, waited_on = replay_run.replay_once(
                ctx, policy, can, speedup=args.speedup, timeout_s=args.timeout,
                report=report, run=run, saved=saved)
            runs[policy], metrics[policy] = rs, replay.metrics(
                rs, demands, capacity, speedup=args.speedup, waited_on=waited_on)
            metrics[policy]["not_runnable"] = len(cannot)
            t0[policy] = min((d.eligible for d in demands), default=0.0)
            per_class: dict[str, list[float]] = defaultdict(list)
            for d in demands:
                starts = [r.start for r in rs if r.job == d.job and r.start]
                if starts:
                    per_class[d.task_class].append(min(starts) - d.eligible)
            waits[policy] = dict(per_class)
        if "baseline" in policies:
            replay_run.use_policy(s, "gpupool", saved)  # leave the lab on gpupool's policy
    top = class_policies(desc)[0].name  # the highest priority tier
    classes = replay.class_figures(replay_run.offered(jobs, args.speedup), capacity,
                                   args.horizon / args.speedup)
    result = {"trace": name, "jobs": len(jobs), "speedup": args.speedup,
              "offered_load": round(trace.offered_load(jobs, capacity, args.horizon), 3),
              "classes": classes, "policies": metrics,
              "targets": replay.targets(metrics, top, slurm.sched_interval_s(desc),
                                        replay_run.CHECKPOINT_INTERVAL_S, classes)}
    path = replay_report.write(args.out, result, runs, waits, t0)
    if args.json:
        emit_json(result)
    else:
        table = Table(title=f"Replay of {name}", title_justify="left")
        table.add_column("metric")
        for p in metrics:
            table.add_column(p, justify="right")
        for key in ("gpu_utilization_saturated", "makespan_s", "makespan_trace_s",
                    "completed", "failed_share", "not_runnable", "preemptions_and_requeues",
                    "work_lost_gpu_s", "work_lost_share", "work_lost_per_preemption_s"):
            table.add_row(key, *(cell(m[key]) for m in metrics.values()))
        out.print(table)
        for t in result["targets"]:
            verdict = {True: "met", False: "missed", None: "no evidence"}[t["met"]]
            out.print(escape(f"target: {t['target']}: {verdict} ({t['value']})"
                             + (f"; {t['why']}" if t["why"] else "")), highlight=False)
        out.print(f"report: {escape(str(path))}")
    done = all(m["completed"] == m["jobs"] for m in metrics.values())
    return EXIT_OK if done else EXIT_INVALID


def _budgets(args: argparse.Namespace, desc: Description, other: Description
             ) -> list[budgets.Budget]:
    """The description's declared budgets with --budget over them (classes of either
    description may be named)."""
    classes = set(desc.task_classes) | set(other.task_classes)
    declared = [budgets.parse_budget(f, v, classes, f"replay_budgets.{f[:80]}")
                for f, v in desc.replay_budgets.items()]
    given = [budgets.parse_option(text, classes) for text in args.budget]
    return replay_compare.merge(declared, given)


def _compare(args: argparse.Namespace, desc: Description) -> int:
    """Replay the trace under desc's policy, then OTHER's, and check the budgets."""
    other = loader.load_file(args.compare)  # a DescriptionError is reported as any
    guarded = _budgets(args, desc, other)
    drain = replay_run.compared_nodes(desc, other)
    name, jobs = _trace(args, desc)
    replay_run.check_trace(desc, jobs)
    replay_run.check_trace(other, jobs)
    start = time.monotonic()

    def report(msg: str) -> None:
        err.print(f"[dim]{time.monotonic() - start:6.1f}s[/] {escape(msg)}", highlight=False)

    metrics: dict[str, dict] = {}
    with hosts.lab_lock():
        s, _ = slurm_cluster.bring_up(desc, report=report)
        ctx = Context(desc, s)
        run = replay_run.run_key()
        saved = replay_run.gpupool_conf(s)
        try:
            for label, d in (("before", desc), ("after", other)):
                capacity, _ = _capacity(d)
                can, cannot = replay_run.runnable(d, "gpupool", jobs)
                if label == "after":
                    saved = saved or replay_run.gpupool_conf(s)  # the first run put it back
                    if saved is None:
                        raise slurm_cluster.SlurmLabError("gpupool's slurm.conf not in force")
                    report(f"putting {args.compare} on the lab"
                           + (f" ({', '.join(drain)} drained)" if drain else ""))
                    replay_run.use_other(s, other, saved, drain)
                # What the lab holds as the run starts: evidence of the policy replayed.
                in_force = {"drained": replay_run.drained_by_compare(s),
                            "team_limits": replay_run.team_limits(s)}
                s.reset_usage(list(d.teams))  # both runs start without fairshare history
                report(f"replaying {len(can)} jobs under the policy {label}")
                rs, demands, waited_on = replay_run.replay_once(
                    ctx, "gpupool", can, speedup=args.speedup, timeout_s=args.timeout,
                    report=report, run=run, saved=saved,
                    label=None if label == "before" else label)
                metrics[label] = replay.metrics(rs, demands, capacity, speedup=args.speedup,
                                                waited_on=waited_on)
                metrics[label]["not_runnable"] = len(cannot)
                metrics[label]["in_force"] = in_force
        finally:
            if replay_run.drained_by_compare(s) or not replay_run.gpupool_conf(s):
                report("putting the lab back on its own policy")
                replay_run.restore_policy(s, saved)
    results = [replay_compare.check(b, metrics["before"], metrics["after"]) for b in guarded]
    failing = replay_compare.verdict(results, args.strict)
    result = {"trace": name, "jobs": len(jobs), "speedup": args.speedup,
              "description": str(desc.source or ""), "compared": str(args.compare),
              "drained": drain, "policies": metrics,
              "changes": replay_compare.changes(metrics["before"], metrics["after"]),
              "budgets": results, "strict": args.strict,
              "broken": [r["budget"] for r in failing]}
    _write_compare(args.out, result)
    if args.json:
        emit_json(result)
    else:
        table = Table(title=escape(f"Replay of {name}: before (the description) and after "
                                   f"({args.compare})"), title_justify="left")
        for col in ("figure", "before", "after", "change", "relative"):
            table.add_column(col, justify="left" if col == "figure" else "right")
        for c in result["changes"]:
            rel = None if c["relative"] is None else f"{c['relative'] * 100:+.1f}%"
            table.add_row(escape(c["figure"]), cell(c["before"]), cell(c["after"]),
                          cell(c["change"]), cell(rel))
        out.print(table)
        for r in results:
            word = {True: "BROKEN", False: "kept", None: "no evidence"}[r["broken"]]
            out.print(escape(f"budget {r['budget']} ({r['source']}): {word}: {r['why']}"),
                      highlight=False)
        out.print(f"report: {escape(str(args.out / 'compare.md'))}")
    if failing:
        err.print(escape("budget broken: " + ", ".join(result["broken"])), highlight=False)
        return EXIT_BUDGET
    done = all(m["completed"] == m["jobs"] for m in metrics.values())
    return EXIT_OK if done else EXIT_INVALID


def _write_compare(folder: Path, result: dict) -> None:
    """compare.json (everything) and compare.md (the table and the budgets)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Replay compare: {result['trace']}", "",
             f"Before: {result['description']}; after: {result['compared']}"
             + (f" (drained: {', '.join(result['drained'])})" if result["drained"] else ""),
             "", "| figure | before | after | change | relative |", "|---|---|---|---|---|"]
    lines += [f"| {c['figure']} | {cell(c['before'])} | {cell(c['after'])} | "
              f"{cell(c['change'])} | "
              f"{'' if c['relative'] is None else format(c['relative'] * 100, '+.1f') + '%'} |"
              for c in result["changes"]]
    lines += ["", "## Budgets", ""] + [
        f"- `{r['budget']}` ({r['source']}): "
        f"{ {True: 'BROKEN', False: 'kept', None: 'no evidence'}[r['broken']]}: {r['why']}"
        for r in result["budgets"]] + ["", f"Broken: {', '.join(result['broken']) or 'none'}"]
    (folder / "compare.md").write_text("\n".join(lines) + "\n")
