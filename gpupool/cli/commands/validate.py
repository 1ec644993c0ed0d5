"""`gpupool validate`: check the description and report every problem at once."""

from __future__ import annotations

import argparse

from gpupool.cli.output import EXIT_OK, emit_json, out
from gpupool.cli.registry import command
from gpupool.spec.model import Description


@command("validate", "check the description; report every problem at once")
def cmd_validate(args: argparse.Namespace, desc: Description) -> int:
    # Loading already validated it: an invalid description never reaches a verb.
    if args.json:
        emit_json({"valid": True, "pool": desc.pool.name, "problems": []})
    else:
        out.print(f"[green]valid[/green]: pool {desc.pool.name} "
                  f"({len(desc.nodes)} nodes, {len(desc.teams)} teams)")
    return EXIT_OK
