"""`gpupool plan`: what the Pulumi program declares for a stack, without the Pulumi CLI."""

from __future__ import annotations

import argparse

from rich.table import Table

from gpupool.cli.output import EXIT_OK, emit_json, err, out
from gpupool.cli.registry import command
from gpupool.spec.model import Description


@command("plan")
def cmd_plan(args: argparse.Namespace, desc: Description) -> int:
    # The cloud extra, imported when the verb runs (registry.VERBS).
    from gpupool.preview import plan  # noqa: PLC0415
    from policies import offline  # noqa: PLC0415

    stack = args.stack if not args.file else desc.pool.name
    # The stack config the program reads (gpupool:burstImageId), as `pulumi preview` would.
    config = {} if args.file else offline.program_config(
        offline.stack_config(stack, args.project_root))
    with err.status(f"running the Pulumi program for stack {stack} under mocks"):
        result = plan.as_json(plan.declare(desc, stack, last=True, config=config))
    if args.json:
        emit_json(result)
        return EXIT_OK
    out.print(plan.as_tree(result), crop=False)
    table = Table(title="Resources per type", title_justify="left")
    table.add_column("type")
    table.add_column("count", justify="right")
    for type_, n in result["counts"].items():
        table.add_row(type_, str(n))
    table.add_section()
    table.add_row("[bold]total[/]", f"[bold]{result['total']}[/]")
    out.print(table)
    return EXIT_OK
