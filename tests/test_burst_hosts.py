"""The lab's burst data plane without the lab: the FIXTURE metadata service speaks IMDSv2 as
EC2 documents it (tokens required, notices from files), and what gpupool.lab.burst_hosts
declares in moto (the pool's subnets, the launch templates with the real user-data) is what
the resume program and the boot read. The hosts themselves are proven in
tests/integration/test_slurm_lab.py."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpupool.lab import burst_hosts, fixture_imds, localaws
from gpupool.onhost import burst, spot_watch
from gpupool.render import slurm
from gpupool.render.cloud import launch, names, network
from gpupool.spec import loader
from tests.conftest import ROOT

DESC = loader.load_stack("lab", ROOT)
REGION = DESC.burst_groups["l4-burst"].region


@pytest.fixture
def imds(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"meta-data": {"instance-type": "g6.12xlarge",
                                               "tags/instance/gpupool:slurm-node": "n1"}}))
    with fixture_imds.serving(state) as base:
        yield base, tmp_path


def _call(url: str, method: str = "GET", headers: dict[str, str] | None = None
          ) -> tuple[int, str]:
    req = urllib.request.Request(url, method=method, headers=headers or {})  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 - loopback fixture
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def _token(base: str) -> str:
    status, token = _call(base + fixture_imds.TOKEN_PATH, "PUT",
                          {fixture_imds.TOKEN_TTL_HEADER: "60"})
    assert status == 200
    return token


def test_metadata_needs_a_token_it_issued(imds: tuple[str, Path]) -> None:
    base, _ = imds
    path = base + "/latest/meta-data/instance-type"
    assert _call(path)[0] == 401
    assert _call(path, headers={fixture_imds.TOKEN_HEADER: "made-up"})[0] == 401
    for ttl in ("", "0", "21601", "x"):
        assert _call(base + fixture_imds.TOKEN_PATH, "PUT",
                     {fixture_imds.TOKEN_TTL_HEADER: ttl} if ttl else {})[0] == 400
    assert _call(path, headers={fixture_imds.TOKEN_HEADER: _token(base)}) == (200, "g6.12xlarge")


def test_notices_appear_when_written_and_speak_the_watchers_paths(
        imds: tuple[str, Path]) -> None:
    base, folder = imds
    token = {fixture_imds.TOKEN_HEADER: _token(base)}
    # The paths the spot watcher polls are the ones the fixture serves notices on.
    assert {fixture_imds.META + p for p in fixture_imds.NOTICE_FILES} == {
        spot_watch.INSTANCE_ACTION, spot_watch.REBALANCE}
    assert fixture_imds.TOKEN_PATH == spot_watch.TOKEN_PATH
    action = base + spot_watch.INSTANCE_ACTION
    assert _call(action, headers=token)[0] == 404
    notice = json.dumps({"action": "terminate", "time": "2026-12-02T03:00:00Z"})
    (folder / fixture_imds.NOTICE_FILES["spot/instance-action"]).write_text(notice)
    assert _call(action, headers=token) == (200, notice)
    assert _call(base + "/latest/meta-data/nothing/here", headers=token)[0] == 404
    assert _call(base + "/latest/user-data", headers=token)[0] == 404


def test_metadata_of_an_instance() -> None:
    instance = {"InstanceId": "i-1", "InstanceType": "g6.12xlarge",
                "InstanceLifecycle": "spot", "PrivateIpAddress": "10.232.0.4",
                "Placement": {"AvailabilityZone": "eu-west-1b"},
                "Tags": [{"Key": names.TAG_SLURM_NODE, "Value": "l4-burst-1"},
                         {"Key": "pool", "Value": "lab"}]}
    served = burst_hosts.metadata(instance, REGION)
    assert served["tags/instance/" + names.TAG_SLURM_NODE] == "l4-burst-1"
    assert served["tags/instance"] == f"{names.TAG_SLURM_NODE}\npool"
    assert served["instance-life-cycle"] == "spot"
    assert served["placement/availability-zone"] == "eu-west-1b"
    creds = json.loads(served[f"iam/security-credentials/{burst_hosts.ROLE_NAME}"])
    assert creds["AccessKeyId"] == burst_hosts.FIXTURE_KEY
    assert served["iam/security-credentials/"] == burst_hosts.ROLE_NAME
    on_demand = burst_hosts.metadata({**instance, "InstanceLifecycle": None}, REGION)
    assert on_demand["instance-life-cycle"] == "on-demand"


def test_declared_network_and_templates_are_what_the_launch_and_boot_read() -> None:
    with localaws.endpoint() as url:
        config = {**slurm.burst_config(DESC), "endpoint_url": url}
        ec2 = burst.client(config, slurm.burst_config(DESC)["groups"]["l4-burst"]["nodes"])
        made = burst_hosts.declare_network(ec2, DESC, REGION)
        assert {(seg, cidr) for seg, cidr in made.values()} == {
            (seg, cidr) for (seg, _), cidr in network.subnets(DESC, REGION).items()}
        image = ec2.describe_images(MaxResults=1)["Images"][0]["ImageId"]
        burst_hosts.declare_templates(ec2, DESC, image)
        group = config["groups"]["l4-burst"]
        # The resume program finds the group's subnets in every zone, in zone order.
        assert [z for z, _ in burst.subnets(ec2, group)] == group["zones"]
        (launched,) = burst.resume(ec2, config, [group["nodes"][0]], update=lambda *_: None)
        (instance,) = [i for r in ec2.describe_instances(InstanceIds=[launched.instance_id])[
            "Reservations"] for i in r["Instances"]]
        assert made[instance["SubnetId"]][0] == group["subnet_segment"]
        # The host boots with the template's user-data, byte for byte what infra/burst.py
        # gives the real template.
        assert burst_hosts._user_data(ec2, DESC, instance) == launch.user_data(
            DESC, "l4-burst", DESC.burst_groups["l4-burst"])
        data = ec2.describe_launch_template_versions(
            LaunchTemplateName=group["launch_template"], Versions=["$Latest"])[
            "LaunchTemplateVersions"][0]["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        assert data["MetadataOptions"]["InstanceMetadataTags"] == "enabled"
        assert base64.b64decode(data["UserData"]).decode().startswith("#!/bin/bash\n")
        # The template's boot profile, which the lab associates as EC2 would (moto's fleets
        # do not), once; the boot's swap finds it there.
        boot_profile = names.boot_profile_name(DESC, "l4-burst")
        assert data["IamInstanceProfile"] == {"Name": boot_profile}
        for _ in range(2):
            burst_hosts.associate_boot_profile(ec2, DESC, instance)
        (assoc,) = ec2.describe_iam_instance_profile_associations(Filters=[
            {"Name": "instance-id", "Values": [launched.instance_id]}])[
            "IamInstanceProfileAssociations"]
        assert assoc["IamInstanceProfile"]["Arn"].endswith(f":instance-profile/{boot_profile}")


def test_the_labs_hybrid_link_exempts_exactly_cloud_to_onprem_from_masquerade() -> None:
    rules = burst_hosts._link_rules(DESC)
    pairs = {(r[r.index("-s") + 1], r[r.index("-d") + 1]) for r in rules}
    onprem = {s.cidr for s in DESC.network.segments.values()}
    clouds = set(network.vpc_cidrs(DESC))
    assert pairs == {(c, o) for c in clouds for o in onprem} | {
        (o, c) for c in clouds for o in onprem}
    assert all(r[0] == "POSTROUTING" and r[-2:] == ["-j", "ACCEPT"] for r in rules)
    assert all(f"gpupool lab {DESC.pool.name} hybrid link" in r for r in rules)


def test_a_burst_host_gets_the_fixture_devices_gres_conf_names_for_it() -> None:
    """slurmd refuses to start where a file gres.conf names is missing: each cloud node's
    host gets as many fixture devices as its instance type has GPUs, in the file the slurm
    role writes on-prem (slurm.fixture_gpus_conf, at the role's path); a name that is no
    node gets none."""
    [line] = slurm.gres_conf(DESC)
    for node in (n for n in slurm.nodes(DESC) if n.cloud):
        rows = [r for r in slurm.fixture_gpus_conf(DESC, node.name).splitlines()
                if not r.startswith("#")]
        assert [r.split()[1] for r in rows] == [f"/dev/nvidia{i}" for i in range(node.gpus)]
        assert all(r.split()[-1] == f"195:{i}" for i, r in enumerate(rows))
        assert f"File=/dev/nvidia[0-{node.gpus - 1}]" in line
    assert all(r.startswith("#") for r in
               slurm.fixture_gpus_conf(DESC, "no-such-node").splitlines())
    role_vars = yaml.safe_load((ROOT / "roles/slurm/vars/Debian.yml").read_text())
    role_path = f"{role_vars['slurm_tmpfiles_dir']}/gpupool-fixture-gpus.conf"
    assert role_path == burst_hosts.FIXTURE_GPUS
