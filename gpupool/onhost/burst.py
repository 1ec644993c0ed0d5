"""Slurm ResumeProgram / SuspendProgram for the pool's burst groups.

slurmctld runs `burst.py resume HOSTLIST` when jobs need powered-down cloud nodes and
`burst.py suspend HOSTLIST` when they have idled for SuspendTime.

Resume launches one instance per node with an EC2 Fleet of type `instant` through the
group's launch template (declared by the Pulumi program, infra/burst.py). Each fleet asks
for one instance of one instance type in one market (spot or on-demand), with one
override per subnet of the group (the pool's subnets of the group's segment, in the
group's zones) and the group's cluster placement group when it declares EFA. The program
walks the markets (see markets) and, within each, the instance types in their declared
order: a fleet that reports no capacity falls back to the next pair. One fleet per pair,
rather than one fleet with every type at a priority, because spot allocation strategies
only honour priorities on a best-effort basis, and the declared order is the contract.
The instance is tagged with the pool, group, team (the group's tags) and its Slurm node
name, and slurmctld is told its address (`scontrol update NodeAddr`).

When every pair is out of capacity the node is marked DOWN with a reason, so slurmctld
requeues its jobs onto other nodes at once instead of waiting out ResumeTimeout and asking
for the same node again; a transient systemd timer returns it to service after the
group's blackout (`capacity_blackout_s`), so a blackout is bounded even when no further
resume or suspend runs. It returns it with `state=power_down_force`, not `state=resume`:
the node is DOWN while still powering up (or, past ResumeTimeout, powered down), and in
Slurm 22.05 `resume` leaves a powering-up node waiting for a boot that never comes until
ResumeTimeout marks it DOWN again, while a forced power down takes it through
SuspendProgram (nothing to terminate) back to idle and powered down (measured in the lab,
tests/integration/test_slurm_lab.py). An operator keeping the node out longer stops the
timer (`systemctl stop gpupool-burst-release-NODE.timer`).

Suspend terminates the node's instances: only those tagged with this pool and that node
name, so another pool's nodes of the same name in the same account are never touched.

Spot interruptions steer the next launch. The spot watcher on each spot node
(gpupool/onhost/spot_watch.py) drains its node with a reason that records the instance
type and zone (SPOT_RECORD, a copy of its RECORD). As a program (main), both actions first
read every node's reason (`sinfo --Node`, see spot_records). Resume avoids each (type,
zone) a spot record named within SPOT_AVOID_S: in the spot market such a type moves to
the end of the order and its fleet leaves out the recorded zones while another zone
remains (see launch_order); when everything is avoided the declared order stands, since
a launch that may be interrupted beats none. A rebalance recommendation counts like an
interruption notice: it is EC2 saying that same capacity pool is at elevated risk.
Suspend then lifts the watcher's drain from the nodes it powered down (`scontrol update
state=undrain`), and only a drain whose reason is a spot record: never an operator's or
the acceptance gate's. The reason itself stays on the node (Slurm keeps it until another
is set), so the record goes on steering resumes for its window. Called as functions (the
lab proof does), resume avoids nothing unless told and suspend runs no Slurm command.

This file runs on the controller with the system python3 and boto3 only (no gpupool
import): the slurm role installs it as is. The configuration is the JSON the role writes
from gpupool.render.slurm.burst_config(). Every value from it that ends up in a request,
a tag or a command is checked against what EC2 and Slurm accept before use (check_group).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

log = logging.getLogger("gpupool-burst")

NODE_TAG = "gpupool:slurm-node"
POOL_TAG = "pool"  # gpupool.render.cloud.names.TAG_POOL, on everything the pool owns
# Fleet error codes that mean "this type (or market) has no capacity now": try the next.
CAPACITY_ERRORS = frozenset({
    "InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity",
    "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded", "Unsupported",
    "InsufficientFreeAddressesInSubnet", "UnfulfillableCapacity",
})
LIVE_STATES = ["pending", "running"]
MARKETS = ("spot", "on-demand")
# Each subprocess (scontrol, systemd-run) answers in well under this, or is hung.
COMMAND_TIMEOUT_S = 30
# A launched instance is known to DescribeInstances within seconds (eventual consistency).
DESCRIBE_TRIES, DESCRIBE_PAUSE_S = 5, 2.0
RELEASE_UNIT = "gpupool-burst-release-{node}"
REDRAIN_UNIT = "gpupool-burst-redrain-{node}"
# After SuspendTimeout: by then Slurm has finished powering the node down, and with it
# cleared its drain (idle_on_node_suspend); the drain set after that stays.
REDRAIN_MARGIN_S = 30

# What EC2 and Slurm accept, so nothing from the configuration or the hostlist can carry
# a separator, an option or a shell word into a request, a tag or a command line.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")
TEMPLATE_NAME = re.compile(r"[A-Za-z0-9().\-/_]{3,128}")
PLACEMENT_NAME = re.compile(r"[A-Za-z0-9._-]{1,255}")
INSTANCE_TYPE = re.compile(r"[a-z0-9-]+\.[a-z0-9-]+")
REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")
ZONE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d[a-z]")
SEGMENT = re.compile(r"[a-z][a-z0-9-]{0,62}")
TAG_KEY = re.compile(r"(?!aws:)[A-Za-z0-9 _.:/=+@-]{1,128}")
TAG_VALUE = re.compile(r"[A-Za-z0-9 _.:/=+@-]{0,256}")
MAX_BLACKOUT_S = 86400
# sinfo's long node state: a name, "+"-joined flags, and its one-character suffix.
NODE_STATE = re.compile(r"[a-z][a-z+]{0,62}[~*#!%$@^-]?")

# gpupool/onhost/spot_watch.py's RECORD, copied because this file imports nothing of
# gpupool; tests/test_burst.py keeps the two identical.
SPOT_RECORD = re.compile(
    r"gpupool: spot (?P<kind>interruption notice|rebalance recommendation)"
    r"(?:, (?P<verb>terminating|stopping|hibernating))? at (?P<time>\S+) "
    r"\[instance-type=(?P<instance_type>\S+) zone=(?P<zone>\S+)\]")
# How long a spot record steers launches away from its type and zone: EC2 reclaims a
# capacity pool in waves over hours rather than minutes, and after an hour the declared
# order (the operator's preference) is worth trying again.
SPOT_AVOID_S = 3600
# Every node's reason, with slurmctld's time of it (in SLURM_TIME_FORMAT=standard, the
# controller's local time) and state. `--Node` over all states rather than `-R`: -R lists
# only down, drained and failed nodes, and the pool's slurm.conf (idle_on_node_suspend)
# lifts the drain when a node powers down, so -R would lose the record at the first suspend
# while the reason itself stays on the node.
SINFO_REASONS = ["sinfo", "--noheader", "--Node", "--format=%N|%H|%T|%E"]
REASON_TIME = "%Y-%m-%dT%H:%M:%S"
# The reason a burst node that failed its boot gate drains itself with (gpupool/gate/
# boot.py through the user-data): carried over the power-down as it is where its
# characters are plain, else as GATE_FAILED_PLAIN.
GATE_REASON = re.compile(
    r"gpupool gate (failed|could not run): [A-Za-z0-9 _.,:;()/=+?'\[\]-]{0,180}")
GATE_FAILED_PLAIN = "gpupool gate failed (reason not kept: see the boot's log)"
# More lines than this is not the pool's sinfo (a node appears once per partition).
MAX_SINFO_LINES = 100000


@dataclass(frozen=True)
class Launched:
    node: str
    instance_id: str
    instance_type: str
    market: str
    address: str


@dataclass(frozen=True)
class SpotRecord:
    """A node whose reason is a spot watcher's record, every field checked."""
    node: str
    state: str  # sinfo's %T: "drained", "idle", "down~", ...
    instance_type: str
    zone: str
    at: float  # when slurmctld set the reason, seconds since the epoch


class NoCapacityError(RuntimeError):
    def __init__(self, node: str, tried: list[tuple[str, str, str]]) -> None:
        super().__init__(f"{node}: no capacity; tried {tried}")
        self.node, self.tried = node, tried


class LaunchError(RuntimeError):
    """A fleet refused for a reason other than capacity: a configuration or permission
    fault that the next type would hit too, so it is raised rather than fallen back on."""


class PoolEC2:
    """An EC2 client of one pool: boto3's client (every call passes through) plus the
    pool's name, which scopes what live_instances sees and suspend may terminate."""

    def __init__(self, ec2: Any, pool: str) -> None:
        self.ec2, self.pool = ec2, _checked(TAG_VALUE, pool, "pool")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ec2, name)


def _checked(pattern: re.Pattern[str], value: object, field: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"burst config: {field}={value!r} does not match {pattern.pattern}")
    return value


def check_node(node: str) -> str:
    return _checked(NODE_NAME, node, "node")


def check_group(name: str, group: dict[str, Any]) -> dict[str, Any]:
    """The group, once every field a request, tag or command takes is known to be safe."""
    where = f"groups.{name}"
    _checked(REGION, group["region"], f"{where}.region")
    _checked(TEMPLATE_NAME, group["launch_template"], f"{where}.launch_template")
    for node in group["nodes"]:
        _checked(NODE_NAME, node, f"{where}.nodes")
    for itype in group["instance_types"]:
        _checked(INSTANCE_TYPE, itype, f"{where}.instance_types")
    for market in group["capacity"]:
        if market not in MARKETS:
            raise ValueError(f"burst config: {where}.capacity has {market!r}, not one of "
                             f"{MARKETS}")
    for zone in group["zones"]:
        _checked(ZONE, zone, f"{where}.zones")
    _checked(SEGMENT, group["subnet_segment"], f"{where}.subnet_segment")
    if group["placement_group"] is not None:
        _checked(PLACEMENT_NAME, group["placement_group"], f"{where}.placement_group")
    for key, value in group["tags"].items():
        _checked(TAG_KEY, key, f"{where}.tags")
        _checked(TAG_VALUE, value, f"{where}.tags.{key}")
    blackout = group["capacity_blackout_s"]
    if not isinstance(blackout, int) or not 0 < blackout <= MAX_BLACKOUT_S:
        raise ValueError(f"burst config: {where}.capacity_blackout_s={blackout!r} is not "
                         f"1..{MAX_BLACKOUT_S}")
    return group


# Slurm's own limit is far above any pool; past this an expression is a mistake, not nodes.
MAX_HOSTLIST_NAMES = 65536
_HOSTLIST_ITEM = re.compile(r"([^\[\],]*)(?:\[([0-9,-]+)\])?([^\[\],]*)")
_HOSTLIST_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?")


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist expressions: 'gpu-[0-2,5],x' -> gpu-0, gpu-1, gpu-2, gpu-5, x. One
    bracket per name (gpupool's names end in one number); anything else, a range that runs
    backwards, or more than MAX_HOSTLIST_NAMES names is a ValueError."""
    names: list[str] = []
    for item in re.findall(r"[^,\[]*(?:\[[^\]]*\])?[^,]*", expr):
        if not item:
            continue
        m = _HOSTLIST_ITEM.fullmatch(item)
        if not m or not (m[1] or m[2]):
            raise ValueError(f"hostlist {expr[:80]!r}: cannot read {item[:40]!r}")
        prefix, ranges, suffix = m.groups()
        if not ranges:
            names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            r = _HOSTLIST_RANGE.fullmatch(part)
            if not r or int(r[2] or r[1]) < int(r[1]):
                raise ValueError(f"hostlist {expr[:80]!r}: cannot read the range {part[:20]!r}")
            lo, hi = int(r[1]), int(r[2] or r[1])
            if len(names) + hi - lo + 1 > MAX_HOSTLIST_NAMES:
                raise ValueError(f"hostlist {expr[:80]!r}: more than {MAX_HOSTLIST_NAMES} names")
            width = len(r[1]) if r[1].startswith("0") and len(r[1]) > 1 else 0
            names += [f"{prefix}{i:0{width}d}{suffix}" for i in range(lo, hi + 1)]
    return names


def group_of(config: dict[str, Any], node: str) -> tuple[str, dict[str, Any]]:
    for name, group in config["groups"].items():
        if node in group["nodes"]:
            return name, check_group(name, group)
    raise KeyError(f"{node} is in no burst group")


def _tags(group: dict[str, Any], node: str) -> list[dict[str, str]]:
    tags = {**group["tags"], NODE_TAG: check_node(node), "Name": node}
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def live_instances(ec2: PoolEC2, nodes: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """Pending or running instances of this pool, per node name."""
    out: dict[str, list[dict[str, Any]]] = {}
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[
        {"Name": f"tag:{POOL_TAG}", "Values": [ec2.pool]},
        {"Name": f"tag:{NODE_TAG}", "Values": [check_node(n) for n in nodes]},
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


def subnets(ec2: PoolEC2, group: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """The pool's subnets of the group's segment in the group's zones, in zone order, as
    (zone, fleet override). The Pulumi program tags each subnet with the pool and its segment
    (infra/network.py) and launches a group into its segment's subnets (infra/burst.py)."""
    found = ec2.describe_subnets(Filters=[
        {"Name": f"tag:{POOL_TAG}", "Values": [ec2.pool]},
        {"Name": "tag:segment", "Values": [group["subnet_segment"]]},
        {"Name": "availability-zone", "Values": group["zones"]}])["Subnets"]
    by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in found}
    return [(z, {"SubnetId": by_zone[z]}) for z in group["zones"] if z in by_zone]


def placements(ec2: PoolEC2, config: dict[str, Any],
               group: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Where a fleet may put the node: one override per subnet, each in the group's
    placement group when it has one; with its zone."""
    where = subnets(ec2, group)
    if not where:
        if not config.get("endpoint_url"):
            # Without its subnets the template's interfaces would land in the default VPC
            # (or fail there): the network is not deployed, which is a fault, not a
            # capacity shortage.
            raise LaunchError(f"no subnet tagged {POOL_TAG}={ec2.pool} "
                              f"segment={group['subnet_segment']} in {group['zones']}")
        # A local EC2 stand-in (the lab's moto) has no network from the Pulumi program:
        # launch by zone, the template's networking deciding the rest.
        log.warning("no pool subnet at %s; launching by zone", config["endpoint_url"])
        where = [(z, {"AvailabilityZone": z}) for z in group["zones"]]
    if group["placement_group"]:
        # The lab's moto accepts a placement group and ignores it (the tests read it from
        # the request); EC2 places the instance in the group or reports no capacity.
        where = [(z, {**w, "Placement": {"GroupName": group["placement_group"]}})
                 for z, w in where]
    return where


def _fleet(ec2: PoolEC2, group: dict[str, Any], node: str, market: str, itype: str, *,
           where: list[dict[str, Any]]) -> dict[str, Any]:
    """One instant fleet for one instance of itype in market; its response."""
    overrides = [{"InstanceType": itype, "Priority": float(i), **w}
                 for i, w in enumerate(where)]
    # Spot: the subnet (zone) with the deepest pool of that type, fewest interruptions.
    # On-demand: the subnets in the declared zone order.
    options = ({"SpotOptions": {"AllocationStrategy": "capacity-optimized",
                                "InstanceInterruptionBehavior": "terminate"}}
               if market == "spot" else
               {"OnDemandOptions": {"AllocationStrategy": "prioritized"}})
    return ec2.create_fleet(
        Type="instant",
        LaunchTemplateConfigs=[{
            "LaunchTemplateSpecification": {"LaunchTemplateName": group["launch_template"],
                                            "Version": "$Latest"},
            "Overrides": overrides}],
        TargetCapacitySpecification={"TotalTargetCapacity": 1,
                                     "DefaultTargetCapacityType": market},
        TagSpecifications=[{"ResourceType": "instance", "Tags": _tags(group, node)}],
        **options)


def address(ec2: PoolEC2, instance_id: str) -> str:
    """The private address of an instance just launched. A fleet's answer carries none,
    and EC2's reads are eventually consistent: a new id may be unknown to
    DescribeInstances for a moment, so a few spaced tries."""
    for attempt in range(1, DESCRIBE_TRIES + 1):
        try:
            described = ec2.describe_instances(InstanceIds=[instance_id])
            break
        except ClientError as exc:
            if (exc.response["Error"]["Code"] != "InvalidInstanceID.NotFound"
                    or attempt == DESCRIBE_TRIES):
                raise
            time.sleep(DESCRIBE_PAUSE_S)
    return str(described["Reservations"][0]["Instances"][0].get("PrivateIpAddress", ""))


def launch_order(group: dict[str, Any], node: str, where: list[tuple[str, dict[str, Any]]],
                 avoid: frozenset[tuple[str, str]],
                 ) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(market, instance type, overrides) to try, in order: markets as markets() says,
    types in their declared order, except that in the spot market a type with an avoided
    zone moves behind the others and leaves those zones out while another remains. The
    on-demand market is left alone: an interruption says a spot pool is being reclaimed,
    nothing about on-demand capacity, and an on-demand instance is never interrupted."""
    order = []
    for market in markets(group, node):
        clear, avoided = [], []
        for itype in group["instance_types"]:
            kept = [w for z, w in where if market != "spot" or (itype, z) not in avoid]
            if len(kept) == len(where):
                clear.append((market, itype, kept))
            else:  # never no zone at all: an interruptible launch beats none
                avoided.append((market, itype, kept or [w for _, w in where]))
        order += clear + avoided
    return order


def launch(ec2: PoolEC2, config: dict[str, Any], group: dict[str, Any], node: str,
           avoid: frozenset[tuple[str, str]] = frozenset()) -> Launched:
    """One instance for node along launch_order, each an instant fleet over the group's
    subnets."""
    tried = []
    for market, itype, where in launch_order(group, node, placements(ec2, config, group),
                                             avoid):
        got = _fleet(ec2, group, node, market, itype, where=where)
        if got.get("Instances"):
            inst = got["Instances"][0]
            iid = inst["InstanceIds"][0]
            return Launched(node, iid, inst["InstanceType"], market, address(ec2, iid))
        codes = {e.get("ErrorCode", "") for e in got.get("Errors", [])}
        fatal = codes - CAPACITY_ERRORS
        if fatal:
            raise LaunchError(f"{node}: {market} {itype}: {sorted(fatal)}: "
                              f"{got['Errors']}")
        code = ",".join(sorted(codes)) or "no instance"
        log.warning("%s: %s %s: %s, trying the next", node, market, itype, code)
        tried.append((market, itype, code))
    raise NoCapacityError(node, tried)


def scontrol(*args: str) -> None:
    subprocess.run(["scontrol", "update", *args], check=True, timeout=COMMAND_TIMEOUT_S)


def timer_argv(unit: str, delay_s: int, *update: str) -> list[str]:
    """A transient systemd timer running `scontrol update UPDATE` after delay_s: it outlives
    the resume or suspend program, and nothing else has to run for it to fire."""
    return ["systemd-run", f"--unit={unit}", f"--on-active={int(delay_s)}s",
            "--timer-property=AccuracySec=1s", "--collect", "--quiet", "--",
            "scontrol", "update", *update]


def _start(argv: list[str]) -> None:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                         check=False)
    if out.returncode:
        # Typically a timer of the same name still pending: it does the same.
        log.warning("%s not started: %s", argv[1], out.stderr.strip())


def release_later(node: str, delay_s: int) -> None:
    """Return node to service after delay_s (the capacity blackout's end)."""
    _start(timer_argv(RELEASE_UNIT.format(node=check_node(node)), delay_s,
                      f"nodename={node}", "state=power_down_force"))


def resume(ec2: PoolEC2, config: dict[str, Any], nodes: list[str],
           update: Callable[..., None] = scontrol,
           release: Callable[[str, int], None] = release_later, *,
           avoid: frozenset[tuple[str, str]] = frozenset()) -> list[Launched]:
    """Launch what is missing; a node that already has a live instance keeps it. A node
    with no capacity anywhere is marked down for its group's blackout. avoid: the (instance
    type, zone) pairs recently interrupted (see recently_interrupted, launch_order)."""
    live = live_instances(ec2, nodes)
    launched = []
    for node in nodes:
        if node in live:
            log.info("%s: already has %s", node, live[node][0]["InstanceId"])
            continue
        _, group = group_of(config, node)
        try:
            got = launch(ec2, config, group, node, avoid)
        except NoCapacityError as exc:
            blackout = group["capacity_blackout_s"]
            until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + blackout))
            # Slurm requeues the node's jobs elsewhere instead of waiting for ResumeTimeout.
            update(f"nodename={node}", "state=down",
                   f"reason=gpupool-burst: no capacity ({len(exc.tried)} tried) "
                   f"until {until}")
            release(node, blackout)
            log.error("%s; down until %s", exc, until)
            continue
        if got.address:
            update(f"nodename={node}", f"nodeaddr={got.address}", f"nodehostname={node}")
        log.info("%s: %s %s %s %s", node, got.instance_id, got.market, got.instance_type,
                 got.address)
        launched.append(got)
    return launched


def suspend(ec2: PoolEC2, nodes: list[str]) -> list[str]:
    """Terminate the nodes' instances: this pool's only (see live_instances)."""
    ids = [i["InstanceId"] for insts in live_instances(ec2, nodes).values() for i in insts]
    if ids:
        ec2.terminate_instances(InstanceIds=ids)
    log.info("terminated %s for %s", ids, nodes)
    return ids


def sinfo_reasons() -> str:
    """SINFO_REASONS' output; empty when sinfo fails, since a launch in the declared order
    (or a drain left for the operator) is better than a resume or suspend that fails."""
    try:
        out = subprocess.run(SINFO_REASONS, capture_output=True, text=True, check=False,
                             timeout=COMMAND_TIMEOUT_S,
                             env={**os.environ, "SLURM_TIME_FORMAT": "standard"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("no spot records: %s", exc)
        return ""
    if out.returncode:
        log.warning("no spot records: sinfo: %s", out.stderr.strip())
        return ""
    return out.stdout


def spot_records(text: str) -> list[SpotRecord]:
    """The nodes of SINFO_REASONS' output whose reason is a whole spot record, one per
    node. Anything else (another reason, a value EC2 or Slurm would not give, a quote or
    a separator anywhere) is skipped, so nothing a reason carries reaches a request or a
    command unchecked."""
    found: dict[str, SpotRecord] = {}
    for line in text.splitlines()[:MAX_SINFO_LINES]:
        fields = [f.strip() for f in line.split("|", 3)]
        if len(fields) != 4:
            continue
        node, stamp, state, reason = fields
        m = SPOT_RECORD.fullmatch(reason)
        if not m:
            continue
        itype, zone = m["instance_type"], m["zone"]
        if not (NODE_NAME.fullmatch(node) and INSTANCE_TYPE.fullmatch(itype)
                and ZONE.fullmatch(zone) and NODE_STATE.fullmatch(state)):
            log.warning("ignoring spot record %r", line)
            continue
        try:
            at = datetime.strptime(stamp, REASON_TIME).timestamp()  # local, as sinfo's
        except ValueError:
            log.warning("ignoring spot record %r: time %r", line, stamp)
            continue
        found[node] = SpotRecord(node, state, itype, zone, at)
    return list(found.values())


def recently_interrupted(records: Iterable[SpotRecord], now: float,
                         window_s: int = SPOT_AVOID_S) -> frozenset[tuple[str, str]]:
    """The (instance type, zone) pairs of the records set within window_s of now."""
    return frozenset((r.instance_type, r.zone) for r in records
                     if abs(now - r.at) <= window_s)


def clear_spot_drains(records: Iterable[SpotRecord], nodes: list[str],
                      update: Callable[..., None] = scontrol) -> list[str]:
    """Lift the watcher's drain from nodes just powered down, so an interrupted node can
    be resumed again; only where the drain's reason is a spot record. `undrain` rather
    than `resume`: on a node powering down, Slurm 22.05 makes `resume` cut SuspendTimeout
    short, while undrain clears the drain flag alone and keeps the state and the reason.
    One node's failure does not keep the others drained."""
    cleared = []
    for r in records:
        if r.node not in nodes or "drain" not in r.state:
            continue
        try:
            update(f"nodename={r.node}", "state=undrain")
        except (OSError, subprocess.SubprocessError) as exc:
            log.error("%s: spot drain not lifted: %s", r.node, exc)
            continue
        log.info("%s: spot drain lifted (%s %s)", r.node, r.instance_type, r.zone)
        cleared.append(r.node)
    return cleared


def gate_failures(text: str) -> dict[str, str]:
    """Node -> the reason of each node in SINFO_REASONS' output that its boot gate drained
    (GATE_REASON; a reason in other characters is replaced by GATE_FAILED_PLAIN). By the
    reason, whatever the state: the node powers itself down before it drains, so the drain
    flag may be gone (idle_on_node_suspend) or not yet there; on-call's resume clears it."""
    found: dict[str, str] = {}
    for line in text.splitlines()[:MAX_SINFO_LINES]:
        fields = [f.strip() for f in line.split("|", 3)]
        if len(fields) != 4 or not fields[3].startswith("gpupool gate "):
            continue
        node, _, _, reason = fields
        if NODE_NAME.fullmatch(node):
            found[node] = reason if GATE_REASON.fullmatch(reason) else GATE_FAILED_PLAIN
    return found


def redrain_argv(node: str, reason: str, delay_s: int) -> list[str]:
    """The timer that drains node again with reason after delay_s."""
    return timer_argv(REDRAIN_UNIT.format(node=check_node(node)), delay_s,
                      f"nodename={node}", "state=drain", f"reason={reason}")


def hold_gate_drains(failures: dict[str, str], nodes: list[str], suspend_timeout_s: int,
                     start: Callable[[list[str]], None] = _start) -> list[str]:
    """Keep a node that failed its boot gate drained once it is powered down: Slurm lifts
    the drain as the power-down completes (idle_on_node_suspend, which lets a node that
    failed for a passing reason be resumed), so the drain is set again after
    SuspendTimeout. Without it the next pending job would boot the same broken image."""
    held = []
    for node in nodes:
        if node in failures:
            start(redrain_argv(node, failures[node], suspend_timeout_s + REDRAIN_MARGIN_S))
            log.info("%s: drained again after its power-down: %s", node, failures[node])
            held.append(node)
    return held


def client(config: dict[str, Any], nodes: list[str]) -> PoolEC2:
    regions = {group_of(config, n)[1]["region"] for n in nodes}
    if len(regions) != 1:
        raise ValueError(f"nodes span regions {sorted(regions)}; call once per region")
    # Few retries: a fleet out of capacity answers at once and the launch loop moves on to
    # the next type; botocore's backoff on a throttled or failing call would only spend
    # ResumeTimeout on the same request.
    ec2 = boto3.client("ec2", region_name=regions.pop(),
                       endpoint_url=config.get("endpoint_url") or None,
                       config=Config(retries={"mode": "standard", "max_attempts": 2}))
    return PoolEC2(ec2, config["pool"])


def _read(config_path: str, hostlist: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The configuration, and the hostlist's nodes by their group's region (each a node of
    the configuration)."""
    with open(config_path) as f:
        config = json.load(f)
    by_region: dict[str, list[str]] = {}
    for n in (check_node(n) for n in expand_hostlist(hostlist)):
        by_region.setdefault(group_of(config, n)[1]["region"], []).append(n)
    return config, by_region


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Slurm ResumeProgram/SuspendProgram for burst")
    p.add_argument("action", choices=["resume", "suspend"])
    p.add_argument("hostlist", help="Slurm hostlist expression, as slurmctld passes it")
    p.add_argument("--config", default="/etc/slurm/gpupool-burst.json")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        config, by_region = _read(args.config, args.hostlist)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # slurmctld logs what its ResumeProgram prints: one line, never a traceback.
        log.error("%s %s: %s: %s", args.action, args.hostlist[:200], type(exc).__name__, exc)
        return 2
    # Read before anything is cleared or launched: the records steer resume, and suspend
    # lifts only a drain whose reason it has just read as a spot record.
    reasons = sinfo_reasons()
    records = spot_records(reasons)
    avoid = recently_interrupted(records, time.time())
    if avoid:
        log.info("recent spot interruptions: %s", sorted(avoid))
    for region_nodes in by_region.values():
        ec2 = client(config, region_nodes)
        if args.action == "resume":
            resume(ec2, config, region_nodes, avoid=avoid)
        else:
            suspend(ec2, region_nodes)
            clear_spot_drains(records, region_nodes)
            hold_gate_drains(gate_failures(reasons), region_nodes,
                             int(config["suspend_timeout_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
