#!/usr/bin/env python3
"""Converge Slurm's accounting database to a gpupool accounting plan, idempotently (role slurm
installs it on the controller as <slurm_lib_dir>/gpupool_sacct_apply.py).

Usage: gpupool_sacct_apply.py PLAN.json --phase base|limits [--check]
  base:   cluster, QOS per task class, accounts per team, user associations, coordinators
  limits: team GrpTRES (only once slurmctld has registered the TRES they name)
Prints one JSON line {"changed": bool, "actions": [...]}; --check reports without changing.
Runs on the controller with the system python3 (standard library only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


class SacctmgrError(Exception):
    """sacctmgr failed: its command and what it said, for the role's task output."""


def sacctmgr(*args: str) -> list[list[str]]:
    proc = subprocess.run(["sacctmgr", "-n", "-P", *args], capture_output=True, text=True,
                          timeout=60, check=False)
    if proc.returncode != 0:
        said = " ".join((proc.stderr or proc.stdout).split())[-500:]
        raise SacctmgrError(f"sacctmgr {' '.join(args)}: exit {proc.returncode}: {said}")
    return [line.split("|") for line in proc.stdout.splitlines() if line.strip()]


def seconds(value: str) -> int:
    """Slurm times ('1-00:00:00', '01:00:00', '30:00', '') in seconds."""
    if not value:
        return 0
    days, _, rest = value.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def tres(value: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in value.split(",") if "=" in p)


class Applier:
    def __init__(self, plan: dict, check: bool) -> None:
        self.plan, self.check, self.actions = plan, check, []

    def run(self, *args: str) -> None:
        self.actions.append(" ".join(args))
        if not self.check:
            subprocess.run(["sacctmgr", "-i", *args], check=True, capture_output=True,
                           text=True)

    def base(self) -> None:
        cluster = self.plan["cluster"]
        if [cluster] not in sacctmgr("show", "cluster", "format=cluster"):
            self.run("add", "cluster", cluster)
        qos = {r[0]: r for r in sacctmgr("show", "qos", "format=name,priority,maxwall")}
        for q in self.plan["qos"]:
            have = qos.get(q["name"])
            if have is None:
                self.run("add", "qos", q["name"])
            if (have is None or int(have[1] or 0) != q["Priority"]
                    or seconds(have[2]) != seconds(q["MaxWall"])):
                self.run("modify", "qos", "where", f"name={q['name']}", "set",
                         f"Priority={q['Priority']}", f"MaxWall={q['MaxWall']}")
        accounts = {r[0]: r for r in sacctmgr("show", "account",
                                              "format=account,organization,description")}
        assoc = {(r[0], r[1]): r for r in sacctmgr(
            "show", "assoc", f"cluster={cluster}", "format=account,user,fairshare,grptres")}
        for a in self.plan["accounts"]:
            name = a["name"]
            if name not in accounts:
                self.run("add", "account", name, f"cluster={cluster}",
                         f"Organization={a['Organization']}",
                         f"Description={a['Description']}", f"Fairshare={a['Fairshare']}")
                continue
            have = assoc.get((name, ""))
            if (accounts[name][1].lower() != a["Organization"].lower()
                    or accounts[name][2] != a["Description"]):
                self.run("modify", "account", "where", f"name={name}", "set",
                         f"Organization={a['Organization']}", f"Description={a['Description']}")
            if have is None or have[2] != str(a["Fairshare"]):
                self.run("modify", "account", "where", f"name={name}", f"cluster={cluster}",
                         "set", f"Fairshare={a['Fairshare']}")
        users = {r[0]: r for r in sacctmgr("show", "user", "format=user,defaultaccount")}
        wanted = {(u["account"], u["name"]) for u in self.plan["users"]}
        for u in self.plan["users"]:
            if (u["account"], u["name"]) not in assoc:
                self.run("add", "user", u["name"], f"account={u['account']}",
                         f"cluster={cluster}", f"DefaultAccount={u['DefaultAccount']}")
            elif users.get(u["name"], ["", ""])[1] != u["DefaultAccount"]:
                self.run("modify", "user", "where", f"name={u['name']}", "set",
                         f"DefaultAccount={u['DefaultAccount']}")
        managed = {a["name"] for a in self.plan["accounts"]}
        # Membership revoked in the description: drop the association (not the user).
        for (account, user) in sorted(assoc):
            if account in managed and user and user not in self.plan.get("keep_users", [])\
                    and (account, user) not in wanted:
                self.run("delete", "user", "where", f"name={user}", f"account={account}",
                         f"cluster={cluster}")
        coords = {(r[0], c) for r in sacctmgr("show", "account", "withcoord",
                                               "format=account,coordinators")
                  for c in r[1].split(",") if c}
        for c in self.plan["coordinators"]:
            if (c["account"], c["name"]) not in coords:
                self.run("add", "coordinator", f"account={c['account']}", f"names={c['name']}")

    def limits(self) -> None:
        cluster = self.plan["cluster"]
        known = {f"{r[0]}/{r[1]}" if r[1] else r[0]
                 for r in sacctmgr("show", "tres", "format=type,name")}
        missing = [t for t in self.plan["tres"] if t not in known]
        if missing:
            sys.exit(f"TRES not registered yet (start slurmctld first): {missing}")
        assoc = {r[0]: r for r in sacctmgr("show", "assoc", f"cluster={cluster}", "user=",
                                           "format=account,user,grptres") if not r[1]}
        for lim in self.plan["limits"]:
            have = tres(assoc.get(lim["account"], ["", "", ""])[2])
            want = tres(lim["GrpTRES"])
            if have != want:
                # sacctmgr's set leaves the TRES it is not given as they were: a limit the
                # plan no longer holds (a MIG quota removed) is cleared with -1.
                value = ",".join([lim["GrpTRES"],
                                  *(f"{k}=-1" for k in sorted(have) if k not in want)])
                self.run("modify", "account", "where", f"name={lim['account']}",
                         f"cluster={cluster}", "set", f"GrpTRES={value}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("plan")
    p.add_argument("--phase", choices=["base", "limits"], required=True)
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    with open(args.plan) as f:
        plan = json.load(f)
    applier = Applier(plan, args.check)
    try:
        getattr(applier, args.phase)()
    except (SacctmgrError, subprocess.TimeoutExpired) as exc:
        print(f"gpupool_sacct_apply: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"changed": bool(applier.actions), "actions": applier.actions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
