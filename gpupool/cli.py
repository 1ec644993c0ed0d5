"""The `gpupool` command line.

Exit codes: 0 success; 1 the description (or what was checked) is invalid; 2 usage error.
Every subcommand takes --json for machine-readable output on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from gpupool import inventory, loader, summary
from gpupool.errors import DescriptionError
from gpupool.model import Description

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2

out = Console()
err = Console(stderr=True)

Handler = Callable[[argparse.Namespace, Description], int]
COMMANDS: dict[str, tuple[str, Handler, Callable[[argparse.ArgumentParser], None]]] = {}


def command(name: str, help_: str, setup: Callable[[argparse.ArgumentParser], None] = (
        lambda p: None)) -> Callable[[Handler], Handler]:
    """Register a subcommand that works on a validated description."""

    def wrap(fn: Handler) -> Handler:
        COMMANDS[name] = (help_, fn, setup)
        return fn

    return wrap


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def load(args: argparse.Namespace) -> Description:
    if args.file:
        return loader.load_file(Path(args.file))
    return loader.load_stack(args.stack)


@command("validate", "check the description; report every problem at once")
def cmd_validate(args: argparse.Namespace, desc: Description) -> int:
    if args.json:
        emit_json({"valid": True, "pool": desc.pool.name, "problems": []})
    else:
        out.print(f"[green]valid[/green]: pool {desc.pool.name} "
                  f"({len(desc.nodes)} nodes, {len(desc.teams)} teams)")
    return EXIT_OK


def _table(title: str, columns: list[str], rows: list[list[Any]], total: list[Any] | None
           ) -> Table:
    table = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    if total is not None:
        table.add_section()
        table.add_row(*(f"[bold]{v}[/bold]" for v in total))
    return table


@command("show", "a readable summary: capacity, segments, quotas and classes")
def cmd_show(args: argparse.Namespace, desc: Description) -> int:
    s = summary.summarize(desc)
    if args.json:
        emit_json(s)
        return EXIT_OK
    cap_cols = ["on-prem", "on-demand", "spot", "total"]
    out.print(_table(
        f"GPU capacity of pool {s['pool']} ({s['environment']})", ["model", *cap_cols],
        [[r["model"], *(r[c] for c in cap_cols)] for r in s["capacity"]],
        ["total", *(s["capacity_totals"][c] for c in cap_cols)]))
    out.print(_table(
        "Network segments", ["segment", "cidr", "vlan", "mtu", "nodes", "gpus"],
        [[r["segment"], r["cidr"], r["vlan"], r["mtu"], r["nodes"], r["gpus"]]
         for r in s["segments"]],
        ["total", "", "", "", len(desc.nodes), sum(r["gpus"] for r in s["segments"]
                                                   if r["segment"] == "training")]))
    models = [r["model"] for r in s["capacity"]]
    out.print(_table(
        "Team quotas (GPUs; + borrowing limit)", ["team", "cost centre", *models, "members"],
        [[q["team"], q["cost_centre"],
          *(f"{q['quota'][m]} +{q['borrowing_limit'][m]}" for m in models), q["members"]]
         for q in s["quotas"]],
        ["total", "", *(s["quota_totals"][m] for m in models), ""]))
    out.print(_table(
        "Task classes", ["class", "priority", "max runtime", "preemptible", "requeue",
                         "grace", "preempts"],
        [[c["class"], c["priority"], c["max_runtime"], c["preemptible"], c["requeue"],
          c["grace_time"], ", ".join(c["preempts"]) or "-"] for c in s["task_classes"]],
        None))
    return EXIT_OK


def _inventory_setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", help="write to this file (.yml) instead of stdout")


@command("inventory", "the Ansible inventory derived from the description", _inventory_setup)
def cmd_inventory(args: argparse.Namespace, desc: Description) -> int:
    inv = inventory.build(desc)
    text = (json.dumps(inv, indent=2, sort_keys=True) + "\n" if args.json
            else yaml.safe_dump(inv, sort_keys=False))
    if args.output:
        Path(args.output).write_text(text)
        err.print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _load_command_modules(wanted: str | None) -> None:
    """Subcommands beyond the core ones live in gpupool/commands/, one module each, named
    as the command. Only the wanted one is imported when it is known, so a host with only
    the gate's packages (a GPU node running `gpupool gate --local`) needs no Pulumi,
    Ansible or plotting libraries."""
    import gpupool.commands as pkg  # noqa: PLC0415 - importing registers the commands

    names = [mod.name for mod in pkgutil.iter_modules(pkg.__path__)]
    for name in [wanted] if wanted in names else names:
        importlib.import_module(f"{pkg.__name__}.{name}")


def build_parser(wanted: str | None = None) -> argparse.ArgumentParser:
    _load_command_modules(wanted)
    parser = argparse.ArgumentParser(prog="gpupool", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_, _, setup) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        src = p.add_mutually_exclusive_group()
        src.add_argument("--stack", default="lab", help="stack name (default: lab)")
        src.add_argument("--file", help="a description file instead of a stack")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        setup(p)
    return parser


def report_invalid(exc: DescriptionError, as_json: bool) -> int:
    if as_json:
        emit_json({"valid": False, "source": exc.source,
                   "problems": [p.as_dict() for p in exc.problems]})
    else:
        # One line per problem: readable, and greppable in CI logs.
        err.print(f"[bold red]invalid[/]: {exc.source}: {len(exc.problems)} problem(s); "
                  "nothing was changed", highlight=False)
        for p in exc.problems:
            err.print(f"  [bold]{p.path}[/]: [yellow]\\[{p.rule}][/] {p.message} "
                      f"(got {p.value!r})", highlight=False, soft_wrap=True)
    return EXIT_INVALID


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    wanted = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(wanted).parse_args(argv)
    _, handler, _ = COMMANDS[args.command]
    try:
        desc = load(args)
    except DescriptionError as exc:
        return report_invalid(exc, args.json)
    return handler(args, desc)
