"""Slurm ResumeProgram / SuspendProgram for the pool's burst groups.

slurmctld runs `burst.py resume HOSTLIST` when jobs need powered-down cloud nodes and
`burst.py suspend HOSTLIST` when they have idled for SuspendTime. Resume launches one
instance per node from the group's launch template (declared by the Pulumi program),
trying the capacity types and then the instance types in their declared order, so a type
that is out of capacity falls back to the next; it tags each instance with its Slurm node
name and tells slurmctld the node's address. Suspend terminates the node's instances.

This file runs on the controller with the system python3 and boto3 only (no gpupool
import): the slurm role installs it as is. The configuration is the JSON the role writes
from gpupool.render.slurm.burst_config().
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

log = logging.getLogger("gpupool-burst")

NODE_TAG = "gpupool:slurm-node"
# EC2 errors that mean "this type (or market) has no capacity now": try the next one.
CAPACITY_ERRORS = frozenset({
    "InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity",
    "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded", "Unsupported",
    "InsufficientFreeAddressesInSubnet",
})
LIVE_STATES = ["pending", "running"]


@dataclass(frozen=True)
class Launched:
    node: str
    instance_id: str
    instance_type: str
    market: str
    address: str


class NoCapacityError(RuntimeError):
    def __init__(self, node: str, tried: list[tuple[str, str, str]]) -> None:
        super().__init__(f"{node}: no capacity; tried {tried}")
        self.node, self.tried = node, tried


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist expressions: 'gpu-[0-2,5],x' -> gpu-0, gpu-1, gpu-2, gpu-5, x."""
    names: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?([^,]*)", expr):
        prefix, ranges, suffix = m.groups()
        if not ranges:
            names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{prefix}{i:0{width}d}{suffix}")
    return names


def group_of(config: dict[str, Any], node: str) -> tuple[str, dict[str, Any]]:
    for name, group in config["groups"].items():
        if node in group["nodes"]:
            return name, group
    raise KeyError(f"{node} is in no burst group")


def _tags(group: dict[str, Any], node: str) -> list[dict[str, str]]:
    tags = {**group["tags"], NODE_TAG: node, "Name": node}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def live_instances(ec2: Any, nodes: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """Pending or running instances per node name."""
    out: dict[str, list[dict[str, Any]]] = {}
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[
        {"Name": f"tag:{NODE_TAG}", "Values": list(nodes)},
        {"Name": "instance-state-name", "Values": LIVE_STATES}])
    for page in pages:
        for res in page["Reservations"]:
            for inst in res["Instances"]:
                node = next(t["Value"] for t in inst["Tags"] if t["Key"] == NODE_TAG)
                out.setdefault(node, []).append(inst)
    return out


def markets(group: dict[str, Any], node: str) -> list[str]:
    """The markets to try for node, in order. The group's first on_demand_nodes nodes are
    its on-demand base and try on-demand first; the others keep the declared order. A
    market without capacity falls back to the next, as long as the group allows it."""
    declared = group["capacity"]
    if group["nodes"].index(node) < group["on_demand_nodes"]:
        return ["on-demand", *(m for m in declared if m != "on-demand")]
    return list(declared)


def launch(ec2: Any, group: dict[str, Any], node: str) -> Launched:
    """One instance for node: markets in order (see markets), then instance types in
    their declared order."""
    tried = []
    for market in markets(group, node):
        for itype in group["instance_types"]:
            args: dict[str, Any] = {
                "LaunchTemplate": {"LaunchTemplateName": group["launch_template"],
                                   "Version": "$Latest"},
                "InstanceType": itype, "MinCount": 1, "MaxCount": 1,
                "TagSpecifications": [{"ResourceType": "instance",
                                       "Tags": _tags(group, node)}],
            }
            if market == "spot":
                args["InstanceMarketOptions"] = {
                    "MarketType": "spot",
                    "SpotOptions": {"SpotInstanceType": "one-time",
                                    "InstanceInterruptionBehavior": "terminate"}}
            try:
                inst = ec2.run_instances(**args)["Instances"][0]
            except ClientError as exc:
                code = exc.response["Error"]["Code"]
                if code not in CAPACITY_ERRORS:
                    raise
                log.warning("%s: %s %s: %s, trying the next", node, market, itype, code)
                tried.append((market, itype, code))
                continue
            return Launched(node, inst["InstanceId"], itype, market,
                            inst.get("PrivateIpAddress", ""))
    raise NoCapacityError(node, tried)


def scontrol(*args: str) -> None:
    subprocess.run(["scontrol", "update", *args], check=True)


def resume(ec2: Any, config: dict[str, Any], nodes: list[str],
           update: Callable[..., None] = scontrol) -> list[Launched]:
    """Launch what is missing; a node that already has a live instance keeps it."""
    live = live_instances(ec2, nodes)
    launched = []
    for node in nodes:
        if node in live:
            log.info("%s: already has %s", node, live[node][0]["InstanceId"])
            continue
        _, group = group_of(config, node)
        try:
            got = launch(ec2, group, node)
        except NoCapacityError as exc:
            # Slurm requeues the node's jobs elsewhere instead of waiting for ResumeTimeout.
            update(f"nodename={node}", "state=down",
                   f"reason=gpupool-burst: no capacity ({len(exc.tried)} tried)")
            log.error("%s", exc)
            continue
        if got.address:
            update(f"nodename={node}", f"nodeaddr={got.address}", f"nodehostname={node}")
        log.info("%s: %s %s %s %s", node, got.instance_id, got.market, got.instance_type,
                 got.address)
        launched.append(got)
    return launched


def suspend(ec2: Any, nodes: list[str]) -> list[str]:
    ids = [i["InstanceId"] for insts in live_instances(ec2, nodes).values() for i in insts]
    if ids:
        ec2.terminate_instances(InstanceIds=ids)
    log.info("terminated %s for %s", ids, nodes)
    return ids


def client(config: dict[str, Any], nodes: list[str]) -> Any:
    regions = {group_of(config, n)[1]["region"] for n in nodes}
    if len(regions) != 1:
        raise ValueError(f"nodes span regions {sorted(regions)}; call once per region")
    # Few retries: a capacity error answers with HTTP 500, which botocore would retry with
    # backoff, while the next instance type may have capacity now (ResumeTimeout runs).
    return boto3.client("ec2", region_name=regions.pop(),
                        endpoint_url=config.get("endpoint_url") or None,
                        config=Config(retries={"mode": "standard", "max_attempts": 2}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Slurm ResumeProgram/SuspendProgram for burst")
    p.add_argument("action", choices=["resume", "suspend"])
    p.add_argument("hostlist", help="Slurm hostlist expression, as slurmctld passes it")
    p.add_argument("--config", default="/etc/slurm/gpupool-burst.json")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with open(args.config) as f:
        config = json.load(f)
    nodes = expand_hostlist(args.hostlist)
    by_region: dict[str, list[str]] = {}
    for n in nodes:
        by_region.setdefault(group_of(config, n)[1]["region"], []).append(n)
    for region_nodes in by_region.values():
        ec2 = client(config, region_nodes)
        if args.action == "resume":
            resume(ec2, config, region_nodes)
        else:
            suspend(ec2, region_nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
