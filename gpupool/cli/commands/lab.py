"""`gpupool lab up|down|status`: the local podman lab pool (see gpupool/lab/hosts.py)."""

from __future__ import annotations

import argparse
import time

from rich.markup import escape
from rich.table import Table

from gpupool.cli.output import EXIT_INVALID, EXIT_OK, emit_json, err, out
from gpupool.cli.registry import command
from gpupool.lab import hosts
from gpupool.spec.model import Description


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down", "status"])


def _table(state: hosts.LabState) -> Table:
    table = Table(title=f"lab pool {state.pool} ({'ready' if state.ready else 'not ready'})",
                  title_justify="left")
    for col in ("host", "container", "podman", "systemd", "addresses"):
        table.add_column(col)
    for h in state.hosts.values():
        table.add_row(h.name, h.container, h.state, h.systemd,
                      ", ".join(f"{s} {a}" for s, a in h.addresses.items()))
    return table


@command("lab", _setup)
def cmd_lab(args: argparse.Namespace, desc: Description) -> int:
    start = time.monotonic()

    def report(msg: str) -> None:
        if not args.json:
            err.print(f"[dim]{time.monotonic() - start:6.1f}s[/] {escape(msg)}",
                      highlight=False)

    try:
        if args.action == "status":
            state = hosts.status(desc)
            if args.json:
                emit_json(state.as_dict())
            else:
                out.print(_table(state))
            return EXIT_OK if state.ready else EXIT_INVALID
        with hosts.lab_lock(), err.status(f"lab {args.action} for pool {desc.pool.name}"):
            if args.action == "up":
                state = hosts.up(desc, report)
                if args.json:
                    emit_json(state.as_dict())
                else:
                    out.print(_table(state))
                return EXIT_OK
            removed = hosts.down(desc, report)
            if args.json:
                emit_json({"pool": desc.pool.name, "removed": removed})
            else:
                out.print(f"lab pool {desc.pool.name} down "
                          f"({len(removed)} resources removed)")
            return EXIT_OK
    except hosts.LabError as exc:
        # Reported by cli.main as every failure is (under --json, its error object).
        raise hosts.LabError(f"lab {args.action} for pool {desc.pool.name}: {exc}") from exc
