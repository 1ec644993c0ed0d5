"""MIG layouts rendered from the description, once, for every consumer: the `mig` role
(nvidia-mig-parted on the host), the GPU Operator's mig-manager (its ConfigMap and
`mig.strategy`), and the inventory both read them from. Slurm's MIG GRES are in
render/slurm.py; the per-class Kubernetes resources Kueue needs are spec.mig.kueue_resources.

One mig-parted config per MIG-capable node class, named `gpupool-<class>`, applied to all
of its GPUs (`devices: all`): a class is one layout. Classes whose GPUs have no MIG (L4,
L40S) get no config, and their nodes no `nvidia.com/mig.config` label.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from gpupool.spec import mig
from gpupool.spec.catalog import GPU_MODELS
from gpupool.spec.model import RE_NAME, Description, MigStrategy

CONFIG_PREFIX = "gpupool-"
ALL_DISABLED = "all-disabled"  # mig-manager's default config name (the chart's default)
# The GPU Operator's mig-manager reads its configs from this key of its ConfigMap.
CONFIGMAP_KEY = "config.yaml"


def config_name(node_class: str) -> str:
    """The mig-parted config of a class, also the `nvidia.com/mig.config` label value and
    a word in a systemd ExecStart: a DNS label of at most 63 characters. A class name is one
    (validation); a longer or unvalidated one gets a digest instead of being written."""
    name = CONFIG_PREFIX + node_class
    if RE_NAME.fullmatch(node_class) and len(name) <= 63:
        return name
    return CONFIG_PREFIX + "class-" + hashlib.sha256(node_class.encode()).hexdigest()[:16]


def mig_classes(desc: Description) -> dict[str, Any]:
    """GPU node classes whose model has MIG, by name (MIG on or off)."""
    return {name: nc for name, nc in desc.node_classes.items()
            if nc.gpu is not None and GPU_MODELS[nc.gpu.model].mig_capable}


def mig_parted_config(desc: Description) -> dict[str, Any]:
    """nvidia-mig-parted's config file (format `version: v1`), one config per class."""
    configs: dict[str, Any] = {ALL_DISABLED: [{"devices": "all", "mig-enabled": False}]}
    for name, nc in mig_classes(desc).items():
        entry: dict[str, Any] = {"devices": "all", "mig-enabled": mig.is_partitioned(nc.gpu)}
        if entry["mig-enabled"]:
            entry["mig-devices"] = dict(sorted(nc.gpu.mig_profiles.items()))
        configs[config_name(name)] = [entry]
    return {"version": "v1", "mig-configs": configs}


def mig_parted_yaml(desc: Description) -> str:
    """The config as YAML text, profile names quoted (mig-parted's own examples do)."""
    return yaml.safe_dump(mig_parted_config(desc), sort_keys=False, default_flow_style=False)


def strategy(desc: Description) -> str:
    """The GPU Operator's cluster-wide mig.strategy: the MIG classes' one strategy (the
    rules refuse two), `none` where no class is partitioned."""
    used = {nc.gpu.mig_strategy for nc in desc.node_classes.values()
            if nc.gpu is not None and mig.is_partitioned(nc.gpu)}
    return next(iter(used), MigStrategy.NONE).value


def operator(desc: Description, configmap: str) -> dict[str, Any]:
    """The GPU Operator's MIG values and the mig-manager ConfigMap's data, from the layout.

    values: `mig.strategy` and `migManager` (enabled when any class is partitioned, reading
    `configmap`, default all-disabled); configmap_data: {config.yaml: mig-parted config};
    node_configs: node -> its class's config, for the `nvidia.com/mig.config` label.
    """
    classes = mig_classes(desc)
    return {
        "values": {
            "mig": {"strategy": strategy(desc)},
            "migManager": {"enabled": any(mig.is_partitioned(nc.gpu)
                                          for nc in classes.values()),
                           "config": {"name": configmap, "default": ALL_DISABLED}},
        },
        "configmap_data": {CONFIGMAP_KEY: mig_parted_yaml(desc)},
        "node_configs": {n: config_name(node.class_) for n, node in desc.nodes.items()
                         if node.class_ in classes},
    }


def plan(desc: Description) -> dict[str, Any]:
    """What the `mig` role needs, as the Ansible variable `gpupool_mig`.

    classes: per MIG-capable class, its config name, whether MIG is on, the layout, the
    devices it yields per GPU and whether applying it changes MIG mode (a GPU reset, or a
    reboot where the reset is refused); config: the mig-parted file's text; strategy and
    manager_enabled: the GPU Operator's values (see operator()).
    """
    classes = {}
    for name, nc in mig_classes(desc).items():
        layout = dict(sorted(nc.gpu.mig_profiles.items())) if mig.is_partitioned(nc.gpu) else {}
        classes[name] = {
            "config": config_name(name),
            "mig_enabled": bool(layout),
            "layout": layout,
            "instances_per_gpu": sum(layout.values()),
            "gpus": nc.gpu.count,
            "reset_needed": mig.needs_gpu_reset(nc.gpu),
        }
    return {"config": mig_parted_yaml(desc), "strategy": strategy(desc),
            "manager_enabled": any(c["mig_enabled"] for c in classes.values()),
            "classes": classes}
