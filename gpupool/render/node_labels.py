"""The labels and taints each Kubernetes node of the pool registers with, computed once.

Kueue's ResourceFlavors (k8s_objects.resource_flavors) select nodes by these labels and
list these taints, so both come from the functions here: on-prem nodes register with them
through kubelet (roles/kubernetes_node writes KUBELET_EXTRA_ARGS from the inventory's
`gpupool_node.kubernetes`), burst nodes through their launch template's user data
(cloud.launch.user_data), which reads the instance's capacity type from the metadata service
because an Auto Scaling group that mixes spot and on-demand decides it at launch.

GPU models are gpupool's model names (`gpupool.io/gpu-model`), not GPU Feature
Discovery's `nvidia.com/gpu.product`: one model spans several products (A100 40 and
80 GB, SXM and PCIe; H100 SXM and NVL) and a flavor's nodeLabels match one value each.
GPU Feature Discovery still sets `nvidia.com/gpu.product` where the GPU Operator runs, and
gpu_product() says what it will read for the catalogue's reference product.
"""

from __future__ import annotations

from typing import Any

from gpupool.spec.catalog import GPU_MODELS
from gpupool.spec.facts import burst_model
from gpupool.spec.model import Capacity, Description, NodeRole

LABEL_PREFIX = "gpupool.io/"
LABEL_POOL = LABEL_PREFIX + "pool"
LABEL_MODEL = LABEL_PREFIX + "gpu-model"
LABEL_CAPACITY = LABEL_PREFIX + "capacity-type"
LABEL_CLASS = LABEL_PREFIX + "node-class"
LABEL_BURST = LABEL_PREFIX + "burst-group"
LABEL_PRODUCT = "nvidia.com/gpu.product"  # set by GPU Feature Discovery, never by gpupool
ONPREM = "on-prem"  # the capacity type of the pool's own nodes (facts.CAPACITY_TYPES)
SPOT = Capacity.SPOT.value


def gpu_product(model: str) -> str:
    """GPU Feature Discovery's value for the catalogue's product: NVML's name, spaces as
    dashes ("NVIDIA H100 80GB HBM3" -> "NVIDIA-H100-80GB-HBM3")."""
    return GPU_MODELS[model].product.replace(" ", "-")


def flavor_labels(model: str, capacity: str) -> dict[str, str]:
    """What a ResourceFlavor for a GPU model on a capacity type selects."""
    return {LABEL_MODEL: model, LABEL_CAPACITY: capacity}


def flavor_taints(capacity: str) -> list[dict[str, str]]:
    """Spot nodes are tainted so that only work Kueue admitted to a spot flavor (which
    adds the matching toleration) lands there."""
    if capacity != SPOT:
        return []
    return [{"key": LABEL_CAPACITY, "value": SPOT, "effect": "NoSchedule"}]


def onprem_node(desc: Description, name: str) -> dict[str, Any] | None:
    """An on-prem node's registration: labels and taints, or None when it is no node of
    the declared cluster (no Kubernetes, or neither control plane nor compute)."""
    k8s = desc.kubernetes
    node = desc.nodes[name]
    if k8s is None or (name not in k8s.control_plane and NodeRole.COMPUTE not in node.roles):
        return None
    labels = {LABEL_POOL: desc.pool.name, LABEL_CLASS: node.class_}
    gpu = desc.node_classes[node.class_].gpu if node.class_ in desc.node_classes else None
    if gpu is not None and NodeRole.COMPUTE in node.roles:
        labels |= flavor_labels(gpu.model, ONPREM)
    return {"labels": labels, "taints": flavor_taints(ONPREM)}


def burst_nodes(desc: Description, group: str) -> dict[str, dict[str, Any]]:
    """A burst group's registrations per capacity type it may launch on."""
    g = desc.burst_groups[group]
    base = {LABEL_POOL: desc.pool.name, LABEL_BURST: group}
    return {c.value: {"labels": base | flavor_labels(burst_model(g), c.value),
                      "taints": flavor_taints(c.value)} for c in g.capacity}


def kubelet_args(registration: dict[str, Any]) -> str:
    """kubelet flags for a registration: --node-labels and --register-with-taints.

    kubelet applies both when it registers the Node object only (a later change needs
    the node re-registered or relabelled by hand); labels outside kubernetes.io and
    k8s.io are not restricted by the NodeRestriction admission plugin."""
    labels = ",".join(f"{k}={v}" for k, v in sorted(registration["labels"].items()))
    args = [f"--node-labels={labels}"]
    if registration["taints"]:
        args.append("--register-with-taints=" + ",".join(
            f"{t['key']}={t['value']}:{t['effect']}" for t in registration["taints"]))
    return " ".join(args)


def registrations(desc: Description) -> list[dict[str, Any]]:
    """Every registration some node of the pool may make (for checks and tests)."""
    out = [r for n in desc.nodes if (r := onprem_node(desc, n)) is not None]
    if desc.kubernetes is not None:
        out += [r for g in desc.burst_groups for r in burst_nodes(desc, g).values()]
    return out
