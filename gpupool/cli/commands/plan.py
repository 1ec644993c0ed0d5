"""`gpupool plan`: what the Pulumi program declares for a stack, without the Pulumi CLI."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
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
        result = plan.as_json(plan.declare(desc, stack, last=True, config=config), desc)
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
    out.print(cost_table(result["cost"], desc.pool.monthly_budget_usd))
    return EXIT_OK


def cost_table(ceiling: dict[str, Any], budget: int | None) -> Table:
    """The monthly cost ceiling per kind, its total against the budget, and what the
    vendored price table does not price (gpupool/data/prices/SOURCE.md)."""
    table = Table(title=f"Monthly cost ceiling, USD (AWS list prices read "
                        f"{ceiling['prices_read']}; {ceiling['prices_source']})",
                  title_justify="left")
    table.add_column("kind")
    table.add_column("USD / month", justify="right")
    partial = {line["kind"] for line in ceiling["not_priced"]}
    for kind, usd in ceiling["per_kind"].items():
        shown = "[yellow]not priced[/]" if usd is None else f"{usd:,.2f}"
        table.add_row(escape(kind), shown + (" [yellow]+ not priced[/]"
                                             if usd is not None and kind in partial else ""))
    table.add_section()
    total = "total of the priced lines" if partial else "total"
    table.add_row(f"[bold]{total}[/]", f"[bold]{ceiling['total']:,.2f}[/]")
    if budget is not None:
        over = ceiling["total"] > budget
        table.add_row("budget (pool.monthly_budget_usd)",
                      f"{'[red]' if over else ''}{budget:,.2f}{' exceeded[/]' if over else ''}")
    for line in ceiling["not_priced"]:
        table.add_row(f"[yellow]not priced[/] {escape(line['kind'])}",
                      escape(f"{line['resource']} ({line['region']}: {line['what']})"))
    return table
