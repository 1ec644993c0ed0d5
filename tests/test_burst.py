"""The burst resume/suspend programs against a local EC2 (moto server on 127.0.0.1).

EC2 capacity shortages cannot be produced by moto: `capacity_proxy` is a fixture standing
in for a region that is out of capacity for some instance types; it answers RunInstances
for those types with EC2's InsufficientInstanceCapacity error and forwards everything
else to moto.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest

from gpupool.lab import localaws
from gpupool.onhost import burst
from gpupool.render import slurm
from gpupool.spec import loader

REGION = "eu-west-1"
ICE = ("<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error>"
       "<Code>InsufficientInstanceCapacity</Code><Message>We currently do not have "
       "sufficient {itype} capacity in the Availability Zone you requested.</Message>"
       "</Error></Errors><RequestID>fixture</RequestID></Response>")


@pytest.fixture(autouse=True)
def fixture_credentials(monkeypatch):
    """moto accepts any credentials; never let a real profile be picked up."""
    for key, value in localaws.FIXTURE_CREDENTIALS.items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def moto_url():
    with localaws.endpoint() as url:
        yield url


class CapacityProxy:
    """Fixture: EC2 out of capacity for `short` instance types; moto for the rest."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.short, self.refused = upstream, set(), []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                form = urllib.parse.parse_qs(body.decode())
                itype = form.get("InstanceType", [""])[0]
                if form.get("Action") == ["RunInstances"] and itype in proxy.short:
                    proxy.refused.append(itype)
                    self._reply(500, ICE.format(itype=itype).encode())
                    return
                req = urllib.request.Request(  # noqa: S310 - loopback moto
                    proxy.upstream + self.path, data=body,
                                             headers=dict(self.headers), method="POST")
                try:
                    with urllib.request.urlopen(req) as resp:  # noqa: S310 - loopback moto
                        self._reply(resp.status, resp.read())
                except urllib.error.HTTPError as exc:  # moto's own errors pass through
                    self._reply(exc.code, exc.read())

            def _reply(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def capacity_proxy(moto_url):
    proxy = CapacityProxy(moto_url)
    yield proxy
    proxy.server.shutdown()


@pytest.fixture(scope="module")
def launch_templates(moto_url):
    """The launch templates the Pulumi program declares, as moto holds them."""
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_url,
                       aws_access_key_id="fixture", aws_secret_access_key="fixture")  # noqa: S106 - moto
    image = ec2.describe_images(MaxResults=5)["Images"][0]["ImageId"]
    for group in slurm.burst_config(loader.load_stack("lab"))["groups"].values():
        ec2.create_launch_template(LaunchTemplateName=group["launch_template"],
                                   LaunchTemplateData={"ImageId": image})
    return ec2


@pytest.fixture
def config(launch_templates, capacity_proxy):
    """The lab's burst config (from the description), pointed at the local EC2."""
    cfg = slurm.burst_config(loader.load_stack("lab"))
    cfg["endpoint_url"] = capacity_proxy.url
    ec2 = launch_templates
    yield cfg
    live = [i["InstanceId"] for r in ec2.describe_instances()["Reservations"]
            for i in r["Instances"] if i["State"]["Name"] in burst.LIVE_STATES]
    if live:
        ec2.terminate_instances(InstanceIds=live)


def ec2_of(cfg):
    return burst.client(cfg, cfg["groups"]["l4-burst"]["nodes"])


def test_expand_hostlist():
    assert burst.expand_hostlist("l4-burst-[0-1]") == ["l4-burst-0", "l4-burst-1"]
    assert burst.expand_hostlist("a[1,3-4],b") == ["a1", "a3", "a4", "b"]
    assert burst.expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    names = ["lab-gpu1", "lab-gpu2", "l4-burst-0", "l4-burst-1", "x"]
    assert burst.expand_hostlist(slurm.hostlist(names)) == names


def test_config_comes_from_the_description():
    desc = loader.load_stack("lab")
    group = slurm.burst_config(desc)["groups"]["l4-burst"]
    assert group["instance_types"] == desc.burst_groups["l4-burst"].instance_types
    assert group["region"] == desc.burst_groups["l4-burst"].region
    assert group["nodes"] == ["l4-burst-0", "l4-burst-1"]


def test_resume_launches_from_the_template_and_registers(config):
    calls = []
    ec2 = ec2_of(config)
    got = burst.resume(ec2, config, ["l4-burst-0", "l4-burst-1"],
                       update=lambda *a: calls.append(a))
    assert [g.node for g in got] == ["l4-burst-0", "l4-burst-1"]
    group = config["groups"]["l4-burst"]
    # First choice: the first declared market and instance type.
    assert {(g.market, g.instance_type) for g in got} == {
        (group["capacity"][0], group["instance_types"][0])}
    live = burst.live_instances(ec2, group["nodes"])
    for g in got:
        inst = live[g.node][0]
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags[burst.NODE_TAG] == g.node
        assert tags["pool"] == "lab"
        assert tags["cost-centre"] == "cc-lab"
        assert inst["InstanceType"] == g.instance_type
        assert (f"nodename={g.node}", f"nodeaddr={inst['PrivateIpAddress']}",
                f"nodehostname={g.node}") in calls


def test_the_on_demand_base_starts_on_demand(config):
    # The example pool's H100 group: one node of base, spot above it (as its ASG says).
    example = slurm.burst_config(loader.load_stack("example"))["groups"]
    h100 = next(g for g in example.values() if g["on_demand_nodes"])
    first, *rest = h100["nodes"]
    assert burst.markets(h100, first) == ["on-demand", "spot"]
    assert {tuple(burst.markets(h100, n)) for n in rest} == {("spot", "on-demand")}
    # On the local EC2: a base of one in the lab group launches its first node on-demand.
    config["groups"]["l4-burst"]["on_demand_nodes"] = 1
    ec2 = ec2_of(config)
    got = burst.resume(ec2, config, ["l4-burst-0", "l4-burst-1"], update=lambda *a: None)
    assert [(g.node, g.market) for g in got] == [("l4-burst-0", "on-demand"),
                                                 ("l4-burst-1", "spot")]
    live = burst.live_instances(ec2, ["l4-burst-0", "l4-burst-1"])
    assert [live[n][0].get("InstanceLifecycle") for n in ("l4-burst-0", "l4-burst-1")] == [
        None, "spot"]


def test_resume_is_idempotent(config):
    ec2 = ec2_of(config)
    first = burst.resume(ec2, config, ["l4-burst-0"], update=lambda *a: None)
    again = burst.resume(ec2, config, ["l4-burst-0"], update=lambda *a: None)
    assert len(first) == 1
    assert again == []
    assert len(burst.live_instances(ec2, ["l4-burst-0"])["l4-burst-0"]) == 1


def test_falls_back_along_instance_types(config, capacity_proxy):
    group = config["groups"]["l4-burst"]
    first, second = group["instance_types"]
    capacity_proxy.short = {first}
    got = burst.resume(ec2_of(config), config, ["l4-burst-1"], update=lambda *a: None)
    assert [(g.node, g.instance_type, g.market) for g in got] == [
        ("l4-burst-1", second, group["capacity"][0])]
    assert first in capacity_proxy.refused
    inst = burst.live_instances(ec2_of(config), ["l4-burst-1"])["l4-burst-1"][0]
    assert inst["InstanceType"] == second


def test_no_capacity_anywhere_marks_the_node_down(config, capacity_proxy):
    group = config["groups"]["l4-burst"]
    capacity_proxy.short = set(group["instance_types"])
    calls = []
    got = burst.resume(ec2_of(config), config, ["l4-burst-0"],
                       update=lambda *a: calls.append(a))
    assert got == []
    # Every market x type was tried before giving up.
    assert set(capacity_proxy.refused) == set(group["instance_types"])
    assert calls and calls[0][:2] == ("nodename=l4-burst-0", "state=down")
    assert "no capacity" in calls[0][2]
    assert burst.live_instances(ec2_of(config), ["l4-burst-0"]) == {}


def test_other_errors_are_not_swallowed(config):
    config["groups"]["l4-burst"]["launch_template"] = "no-such-template"
    with pytest.raises(burst.ClientError):
        burst.resume(ec2_of(config), config, ["l4-burst-0"], update=lambda *a: None)


def test_suspend_terminates_only_the_named_nodes(config):
    ec2 = ec2_of(config)
    burst.resume(ec2, config, ["l4-burst-0", "l4-burst-1"], update=lambda *a: None)
    ids = burst.suspend(ec2, ["l4-burst-1"])
    assert len(ids) == 1
    live = burst.live_instances(ec2, ["l4-burst-0", "l4-burst-1"])
    assert set(live) == {"l4-burst-0"}


def test_program_as_slurmctld_runs_it(config, tmp_path: Path):
    """The file the role installs, run like SuspendProgram with a hostlist argument."""
    ec2 = ec2_of(config)
    burst.resume(ec2, config, ["l4-burst-0", "l4-burst-1"], update=lambda *a: None)
    cfg = tmp_path / "burst.json"
    cfg.write_text(json.dumps(config))
    env = {"AWS_ACCESS_KEY_ID": "fixture", "AWS_SECRET_ACCESS_KEY": "fixture",
           "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, burst.__file__, "suspend", "l4-burst-[0-1]",
                          "--config", str(cfg)], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert burst.live_instances(ec2, ["l4-burst-0", "l4-burst-1"]) == {}
