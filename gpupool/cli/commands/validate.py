"""`gpupool validate`: check the description and report every problem at once; for a lab
description, also every control the lab weakens (warnings: the description is valid), and
for a production one, what its lock leaves out that an operator would otherwise assume
(notices: GPU detection without NVML, nodes on a Debian release the lab has not proven)."""

from __future__ import annotations

import argparse

from rich.markup import escape

from gpupool.cli.output import EXIT_OK, emit_json, header, named, out
from gpupool.cli.registry import command
from gpupool.render.lab_controls import weakened
from gpupool.spec import gpu_detection, os_release
from gpupool.spec.model import Description


@command("validate")
def cmd_validate(args: argparse.Namespace, desc: Description) -> int:
    # Loading already validated it: an invalid description never reaches a verb.
    warnings = weakened(desc)
    notices = [n for n in (gpu_detection.notice(desc), os_release.notice(desc)) if n]
    if args.json:
        # Named as an invalid one is (cli.main.report_invalid): stack, description, source.
        emit_json({"valid": True, **named(args), "source": str(desc.source),
                   "pool": desc.pool.name, "problems": [],
                   "warnings": [{"rule": "lab-weakens", **w.as_dict()} for w in warnings],
                   "notices": notices})
        return EXIT_OK
    # Header lines: whole at any width, piped or not (output.header).
    header(out, f"[green]valid[/green]: pool {desc.pool.name} "
                f"({len(desc.nodes)} nodes, {len(desc.teams)} teams)")
    if warnings:
        header(out, f"[bold yellow]warning[/bold yellow]: pool {desc.pool.name} is a lab "
                    f"description; it weakens {len(warnings)} control(s) production keeps:")
        for w in warnings:
            out.print(f"  [yellow]{w.control}[/yellow]: {w.detail} ({w.where})",
                      highlight=False, markup=True)
    for n in notices:
        out.print(f"[bold]note[/bold]: {escape(n)}", highlight=False)
    return EXIT_OK
