"""`gpupool inventory`: the Ansible inventory derived from the description."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.markup import escape

from gpupool.cli.output import EXIT_OK, HEADER, busy, err, project_cache, write_file
from gpupool.cli.registry import command
from gpupool.render import ansible_yaml, inventory
from gpupool.spec.model import Description


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", type=Path,
                   help="write to this file (.yml) instead of stdout; an existing file only "
                        "when gpupool wrote it (or with --force)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing output file gpupool did not write")


@command("inventory", _setup)
def cmd_inventory(args: argparse.Namespace, desc: Description) -> int:
    # The stack config's connection settings (none with --file); the inventory plugin
    # (inventory_plugins/gpupool.py) builds the same.
    with busy(f"building the inventory of {len(desc.nodes)} nodes"):
        inv = inventory.build(desc, connection=args.connection, cache_dir=project_cache(args))
        text = (json.dumps(inv, indent=2, sort_keys=True) + "\n" if args.json
                else ansible_yaml.dump(inv))
    if args.output:
        # JSON has no comments: a JSON file is gpupool's only with --force.
        head = "" if args.json else (f"{HEADER} inventory from pool {desc.pool.name!r}; "
                                     "regenerate it, do not edit it.\n")
        write_file(args.output, head + text, force=args.force)
        err.print(f"wrote {escape(str(args.output))}")
    else:
        sys.stdout.write(text)
    return EXIT_OK
