"""`gpupool gate NODE... --tier T`: the acceptance gate, one JSON report per node."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from gpupool.cli.output import UsageError, cell, emit_json, out, project_cache
from gpupool.cli.registry import command
from gpupool.gate import probes, runner
from gpupool.gate.expect import node_expect, with_locks
from gpupool.gate.plugin import TIERS, runs_at
from gpupool.spec.model import Description, Software

OUT = "gate"  # in the project's .cache unless --out says where
VERDICT_STYLE = {"pass": "green", "fail": "red", "could-not-run": "yellow"}


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("nodes", nargs="*", help="nodes to gate (default: every node)")
    p.add_argument("--tier", choices=TIERS, default="quick",
                   help="how deep: quick (minutes), standard, burn-in (hours on real GPUs)")
    p.add_argument("--inventory", type=Path,
                   help="Ansible inventory to reach the nodes (default: the lab's)")
    p.add_argument("--local", action="store_true",
                   help="gate this machine itself as NODE (how GPU hosts run the GPU tier)")
    p.add_argument("--out", type=Path,
                   help=f"report directory (default: .cache/{OUT} in the project)")
    p.add_argument("--suite", action="append", default=[], dest="suites",
                   choices=runner.SUITE_NAMES,
                   help="run only this suite (repeatable; a misspelt one is refused, not "
                        "an empty gate that passes)")
    p.add_argument("--exclude", action="append", default=[],
                   help="leave out checks whose id starts with this, e.g. gpu.dcgm_diag "
                        "(the report lists what was left out)")
    # One output per run: both flags would print one of them and silently drop the other.
    printed = p.add_mutually_exclusive_group()
    printed.add_argument("--print-expect", action="store_true",
                         help="print what each node is checked against, as JSON (node -> "
                              "expectation), and gate nothing: the health loop's input "
                              "(roles/acceptance_gate)")
    printed.add_argument("--print-probes", action="store_true",
                         help="print, as JSON (node -> peer -> command), the firewall probes "
                              "to run on each node's peers for --tier (none below standard), "
                              "and gate nothing: role admission runs them for a gate on the "
                              "node")
    p.add_argument("--lock", action="append", default=[], metavar="COMPONENT=VERSION",
                   help="expect this version of a locked component instead of the "
                        "description's (repeatable; a rollback gates nodes on the previous "
                        "lock)")


def _locks(pairs: list[str], desc: Description) -> tuple[str, ...] | str:
    """The --lock overrides as checked COMPONENT=VERSION pairs, or the problem."""
    over: dict[str, str] = {}
    for pair in pairs:
        component, sep, version = pair.partition("=")
        if not sep or component not in Software.model_fields or component == "blocklist":
            return f"--lock {pair!r}: expected COMPONENT=VERSION, COMPONENT one of " \
                   + ", ".join(f for f in Software.model_fields if f != "blocklist")
        over[component] = version
    try:
        checked = Software.model_validate({**desc.software.model_dump(), **over})
    except ValidationError as exc:
        return "--lock: " + "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())
    return tuple(f"{c}={getattr(checked, c)}" for c in over)


def _summary(reports: list[dict[str, Any]]) -> Table:
    """One row per node, readable at 80 columns: the counts in one column (pass/fail/skip/
    error), the failed checks wrapping rather than cut."""
    tiers = sorted({r["tier"] for r in reports})
    table = Table(title=f"Acceptance gate, tier {', '.join(tiers)}", title_justify="left",
                  caption="checks: pass/fail/skip/error", caption_justify="left")
    table.add_column("node", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("checks", justify="right", no_wrap=True)
    table.add_column("failed checks", overflow="fold")
    table.add_column("action")
    table.add_column("s", justify="right", no_wrap=True)
    for r in reports:
        counts = r.get("counts", {})
        style = VERDICT_STYLE[r["verdict"]]
        table.add_row(cell(r["node"]), f"[{style}]{r['verdict']}[/]",
                      "/".join(str(counts.get(k, 0)) for k in ("pass", "fail", "skip", "error")),
                      cell(", ".join(r["failed"]) or r.get("error", "")[-80:]),
                      cell(r.get("action")), f"{r['duration_s']:.1f}")
    return table


def _inventory(args: argparse.Namespace, desc: Description) -> Path | None:
    if args.inventory:
        return Path(args.inventory)
    from gpupool.lab import hosts  # noqa: PLC0415 - only the default path needs the lab

    path = hosts.inventory_path(desc)
    return path if path.exists() else None


def _derived(args: argparse.Namespace, desc: Description, nodes: list[str],
             locks: tuple[str, ...]) -> dict[str, Any]:
    """What --print-expect or --print-probes prints, node by node: what a gate on the node
    itself needs from the description (roles acceptance_gate and admission)."""
    if args.print_expect:
        return {n: dataclasses.asdict(with_locks(node_expect(desc, n), locks)) for n in nodes}
    probed = runs_at(probes.TIER, args.tier)
    return {n: probes.commands(node_expect(desc, n)) if probed else {} for n in nodes}


@command("gate", _setup)
def cmd_gate(args: argparse.Namespace, desc: Description) -> int:
    args.out = args.out or project_cache(args, OUT)
    nodes = args.nodes or list(desc.nodes)
    unknown = [n for n in nodes if n not in desc.nodes]
    if unknown:
        raise UsageError(f"unknown node(s): {', '.join(unknown)}")
    locks = _locks(args.lock, desc)
    if isinstance(locks, str):
        raise UsageError(locks)
    if args.print_expect or args.print_probes:
        emit_json(_derived(args, desc, nodes, locks))
        return 0
    # The file the description was read from: the gate on each node reads it again.
    description = desc.source or Path(args.file)
    if args.local:
        if len(nodes) != 1:
            raise UsageError("--local gates exactly one node: this machine")
        targets = [runner.local_target(nodes[0])]
    else:
        inv = _inventory(args, desc)
        if inv is None:
            raise UsageError("no inventory: pass --inventory, or bring the lab up first")
        targets = [runner.ansible_target(n, inv) for n in nodes]
    with out.status(f"gating {len(targets)} node(s), tier {args.tier}") as status:
        done: list[str] = []

        def progress(report: dict[str, Any]) -> None:
            done.append(report["node"])
            status.update(f"gated {len(done)}/{len(targets)}: last {report['node']} "
                          f"{report['verdict']}")

        reports = runner.gate(description.resolve(), targets, args.tier, args.out, on_done=progress,
                              suites=tuple(args.suites), exclude=tuple(args.exclude),
                              locks=locks)
    if args.json:
        emit_json({"reports": reports})
    else:
        out.print(_summary(reports))
        out.print(f"reports: {escape(str(args.out))}/<node>.json")
    return runner.exit_code(reports)
