"""Compute: IMDSv2, encrypted volumes, EFA in cluster placement groups, spot only with
checkpoints and requeue, burst nodes boot the pool's pre-built image."""

from __future__ import annotations

from collections.abc import Iterator

from gpupool.render import image
from gpupool.render.cloud import names, storage
from gpupool.spec.model import Description, Purpose
from policies.core import (
    Level,
    Res,
    Stack,
    as_list,
    by_tag,
    policy_statements,
    resource_policy,
    stack_policy,
    tags_of,
)
from policies.types import (
    AWS_ASG,
    AWS_BUCKET,
    AWS_IAM_POLICY,
    AWS_IMAGEBUILDER_IMAGE,
    AWS_INSTANCE,
    AWS_LAUNCH_TEMPLATE,
    AWS_PLACEMENT,
    AWS_VOLUME,
)

GROUP_TAG = "burst-group"


def _true(v: object) -> bool:
    return v is True or v == "true"


@resource_policy("compute-imdsv2-required", "compute", Level.MANDATORY,
                 "Launch templates and instances require IMDSv2 session tokens.",
                 (AWS_LAUNCH_TEMPLATE, AWS_INSTANCE))
def imdsv2(r: Res, desc: Description) -> Iterator[str]:
    tokens = (r.props.get("metadataOptions") or {}).get("httpTokens")
    if tokens != "required":
        yield f"instance metadata allows IMDSv1 (httpTokens={tokens}); require IMDSv2 tokens"


@resource_policy("compute-encrypted-volumes", "compute", Level.MANDATORY,
                 "Every EBS volume a node gets is encrypted.")
def encrypted_volumes(r: Res, desc: Description) -> Iterator[str]:
    if r.type == AWS_LAUNCH_TEMPLATE:
        mappings = r.props.get("blockDeviceMappings") or []
        if not mappings:
            yield "launch template keeps the AMI's root volume settings; declare it encrypted"
        for m in mappings:
            if not _true((m.get("ebs") or {}).get("encrypted")):
                yield f"volume {m.get('deviceName')} is not encrypted"
    elif r.type == AWS_INSTANCE and not _true((r.props.get("rootBlockDevice") or {}).get(
            "encrypted")):
        yield "instance root volume is not encrypted"
    elif r.type == AWS_VOLUME and not _true(r.props.get("encrypted")):
        yield "volume is not encrypted"


def _efa(lt: Res) -> bool:
    return any(n.get("interfaceType") in ("efa", "efa-only")
               for n in lt.props.get("networkInterfaces") or [])


@stack_policy("compute-efa-in-cluster-placement", "compute", Level.MANDATORY,
              "A launch template with EFA interfaces is used only by groups in a cluster "
              "placement group.")
def efa_placement(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    for lt in stack.of_type(AWS_LAUNCH_TEMPLATE):
        if not _efa(lt):
            continue
        group = tags_of(lt).get(GROUP_TAG)
        asgs = by_tag(stack.of_type(AWS_ASG), GROUP_TAG, group) if group else []
        placements = [p for p in by_tag(stack.of_type(AWS_PLACEMENT), GROUP_TAG, group or "")
                      if p.props.get("strategy") == "cluster"]
        if not asgs:
            yield lt.urn, "EFA launch template belongs to no autoscaling group of its burst group"
        for asg in asgs:
            if not asg.props.get("placementGroup") or not placements:
                yield asg.urn, (f"burst group {group} uses EFA but is not in a cluster "
                                "placement group; EFA traffic needs one")


def _spot(asg: Res) -> bool:
    dist = ((asg.props.get("mixedInstancesPolicy") or {}).get("instancesDistribution") or {})
    return dist.get("onDemandPercentageAboveBaseCapacity", 100) < 100


def _writes_checkpoints(policy: Res, bucket: str) -> bool:
    return any(s.get("Effect") == "Allow" and "s3:PutObject" in as_list(s.get("Action"))
               and any(str(x).startswith(f"arn:aws:s3:::{bucket}/")
                       for x in as_list(s.get("Resource")))
               for s in policy_statements(policy.props.get("policy")))


@stack_policy("compute-spot-needs-checkpoints", "compute", Level.MANDATORY,
              "Spot capacity only with a checkpoints bucket its nodes can write and a "
              "preemptible task class that requeues.")
def spot_checkpoints(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    tiers = [t for t, v in storage.bucket_tiers(desc).items() if v.purpose is Purpose.CHECKPOINTS]
    buckets = {names.bucket_name(desc, t) for t in tiers}
    declared = [b.props.get("bucket") for b in stack.of_type(AWS_BUCKET)
                if b.props.get("bucket") in buckets]
    requeue = [n for n, c in desc.task_classes.items() if c.preemptible and c.requeue]
    for asg in stack.of_type(AWS_ASG):
        if not _spot(asg):
            continue
        group = tags_of(asg).get(GROUP_TAG)
        if not declared:
            yield asg.urn, (f"spot group {group} runs without checkpoints: no checkpoints "
                            "bucket is declared, so preempted work restarts from zero")
        elif not any(_writes_checkpoints(p, b) for p in by_tag(stack.of_type(AWS_IAM_POLICY),
                                                                GROUP_TAG, group or "")
                     for b in declared):
            yield asg.urn, (f"spot group {group} runs without checkpoints: its nodes may not "
                            "write to the checkpoints bucket")
        if not requeue:
            yield asg.urn, f"spot group {group} needs a preemptible task class with requeue"


@stack_policy("compute-spot-rebalance", "compute", Level.ADVISORY,
              "Spot groups rebalance capacity ahead of interruptions.")
def spot_rebalance(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    for asg in stack.of_type(AWS_ASG):
        if _spot(asg) and asg.props.get("capacityRebalance") is not True:
            yield asg.urn, "spot group does not use capacity rebalancing"


def _prebuilt(stack: Stack, desc: Description) -> tuple[dict[str, str], str | None]:
    """Region -> AMI id of the stack config's gpupool:burstImageId, or why it is unusable."""
    value, _ = stack.config.get(f"gpupool:{image.CONFIG_KEY}", (None, False))
    try:
        return image.image_overrides(value if isinstance(value, str) else None,
                                     names.regions(desc)), None
    except ValueError as e:
        return {}, str(e)


@stack_policy("compute-burst-image-prebuilt", "compute", Level.MANDATORY,
              "A burst group's launch template boots the pool's pre-built burst image: its "
              "region's Image Builder image or the AMI of gpupool:burstImageId, never a bare "
              "public AMI, which has neither slurmd, munge nor the NVIDIA stack to join with.")
def burst_image_prebuilt(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    given, problem = _prebuilt(stack, desc)
    if problem:
        yield None, problem
    built = {(i.name, tags_of(i).get(names.TAG_BURST_REGION))
             for i in stack.of_type(AWS_IMAGEBUILDER_IMAGE)}
    for lt in stack.of_type(AWS_LAUNCH_TEMPLATE):
        group = tags_of(lt).get(GROUP_TAG)
        if group not in desc.burst_groups:
            continue
        region = desc.burst_groups[group].region
        source = tags_of(lt).get(names.TAG_BURST_IMAGE)
        ami = lt.props.get("imageId")
        if source == names.IMAGE_FROM_CONFIG and region in given:
            if ami is not None and ami != given[region]:
                yield lt.urn, (f"burst group {group} boots {ami}, not {given[region]} that "
                               f"gpupool:{image.CONFIG_KEY} names for {region}")
        elif source is None or (source, region) not in built:
            yield lt.urn, (f"burst group {group} boots {ami}, which is no pre-built burst "
                           f"image: declare {region}'s image pipeline (infra/image.py) or set "
                           f"gpupool:{image.CONFIG_KEY}")
