"""What the command line prints: exit codes, the two consoles, JSON and tables.

Kept apart from the registry and the entry point so that a verb module imports its helpers
without importing the parser that imports it (no cycle).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
# An internal error (a bug), as sysexits.h's EX_SOFTWARE: apart from every code a verb
# gives a meaning to (the gate's 3 is a node that could not be gated).
EXIT_INTERNAL = 70

out = Console()
err = Console(stderr=True)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def yaml_text(data: Any) -> str:
    """Data as YAML in its own key order; on libyaml where PyYAML has it (a 3,000-node
    inventory takes a tenth of the time)."""
    dumper = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper
    return yaml.dump(data, Dumper=dumper, sort_keys=False)


def table(title: str, columns: list[str], rows: list[list[Any]], total: list[Any] | None
          ) -> Table:
    """A left-aligned first column, right-aligned figures, and an optional bold total row."""
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*(str(v) for v in row))
    if total is not None:
        t.add_section()
        t.add_row(*(f"[bold]{v}[/bold]" for v in total))
    return t
