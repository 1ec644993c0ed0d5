"""`gpupool slurm render`: the Slurm policy files and the role's variables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.markup import escape

from gpupool.cli.output import (
    EXIT_OK,
    HEADER,
    busy,
    check_output,
    emit_json,
    err,
    write_file,
    yaml_text,
)
from gpupool.cli.registry import command
from gpupool.render import ansible_yaml, slurm
from gpupool.spec.model import Description


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["render"], help="render the policy")
    p.add_argument("--out", help="write slurm.conf, gres.conf, topology.conf, cgroup.conf "
                                 "and accounting.yaml here (default: print slurm.conf); "
                                 "existing files only when gpupool wrote them (or with "
                                 "--force)")
    p.add_argument("--vars", type=Path,
                   help="write the Ansible variables file (gpupool_slurm) here")
    p.add_argument("--force", action="store_true",
                   help="replace existing output files gpupool did not write")


@command("slurm", _setup)
def cmd_slurm(args: argparse.Namespace, desc: Description) -> int:
    # A slurm.SlurmPolicyError (a description Slurm cannot take) is cli.main's to report.
    with busy(f"rendering the Slurm policy of {len(desc.nodes)} nodes"):
        plan = slurm.plan(desc)
    head = f"{HEADER} slurm render from pool {desc.pool.name!r}; regenerate it.\n"
    if args.vars:
        write_file(args.vars, head + ansible_yaml.dump({"gpupool_slurm": plan}),
                   force=args.force)
        err.print(f"wrote {escape(str(args.vars))}")
    if args.json:
        emit_json(plan)
    elif args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        files = {**slurm.render_files(desc),
                 "accounting.yaml": head + yaml_text(plan["accounting"])}
        for name in files:  # every refusal before any file is written
            check_output(out / name, force=args.force)
        for name, text in files.items():
            write_file(out / name, text, force=args.force)
        err.print(escape(f"wrote {out}/{{slurm,gres,topology,cgroup}}.conf and "
                         "accounting.yaml"))
    elif not args.vars:
        sys.stdout.write(slurm.render_files(desc)["slurm.conf"])
    return EXIT_OK
