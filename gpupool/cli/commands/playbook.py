"""`gpupool playbook [NAME [ARGS...]]`: gpupool's playbooks, run in the pool project.

The playbooks and roles are the installed gpupool's (paths.SHARE); a project names neither
(`gpupool init`), so this verb does, when it runs: ansible-playbook on NAME with the
project's ansible.cfg (from any folder of the project), gpupool's roles on its roles path,
and ARGS as given. Without NAME it lists the playbooks and where they are.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rich.markup import escape

from gpupool.cli.output import EXIT_OK, Failure, UsageError, emit_json, out, tell
from gpupool.cli.registry import plain_command
from gpupool.paths import SHARE, find_project

PLAYBOOKS = SHARE / "playbooks"
ROLES = SHARE / "roles"


def names() -> list[str]:
    return sorted(p.stem for p in PLAYBOOKS.glob("*.yml"))


def _setup(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="the playbook, by name (site, onboard, ...); none: list them")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="passed on to ansible-playbook (after NAME)")
    p.add_argument("--project", help="the pool project folder (default: the nearest folder "
                                     "from here upwards with an ansible.cfg and a Pulumi.yaml)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def ansible_playbook() -> str | None:
    """The ansible-playbook beside this Python (gpupool's virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    return str(beside) if beside.is_file() else shutil.which("ansible-playbook")


@plain_command("playbook", _setup)
def cmd_playbook(args: argparse.Namespace) -> int:
    if "--json" in args.args:  # gpupool's, wherever given: ansible-playbook has no --json
        args.args = [a for a in args.args if a != "--json"]
        args.json = True
    if not args.name:
        listed = {"playbooks": {n: str(PLAYBOOKS / f"{n}.yml") for n in names()},
                  "roles_path": str(ROLES)}
        if args.json:
            emit_json(listed)
        else:
            for name, path in listed["playbooks"].items():
                out.print(f"{name:26s} {escape(path)}", highlight=False, soft_wrap=True)
            out.print(f"roles: {escape(str(ROLES))}", highlight=False, soft_wrap=True)
        return EXIT_OK
    if args.name not in names():
        raise UsageError(f"NAME: [playbook-name] no playbook {args.name!r}; gpupool's are "
                         + ", ".join(names()))
    root = Path(args.project).resolve() if args.project else find_project(Path.cwd())
    if root is None or not (root / "ansible.cfg").is_file():
        raise UsageError(f"--project: [project-exists] no ansible.cfg in "
                         f"{root or 'this folder or one above'}: run it in a pool project "
                         "(`gpupool init DIR`), or pass --project DIR")
    runner = ansible_playbook()
    if runner is None:
        raise ModuleNotFoundError("No module named 'ansible'", name="ansible")
    roles = os.pathsep.join(filter(None, [str(ROLES), os.environ.get("ANSIBLE_ROLES_PATH")]))
    env = os.environ | {"ANSIBLE_CONFIG": str(root / "ansible.cfg"),
                        "ANSIBLE_ROLES_PATH": roles}
    playbook = str(PLAYBOOKS / f"{args.name}.yml")
    argv = [runner, playbook, *args.args]
    if not args.json:
        return subprocess.run(argv, cwd=root, env=env, check=False).returncode
    # --json: Ansible's json callback (ansible.posix, in the lab extra's ansible) reports the
    # run, and gpupool's object carries it; Ansible's messages stay on stderr.
    env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    proc = subprocess.run(argv, cwd=root, env=env, check=False, stdout=subprocess.PIPE,
                          text=True)
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        result = None
    if proc.returncode == 0:
        # result: the json callback's report; null where Ansible printed none (--list-hosts,
        # --syntax-check print text, kept as output).
        emit_json({"playbook": playbook, "project": str(root), "result": result,
                   "output": proc.stdout if result is None else None})
        return EXIT_OK
    return tell(Failure("playbook", f"ansible-playbook {playbook} exited {proc.returncode}",
                        proc.returncode, {"playbook": playbook, "result": result}),
                "playbook", as_json=True)
