"""The system and service accounts of converged lab hosts: what validation's rule
`user-reserved` reads from gpupool/data/system-accounts (SOURCE.md there), made from the
hosts' real passwd and group files, never typed.

    python -m gpupool.lab.system_accounts [--stack lab]   # on a converged lab
"""

from __future__ import annotations

import argparse
import sys

from gpupool.lab import hosts
from gpupool.spec import loader
from gpupool.spec.catalog import ROLE_GROUP_PREFIX, SYSTEM_ACCOUNTS_FILE, TEAM_GROUP_PREFIX
from gpupool.spec.model import Description

# Debian's ranges for people (login.defs UID_MIN..UID_MAX); the rest is the system's:
# base-passwd's, packages' service accounts, nobody/nogroup and dynamic users.
PEOPLE = range(1000, 60000)
HEADER = ("# Made by `python -m gpupool.lab.system_accounts` from the converged lab hosts "
          "(SOURCE.md).")


def parse(table: str) -> set[str]:
    """Names of getent passwd/group lines whose id is not a person's."""
    names = set()
    for line in table.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2].isdigit() and int(fields[2]) not in PEOPLE:
            names.add(fields[0])
    return {n for n in names if not n.startswith((TEAM_GROUP_PREFIX, ROLE_GROUP_PREFIX))}


def on_host(desc: Description, node: str) -> set[str]:
    """A running lab host's system users and groups."""
    found: set[str] = set()
    for database in ("passwd", "group"):
        proc = hosts.exec_(desc, node, ["getent", database], timeout=30)
        if proc.returncode != 0:
            raise hosts.LabError(f"{node}: getent {database}: {proc.stderr.strip()[-300:]}")
        found |= parse(proc.stdout)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="lab")
    args = parser.parse_args(argv)
    desc = loader.load_stack(args.stack)
    try:
        names = set().union(*(on_host(desc, node) for node in desc.nodes))
    except hosts.LabError as e:
        print(f"system_accounts: {e} (is the lab up and converged?)", file=sys.stderr)
        return 1
    SYSTEM_ACCOUNTS_FILE.write_text("\n".join([HEADER, *sorted(names)]) + "\n")
    print(f"{len(names)} accounts -> {SYSTEM_ACCOUNTS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
