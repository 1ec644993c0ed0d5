"""The lab's burst data plane: every instance the lab's EC2 (moto on this machine,
gpupool.lab.localaws) reports running for the pool becomes a lab host, and every host whose
instance is gone is removed. So the resume program's real launch (gpupool.onhost.burst)
boots a real host, which joins Slurm by the launch template's real user-data.

- **The image** (the lab's stand-in for the pre-built AMI): built by the Pulumi program's
  own Image Builder component, playbooks/burst_image.yml at the lock, in a bare lab host,
  plus a FIXTURE layer (the metadata service, an `aws` wrapper for the lab's moto); see
  gpupool/lab/burst_image.py. Built once per lab, reused by every test.
- **The network**: the pool's cloud subnets of the burst region, declared in moto as
  infra/network.py declares them (tags `pool` and `segment`), and one podman network per
  subnet with the subnet's CIDR, so a host gets the private address EC2 gave its
  instance. The lab's stand-in for the hybrid link is this machine's routing between its
  networks, with the pool's cloud blocks and on-prem segments exempt from podman's
  masquerade (link_up): addresses arrive unchanged, as over a VPN. The on-prem hosts
  route the cloud blocks through their management network, so they speak to burst nodes
  from their management address, as the flows say.
- **The boot**: the instance's user-data (from its launch template) is the host's NoCloud
  seed; the metadata fixture serves the instance's id, type, zone, life cycle, tags and the
  instance role's (fixture) credentials. The instance carries its template's boot profile
  (associated here: moto's fleets do not), which the boot swaps for the run profile in
  moto; the fixture serves one credential throughout and moto enforces no IAM, so what
  each role may do is proven by its policy (tests/test_infra_program.py), not here.

A burst host's firewall is the image's: the hardening role's ruleset for a burst node
(flows.burst_inbound, any of its addresses), as playbooks/burst_image.yml applies it; on
AWS the security groups the Pulumi program declares (infra/network.py) stand in front of
it. Its node and DCGM exporters are disabled in the image: the roles bind them to a host's
declared management address, which a burst node does not have. The boot binds both to
the instance's address and starts them (launch.user_data); the DCGM exporter here is the
lab's fixture package, so what its scrape shows is the binding, not GPU telemetry.
Nothing here is EC2; no cloud behaviour follows from it beyond what moto and the fixtures
do.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from gpupool.lab import burst_image, hosts
from gpupool.render import slurm
from gpupool.render.cloud import launch, names, network
from gpupool.spec.model import Description

BURST_LABEL = "gpupool.burst-instance"
ROLE_NAME = "gpupool-burst-node"  # the instance profile's role, as the metadata names it
FIXTURE_KEY = "fixture"  # moto's fixture credentials, not a secret
LINK_COPIES_MAX = 10
FIXTURE_GPUS = "/etc/tmpfiles.d/gpupool-fixture-gpus.conf"  # the slurm role's, on-prem


class BurstLabError(hosts.LabError):
    """The lab's burst data plane could not do what was asked; the message says what."""


def declare_network(ec2: Any, desc: Description, region: str) -> dict[str, tuple[str, str]]:
    """The pool's VPC and subnets in moto, tagged as infra/network.py tags them; returns
    subnet id -> (segment, CIDR)."""
    first, *more = network.vpc_cidrs(desc)
    vpc = ec2.create_vpc(CidrBlock=first)["Vpc"]["VpcId"]
    for cidr in more:
        ec2.associate_vpc_cidr_block(VpcId=vpc, CidrBlock=cidr)
    made = {}
    for (segment, zone), cidr in sorted(network.subnets(desc, region).items()):
        tags = [{"Key": k, "Value": v} for k, v in {**names.tags(desc), "segment": segment}.items()]
        sid = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone,
                                TagSpecifications=[{"ResourceType": "subnet", "Tags": tags}]
                                )["Subnet"]["SubnetId"]
        made[sid] = (segment, cidr)
    return made


def declare_profiles(iam: Any, desc: Description) -> None:
    """Each burst group's boot and run instance profiles, with their roles, under the
    names infra/burst.py gives them (the user-data names the run profile). Their policies
    are not declared: moto enforces no IAM (tests/test_infra_program.py proves them)."""
    trust = json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": "sts:AssumeRole",
        "Principal": {"Service": "ec2.amazonaws.com"}}]})
    for name in desc.burst_groups:
        for profile in (names.boot_profile_name(desc, name), names.run_profile_name(desc, name)):
            iam.create_role(RoleName=profile, AssumeRolePolicyDocument=trust)
            iam.create_instance_profile(InstanceProfileName=profile)
            iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=profile)


def declare_templates(ec2: Any, desc: Description, image_id: str) -> None:
    """Each burst group's launch template as infra/burst.py declares it, as far as moto
    and the boot read it: the image, the boot profile (declare_profiles, in the same
    moto), IMDSv2 with instance tags, the user-data."""
    import boto3  # noqa: PLC0415 - as gpupool.onhost.burst: only where AWS is spoken to

    declare_profiles(boto3.client("iam", endpoint_url=ec2.meta.endpoint_url,
                                  region_name=ec2.meta.region_name), desc)
    for name, group in desc.burst_groups.items():
        ec2.create_launch_template(
            LaunchTemplateName=names.burst_name(desc, name),
            LaunchTemplateData={
                "ImageId": image_id,
                "IamInstanceProfile": {"Name": names.boot_profile_name(desc, name)},
                "MetadataOptions": {"HttpEndpoint": "enabled", "HttpTokens": "required",
                                    "HttpPutResponseHopLimit": 1,
                                    "InstanceMetadataTags": "enabled"},
                "UserData": base64.b64encode(
                    launch.user_data(desc, name, group).encode()).decode()})


def _user_data(ec2: Any, desc: Description, instance: dict[str, Any]) -> str:
    """The user-data the instance boots with: its own, else its group's launch template's
    (moto's fleets do not copy the template's onto the instance)."""
    own = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"],
                                          Attribute="userData").get("UserData", {})
    if own.get("Value"):
        return base64.b64decode(own["Value"]).decode()
    group = _tags(instance).get("burst-group", "")
    data = ec2.describe_launch_template_versions(
        LaunchTemplateName=names.burst_name(desc, group), Versions=["$Latest"])[
        "LaunchTemplateVersions"][0]["LaunchTemplateData"]
    return base64.b64decode(data.get("UserData", "")).decode()


def associate_boot_profile(ec2: Any, desc: Description, instance: dict[str, Any]) -> None:
    """FIXTURE (moto): EC2 associates a launch template's instance profile with the
    instance it launches; moto's fleets do not, so the lab does it before the boot, which
    swaps it for the run profile (launch.user_data)."""
    found = ec2.describe_iam_instance_profile_associations(Filters=[
        {"Name": "instance-id", "Values": [instance["InstanceId"]]}])
    if not found["IamInstanceProfileAssociations"]:
        group = _tags(instance).get("burst-group", "")
        ec2.associate_iam_instance_profile(
            InstanceId=instance["InstanceId"],
            IamInstanceProfile={"Name": names.boot_profile_name(desc, group)})


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def metadata(instance: dict[str, Any], region: str) -> dict[str, str]:
    """What the metadata fixture serves for an instance (paths under meta-data/)."""
    tags = _tags(instance)
    creds = {"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": FIXTURE_KEY,
             "SecretAccessKey": FIXTURE_KEY, "Token": FIXTURE_KEY,
             "LastUpdated": "2026-01-01T00:00:00Z", "Expiration": "2099-01-01T00:00:00Z"}
    zone = instance["Placement"]["AvailabilityZone"]
    served = {
        "instance-id": instance["InstanceId"], "instance-type": instance["InstanceType"],
        "instance-life-cycle": "spot" if instance.get("InstanceLifecycle") == "spot"
        else "on-demand",
        "local-ipv4": instance.get("PrivateIpAddress", ""),
        "placement/availability-zone": zone, "placement/region": region,
        "tags/instance": "\n".join(sorted(tags)),
        "iam/security-credentials/": ROLE_NAME,
        f"iam/security-credentials/{ROLE_NAME}": json.dumps(creds),
    }
    served.update({f"tags/instance/{k}": v for k, v in tags.items()})
    return served


def host_name(desc: Description, node: str) -> str:
    return hosts.container_name(desc, node)


def _network(desc: Description, segment: str, cidr: str) -> str:
    """The podman network of one cloud subnet (created once)."""
    name = f"{hosts.prefix(desc)}-aws-{cidr.replace('.', '-').replace('/', '_')}"
    if hosts.podman("network", "exists", name, check=False).returncode != 0:
        hosts.podman("network", "create", *hosts.labels(desc), "--label",
                     f"gpupool.segment={segment}", "--subnet", cidr, name)
    return name


def aws_address(desc: Description) -> str:
    """Where the lab's moto listens so burst hosts reach it: this machine's address on the
    lab's management network (it exists while the lab's hosts run; a burst host reaches it
    through its own network's gateway, this machine)."""
    info = json.loads(hosts.podman("network", "inspect",
                                   hosts.network_name(desc, "management")).stdout)
    return str(info[0]["subnets"][0]["gateway"])


def _link_rules(desc: Description) -> list[list[str]]:
    """iptables nat rules that route the pool's cloud blocks and its on-prem segments to
    each other unchanged, as the hybrid link (a VPN) does: podman masquerades traffic
    that leaves a network, and slurmctld takes a cloud node's address from where its
    registration comes from (cloud_reg_addrs), so a masqueraded node would be unreachable."""
    onprem = [s.cidr for _, s in sorted(desc.network.segments.items())]
    comment = ["-m", "comment", "--comment", f"gpupool lab {desc.pool.name} hybrid link"]
    pairs = [(x, o) for x in network.vpc_cidrs(desc) for o in onprem]
    return [["POSTROUTING", "-s", a, "-d", b, *comment, "-j", "ACCEPT"]
            for x, o in pairs for a, b in ((x, o), (o, x))]


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", "10", "-t", "nat", *args], capture_output=True,
                          text=True, timeout=30, check=False)


def _onprem_routes(desc: Description, verb: str) -> list[str]:
    """On every on-prem lab host that runs, `ip route VERB` each cloud block through its
    management network, as the network team routes the burst VPC: a management flow's
    source is a host's management address (flows), and the burst nodes' firewall admits
    slurmctld, srun's peers and the scrapers from there only. podman gives a host with
    several networks a default route on each, and the kernel took the storage one.
    Returns the hosts where it failed."""
    gateway = aws_address(desc)  # this machine on the management network
    failed = []
    for node in desc.nodes:
        if hosts.podman("container", "exists", host_name(desc, node),
                        check=False).returncode != 0:
            continue
        for block in network.vpc_cidrs(desc):
            done = hosts.exec_(desc, node, ["ip", "route", verb, block, "via", gateway])
            if done.returncode != 0:
                failed.append(f"{node}: ip route {verb} {block}: {done.stderr.strip()}")
    return failed


def link_up(desc: Description) -> None:
    """The lab's hybrid link (idempotent)."""
    for rule in _link_rules(desc):
        if _iptables("-C", *rule).returncode != 0:
            done = _iptables("-I", *rule)
            if done.returncode != 0:
                raise BurstLabError(f"iptables -I {' '.join(rule)}: {done.stderr.strip()}")
    failed = _onprem_routes(desc, "replace")
    if failed:
        raise BurstLabError("; ".join(failed))


def link_down(desc: Description) -> None:
    for rule in _link_rules(desc):
        for _ in range(LINK_COPIES_MAX):  # copies left by runs that never removed theirs
            if _iptables("-C", *rule).returncode != 0:
                break
            _iptables("-D", *rule)
    _onprem_routes(desc, "del")  # a host without the route has nothing to remove


def _running(ec2: Any, desc: Description) -> list[dict[str, Any]]:
    found = ec2.describe_instances(Filters=[
        {"Name": f"tag:{names.TAG_POOL}", "Values": [desc.pool.name]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return [i for r in found["Reservations"] for i in r["Instances"]]


def _boot(desc: Description, ec2: Any, instance: dict[str, Any], *, image: str,
          subnets: dict[str, tuple[str, str]], endpoint: str, region: str) -> None:
    node = _tags(instance)[names.TAG_SLURM_NODE]
    associate_boot_profile(ec2, desc, instance)
    segment, cidr = subnets[instance["SubnetId"]]
    net = _network(desc, segment, cidr)
    name = host_name(desc, node)
    hosts_args = [a for n, other in desc.nodes.items()
                  for a in ("--add-host", f"{n}:{other.addresses['management']}")]
    hosts.podman("create", *hosts.labels(desc), "--label",
                 f"{BURST_LABEL}={instance['InstanceId']}", "--name", name, "--hostname", node,
                 "--systemd=always",
                 "--network", f"{net}:ip={instance['PrivateIpAddress']}", *hosts_args,
                 "--cap-add", "NET_ADMIN", *hosts.shared_mounts(desc), image)
    seed = {
        f"{burst_image.SEED_DIR}/meta-data": json.dumps(
            {"instance-id": instance["InstanceId"], "local-hostname": node}),
        f"{burst_image.SEED_DIR}/user-data": _user_data(ec2, desc, instance),
        burst_image.IMDS_STATE: json.dumps({"meta-data": metadata(instance, region)}),
        burst_image.ENDPOINT_FILE: endpoint,
        FIXTURE_GPUS: slurm.fixture_gpus_conf(desc, node),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for i, (path, text) in enumerate(seed.items()):
            local = Path(tmp) / str(i)
            local.write_text(text)
            hosts.podman("cp", str(local), f"{name}:{path}")
    hosts.podman("start", name)


def sync(desc: Description, ec2: Any, image: str, endpoint: str,
         region: str) -> dict[str, str]:
    """Make the lab's burst hosts match moto: a host per running instance of the pool
    (booted once), none for an instance that is gone. Returns node -> instance id."""
    subnets = {s["SubnetId"]: (next((t["Value"] for t in s.get("Tags", [])
                                     if t["Key"] == "segment"), ""), s["CidrBlock"])
               for s in ec2.describe_subnets()["Subnets"]}
    wanted = {}
    for instance in _running(ec2, desc):
        tags = _tags(instance)
        if names.TAG_SLURM_NODE in tags and instance.get("SubnetId") in subnets:
            wanted[tags[names.TAG_SLURM_NODE]] = instance
    link_up(desc)
    present = _present(desc)
    for node, instance_id in present.items():
        if wanted.get(node, {}).get("InstanceId") != instance_id:
            hosts.podman("rm", "-f", "-t", "5", host_name(desc, node), timeout=120)
    for node, instance in wanted.items():
        if present.get(node) != instance["InstanceId"]:
            _boot(desc, ec2, instance, image=image, subnets=subnets, endpoint=endpoint,
                  region=region)
    return {node: i["InstanceId"] for node, i in wanted.items()}


def _present(desc: Description) -> dict[str, str]:
    """node -> instance id of the burst hosts that exist now."""
    out = hosts.podman("ps", "-a", "--filter", f"label=gpupool.pool={desc.pool.name}",
                       "--filter", f"label={BURST_LABEL}", "--format",
                       f'{{{{.Names}}}} {{{{index .Labels "{BURST_LABEL}"}}}}').stdout
    pre = hosts.prefix(desc) + "-"
    return {name.removeprefix(pre): iid for name, iid in
            (line.split() for line in out.splitlines() if line.strip())}


def remove_all(desc: Description) -> list[str]:
    """Remove every burst host and subnet network of the lab (its on-prem hosts stay)."""
    present = [host_name(desc, n) for n in _present(desc)]
    if present:
        hosts.podman("rm", "-f", "-t", "5", *present, timeout=120)
    nets = hosts.podman("network", "ls", "--filter", f"label=gpupool.pool={desc.pool.name}",
                        "--format", "{{.Name}}").stdout.split()
    aws = [n for n in nets if n.startswith(f"{hosts.prefix(desc)}-aws-")]
    if aws:
        hosts.podman("network", "rm", "-f", *aws)
    link_down(desc)
    return present + aws


def notice(desc: Description, node: str, action: str, when: str) -> None:
    """Inject a spot interruption notice into a burst host's metadata fixture."""
    body = json.dumps({"action": action, "time": when})
    hosts.podman("exec", host_name(desc, node), "sh", "-c",
                 f"printf '%s' {shlex.quote(body)} > {burst_image.IMDS_DIR}/spot-instance-action")
