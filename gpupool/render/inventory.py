"""The Ansible inventory derived from a pool description.

Groups: role_*, class_*, site_*, leaf_*, rack_*, team_* (a node's owner team), gpu_*
(GPU model), burst_* (cloud nodes join these when they register), controller_primary and
image_registry (the declared registry's host).
Group names use underscores because Ansible rejects '-' in them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.render import ansible_yaml, environment_image, flows, node_labels, scheduling, slurm
from gpupool.render import mig_config as mig_render
from gpupool.render.cloud import iam, names
from gpupool.spec import os_release
from gpupool.spec.catalog import INSTANCE_TYPES
from gpupool.spec.connection import Connection
from gpupool.spec.facts import controller, gpu_capacity, rack_places
from gpupool.spec.model import Description, duration_seconds

PRIMARY_GROUP = "controller_primary"
REGISTRY_GROUP = "image_registry"  # the host of the declared registry (role image_registry)
# The pool-wide variables (pool_vars) are held once, by the primary controller's host
# variable POOL_WIDE, and `all` names each by a template that reads it there: in a play the
# reference costs nothing, but `ansible-inventory --list` (what AWX and Semaphore sync)
# writes every host's variables with its groups' merged in. Held in `all`, slurm.conf's
# node lines, every flow source's addresses and every team were copied into each host:
# 1.2 GB and 127 CPU-s at 1,000 nodes (bench/inventory.py has the figures since).
POOL_WIDE = "gpupool_pool_wide"


def group_name(prefix: str, name: str) -> str:
    return f"{prefix}_{name.replace('-', '_').replace('.', '_')}"


def storage_tiers(desc: Description) -> dict[str, Any]:
    """The storage tiers as role storage reads them (gpupool_storage_tiers)."""
    return {n: t.model_dump(mode="json") for n, t in desc.storage_tiers.items()}


def lustre_client(desc: Description) -> dict[str, Any] | None:
    """Where role storage installs the Lustre client from (None: no tier mounts Lustre)."""
    return desc.lustre_client.model_dump(mode="json") if desc.lustre_client else None


def health_plan(desc: Description) -> dict[str, Any]:
    h = desc.health
    return {"interval_s": duration_seconds(h.interval), "reset": h.reset.value,
            "reboot": h.reboot.value, "drain_timeout_s": duration_seconds(h.drain_timeout),
            "isolate_after": h.isolate_after, "window_s": duration_seconds(h.window)}


def backup_plan(desc: Description) -> dict[str, Any] | None:
    """roles/controller_backup's plan: when and how many, and the bucket they go to."""
    b = desc.backup
    if b is None:
        return None
    return {"interval_s": duration_seconds(b.interval), "keep": b.keep,
            "bucket": names.bucket_name(desc, b.tier), "prefix": iam.BACKUP_PREFIX,
            "region": desc.pool.cloud_region}


def sync_plan(desc: Description) -> list[dict[str, Any]]:
    """roles/storage_sync's plan: each `both` tier's declared copy between its mount and its
    bucket, run from the primary controller (which mounts every tier)."""
    return [{"tier": name, "path": t.mount.path, "bucket": names.bucket_name(desc, name),
             "region": desc.pool.cloud_region, "direction": t.sync.direction.value,
             "interval_s": t.sync.every_minutes * 60, "delete": t.sync.delete}
            for name, t in desc.storage_tiers.items()
            if t.sync is not None and t.mount is not None]


def pool_vars(desc: Description) -> dict[str, Any]:
    """Variables every host sees: the pool-wide parts of the description."""
    return {
        "gpupool_pool": desc.pool.model_dump(mode="json"),
        "gpupool_software": os_release.lock(desc),
        "gpupool_segments": {
            n: s.model_dump(mode="json") for n, s in desc.network.segments.items()},
        "gpupool_flows": [f.model_dump(mode="json", by_alias=True) for f in desc.network.flows],
        "gpupool_admin_cidrs": list(desc.network.admin_cidrs),
        "gpupool_teams": {n: t.model_dump(mode="json") for n, t in desc.teams.items()},
        "gpupool_ids": desc.ids.model_dump(mode="json"),
        "gpupool_task_classes": {
            n: c.model_dump(mode="json") for n, c in desc.task_classes.items()},
        "gpupool_storage_tiers": storage_tiers(desc),
        "gpupool_lustre_client": lustre_client(desc),
        "gpupool_gpu_capacity": gpu_capacity(desc),
        # The declared Kubernetes cluster (CNI, control plane), or None: no cluster.
        "gpupool_kubernetes": (desc.kubernetes.model_dump(mode="json")
                               if desc.kubernetes else None),
        # Per flow source segment, the addresses its flows let in (gpupool/render/flows.py):
        # once for the pool, so the inventory grows linearly with it.
        "gpupool_flow_sources": {s: list(a) for s, a in flows.segment_sources(desc).items()},
        # The scheduler policy the slurm role applies (gpupool/render/slurm.py).
        "gpupool_slurm": slurm.plan(desc),
        # MIG layouts: mig-parted's config per class, the GPU Operator's strategy
        # (gpupool/render/mig_config.py), read by the mig and gpu_operator roles.
        "gpupool_mig": mig_render.plan(desc),
        # The health loop's timer and policy (roles/acceptance_gate, gpupool/gate/health.py),
        # durations in seconds so no role parses them.
        "gpupool_health": health_plan(desc),
        "gpupool_backup": backup_plan(desc),
        # Declared copies between `both` tiers' mounts and buckets (roles/storage_sync).
        "gpupool_storage_sync": sync_plan(desc),
        # The backup controller and the tier both controllers keep Slurm's state on, or None.
        "gpupool_failover": desc.failover.model_dump(mode="json") if desc.failover else None,
        # Idle-GPU reclaim per task class (gpupool/render/scheduling.py), for the controller.
        "gpupool_idle_reclaim": scheduling.idle_reclaim_plan(desc),
        # The declared image registry and the images it serves (role image_registry), or
        # None: no registry.
        "gpupool_image_registry": environment_image.registry_plan(desc),
        **({"gpupool_description_file": str(desc.source)} if desc.source else {}),
    }


def host_vars(desc: Description, name: str, places: dict[str, Any] | None = None,
              sources: dict[str, tuple[str, ...]] | None = None) -> dict[str, Any]:
    """One host's variables; pass places and sources, computed once, for many hosts."""
    node = desc.nodes[name]
    place = (places or rack_places(desc))[node.rack]
    cls = desc.node_classes[node.class_]
    return {
        "ansible_host": node.addresses["management"],
        "gpupool_node": {
            "name": name,
            "class": node.class_,
            # The Debian release the node runs (its class's `os`): the roles' lock is that
            # release's (group os_<release>'s gpupool_software where it has its own).
            "os": cls.os.value,
            "roles": [r.value for r in node.roles],
            "site": place.site,
            "leaf": place.leaf,
            "rack": node.rack,
            "owner_team": node.owner_team,
            "addresses": dict(node.addresses),
            "gpu": cls.gpu.model_dump(mode="json") if cls.gpu else None,
            "nics": [n.model_dump(mode="json") for n in cls.nics],
            "cpus": cls.cpus,
            "memory_gib": cls.memory_gib,
            "nvme": cls.nvme.model_dump(mode="json"),
            # What kubelet registers the node with: the labels Kueue's flavors select and
            # the taints they tolerate (gpupool/render/node_labels.py); None: no cluster.
            "kubernetes": node_labels.onprem_node(desc, name),
            # Inbound firewall allowances from the declared flows (gpupool/render/flows.py).
            "inbound": flows.inbound_vars(
                desc, name, flows.segment_sources(desc) if sources is None else sources),
        },
    }


def pool_wide_reference(var: str) -> ansible_yaml.Template:
    """`all`'s value for var, a pool-wide variable: the primary controller's copy, which
    every host reads through hostvars (there in any play, whatever its hosts or --limit)."""
    return ansible_yaml.Template(
        f"{{{{ hostvars[groups['{PRIMARY_GROUP}'][0]].{POOL_WIDE}.{var} }}}}")


def build(desc: Description, extra_vars: dict[str, Any] | None = None,
          connection: Connection | None = None, cache_dir: Path | None = None
          ) -> dict[str, Any]:
    """An inventory in Ansible's YAML inventory format; connection settings (the stack
    config's, gpupool/spec/connection.py) go to `all` and to the site_* groups. cache_dir,
    the pool project's .cache, is where the roles keep what they make on the control host
    (`gpupool_cache_dir`): an installed gpupool's playbooks live inside the package, where
    nothing should be written."""
    connection = connection or Connection()
    if cache_dir is not None:
        extra_vars = {"gpupool_cache_dir": str(cache_dir), **(extra_vars or {})}
    groups: dict[str, set[str]] = {}
    places = rack_places(desc)
    sources = flows.segment_sources(desc)

    def add(group: str, host: str | None = None) -> None:
        members = groups.setdefault(group, set())
        if host is not None:
            members.add(host)

    for name, node in desc.nodes.items():
        place = places[node.rack]
        for role in node.roles:
            add(group_name("role", role.value), name)
        add(group_name("class", node.class_), name)
        add(group_name("os", desc.node_classes[node.class_].os.value), name)
        add(group_name("site", place.site), name)
        add(group_name("leaf", place.leaf), name)
        add(group_name("rack", node.rack), name)
        if node.owner_team:
            add(group_name("team", node.owner_team), name)
        gpu = desc.node_classes[node.class_].gpu
        if gpu is not None:
            add(group_name("gpu", gpu.model), name)
    # The primary controller alone: the accounting database, metrics, backups and the
    # record of rollouts live there (a backup controller is in role_controller too).
    add(PRIMARY_GROUP, controller(desc))
    if desc.image_registry is not None:
        add(REGISTRY_GROUP, desc.image_registry.host)
    for team in desc.teams:
        add(group_name("team", team))
    for burst in desc.burst_groups:
        add(group_name("burst", burst))

    pool = pool_vars(desc)
    hosts = {n: host_vars(desc, n, places, sources) for n in desc.nodes}
    hosts[controller(desc)][POOL_WIDE] = pool
    children: dict[str, Any] = {
        g: ({"hosts": dict.fromkeys(sorted(h))} if h else {}) for g, h in sorted(groups.items())
    }
    for release in desc.software.per_release:
        # A release with versions of its own: its hosts' lock replaces the pool's.
        if (group := group_name("os", release.value)) in children:
            children[group]["vars"] = {"gpupool_software": os_release.lock(desc, release)}
    for site in desc.sites:
        if site_vars := connection.site_vars(site):
            children.setdefault(group_name("site", site), {})["vars"] = site_vars
    return {
        "all": {
            "hosts": hosts,
            "vars": {**{k: pool_wide_reference(k) for k in pool},
                     **connection.all.ansible_vars(), **(extra_vars or {})},
            "children": children,
        }
    }


def burst_image_vars(desc: Description, region: str) -> dict[str, Any]:
    """The variables playbooks/burst_image.yml runs with on an image builder's instance,
    which no inventory knows: the pool-wide parts the image's roles read (the lock, the
    teams' users and groups) and a `gpupool_node` for a burst node of the region. A burst
    node has no declared address or class; its host firewall admits any of its addresses
    (flows.burst_inbound), beside its security groups (infra/network.py), and its
    Kubernetes registration comes at boot (launch.user_data)."""
    groups = [g for g in desc.burst_groups.values() if g.region == region]
    if not groups:
        raise ValueError(f"no burst group bursts in {region}")
    first = INSTANCE_TYPES[groups[0].instance_types[0]]
    sources = flows.segment_sources(desc)
    return {
        "gpupool_pool": desc.pool.model_dump(mode="json"),
        "gpupool_software": os_release.lock(desc, os_release.burst_release(desc)),
        "gpupool_teams": {n: t.model_dump(mode="json") for n, t in desc.teams.items()},
        "gpupool_ids": desc.ids.model_dump(mode="json"),
        # The tiers whose mount units the image carries (role storage).
        "gpupool_storage_tiers": storage_tiers(desc),
        "gpupool_lustre_client": lustre_client(desc),
        # The host firewall's sources; the health policy (read by the roles' argument
        # specs, whose defaults Ansible resolves even where the playbook sets the option);
        # and no description (the image runs no health loop: a burst node gates itself at
        # boot from its facts).
        "gpupool_flow_sources": {k: list(v) for k, v in sources.items()},
        "gpupool_health": health_plan(desc),
        "gpupool_description_file": "",
        # The slurm role's NVML plugin for the image's slurmd (its default reads the
        # pool's Slurm plan, which an image build has none of): empty where none fits.
        "slurm_nvml_plugin_version": slurm.nvml_plugin_version(desc) or "",
        "gpupool_node": {
            "name": f"burst-image-{region}",
            "roles": ["compute"],
            "addresses": {},
            # The region's first instance type; the catalog knows no interconnect, so the
            # image has no fabric manager (playbooks/burst_image.yml says what is left).
            "gpu": {"model": first.gpu_model, "count": first.gpus,
                    "memory_gib": first.gpu_memory_gib},
            "kubernetes": None,
            "inbound": flows.burst_inbound_vars(desc, sources),
        },
    }
