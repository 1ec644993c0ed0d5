"""The names and tags of the pool's AWS resources, and the regions they live in.

The Pulumi program names its resources by these, the Slurm resume program and the burst
boot find them by them, and the policy pack checks them: one derivation of the
description for all of them.
"""

from __future__ import annotations

from gpupool.render.node_labels import LABEL_PREFIX
from gpupool.spec.model import (
    Description,
)
from gpupool.spec.model import bucket_name as model_bucket_name

# Tag keys on every taggable AWS resource; Kubernetes objects carry the same as labels.
TAG_POOL, TAG_TEAM, TAG_COST_CENTRE = "pool", "team", "cost-centre"
SHARED = "shared"  # the team tag of resources every team uses
TAG_BURST_REGION = "burst-region"  # on a burst region's image pipeline and its parts
# On a burst launch template: where its AMI comes from, the name of its region's image
# (infra/image.py) or IMAGE_FROM_CONFIG (the stack config's gpupool:burstImageId).
TAG_BURST_IMAGE = "burst-image"
IMAGE_FROM_CONFIG = "stack-config"


def tags(desc: Description, team: str | None = None, **extra: str) -> dict[str, str]:
    """Pool tags; a team's own cost centre when the resource belongs to one team."""
    cost = desc.teams[team].cost_centre if team else desc.pool.cost_centre
    return {TAG_POOL: desc.pool.name, TAG_TEAM: team or SHARED, TAG_COST_CENTRE: cost,
            **extra}


def labels(desc: Description, team: str | None = None) -> dict[str, str]:
    return {LABEL_PREFIX + k: v for k, v in tags(desc, team).items()}


def regions(desc: Description) -> list[str]:
    """Regions that get a VPC: every burst region (sorted for stable names)."""
    return sorted({g.region for g in desc.burst_groups.values()})


def region_zones(desc: Description, region: str) -> list[str]:
    zones: list[str] = []
    for g in desc.burst_groups.values():
        if g.region == region:
            zones += [z for z in g.availability_zones if z not in zones]
    return sorted(zones)


def burst_name(desc: Description, group: str) -> str:
    """Name of a burst group's launch template, placement group and autoscaling group:
    the Pulumi program declares them, the Slurm resume program launches from them."""
    return f"{desc.pool.name}-{group}"


def boot_profile_name(desc: Description, group: str) -> str:
    """The instance profile a burst group's launch template gives every instance: its role
    reads the munge key and swaps this profile for the run profile, nothing else."""
    return f"{burst_name(desc, group)}-boot"


def run_profile_name(desc: Description, group: str) -> str:
    """The instance profile a burst node runs with once its boot has swapped it in: its
    role (node_policy) reaches the datasets and its teams' checkpoints, never the munge
    key. The user-data names it, so the program gives it this name."""
    return f"{burst_name(desc, group)}-node"


def burst_image_name(desc: Description, region: str) -> str:
    """Name of a burst region's image pipeline and its parts (component, recipe,
    configurations): one image per region serves every burst group there."""
    return f"{desc.pool.name}-{region}-burst-image"


def bucket_name(desc: Description, tier: str) -> str:
    """Globally unique by pool, tier and home region (the spec's one formula, whose length
    validation bounds)."""
    return model_bucket_name(desc.pool.name, tier, desc.pool.cloud_region)


def bucket_arn(desc: Description, tier: str) -> str:
    return f"arn:aws:s3:::{bucket_name(desc, tier)}"


def via_service(service: str, region: str) -> str:
    return f"{service}.{region}.amazonaws.com"


# The tag the resume program gives an instance: its Slurm node name
# (gpupool.onhost.burst.NODE_TAG; that file imports nothing of gpupool, a test keeps them equal).
TAG_SLURM_NODE = "gpupool:slurm-node"


def munge_secret_name(desc: Description) -> str:
    """The Secrets Manager secret holding the pool's munge key: the program declares it,
    a burst node's user-data reads it, an operator puts the controller's key in it."""
    return f"gpupool/{desc.pool.name}/munge-key"
