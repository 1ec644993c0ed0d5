"""`gpupool policy`: the policy pack, offline, over what the program declares."""

from __future__ import annotations

import argparse
from collections import defaultdict

from rich.markup import escape
from rich.padding import Padding
from rich.text import Text

from gpupool.cli.output import EXIT_INVALID, EXIT_OK, emit_json, err, out
from gpupool.cli.registry import command
from gpupool.spec.model import Description
from policies.catalog import POLICIES
from policies.core import STACK, Level, Violation


def report(violations: list[Violation]) -> None:
    """Violations grouped by resource, the stack's own first."""
    by_resource: dict[str, list[Violation]] = defaultdict(list)
    for v in violations:
        by_resource[v.resource].append(v)
    for resource in sorted(by_resource, key=lambda r: (r != STACK, r)):
        out.print(f"[bold]{escape(resource)}[/]", highlight=False, soft_wrap=True)
        for v in by_resource[resource]:
            colour = "red" if v.level == Level.MANDATORY else "yellow"
            out.print(f"  [{colour}]{v.level}[/] {v.policy}: {escape(v.message)}",
                      highlight=False,
                      soft_wrap=True)


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("--list", action="store_true",
                   help="list the pack's policies (name, group, level, what each checks) "
                        "instead of running it")


def list_pack(as_json: bool) -> int:
    rows = sorted(POLICIES.values(), key=lambda p: (p.group, p.name))
    if as_json:
        emit_json({"policies": [{"name": p.name, "group": p.group, "level": p.level.value,
                                 "description": p.description} for p in rows]})
        return EXIT_OK
    # Not a table: a sentence per policy does not fit a column at 80 characters. Each
    # group under its name, each policy on its own line, what it checks wrapped below it.
    out.print(f"Policy pack: {len(rows)} policies (M mandatory, A advisory)")
    for group in dict.fromkeys(p.group for p in rows):
        out.print(f"\n[bold]{group}[/]")
        for p in (p for p in rows if p.group == group):
            out.print(f"  {p.level.value[0].upper()} [bold]{p.name}[/]")
            out.print(Padding(Text(p.description), (0, 0, 0, 6)))
    return EXIT_OK


@command("policy", _setup)
def cmd_policy(args: argparse.Namespace, desc: Description) -> int:
    if args.list:
        return list_pack(args.json)
    # The cloud extra, imported when the verb runs (registry.VERBS).
    from gpupool.preview import plan  # noqa: PLC0415
    from policies import offline  # noqa: PLC0415

    stack = args.stack if not args.file else desc.pool.name
    config = {} if args.file else offline.stack_config(stack, args.project_root)
    with err.status(f"running the Pulumi program for stack {stack} and the policy pack"):
        run = plan.declare(desc, stack, last=True, config=offline.program_config(config))
        violations = offline.check(run, desc, config)
    mandatory = [v for v in violations if v.level == Level.MANDATORY]
    if args.json:
        emit_json({"stack": stack, "passed": not mandatory, "policies": len(POLICIES),
                   "mandatory": len(mandatory), "advisory": len(violations) - len(mandatory),
                   "violations": [v.as_dict() for v in violations]})
    else:
        report(violations)
        verdict = "[red]rejected[/]" if mandatory else "[green]passed[/]"
        out.print(f"{verdict}: {len(POLICIES)} policies, {len(mandatory)} mandatory and "
                  f"{len(violations) - len(mandatory)} advisory violation(s)")
    return EXIT_INVALID if mandatory else EXIT_OK
