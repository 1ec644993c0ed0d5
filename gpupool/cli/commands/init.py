"""`gpupool init DIR [--from lab|example]`: a new pool project that validates, plans and
renders at once. The Pulumi program, roles and playbooks stay in the gpupool checkout the
project's files point to; the project holds only what is the user's: the description, the
stack settings and the Ansible settings."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gpupool.cli.output import EXIT_INVALID, EXIT_OK, EXIT_USAGE, err, out
from gpupool.cli.registry import plain_command
from gpupool.paths import PROJECT_FILE, PROJECT_ROOT
from gpupool.spec import loader

STARTERS = ("lab", "example")


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="the new project's folder (created; must be empty)")
    p.add_argument("--from", dest="starter", choices=STARTERS, default="example",
                   help="the description to start from (default: example)")
    p.add_argument("--stack", default="prod",
                   help="the first stack's name (default: prod)")


def files(name: str, stack: str, starter: str) -> dict[str, str]:
    """The project's files, relative path -> text."""
    description = loader.description_path(starter, PROJECT_ROOT).read_text()
    pulumi = (PROJECT_ROOT / PROJECT_FILE).read_text()
    pulumi = re.sub(r"(?m)^name: .*$", f"name: {name}", pulumi)
    pulumi = re.sub(r"(?m)^    virtualenv: .*$", f"    virtualenv: {PROJECT_ROOT / '.venv'}",
                    pulumi)
    pulumi = re.sub(r"(?m)^main: .*$", f"main: {PROJECT_ROOT / 'infra'}/", pulumi)
    ansible = (PROJECT_ROOT / "ansible.cfg").read_text()
    ansible = re.sub(r"(?m)^roles_path = .*$", f"roles_path = {PROJECT_ROOT / 'roles'}",
                     ansible)
    ansible = re.sub(r"(?m)^inventory_plugins = .*$",
                     f"inventory_plugins = {PROJECT_ROOT / 'inventory_plugins'}", ansible)
    # The project's inventory is its description, read by the gpupool plugin at each run.
    ansible = re.sub(r"(?m)^inventory = .*$", "inventory = gpupool.yml", ansible)
    return {
        PROJECT_FILE: pulumi,
        f"Pulumi.{stack}.yaml": "# The stack's pool description; everything is derived from "
                                f"it.\nconfig:\n  gpupool:description: pools/{stack}.yaml\n",
        f"pools/{stack}.yaml": description,
        "ansible.cfg": ansible,
        "gpupool.yml": "# This project's Ansible inventory, read from the stack's description "
                       "at every run\n# by gpupool's inventory plugin (inventory_plugins/"
                       f"gpupool.py).\nplugin: gpupool\nstack: {stack}\n",
        "README.md": f"""# {name}: a gpupool pool project

Created by `gpupool init` from the `{starter}` description. Edit `pools/{stack}.yaml`, then:

    gpupool validate --stack {stack}     # every problem at once
    gpupool show --stack {stack}         # capacity, segments, quotas, classes
    gpupool plan --stack {stack}         # what the Pulumi program declares
    gpupool policy --stack {stack}       # the policy pack over it
    ansible-playbook {PROJECT_ROOT / 'playbooks' / 'site.yml'}

Ansible's inventory is `gpupool.yml` (the `inventory` of `ansible.cfg`): the gpupool
inventory plugin reads the stack's description at every run, so it is never stale.
`gpupool inventory --stack {stack} -o inventory.yml` writes the same inventory to a file.
How Ansible reaches the nodes (user, bastion, become, SSH arguments) is the stack config's
`gpupool:connection` section, in `Pulumi.{stack}.yaml`; both carry it.

Run the `gpupool` verbs here or in any folder below, Ansible here (it reads
`./ansible.cfg`). The Pulumi program, the roles and the playbooks are
gpupool's, at {PROJECT_ROOT}.
""",
    }


@plain_command("init", "create a new pool project in DIR", _setup)
def cmd_init(args: argparse.Namespace) -> int:
    target: Path = args.dir.resolve()
    name = re.sub(r"[^a-z0-9-]+", "-", target.name.lower()).strip("-") or "pool"
    if not loader.STACK_RE.fullmatch(args.stack) or ".." in args.stack:
        err.print(f"--stack: [stack-name] not a stack name: {args.stack!r}", highlight=False)
        return EXIT_USAGE
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        err.print(f"[bold red]failed[/]: {target}: [yellow]\\[project-empty][/] exists and is "
                  "not an empty folder; nothing was written", highlight=False)
        return EXIT_INVALID
    for rel, text in files(name, args.stack, args.starter).items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    out.print(f"created pool project [bold]{name}[/] in {target} (stack {args.stack}, from "
              f"{args.starter}); next: cd {target} && gpupool validate --stack {args.stack}")
    return EXIT_OK
