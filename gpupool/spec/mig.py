"""MIG facts of a description: how a node class's declared layout fits its GPU, and what
it offers to schedulers. Shared by the rules, the Slurm, mig-parted and GPU Operator
renderings, the acceptance gate and (later) Kueue, so the layout is read in one place.

A layout is the node class's `gpu.mig_profiles` ({"3g.40gb": 1, "2g.20gb": 1}): the GPU
instances every GPU of the class is split into (mig-parted's `devices: all`). Each GPU
instance carries one compute instance of the same size, as nvidia-mig-parted and the GPU
Operator create them, so a GPU instance is one schedulable device.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from gpupool.spec.catalog import GPU_MODELS, MigGeometry, mig_geometry
from gpupool.spec.model import Description, Gpu, MigStrategy, NodeRole

# Kubernetes resource names the NVIDIA device plugin advertises (GPU Operator `mig.strategy`).
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def geometry(gpu: Gpu) -> MigGeometry | None:
    """The MIG geometry of a class's GPU; None for a model or size without MIG."""
    model = GPU_MODELS.get(gpu.model)
    if model is None or not model.mig_capable:
        return None
    return mig_geometry(gpu.model, gpu.memory_gib)


def is_partitioned(gpu: Gpu | None) -> bool:
    return gpu is not None and gpu.mig_strategy is not MigStrategy.NONE and bool(
        gpu.mig_profiles)


def compute_slices(geo: MigGeometry, layout: dict[str, int]) -> int:
    return sum(geo.profiles[p].compute_slices * n for p, n in layout.items()
               if p in geo.profiles)


def placement(geo: MigGeometry, layout: dict[str, int]) -> dict[str, list[int]] | None:
    """Start slices (memory slices) for every instance of the layout on one GPU, or None
    when NVIDIA's placement rules admit no arrangement.

    The placements are the driver's (nvidia-smi mig -lgipp): each profile may start only at
    some memory slices and covers `size` of them; instances may not overlap, and compute
    slices may not exceed the GPU's. At most seven instances per GPU, so an exhaustive
    search is cheap. Profiles not in the geometry make the layout unplaceable.
    """
    if any(p not in geo.profiles for p in layout):
        return None
    if compute_slices(geo, layout) > geo.compute_slices:
        return None
    # Largest first: fewer choices early, and the search stays tiny.
    todo = sorted((p for p, n in layout.items() for _ in range(n)),
                  key=lambda p: (-geo.profiles[p].size, p))
    used = [False] * geo.memory_slices
    starts: dict[str, list[int]] = defaultdict(list)

    def place(i: int) -> bool:
        if i == len(todo):
            return True
        prof = geo.profiles[todo[i]]
        # Same profile: start after the previous instance, so no arrangement is tried twice.
        low = starts[prof.name][-1] + 1 if starts[prof.name] else 0
        for start in prof.placements:
            span = range(start, start + prof.size)
            if start < low or span.stop > geo.memory_slices or any(used[s] for s in span):
                continue
            for s in span:
                used[s] = True
            starts[prof.name].append(start)
            if place(i + 1):
                return True
            starts[prof.name].pop()
            for s in span:
                used[s] = False
        return False

    return {p: list(s) for p, s in starts.items()} if place(0) else None


@dataclass(frozen=True)
class MigResource:
    """What one node of a class offers a scheduler for one kind of device."""

    resource: str  # Kubernetes extended resource name
    profile: str | None  # the MIG profile, None for whole GPUs
    per_node: int


def kubernetes_resources(gpu: Gpu) -> list[MigResource]:
    """The extended resources the NVIDIA device plugin advertises on a node of the class.

    mig_strategy none: whole GPUs as nvidia.com/gpu. single: every GPU split alike, each
    instance advertised as nvidia.com/gpu (the node's nvidia.com/gpu.product label names
    the profile). mixed: one resource per profile, nvidia.com/mig-<profile>.
    """
    if not is_partitioned(gpu):
        return [MigResource(WHOLE_GPU_RESOURCE, None, gpu.count)]
    if gpu.mig_strategy is MigStrategy.SINGLE:
        ((profile, per_gpu),) = gpu.mig_profiles.items()
        return [MigResource(WHOLE_GPU_RESOURCE, profile, per_gpu * gpu.count)]
    return [MigResource(MIG_RESOURCE_PREFIX + p, p, n * gpu.count)
            for p, n in sorted(gpu.mig_profiles.items())]


def kueue_resources(desc: Description) -> dict[str, dict[str, int]]:
    """For Kueue: per GPU node class, resource name -> devices one node offers.

    {"hgx-a100": {"nvidia.com/mig-1g.10gb": 16, "nvidia.com/mig-3g.40gb": 8}} for a mixed
    class of 8 GPUs split 3g.40gb + 2x 1g.10gb; {"l4": {"nvidia.com/gpu": 4}} unsplit.
    Classes without GPUs are left out. Multiply by the class's nodes for capacity
    (mig_capacity does that per profile).
    """
    out: dict[str, dict[str, int]] = {}
    for name, nc in desc.node_classes.items():
        if nc.gpu is None:
            continue
        per: dict[str, int] = defaultdict(int)
        for r in kubernetes_resources(nc.gpu):
            per[r.resource] += r.per_node
        out[name] = dict(per)
    return out


def mig_capacity(desc: Description) -> dict[str, int]:
    """MIG instances per profile over the pool's compute nodes (burst nodes are never
    partitioned: cloud GPUs come whole)."""
    cap: dict[str, int] = defaultdict(int)
    for node in desc.nodes.values():
        gpu = desc.node_classes[node.class_].gpu if node.class_ in desc.node_classes else None
        if NodeRole.COMPUTE in node.roles and gpu is not None and is_partitioned(gpu):
            for p, n in gpu.mig_profiles.items():
                cap[p] += n * gpu.count
    return dict(sorted(cap.items()))


# Changing a GPU's MIG mode (enabling or disabling MIG) needs the GPU idle and reset; on
# some systems (hypervisors, GPUs whose reset is refused, A100 before driver R470 on some
# platforms) a reboot. Changing only the instances of a GPU already in MIG mode does not.
def needs_gpu_reset(gpu: Gpu | None) -> bool:
    """Whether applying the class's layout to a fresh node changes MIG mode (a GPU reset,
    or a reboot where the reset is refused): true for every MIG class, since GPUs ship
    with MIG disabled; false where MIG stays off."""
    return is_partitioned(gpu)
