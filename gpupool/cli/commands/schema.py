"""`gpupool schema [--reference] [-o FILE [--force]]`: the pool description's JSON Schema
(draft 2020-12), for an editor's YAML language server to check and complete descriptions
with, or with --reference its field reference page (Markdown). Both are generated from the
description model (gpupool.spec.reference); no description is read.

stdout holds the schema, one JSON object, with or without --json. Under --json, the
reference page comes as {"format": "markdown", "reference": TEXT}, and a written file as
{"written": PATH, "format": "json-schema" or "markdown"}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.markup import escape

from gpupool.cli.output import EXIT_OK, HEADER_PROBE_BYTES, emit_json, err, write_file
from gpupool.cli.registry import plain_command
from gpupool.spec import reference


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reference", action="store_true",
                   help="the field reference page (Markdown) instead of the JSON Schema")
    p.add_argument("-o", "--output", type=Path,
                   help="write to this file instead of stdout; an existing file only when "
                        "gpupool wrote it (or with --force)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing output file gpupool did not write")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _ours(path: Path) -> bool:
    """Whether path is a schema or page gpupool wrote: JSON has no comment line to start
    with output.HEADER, so each carries reference.MARK near its top instead (the schema's
    "$comment", the page's line under its title)."""
    if not path.is_file() or path.is_symlink():
        return False
    with path.open("rb") as f:
        head = f.read(HEADER_PROBE_BYTES).decode("utf-8", "replace").splitlines()[:3]
    return any(line.strip().removeprefix('"$comment": "').startswith(reference.MARK)
               for line in head)


@plain_command("schema", _setup)
def cmd_schema(args: argparse.Namespace) -> int:
    text = reference.reference() if args.reference else reference.schema_text()
    kind = "markdown" if args.reference else "json-schema"
    if args.output:
        write_file(args.output, text, force=args.force or _ours(args.output))
        err.print(f"wrote {escape(str(args.output))}", highlight=False)
        if args.json:
            emit_json({"written": str(args.output), "format": kind})
    elif args.json and args.reference:
        emit_json({"format": kind, "reference": text})
    else:
        sys.stdout.write(text)
    return EXIT_OK
