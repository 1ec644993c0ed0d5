"""The burst resume/suspend programs against a local EC2 (moto server on 127.0.0.1).

moto runs instant EC2 Fleets from a launch template with per-type, per-subnet overrides,
but it cannot run out of capacity and it ignores a placement group. `capacity_proxy` is a
fixture in front of it (gpupool.lab.localaws.CapacityProxy): it records every CreateFleet
request (so the tests read the placement group, overrides and order the program asked
for), and answers a fleet for an instance type it was told is short the way EC2 does.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from gpupool.lab import localaws
from gpupool.lab.localaws import ICE, CapacityProxy, overrides
from gpupool.onhost import burst, spot_watch
from gpupool.render import slurm
from gpupool.render.cloud import names
from gpupool.spec import loader

REGION = "eu-west-1"
GROUP = "l4-burst"


@pytest.fixture(autouse=True)
def fixture_credentials(monkeypatch):
    """moto accepts any credentials; never let a real profile be picked up."""
    for key, value in localaws.FIXTURE_CREDENTIALS.items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def moto_url():
    with localaws.endpoint() as url:
        yield url


@pytest.fixture
def capacity_proxy(moto_url):
    proxy = CapacityProxy(moto_url)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def launch_templates(moto_url):
    """The launch templates the Pulumi program declares, as moto holds them; created as
    tests/integration/test_slurm_lab.py does (image only, no pool network)."""
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_url,
                       aws_access_key_id="fixture", aws_secret_access_key="fixture")  # noqa: S106 - moto
    image = ec2.describe_images(MaxResults=5)["Images"][0]["ImageId"]
    for group in slurm.burst_config(loader.load_stack("lab"))["groups"].values():
        ec2.create_launch_template(LaunchTemplateName=group["launch_template"],
                                   LaunchTemplateData={"ImageId": image})
    return ec2


def terminate_all(ec2: Any) -> None:
    live = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"]
            for i in r["Instances"] if i["State"]["Name"] in burst.LIVE_STATES]
    if live:
        ec2.terminate_instances(InstanceIds=live)


@pytest.fixture
def config(launch_templates, capacity_proxy):
    """The lab's burst config (from the description), pointed at the local EC2."""
    cfg = slurm.burst_config(loader.load_stack("lab"))
    cfg["endpoint_url"] = capacity_proxy.url
    yield cfg
    terminate_all(launch_templates)


@pytest.fixture
def pool_subnets(launch_templates):
    """The network the Pulumi program declares for the lab's burst region: the pool's
    training subnets per zone (tagged as infra/network.py tags them), plus a storage
    subnet and another pool's training subnet that must never be chosen."""
    ec2 = launch_templates
    vpc = ec2.create_vpc(CidrBlock="10.232.0.0/16")["Vpc"]["VpcId"]
    made = {}
    for cidr, zone, pool, segment in [("10.232.8.0/22", "eu-west-1a", "other", "training"),
                                      ("10.232.0.0/22", "eu-west-1a", "lab", "training"),
                                      ("10.232.4.0/22", "eu-west-1b", "lab", "training"),
                                      ("10.232.16.0/22", "eu-west-1a", "lab", "storage")]:
        sid = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone,
                                TagSpecifications=[{"ResourceType": "subnet", "Tags": [
                                    {"Key": "pool", "Value": pool},
                                    {"Key": "segment", "Value": segment}]}])["Subnet"]["SubnetId"]
        made[(pool, segment, zone)] = (sid, cidr)
    yield made
    terminate_all(ec2)
    for sid, _ in made.values():
        ec2.delete_subnet(SubnetId=sid)
    ec2.delete_vpc(VpcId=vpc)


def ec2_of(cfg):
    return burst.client(cfg, cfg["groups"][GROUP]["nodes"])


def quiet(*_args: object) -> None:
    """An update/release callback that ignores what it is told."""


def test_expand_hostlist():
    assert burst.expand_hostlist("l4-burst-[0-1]") == ["l4-burst-0", "l4-burst-1"]
    assert burst.expand_hostlist("a[1,3-4],b") == ["a1", "a3", "a4", "b"]
    assert burst.expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    names = ["lab-gpu1", "lab-gpu2", "l4-burst-0", "l4-burst-1", "x"]
    assert burst.expand_hostlist(slurm.hostlist(names)) == names


@pytest.mark.parametrize("expr", ["a[1-999999999]", "a[5-2]", "a[x]", "a[1-2]b[3]", "a[",
                                  "a]b", "a[1-2],[]", "a[-1]", "a[1-2-3]", "a[" + "9" * 12 + "]"])
def test_a_hostlist_slurm_never_writes_is_refused(expr: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        burst.expand_hostlist(expr)


@pytest.mark.parametrize("hostlist", ["l4-burst-[0-99999999]", "l4-burst-[1-0]", "$(id)",
                                      "not-a-burst-node"])
def test_the_resume_program_refuses_bad_input_in_one_line(
        tmp_path: Path, hostlist: str, caplog: pytest.LogCaptureFixture) -> None:
    """slurmctld logs what its ResumeProgram prints: a hostlist or a configuration it cannot
    read is one error line and exit 2, before any request."""
    config = tmp_path / "burst.json"
    config.write_text(json.dumps(slurm.burst_config(loader.load_stack("lab"))))
    assert burst.main(["resume", hostlist, "--config", str(config)]) == 2
    assert burst.main(["suspend", "l4-burst-0", "--config", str(tmp_path / "none")]) == 2
    assert all("Traceback" not in r.getMessage() and "\n" not in r.getMessage()
               for r in caplog.records)
    assert [r.levelname for r in caplog.records] == ["ERROR", "ERROR"]


def test_config_comes_from_the_description():
    desc = loader.load_stack("lab")
    config = slurm.burst_config(desc)
    group = config["groups"][GROUP]
    assert config["pool"] == desc.pool.name == group["tags"]["pool"]
    assert group["instance_types"] == desc.burst_groups[GROUP].instance_types
    assert group["region"] == desc.burst_groups[GROUP].region
    assert group["nodes"] == ["l4-burst-0", "l4-burst-1"]
    assert group["zones"] == desc.burst_groups[GROUP].availability_zones
    assert group["subnet_segment"] == "training"
    assert group["placement_group"] is None  # no EFA declared
    assert group["capacity_blackout_s"] == slurm.BURST_CAPACITY_BLACKOUT_S
    burst.check_group(GROUP, group)
    # EFA: the placement group the Pulumi program names after the group, in one zone.
    example = loader.load_stack("example")
    for name, g in slurm.burst_config(example)["groups"].items():
        declared = example.burst_groups[name]
        assert g["placement_group"] == (names.burst_name(example, name) if declared.efa
                                        else None)
        assert g["zones"] == (declared.availability_zones[:1] if declared.efa
                              else declared.availability_zones)
        burst.check_group(name, g)


def test_as_the_lab_proof_calls_it(launch_templates, moto_url):
    """tests/integration/test_slurm_lab.py's calls, unchanged, on a moto with the
    templates and no pool network."""
    config = slurm.burst_config(loader.load_stack("lab"))
    config["endpoint_url"] = moto_url
    cloud_nodes = [n for g in config["groups"].values() for n in g["nodes"]]
    ec2 = burst.client(config, cloud_nodes)
    node = burst.expand_hostlist("l4-burst-[0-1]")[1]
    _, group = burst.group_of(config, node)
    calls = []
    launched = burst.resume(ec2, config, [node], update=lambda *a: calls.append(a))
    assert [g.instance_type for g in launched] == group["instance_types"][:1]
    assert calls[0][0] == f"nodename={node}" and calls[0][1].startswith("nodeaddr=")
    assert burst.suspend(ec2, [node])
    assert burst.live_instances(ec2, [node]) == {}


def test_resume_launches_a_fleet_from_the_template_and_registers(config, capacity_proxy):
    calls = []
    ec2 = ec2_of(config)
    got = burst.resume(ec2, config, ["l4-burst-0", "l4-burst-1"],
                       update=lambda *a: calls.append(a))
    assert [g.node for g in got] == ["l4-burst-0", "l4-burst-1"]
    group = config["groups"][GROUP]
    # First choice: the first declared market and instance type.
    assert {(g.market, g.instance_type) for g in got} == {
        (group["capacity"][0], group["instance_types"][0])}
    live = burst.live_instances(ec2, group["nodes"])
    for g in got:
        inst = live[g.node][0]
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags[burst.NODE_TAG] == g.node
        assert tags["pool"] == "lab"
        assert tags["burst-group"] == GROUP
        assert tags["team"] == "shared"
        assert tags["cost-centre"] == "cc-lab"
        assert inst["InstanceType"] == g.instance_type
        assert (f"nodename={g.node}", f"nodeaddr={inst['PrivateIpAddress']}",
                f"nodehostname={g.node}") in calls
    # What was asked: one instant fleet of one instance per node, through the template;
    # no pool subnet in this moto, so one override per declared zone, in order.
    fleet = capacity_proxy.fleets[0]
    assert fleet["Type"] == "instant"
    assert fleet["LaunchTemplateConfigs.1.LaunchTemplateSpecification.LaunchTemplateName"] == (
        group["launch_template"])
    assert fleet["TargetCapacitySpecification.TotalTargetCapacity"] == "1"
    assert [(o["InstanceType"], o["AvailabilityZone"]) for o in overrides(fleet)] == [
        (group["instance_types"][0], z) for z in group["zones"]]
    assert not any("Placement" in k for k in fleet)


def test_launches_into_the_pool_subnets(config, capacity_proxy, pool_subnets):
    got = burst.resume(ec2_of(config), config, ["l4-burst-0"], update=quiet)
    want = [pool_subnets[("lab", "training", z)][0]
            for z in config["groups"][GROUP]["zones"]]
    assert [o["SubnetId"] for o in overrides(capacity_proxy.fleets[0])] == want
    inst = burst.live_instances(ec2_of(config), ["l4-burst-0"])["l4-burst-0"][0]
    assert inst["SubnetId"] in want
    cidr = next(c for s, c in pool_subnets.values() if s == inst["SubnetId"])
    assert ipaddress.ip_address(got[0].address) in ipaddress.ip_network(cidr)


def test_no_pool_subnet_on_aws_is_an_error(config):
    """On AWS (no endpoint override) a missing network never launches by zone alone."""
    ec2 = ec2_of(config)
    with pytest.raises(burst.LaunchError, match="no subnet tagged pool=lab segment=training"):
        burst.placements(ec2, {**config, "endpoint_url": ""}, config["groups"][GROUP])


def test_efa_groups_launch_into_their_placement_group(config, capacity_proxy):
    # moto ignores a placement group (notes/burst-lab.md): read the request instead.
    group = config["groups"][GROUP]
    group["placement_group"] = "lab-l4-burst"
    burst.resume(ec2_of(config), config, ["l4-burst-0"], update=quiet)
    assert [o["Placement.GroupName"] for o in overrides(capacity_proxy.fleets[0])] == [
        "lab-l4-burst"] * len(group["zones"])


def test_the_on_demand_base_starts_on_demand(config):
    # The example pool's H100 group: one node of base, spot above it (as its ASG says).
    example = slurm.burst_config(loader.load_stack("example"))["groups"]
    h100 = next(g for g in example.values() if g["on_demand_nodes"])
    first, *rest = h100["nodes"]
    assert burst.markets(h100, first) == ["on-demand", "spot"]
    assert {tuple(burst.markets(h100, n)) for n in rest} == {("spot", "on-demand")}
    # On the local EC2: a base of one in the lab group launches its first node on-demand.
    config["groups"][GROUP]["on_demand_nodes"] = 1
    ec2 = ec2_of(config)
    got = burst.resume(ec2, config, ["l4-burst-0", "l4-burst-1"], update=quiet)
    assert [(g.node, g.market) for g in got] == [("l4-burst-0", "on-demand"),
                                                 ("l4-burst-1", "spot")]
    live = burst.live_instances(ec2, ["l4-burst-0", "l4-burst-1"])
    assert [live[n][0].get("InstanceLifecycle") for n in ("l4-burst-0", "l4-burst-1")] == [
        None, "spot"]


def test_resume_is_idempotent(config):
    ec2 = ec2_of(config)
    first = burst.resume(ec2, config, ["l4-burst-0"], update=quiet)
    again = burst.resume(ec2, config, ["l4-burst-0"], update=quiet)
    assert len(first) == 1
    assert again == []
    assert len(burst.live_instances(ec2, ["l4-burst-0"])["l4-burst-0"]) == 1


def test_falls_back_along_instance_types(config, capacity_proxy):
    group = config["groups"][GROUP]
    first, second = group["instance_types"]
    capacity_proxy.short = {first: ICE}
    got = burst.resume(ec2_of(config), config, ["l4-burst-1"], update=quiet)
    assert [(g.node, g.instance_type, g.market) for g in got] == [
        ("l4-burst-1", second, group["capacity"][0])]
    assert capacity_proxy.refused == [(group["capacity"][0], first)]
    inst = burst.live_instances(ec2_of(config), ["l4-burst-1"])["l4-burst-1"][0]
    assert inst["InstanceType"] == second


def test_no_capacity_anywhere_marks_the_node_down_for_a_blackout(config, capacity_proxy):
    group = config["groups"][GROUP]
    capacity_proxy.short = dict.fromkeys(group["instance_types"], ICE)
    calls, released = [], []
    got = burst.resume(ec2_of(config), config, ["l4-burst-0"],
                       update=lambda *a: calls.append(a),
                       release=lambda *a: released.append(a))
    assert got == []
    # Every market x type, in the declared order, was tried before giving up.
    assert capacity_proxy.refused == [(m, t) for m in group["capacity"]
                                      for t in group["instance_types"]]
    assert len(calls) == 1 and calls[0][:2] == ("nodename=l4-burst-0", "state=down")
    assert calls[0][2].startswith("reason=gpupool-burst: no capacity (4 tried) until ")
    assert released == [("l4-burst-0", group["capacity_blackout_s"])]
    assert burst.live_instances(ec2_of(config), ["l4-burst-0"]) == {}


def test_the_blackout_ends_by_a_transient_timer(monkeypatch):
    ran = []
    monkeypatch.setattr(burst.subprocess, "run", lambda argv, **kw: ran.append((argv, kw))
                        or subprocess.CompletedProcess(argv, 0, "", ""))
    burst.release_later("l4-burst-0", 600)
    burst.scontrol("nodename=l4-burst-0", "state=down", "reason=a b")
    (timer, timer_kw), (update, update_kw) = ran
    assert timer == ["systemd-run", "--unit=gpupool-burst-release-l4-burst-0",
                     "--on-active=600s", "--timer-property=AccuracySec=1s", "--collect",
                     "--quiet", "--", "scontrol", "update", "nodename=l4-burst-0",
                     "state=power_down_force"]
    assert update == ["scontrol", "update", "nodename=l4-burst-0", "state=down", "reason=a b"]
    assert timer_kw["timeout"] == update_kw["timeout"] == burst.COMMAND_TIMEOUT_S
    with pytest.raises(ValueError, match="node"):
        burst.release_later("x;reboot", 600)


def test_other_errors_are_not_swallowed(config, capacity_proxy):
    config["groups"][GROUP]["launch_template"] = "no-such-template"
    with pytest.raises(ClientError):
        burst.resume(ec2_of(config), config, ["l4-burst-0"], update=quiet)
    # A fleet that reports a fault other than capacity stops the fallback at once.
    config["groups"][GROUP]["launch_template"] = "lab-l4-burst"
    first = config["groups"][GROUP]["instance_types"][0]
    capacity_proxy.short = {first: "InvalidParameterValue"}
    with pytest.raises(burst.LaunchError, match="InvalidParameterValue"):
        burst.resume(ec2_of(config), config, ["l4-burst-0"], update=quiet)
    assert len(capacity_proxy.refused) == 1


@pytest.mark.parametrize(("field", "value"), [
    ("launch_template", "lab l4; rm -rf /"),
    ("instance_types", ["g6.12xlarge --dry-run"]),
    ("zones", ["eu-west-1a\n"]),
    ("capacity", ["spot", "reserved"]),
    ("placement_group", "pg$(id)"),
    ("subnet_segment", "training,storage"),
    ("tags", {"pool": "lab\nteam=x"}),
    ("tags", {"aws:cloudformation": "x"}),
    ("capacity_blackout_s", 0),
    ("capacity_blackout_s", 10**9),
    ("nodes", ["l4-burst-0", "-x"]),
])
def test_config_values_are_constrained(field, value):
    config = slurm.burst_config(loader.load_stack("lab"))
    config["groups"][GROUP][field] = value
    with pytest.raises(ValueError, match=field):
        burst.group_of(config, "l4-burst-0")


def test_suspend_terminates_only_this_pools_named_nodes(config, launch_templates):
    ec2 = ec2_of(config)
    burst.resume(ec2, config, ["l4-burst-0", "l4-burst-1"], update=quiet)
    # Another pool in the same account with a node of the same name.
    image = launch_templates.describe_images(MaxResults=1)["Images"][0]["ImageId"]
    other = launch_templates.run_instances(
        ImageId=image, MinCount=1, MaxCount=1, TagSpecifications=[{
            "ResourceType": "instance", "Tags": [{"Key": "pool", "Value": "other"},
                                                 {"Key": burst.NODE_TAG,
                                                  "Value": "l4-burst-1"}]}],
    )["Instances"][0]["InstanceId"]
    ids = burst.suspend(ec2, ["l4-burst-1"])
    assert len(ids) == 1 and other not in ids
    live = burst.live_instances(ec2, ["l4-burst-0", "l4-burst-1"])
    assert set(live) == {"l4-burst-0"}
    state = launch_templates.describe_instances(InstanceIds=[other])
    assert state["Reservations"][0]["Instances"][0]["State"]["Name"] in burst.LIVE_STATES


def test_program_as_slurmctld_runs_it(config, tmp_path: Path):
    """The file the role installs, run like SuspendProgram with a hostlist argument."""
    ec2 = ec2_of(config)
    burst.resume(ec2, config, ["l4-burst-0", "l4-burst-1"], update=quiet)
    cfg = tmp_path / "burst.json"
    cfg.write_text(json.dumps(config))
    env = {"AWS_ACCESS_KEY_ID": "fixture", "AWS_SECRET_ACCESS_KEY": "fixture",
           "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, burst.__file__, "suspend", "l4-burst-[0-1]",
                          "--config", str(cfg)], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert burst.live_instances(ec2, ["l4-burst-0", "l4-burst-1"]) == {}
    # A hostlist naming something that is no node name is refused before any call.
    bad = subprocess.run([sys.executable, burst.__file__, "suspend", "l4-burst-0,a b",
                          "--config", str(cfg)], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode != 0 and "node='a b'" in bad.stderr


class NotYetKnown:
    """Stands in for EC2 answering a new instance id with NotFound for a few reads."""

    def __init__(self, misses: int) -> None:
        self.misses, self.calls = misses, 0

    def describe_instances(self, InstanceIds: list[str]) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.misses:
            raise ClientError({"Error": {"Code": "InvalidInstanceID.NotFound",
                                         "Message": "not yet"}}, "DescribeInstances")
        return {"Reservations": [{"Instances": [{"InstanceId": InstanceIds[0],
                                                 "PrivateIpAddress": "10.232.0.9"}]}]}


def test_a_new_instance_is_read_again_a_bounded_number_of_times(monkeypatch):
    monkeypatch.setattr(burst.time, "sleep", quiet)
    ec2 = NotYetKnown(misses=burst.DESCRIBE_TRIES - 1)
    assert burst.address(burst.PoolEC2(ec2, "lab"), "i-1") == "10.232.0.9"
    never = NotYetKnown(misses=burst.DESCRIBE_TRIES)
    with pytest.raises(ClientError):
        burst.address(burst.PoolEC2(never, "lab"), "i-1")
    assert never.calls == burst.DESCRIBE_TRIES


# Spot interruptions: the watcher's record steers resume; suspend lifts its drain.

ZONE_A, ZONE_B = "eu-west-1a", "eu-west-1b"


def reason_line(node: str, state: str, reason: str, at: float) -> str:
    """One line of burst.SINFO_REASONS' output, as sinfo prints it."""
    return f"{node}|{time.strftime(burst.REASON_TIME, time.localtime(at))}|{state}|{reason}"


def watcher_reason(kind: str, itype: str, zone: str) -> str:
    """The reason the spot watcher itself writes."""
    notice = (spot_watch.Notice("interruption", "2026-12-01T11:20:00Z", "terminate")
              if kind == "interruption" else
              spot_watch.Notice("rebalance", "2026-12-01T11:20:00Z"))
    return notice.reason(itype, zone)


def test_the_record_is_the_watchers():
    assert burst.SPOT_RECORD.pattern == spot_watch.RECORD.pattern
    assert burst.SPOT_RECORD.flags == spot_watch.RECORD.flags


def test_spot_records_are_parsed_and_hostile_reasons_ignored():
    now = time.time()
    good = watcher_reason("interruption", "g6.12xlarge", ZONE_A)
    text = "\n".join([
        reason_line("l4-burst-0", "drained", good, now - 60),
        # The same node again (it is in two partitions): one record.
        reason_line("l4-burst-0", "drained", good, now - 60),
        reason_line("l4-burst-1", "idle~", watcher_reason("rebalance", "g6.24xlarge", ZONE_B),
                    now - 2 * burst.SPOT_AVOID_S),
        # Not spot records: the gate's drain, an operator's, none.
        reason_line("lab-gpu1", "drained", "gpupool-gate: nvidia-smi failed", now),
        reason_line("lab-gpu2", "drained", "disk swap, ticket 42", now),
        reason_line("x-0", "idle", "none", now),
        # Hostile or malformed: never passed on.
        reason_line("h-0", "drained", watcher_reason("interruption", "unknown", ZONE_A), now),
        reason_line("h-1", "drained", watcher_reason("interruption", "g6.12xlarge",
                                                     "unknown"), now),
        reason_line("h-2", "drained", watcher_reason("interruption", 'g6.x"large', ZONE_A),
                    now),
        reason_line("h-3", "drained", watcher_reason("interruption", "g6.12xlarge",
                                                     "eu-west-1a;reboot"), now),
        reason_line("h-4", "drained", watcher_reason("interruption", "g6.12xlarge",
                                                     "eu-west-1"), now),
        reason_line("h-5", "drained", good + "; scontrol shutdown", now),
        reason_line("h-6", "drained", "x " + good, now),
        reason_line("-h-7", "drained", good, now),
        reason_line("h-8", "drained;x", good, now),
        f"h-9|yesterday|drained|{good}",
        f"h-10|2026-13-01T00:00:00|drained|{good}",
        f"h-11|drained|{good}",
        "",
    ])
    records = burst.spot_records(text)
    assert [(r.node, r.state, r.instance_type, r.zone) for r in records] == [
        ("l4-burst-0", "drained", "g6.12xlarge", ZONE_A),
        ("l4-burst-1", "idle~", "g6.24xlarge", ZONE_B)]
    assert records[0].at == pytest.approx(now - 60, abs=1)
    # Only the record within the window steers resume; rebalance counts like a notice.
    assert burst.recently_interrupted(records, now) == {("g6.12xlarge", ZONE_A)}
    assert burst.recently_interrupted(records, now, 3 * burst.SPOT_AVOID_S) == {
        ("g6.12xlarge", ZONE_A), ("g6.24xlarge", ZONE_B)}


def test_sinfo_is_asked_once_bounded_and_its_failure_is_no_record(monkeypatch):
    ran = []

    def fake(argv, **kw):
        ran.append((argv, kw))
        return subprocess.CompletedProcess(argv, 0, "l4-burst-0|x|idle|none\n", "")
    monkeypatch.setattr(burst.subprocess, "run", fake)
    assert burst.sinfo_reasons() == "l4-burst-0|x|idle|none\n"
    (argv, kw), = ran
    assert argv == ["sinfo", "--noheader", "--Node", "--format=%N|%H|%T|%E"]
    assert kw["timeout"] == burst.COMMAND_TIMEOUT_S
    assert kw["env"]["SLURM_TIME_FORMAT"] == "standard"

    def missing(argv, **kw):
        raise FileNotFoundError(argv[0])
    monkeypatch.setattr(burst.subprocess, "run", missing)
    assert burst.sinfo_reasons() == ""
    monkeypatch.setattr(burst.subprocess, "run", lambda argv, **kw: (
        subprocess.CompletedProcess(argv, 1, "", "slurm_load_node error")))
    assert burst.sinfo_reasons() == ""


def test_launch_order_avoids_interrupted_types_and_zones():
    group = slurm.burst_config(loader.load_stack("lab"))["groups"][GROUP]
    first, second = group["instance_types"]
    where = [(z, {"AvailabilityZone": z}) for z in (ZONE_A, ZONE_B)]
    both = [{"AvailabilityZone": ZONE_A}, {"AvailabilityZone": ZONE_B}]

    def order(avoid):
        return [(m, t, [w["AvailabilityZone"] for w in ws])
                for m, t, ws in burst.launch_order(group, "l4-burst-0", where,
                                                   frozenset(avoid))]
    declared = [(m, t, [ZONE_A, ZONE_B]) for m in group["capacity"]
                for t in group["instance_types"]]
    assert order(set()) == declared
    assert burst.launch_order(group, "l4-burst-0", where, frozenset())[0][2] == both
    # The interrupted type goes behind the other, without the interrupted zone; the
    # on-demand market (never interrupted) keeps the declared order.
    assert order({(first, ZONE_A)}) == [
        ("spot", second, [ZONE_A, ZONE_B]), ("spot", first, [ZONE_B]),
        ("on-demand", first, [ZONE_A, ZONE_B]), ("on-demand", second, [ZONE_A, ZONE_B])]
    # A type interrupted in every zone keeps them all (no fleet without a subnet).
    assert order({(first, ZONE_A), (first, ZONE_B)})[:2] == [
        ("spot", second, [ZONE_A, ZONE_B]), ("spot", first, [ZONE_A, ZONE_B])]
    # Everything avoided: the declared order.
    assert order({(t, z) for t in group["instance_types"] for z in (ZONE_A, ZONE_B)}) == (
        declared)
    # Pairs of types or zones the group does not have change nothing.
    assert order({("p5.48xlarge", ZONE_A), (first, "us-east-1a")}) == declared


def test_resume_avoids_a_recent_interruption(config, capacity_proxy, pool_subnets):
    group = config["groups"][GROUP]
    first, second = group["instance_types"]
    subnet = {z: pool_subnets[("lab", "training", z)][0] for z in (ZONE_A, ZONE_B)}
    # Without avoid (as the lab proof calls it): the declared order.
    ec2 = ec2_of(config)
    got = burst.resume(ec2, config, ["l4-burst-0"], update=quiet)
    assert [(g.market, g.instance_type) for g in got] == [("spot", first)]
    # The first type was interrupted in zone a: the second type first, then the first
    # in zone b only; the fleets as asked, in order.
    capacity_proxy.short = dict.fromkeys(group["instance_types"], ICE)
    capacity_proxy.fleets.clear()
    got = burst.resume(ec2, config, ["l4-burst-1"], update=quiet, release=quiet,
                       avoid=frozenset({(first, ZONE_A)}))
    assert got == []
    assert [(f["TargetCapacitySpecification.DefaultTargetCapacityType"],
             [(o["InstanceType"], o["SubnetId"]) for o in overrides(f)])
            for f in capacity_proxy.fleets] == [
        ("spot", [(second, subnet[ZONE_A]), (second, subnet[ZONE_B])]),
        ("spot", [(first, subnet[ZONE_B])]),
        ("on-demand", [(first, subnet[ZONE_A]), (first, subnet[ZONE_B])]),
        ("on-demand", [(second, subnet[ZONE_A]), (second, subnet[ZONE_B])])]
    # With capacity, the node launches as the second type.
    capacity_proxy.short = {}
    got = burst.resume(ec2, config, ["l4-burst-1"], update=quiet,
                       avoid=frozenset({(first, ZONE_A)}))
    assert [(g.market, g.instance_type) for g in got] == [("spot", second)]
    # Everything interrupted: the declared order, in every zone.
    burst.suspend(ec2, ["l4-burst-1"])
    capacity_proxy.fleets.clear()
    got = burst.resume(ec2, config, ["l4-burst-1"], update=quiet, avoid=frozenset(
        {(t, z) for t in group["instance_types"] for z in (ZONE_A, ZONE_B)}))
    assert [(g.market, g.instance_type) for g in got] == [("spot", first)]
    assert [o["SubnetId"] for o in overrides(capacity_proxy.fleets[0])] == [
        subnet[ZONE_A], subnet[ZONE_B]]


def test_suspend_lifts_only_spot_drains(monkeypatch):
    ran = []

    def fake(argv, **kw):
        ran.append((argv, kw))
        if argv[2] == "nodename=l4-burst-2":
            raise subprocess.CalledProcessError(1, argv)
        return subprocess.CompletedProcess(argv, 0, "", "")
    monkeypatch.setattr(burst.subprocess, "run", fake)
    now = time.time()
    spot = watcher_reason("interruption", "g6.12xlarge", ZONE_A)
    records = burst.spot_records("\n".join([
        reason_line("l4-burst-2", "drained", spot, now),  # scontrol fails: goes on
        reason_line("l4-burst-0", "drained~", spot, now),
        reason_line("l4-burst-1", "idle~", spot, now),  # not drained (any more)
        reason_line("l4-burst-3", "drained", spot, now),  # not suspended now
        reason_line("l4-burst-4", "drained", "gpupool-gate: dcgm level 1 failed", now),
        reason_line("l4-burst-5", "draining", "operator: spot check", now)]))
    nodes = ["l4-burst-0", "l4-burst-1", "l4-burst-2", "l4-burst-4", "l4-burst-5"]
    assert burst.clear_spot_drains(records, nodes) == ["l4-burst-0"]
    assert [argv for argv, _ in ran] == [
        ["scontrol", "update", "nodename=l4-burst-2", "state=undrain"],
        ["scontrol", "update", "nodename=l4-burst-0", "state=undrain"]]
    assert all(kw["timeout"] == burst.COMMAND_TIMEOUT_S for _, kw in ran)


def test_the_program_reads_the_records_first(config, capacity_proxy, monkeypatch,
                                             tmp_path: Path):
    """main, as slurmctld runs it: sinfo's records steer resume; suspend lifts the spot
    drain of the nodes it powered down, after terminating them."""
    group = config["groups"][GROUP]
    first, second = group["instance_types"]
    cfg = tmp_path / "burst.json"
    cfg.write_text(json.dumps(config))
    sinfo = "\n".join([
        reason_line("l4-burst-0", "drained",
                    watcher_reason("interruption", first, ZONE_A), time.time() - 60),
        reason_line("l4-burst-1", "drained", "gpupool-gate: nccl failed", time.time())])
    ran = []

    def fake(argv, **kw):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, sinfo if argv[0] == "sinfo" else "", "")
    monkeypatch.setattr(burst.subprocess, "run", fake)
    assert burst.main(["resume", "l4-burst-[0-1]", "--config", str(cfg)]) == 0
    assert [overrides(f)[0]["InstanceType"] for f in capacity_proxy.fleets] == [second] * 2
    assert ran[0][0] == "sinfo" and all(a[0] == "scontrol" for a in ran[1:])
    assert not any("state=undrain" in a for a in ran)
    ran.clear()
    assert burst.main(["suspend", "l4-burst-[0-1]", "--config", str(cfg)]) == 0
    assert burst.live_instances(ec2_of(config), group["nodes"]) == {}
    assert ran == [burst.SINFO_REASONS,
                   ["scontrol", "update", "nodename=l4-burst-0", "state=undrain"]]
    # A node its boot gate drained is drained again once it is powered down.
    sinfo = reason_line("l4-burst-1", "drained", "gpupool gate failed: system.sshd_hardened",
                        time.time())
    ran.clear()
    assert burst.main(["suspend", "l4-burst-1", "--config", str(cfg)]) == 0
    assert ran == [burst.SINFO_REASONS, burst.redrain_argv(
        "l4-burst-1", "gpupool gate failed: system.sshd_hardened",
        config["suspend_timeout_s"] + burst.REDRAIN_MARGIN_S)]


def test_a_gate_failure_is_drained_again_after_the_power_down():
    """idle_on_node_suspend lifts every drain as the node powers down; the suspend program
    sets a gate's drain again after SuspendTimeout, by a transient timer, with the reason
    only where its characters are plain, and never for another reason or node. Read by
    the reason whatever the state (l4-burst-2: its drain already lifted)."""
    now = time.time()
    text = "\n".join([
        reason_line("l4-burst-0", "drained", "gpupool gate failed: system.sshd_hardened, "
                    "software.locked_version_held[nvidia_driver]", now),
        reason_line("l4-burst-1", "drained", "gpupool gate could not run: $(reboot) %n", now),
        reason_line("l4-burst-2", "idle", "gpupool gate failed: gpu.gpu_count", now),
        reason_line("l4-burst-3", "drained", "operator: bad fan", now),
        reason_line("x;id", "drained", "gpupool gate failed: gpu.gpu_count", now)])
    failures = burst.gate_failures(text)
    assert failures == {
        "l4-burst-0": "gpupool gate failed: system.sshd_hardened, "
                      "software.locked_version_held[nvidia_driver]",
        "l4-burst-1": burst.GATE_FAILED_PLAIN,
        "l4-burst-2": "gpupool gate failed: gpu.gpu_count"}
    started: list[list[str]] = []
    held = burst.hold_gate_drains(failures, ["l4-burst-1", "l4-burst-3"], 30, started.append)
    assert held == ["l4-burst-1"]
    assert started == [["systemd-run", "--unit=gpupool-burst-redrain-l4-burst-1",
                        "--on-active=60s", "--timer-property=AccuracySec=1s", "--collect",
                        "--quiet", "--", "scontrol", "update", "nodename=l4-burst-1",
                        "state=drain", f"reason={burst.GATE_FAILED_PLAIN}"]]
