"""The whole program: components per capability, and the stack outputs others read."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from gpupool.paths import pulumi_project
from gpupool.render import image, k8s_objects
from gpupool.render.cloud import iam, launch, names
from gpupool.render.cloud.network import network_plan
from gpupool.render.cloud.storage import storage_plan
from gpupool.spec import loader
from gpupool.spec.model import Description
from infra.burst import BurstPool, BurstPoolArgs
from infra.cluster import ClusterServices, ClusterServicesArgs
from infra.image import BurstImage, BurstImageArgs
from infra.network import NetworkSegments
from infra.secrets import MungeKey, MungeKeyArgs
from infra.storage import StorageTiers, StorageTiersArgs


def declare(desc: Description) -> None:
    """Declare every resource of a pool and export what Ansible, the schedulers and the
    runbooks read."""
    pool = desc.pool.name
    providers = {r: aws.Provider(f"aws-{r}", region=r)
                 for r in sorted({desc.pool.cloud_region, *names.regions(desc)})}
    networks = {r: NetworkSegments(f"{pool}-{r}", network_plan(desc, r),
                                   pulumi.ResourceOptions(providers=[providers[r]]))
                for r in names.regions(desc)}
    home = pulumi.ResourceOptions(providers=[providers[desc.pool.cloud_region]])
    account = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(
        provider=providers[desc.pool.cloud_region])).account_id
    storage = StorageTiers(pool, StorageTiersArgs(
        storage_plan(desc), networks.get(desc.pool.cloud_region), account), home)
    prebuilt = _prebuilt_images(desc)
    digest = _artifact_digest(desc)
    images = {r: BurstImage(names.burst_image_name(desc, r),
                            BurstImageArgs(image.image_plan(desc, r, prebuilt.get(r), digest),
                                           networks[r], storage),
                            pulumi.ResourceOptions(providers=[providers[r]]))
              for r in names.regions(desc)}
    bursts = {g: BurstPool(names.burst_name(desc, g),
                           BurstPoolArgs(launch.burst_plan(desc, g), networks[b.region],
                                         storage, images[b.region]),
                           pulumi.ResourceOptions(providers=[providers[b.region]]))
              for g, b in desc.burst_groups.items()}
    if bursts:
        munge = MungeKey(f"{pool}-munge-key", MungeKeyArgs(
            iam.munge_plan(desc), storage.key_arn,
            {g: b.boot_role for g, b in bursts.items()}), home)
        pulumi.export("munge_key_secret", munge.secret_arn)
        # Operators attach it to the identity the controller's resume/suspend run with.
        pulumi.export("burst_launcher_policy",
                      _launcher_policy(desc, account, storage, bursts, home).arn)
    if desc.backup is not None:
        # Operators attach it to the identity the controller's backup timer runs with.
        pulumi.export("controller_backup_policy",
                      _backup_policy(desc, desc.backup.tier, storage, home).arn)
    if (sync := _tier_sync_policy(desc, storage, home)) is not None:
        # Operators attach it to the identity the controller's tier copies run with.
        pulumi.export("tier_sync_policy", sync.arn)
    cluster = ClusterServices(pool, ClusterServicesArgs(k8s_objects.cluster_plan(desc)))

    pulumi.export("onprem_segments", {
        "segments": {n: s.model_dump(mode="json") for n, s in desc.network.segments.items()},
        "flows": [f.model_dump(mode="json", by_alias=True) for f in desc.network.flows],
        "admin_cidrs": list(desc.network.admin_cidrs)})
    pulumi.export("buckets", storage.bucket_names)
    if storage.scratch_dns is not None:
        pulumi.export("scratch_dns", storage.scratch_dns)
    # For the network team: per burst region, the link and the cloud blocks the on-prem
    # side routes to it (and, for a VPN, the tunnel endpoints and the BGP ASN).
    pulumi.export("onprem_routes", {r: n.link.onprem_side for r, n in networks.items()})
    pulumi.export("api_endpoints", {r: n.egress.endpoint_ids for r, n in networks.items()})
    pulumi.export("vpcs", {r: n.vpc_id for r, n in networks.items()})
    pulumi.export("subnets", {r: n.subnet_ids for r, n in networks.items()})
    pulumi.export("security_groups", {r: n.security_group_ids for r, n in networks.items()})
    pulumi.export("launch_templates", {g: b.launch_template_id for g, b in bursts.items()})
    pulumi.export("autoscaling_groups", {g: b.group_name for g, b in bursts.items()})
    pulumi.export("burst_images", {r: i.image_id for r, i in images.items()})
    pulumi.export("image_pipelines", {r: i.pipeline_arn for r, i in images.items()})
    pulumi.export("queues", cluster.queues)


def _launcher_policy(desc: Description, account: pulumi.Output[str], storage: StorageTiers,
                     bursts: dict[str, BurstPool],
                     opts: pulumi.ResourceOptions) -> aws.iam.Policy:
    """The least privilege of the controller's resume/suspend (iam.burst_launch_policy),
    for the boot roles of every burst group (the launch templates' profiles; a node passes
    its run role itself, iam.boot_policy)."""
    roles = [b.boot_role.arn for _, b in sorted(bursts.items())]
    document = pulumi.Output.all(account, storage.key_arn, *roles).apply(
        lambda v: json.dumps(iam.burst_launch_policy(desc, v[0], list(v[2:]), v[1])))
    return aws.iam.Policy(f"{desc.pool.name}-burst-launcher", policy=document,
                          tags=names.tags(desc), opts=opts,
                          description=f"gpupool {desc.pool.name} burst resume/suspend")


def _backup_policy(desc: Description, tier: str, storage: StorageTiers,
                   opts: pulumi.ResourceOptions) -> aws.iam.Policy:
    """The least privilege of the controller's backups (iam.controller_backup_policy)."""
    document = storage.key_arn.apply(
        lambda key: json.dumps(iam.controller_backup_policy(desc, tier, key)))
    return aws.iam.Policy(f"{desc.pool.name}-controller-backup", policy=document,
                          tags=names.tags(desc), opts=opts,
                          description=f"gpupool {desc.pool.name} controller backups")


def _tier_sync_policy(desc: Description, storage: StorageTiers,
                      opts: pulumi.ResourceOptions) -> aws.iam.Policy | None:
    """The least privilege of the controller's tier copies (iam.tier_sync_policy), or None
    where no tier declares a sync."""
    if not iam.tier_syncs(desc):
        return None
    document = storage.key_arn.apply(
        lambda key: json.dumps(iam.tier_sync_policy(desc, key)))
    return aws.iam.Policy(f"{desc.pool.name}-tier-sync", policy=document,
                          tags=names.tags(desc), opts=opts,
                          description=f"gpupool {desc.pool.name} storage tier copies")


def _prebuilt_images(desc: Description) -> dict[str, str]:
    """Region -> AMI id the stack config gives (gpupool:burstImageId); a bad value stops
    the program with its message."""
    try:
        return image.image_overrides(pulumi.Config("gpupool").get(image.CONFIG_KEY),
                                     names.regions(desc))
    except ValueError as e:
        raise pulumi.RunError(str(e)) from None


def _artifact_digest(desc: Description) -> str | None:
    """The burst image artifact's SHA-256 the stack config pins
    (gpupool:burstImageArtifactSha256); a malformed one stops the program with its message.
    Without one every image build refuses its artifact, which the preview says."""
    try:
        digest = image.artifact_digest(pulumi.Config("gpupool").get(image.DIGEST_KEY))
    except ValueError as e:
        raise pulumi.RunError(str(e)) from None
    if digest is None and names.regions(desc):
        pulumi.log.warn(f"gpupool:{image.DIGEST_KEY} is not set: the burst image pipelines "
                        "refuse every artifact until it names the uploaded one's SHA-256 "
                        "(`make burst-image-artifact` prints it)")
    return digest


def main() -> None:
    """What the Pulumi CLI runs: the stack config names the description."""
    path = pulumi.Config("gpupool").require("description")
    declare(loader.load_file(pulumi_project() / path))
