"""What the command line prints: exit codes, the two consoles, JSON and tables.

Kept apart from the registry and the entry point so that a verb module imports its helpers
without importing the parser that imports it (no cycle).
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpupool.spec.errors import Problem, printable

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
# An internal error (a bug), as sysexits.h's EX_SOFTWARE: apart from every code a verb
# gives a meaning to (the gate's 3 is a node that could not be gated).
EXIT_INTERNAL = 70
# `replay --compare`: the replays ran and a declared budget broke (the merge gate's no).
EXIT_BUDGET = 4


class _Console(Console):
    """rich's Console, except that a table is printed uncut: its body is laid out within the
    width anyway, and its title is a header line (table), which never wraps and is never
    cut at the width, the 80 columns rich assumes when nothing is a terminal included."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if any(isinstance(o, Table) for o in objects):
            kwargs.setdefault("crop", False)
        super().print(*objects, **kwargs)


out = _Console()
err = _Console(stderr=True)


# What stopped a verb, as --json's "error"."kind" names it, and its exit code.
FAILURE_KINDS: dict[str, int | None] = {
    "usage": EXIT_USAGE,       # arguments the verb cannot use
    "extra": EXIT_USAGE,       # the verb needs an extra that is not installed
    "invalid": EXIT_INVALID,   # the description or the stack (with "problems")
    "file": EXIT_INVALID,      # a file the verb reads or writes (with "path")
    "output": EXIT_INVALID,    # an output path gpupool will not write
    "encoding": EXIT_INVALID,  # an input that is not UTF-8
    "failed": EXIT_INVALID,    # gpupool's own error: the lab, Slurm, a trace
    "playbook": None,          # ansible-playbook failed: its own exit code (gpupool playbook)
    "internal": EXIT_INTERNAL,  # a bug: --debug shows the traceback
    "interrupted": 130,
}


@dataclass(frozen=True)
class Failure:
    """What stopped a verb: its kind (FAILURE_KINDS), a message for people, the exit code,
    and what --json adds to its "error" object."""

    kind: str
    message: str
    code: int
    details: dict[str, Any] = field(default_factory=dict)

    def as_json(self, command: str | None) -> dict[str, Any]:
        return {"command": command, "exit_code": self.code,
                "error": {"kind": self.kind, "message": self.message, **self.details}}

    def line(self) -> str:
        """One line for people (rich markup)."""
        label = {"usage": "usage", "internal": "internal error", "interrupted": ""}.get(
            self.kind, "failed")
        return f"[bold red]{label}[/]: {escape(self.message)}" if label else self.message


def tell(failed: Failure, command: str | None, as_json: bool) -> int:
    """Say what stopped the verb: on stderr for people, and under --json on stdout too."""
    err.print(failed.line(), highlight=False, soft_wrap=True)
    if as_json:
        emit_json(failed.as_json(command))
    return failed.code


def header(console: Console, markup: str) -> None:
    """A header line (what a verb found, a summary above its details): one line whatever the
    width, never wrapped or padded, piped or not (a log keeps it whole and greppable)."""
    console.print(markup, highlight=False, soft_wrap=True)


def problem_line(p: Problem) -> str:
    """One problem as people read it (rich markup): where, the rule, what is wrong, and the
    offending value where there is one. A hostile key in the path, or a value, is shown with
    its control characters escaped, never raw to the terminal."""
    got = "" if p.value is None else f" (got {escape(repr(p.value))})"
    return (f"  [bold]{escape(printable(p.path))}[/]: [yellow]\\[{escape(p.rule)}][/] "
            f"{escape(printable(p.message, 10_000))}{got}")


def busy(message: str) -> contextlib.AbstractContextManager[Any]:
    """A spinner on stderr while something takes seconds; off a terminal nothing, not even
    rich's live display (the light verbs' start-up stays short)."""
    return err.status(message) if err.is_terminal else contextlib.nullcontext()


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def named(args: Any) -> dict[str, str | None]:
    """How --json names the description a verb read, valid or not: the stack (none with
    --file) and the description file's full path (none if the stack does not name one)."""
    path = getattr(args, "description", None)
    return {"stack": None if args.file else args.stack,
            "description": None if path is None else str(path)}


def yaml_text(data: Any) -> str:
    """Data as YAML in its own key order; on libyaml where PyYAML has it (a 3,000-node
    inventory takes a tenth of the time)."""
    dumper = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper
    return yaml.dump(data, Dumper=dumper, sort_keys=False)


# The first line of every text file gpupool writes (slurm.conf's family already opens with
# "# Rendered by gpupool"). An existing file without it is someone else's: run as root,
# `gpupool inventory -o /etc/passwd` must not replace the system's.
HEADER = "# Written by gpupool"
OURS = (HEADER, "# Rendered by gpupool")
HEADER_PROBE_BYTES = 256


def project_cache(args: Any, name: str = "") -> Path:
    """The pool project's .cache (the working folder's with --file and no project), or a
    verb's default output `name` in it, wherever in the project the command runs from."""
    return (getattr(args, "project_root", None) or Path.cwd()) / ".cache" / name


class UsageError(Exception):
    """The command was given what it cannot use (EXIT_USAGE); the message says what."""


class OutputRefused(Exception):
    """An output path gpupool will not write; the message names it and the way out."""


def write_file(path: Path, text: str, *, force: bool = False) -> None:
    """Write one output file, refusing (OutputRefused, nothing written) what
    check_output refuses."""
    check_output(path, force=force)
    path.write_text(text)


def check_output(path: Path, *, force: bool = False) -> None:
    """Refuse a link or anything but a regular file, and, without force, an existing file
    gpupool did not write. Call it for every file of a set before writing any."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise OutputRefused(f"{path}: [output-not-a-file] a link or not a regular file; "
                            "nothing was written")
    if path.exists() and not force:
        with path.open("rb") as f:
            first = f.read(HEADER_PROBE_BYTES).decode("utf-8", "replace")
        if not first.startswith(OURS):
            raise OutputRefused(
                f"{path}: [output-exists] exists and gpupool did not write it (its first line "
                "is not gpupool's); pass --force to replace it; nothing was written")


def cell(value: Any) -> str:
    """A value as a table shows it: yes/no for booleans, - for nothing, and brackets
    escaped (a check id such as storage.mount_present[scratch] is not markup)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "-" if value is None or value == "" else escape(str(value))


def table(title: str, columns: list[str], rows: list[list[Any]], total: list[Any] | None
          ) -> Table:
    """A first column that never wraps (names stay whole at 80 columns: the others wrap
    instead), figures right-aligned and text left, and an optional bold total row. The title
    is a header line: never wrapped to the table's width, nor padded to it."""
    t = Table(title=Text(title, style="table.title", no_wrap=True, overflow="ignore"),
              title_justify="default")
    for i, c in enumerate(columns):
        text = i == 0 or any(isinstance(row[i], str) and not row[i].replace(".", "").isdigit()
                             for row in rows if len(row) > i)
        t.add_column(c, justify="left" if text else "right", no_wrap=i == 0)
    for row in rows:
        t.add_row(*(cell(v) for v in row))
    if total is not None:
        t.add_section()
        t.add_row(*(f"[bold]{v}[/bold]" for v in total))
    return t
