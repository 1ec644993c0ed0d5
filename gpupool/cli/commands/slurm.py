"""`gpupool slurm render`: the Slurm policy files and the role's variables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpupool.cli.output import EXIT_INVALID, EXIT_OK, emit_json, err, yaml_text
from gpupool.cli.registry import command
from gpupool.render import ansible_yaml, slurm
from gpupool.spec.model import Description


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["render"], help="render the policy")
    p.add_argument("--out", help="write slurm.conf, gres.conf, topology.conf, cgroup.conf "
                                 "and accounting.json here (default: print slurm.conf)")
    p.add_argument("--vars", help="write the Ansible variables file (gpupool_slurm) here")


@command("slurm", "the Slurm policy rendered from the description", _setup)
def cmd_slurm(args: argparse.Namespace, desc: Description) -> int:
    try:
        plan = slurm.plan(desc)
    except slurm.SlurmPolicyError as exc:
        err.print(f"[bold red]cannot render Slurm policy[/]: {exc}", highlight=False)
        return EXIT_INVALID
    if args.vars:
        Path(args.vars).write_text(ansible_yaml.dump({"gpupool_slurm": plan}))
        err.print(f"wrote {args.vars}")
    if args.json:
        emit_json(plan)
    elif args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in slurm.render_files(desc).items():
            (out / name).write_text(text)
        (out / "accounting.yaml").write_text(yaml_text(plan["accounting"]))
        err.print(f"wrote {out}/{{slurm,gres,topology,cgroup}}.conf and accounting.yaml")
    elif not args.vars:
        sys.stdout.write(slurm.render_files(desc)["slurm.conf"])
    return EXIT_OK
