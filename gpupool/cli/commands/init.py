"""`gpupool init DIR [--from lab|example]`: a new pool project that validates, plans and
renders at once. The Pulumi program, policy pack, roles and playbooks stay in the installed
gpupool (paths.SHARE); the project holds what is the user's (the description, the stack and
Ansible settings) and names nothing outside itself: its files find gpupool when they run
(the project's virtualenv, `gpupool playbook`), so a clone elsewhere works as it is."""

from __future__ import annotations

import argparse
import re
import shlex
import unicodedata
from pathlib import Path

from rich.markup import escape

from gpupool.cli.output import EXIT_OK, OutputRefused, UsageError, emit_json, err, out
from gpupool.cli.registry import plain_command
from gpupool.paths import PROJECT_FILE, PROJECT_ROOT, SHARE
from gpupool.spec import loader

STARTERS = ("lab", "example")
# The namespace of every stack config key gpupool reads (gpupool:description,
# gpupool:connection, gpupool:burstImageId, ...), whatever the project is called: gpupool's,
# as aws: is the AWS provider's. The checkout's project is named after it.
CONFIG_NAMESPACE = "gpupool"
# Pulumi's project names (tokens.ValidateProjectName in pulumi/pulumi
# sdk/go/common/tokens/project.go): 1 to 100 of these characters.
PROJECT_NAME_MAX = 100
# The project's folders: its virtualenv (Pulumi's runtime), and the two __main__.py that run
# gpupool's Pulumi program and policy pack from it.
VENV, PROGRAM, PACK = "venv", "program", "policy-pack"
# The project's Ansible settings beyond gpupool's own (ansible.cfg).
UNPARSED_IS_FAILED = ("[inventory]\n# An inventory source that does not parse fails the run.\n"
                      "unparsed_is_failed = true\n")
# The Ansible plugins a project carries a copy of, as (folder, file) under paths.SHARE.
PLUGINS = (("inventory_plugins", "gpupool.py"), ("strategy_plugins", "mitogen_linear.py"))


def project_name(folder: str) -> str:
    """The Pulumi project name for a project in a folder called `folder`: lower case
    letters, digits and single hyphens, accents dropped (ü -> u), at most 100 characters;
    "pool" when nothing of the folder's name is left."""
    ascii_name = unicodedata.normalize("NFKD", folder).encode("ascii", "ignore").decode()
    name = re.sub(r"[^a-z0-9]+", "-", ascii_name.lower()).strip("-")
    return name[:PROJECT_NAME_MAX].rstrip("-") or "pool"


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="the new project's folder (created; must be empty)")
    p.add_argument("--from", dest="starter", choices=STARTERS, default="example",
                   help="the description to start from (default: example)")
    p.add_argument("--stack", default="prod",
                   help="the first stack's name (default: prod)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def files(name: str, stack: str, starter: str) -> dict[str, str]:
    """The project's files, relative path -> text."""
    description = loader.description_path(starter, SHARE).read_text()
    pulumi = (SHARE / PROJECT_FILE).read_text()
    pulumi = re.sub(r"(?m)^name: .*$", f"name: {name}", pulumi)
    if name != CONFIG_NAMESPACE:
        # Pulumi lets a project declare a type only for its own config keys (no namespace,
        # or `<name>:`); one namespaced otherwise "is not namespaced by the project and
        # should not define a type" (Project.Validate, pulumi/pulumi
        # sdk/go/common/workspace/project.go), and the project would not load. gpupool's keys
        # stay in its namespace, set by each stack file, undeclared here as aws:region is.
        pulumi = re.sub(r"(?m)^config:\n(?:[ \t].*\n?|\n)*",
                        f"# The stack config's keys are {CONFIG_NAMESPACE}'s "
                        f"({CONFIG_NAMESPACE}:description, ...),\n# set in each "
                        "Pulumi.<stack>.yaml.\n", pulumi)
    # Every path the project names is relative to it, or resolved when it runs, so that a
    # teammate's clone or CI uses it as it is. Pulumi runs the program and the policy pack
    # in the project's own virtualenv, `venv` (the .gitignore keeps it out of git), in which
    # `pip install 'gpupool[cloud]'` puts gpupool's program (`infra`) and pack (`policies`):
    # the project's two __main__.py run them from there. Pulumi runs that Python as it is
    # (uv would look for a uv project beside the program).
    pulumi = re.sub(r"(?m)^    toolchain: .*$", "    toolchain: pip", pulumi)
    pulumi = re.sub(r"(?m)^    virtualenv: .*$", f"    virtualenv: {VENV}", pulumi)
    pulumi = re.sub(r"(?m)^main: .*$", f"main: {PROGRAM}/", pulumi)
    pack = (PROJECT_ROOT / "policies" / "PulumiPolicy.yaml").read_text()
    pack = re.sub(r"(?m)^# .*\n", "", pack)
    pack = re.sub(r"(?m)^    virtualenv: .*$", f"    virtualenv: ../{VENV}", pack)
    ansible = (SHARE / "ansible.cfg").read_text()
    # The roles are gpupool's, wherever it is installed: `gpupool playbook` names them to
    # Ansible when it runs one (ANSIBLE_ROLES_PATH).
    ansible = re.sub(r"(?m)^roles_path = .*$", "# roles_path: gpupool's roles, named by "
                     "`gpupool playbook NAME` when it runs one", ansible)
    # The project's inventory is its description, read by the gpupool plugin at each run.
    ansible = re.sub(r"(?m)^inventory = .*$", "inventory = gpupool.yml", ansible)
    # A description that does not parse fails every Ansible run here (the plugin raises
    # AnsibleParserError), instead of a warning and a play on no hosts.
    ansible = ansible.replace("\n[ssh_connection]", f"\n{UNPARSED_IS_FAILED}\n[ssh_connection]", 1)
    # The plugins, copied in: Ansible finds a plugin by its file, relative to this file.
    plugins = {f"{kind}/{name}": (SHARE / kind / name).read_text() for kind, name in PLUGINS}
    return {
        PROJECT_FILE: pulumi,
        f"Pulumi.{stack}.yaml": "# The stack's pool description; everything is derived from "
                                f"it.\nconfig:\n  gpupool:description: pools/{stack}.yaml\n",
        f"pools/{stack}.yaml": description,
        f"{PROGRAM}/__main__.py": _runs("infra", "gpupool's Pulumi program (Pulumi.yaml's main)"),
        f"{PACK}/__main__.py": _runs("policies", "gpupool's policy pack, for `pulumi preview "
                                                 f"--policy-pack {PACK}`"),
        f"{PACK}/PulumiPolicy.yaml": pack,
        "ansible.cfg": ansible,
        **plugins,
        "gpupool.yml": "# This project's Ansible inventory, read from the stack's description "
                       "at every run\n# by gpupool's inventory plugin (inventory_plugins/"
                       f"gpupool.py).\nplugin: gpupool\nstack: {stack}\n",
        ".gitignore": "# What gpupool and Pulumi make here, and the project's virtualenv.\n"
                      f".cache/\n{VENV}/\n__pycache__/\n",
        "README.md": f"""# {name}: a gpupool pool project

Created by `gpupool init` from the `{starter}` description. Edit `pools/{stack}.yaml`, then:

    gpupool validate --stack {stack}     # every problem at once
    gpupool show --stack {stack}         # capacity, segments, quotas, classes
    gpupool plan --stack {stack}         # what the Pulumi program declares
    gpupool policy --stack {stack}       # the policy pack over it
    gpupool playbook                    # gpupool's playbooks, and where they are
    gpupool playbook site               # ansible-playbook on gpupool's site.yml, here

Nothing here names a path outside this folder: clone it anywhere. Pulumi runs the program
and the policy pack in this folder's virtualenv, `{VENV}` (kept out of git):

    python3 -m venv {VENV} && {VENV}/bin/pip install 'gpupool[cloud,lab]'
    pulumi preview --stack {stack} --policy-pack {PACK}

`{PROGRAM}/` and `{PACK}/` only run gpupool's program and pack from that virtualenv.

Ansible's inventory is `gpupool.yml` (the `inventory` of `ansible.cfg`): the gpupool
inventory plugin reads the stack's description at every run, so it is never stale.
`gpupool inventory --stack {stack} -o inventory.yml` writes the same inventory to a file.
How Ansible reaches the nodes (user, bastion, become, SSH arguments) is the stack config's
`gpupool:connection` section, in `Pulumi.{stack}.yaml`; both carry it. The roles and the
playbooks are gpupool's, in the installed package: `gpupool playbook NAME [ARGS...]` runs
`ansible-playbook` on one with them, here, whichever folder of the project you are in
(ARGS go to ansible-playbook). `inventory_plugins/` and `strategy_plugins/` are copies of
gpupool's Ansible plugins (`gpupool init` wrote them; they import gpupool when they run).

Ansible verifies every node's SSH host key (`host_key_checking = true`): record the keys
before the first run, from your provisioning or, for a burst node, the host key lines
cloud-init prints to its console (`aws ec2 get-console-output`), in `~/.ssh/known_hosts`
or a file the stack's `ssh_args` name with `-o UserKnownHostsFile=FILE`. A stack cannot
turn the check off (`StrictHostKeyChecking=no`, `UserKnownHostsFile=/dev/null`).

Run the `gpupool` verbs here or in any folder below.
""",
    }


def _runs(package: str, what: str) -> str:
    """A __main__.py that runs an installed package's own, at run time."""
    return (f'"""{what}: run from the gpupool installed where this runs."""\n\n'
            f"import runpy\n\nrunpy.run_module({package!r}, run_name=\"__main__\", "
            "alter_sys=True)\n")


@plain_command("init", _setup)
def cmd_init(args: argparse.Namespace) -> int:
    target: Path = args.dir.resolve()
    name = project_name(target.name)
    if not loader.STACK_RE.fullmatch(args.stack) or ".." in args.stack:
        raise UsageError(f"--stack: [stack-name] not a stack name: {args.stack!r}")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise OutputRefused(f"{target}: [project-empty] exists and is not an empty folder; "
                            "nothing was written")
    written = files(name, args.stack, args.starter)
    for rel, text in written.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if name != target.name:
        # Said, not refused: the folder keeps its name; the Pulumi project's is made from it.
        err.print(f"note: the Pulumi project is named {name}, not the folder's "
                  f"{escape(repr(target.name))}: a project name here is a-z, 0-9 and single "
                  f"hyphens, at most {PROJECT_NAME_MAX} characters (Pulumi.yaml's name:)",
                  highlight=False, soft_wrap=True)
    if args.json:
        emit_json({"project": str(target), "name": name, "stack": args.stack,
                   "starter": args.starter, "files": sorted(written)})
        return EXIT_OK
    # The path as a shell reads it: the hint is pasted into one.
    out.print(f"created pool project [bold]{name}[/] in {escape(str(target))} (stack "
              f"{args.stack}, from {args.starter}); next: cd {escape(shlex.quote(str(target)))}"
              f" && gpupool validate --stack {args.stack}", highlight=False, soft_wrap=True)
    return EXIT_OK
