"""A burst node's launch and boot as plain data: its image's parent, its launch template's
shape (root volume, EFA interfaces, zones) and the user-data that joins it to Slurm
(templates/burst-user-data.sh.tmpl, rendered by shell_template.py), with the facts it
leaves on the node; burst_plan gathers what BurstPool declares for a group.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from dataclasses import dataclass
from typing import Any

from gpupool.render import node_labels, shell_template
from gpupool.render.cloud.iam import group_teams
from gpupool.render.cloud.names import (
    SHARED,
    TAG_SLURM_NODE,
    boot_profile_name,
    munge_secret_name,
    run_profile_name,
    tags,
)
from gpupool.render.cloud.storage import mount_units, purpose_tier
from gpupool.spec import os_release
from gpupool.spec.catalog import (
    INSTANCE_TYPES,
    SLURMCTLD_PORT,
)
from gpupool.spec.facts import controllers
from gpupool.spec.model import (
    NAME_RE,
    BurstGroup,
    Capacity,
    Description,
    Purpose,
)

ROOT_VOLUME_GIB = 200  # OS, drivers and container image cache
# The burst image's parent: Debian's official AMIs, looked up by owner and name pattern
# (pinned here only), of the release burst nodes run (ami_name).
AMI_OWNER = "136693071363"


def ami_name(desc: Description) -> str:
    """The name pattern of Debian's AMIs of the burst nodes' release: the controllers'
    (gpupool/spec/os_release.py), whose Slurm the image installs."""
    return f"debian-{os_release.burst_release(desc).number}-amd64-*"
# The root device Debian's AMIs register (an image built from one keeps it): a launch
# template's or recipe's mapping on another name adds a second volume instead.
ROOT_DEVICE = "/dev/xvda"


def efa_interfaces(group: BurstGroup) -> int:
    """EFA interfaces a launch template can attach: what every fallback type supports."""
    if not group.efa:
        return 0
    return min(INSTANCE_TYPES[t].efa_interfaces for t in group.instance_types)


def group_zones(group: BurstGroup) -> list[str]:
    """A cluster placement group lives in one zone: EFA groups use the first declared
    zone; others spread over all of them."""
    return group.availability_zones[:1] if group.efa else list(group.availability_zones)


def controller_addresses(desc: Description) -> list[tuple[str, str]]:
    """(name, management address) of each Slurm controller, primary first: every burst node
    reaches them, and turns to the backup when the primary does not answer."""
    out = []
    for name in controllers(desc):
        node = desc.nodes[name]
        out.append((name, node.addresses.get("management") or next(iter(node.addresses.values()))))
    return out


MUNGE_KEY_PATH = "/etc/munge/munge.key"
SLURMD_DROPIN = "/etc/systemd/system/slurmd.service.d/gpupool-configless.conf"
# The spot watcher's unit, one per node name (roles/slurm/tasks/node_files.yml installs it;
# a test keeps the names equal).
SPOT_WATCH_UNIT = "gpupool-spot-watch@{}.service"
SPOT_WATCH_PROGRAM = "/usr/local/sbin/gpupool-spot-watch"  # slurm_spot_watch_program
# The acceptance gate's packages in the image (roles/acceptance_gate: acceptance_gate_dir
# + /lib; a test keeps them equal), what the user-data hands it and where its report stays.
GATE_LIB = "/opt/gpupool/gate/lib"
FACTS_PATH = "/etc/gpupool/burst.json"
GATE_REPORTS = "/var/lib/gpupool/gate"
# Bounds the whole gate at boot: its quick tier's own limit (gate/runner.py) plus start-up.
GATE_TIMEOUT_S = 240
# The client configuration a node that failed its gate reports with: slurmd never started,
# so there is no configless copy to read.
CLIENT_CONF = "/run/gpupool/slurm-client.conf"
# Bounded waits at boot: a node that cannot learn its name or key within them fails its
# user-data (and is terminated by suspend at ResumeTimeout) instead of hanging.
BOOT_ATTEMPTS, BOOT_RETRY_S = 10, 6
# Bounds the start of one network tier's mount at boot: its unit's own TimeoutSec (60 s,
# role storage's net.mount.j2) and systemd's start-up of it.
MOUNT_TIMEOUT_S = 75
# Role node_exporter's on Debian (roles/node_exporter/vars/Debian.yml).
NODE_EXPORTER_UNIT = "prometheus-node-exporter"
NODE_EXPORTER_DEFAULTS = "/etc/default/prometheus-node-exporter"
# Role dcgm's exporter unit, which reads its listen host from DCGM_EXPORTER_HOST
# (roles/dcgm/templates/dcgm-exporter.service.j2), and the drop-in a boot sets it in.
DCGM_EXPORTER_UNIT = "dcgm-exporter"
DCGM_EXPORTER_DROPIN = f"/etc/systemd/system/{DCGM_EXPORTER_UNIT}.service.d/gpupool-boot.conf"


def burst_facts(desc: Description, name: str, group: BurstGroup) -> dict[str, Any]:
    """What a burst node learns about itself at boot: read by the onboarding play and, as
    its expectation, by the acceptance gate (gpupool.gate.expect.burst_expect). The group's
    first instance type stands for all: validation keeps every fallback type to the same
    GPUs."""
    itype = INSTANCE_TYPES[group.instance_types[0]]
    release = os_release.burst_release(desc)
    return {"pool": desc.pool.name, "burst_group": name, "team": group.team or SHARED,
            "domain": desc.pool.domain, "environment": desc.pool.environment,
            "instance_type": itype.name, "gpus": itype.gpus, "gpu_model": itype.gpu_model,
            # The release the image is built on (ami_name) and whose lock it installs: the
            # gate refuses a node booted from an image of another release, whose Slurm the
            # controllers may not accept (an image pinned by gpupool:burstImageId from
            # before the controllers moved on).
            "os": release.value,
            "software": os_release.versions(desc, release),
            "teams": sorted(desc.teams), "ids": desc.ids.model_dump(mode="json"),
            # The tiers it mounts, as an on-prem compute node does (the image's storage
            # role renders and enables their units; the network ones come over the
            # hybrid link), and which the boot's gate checks before slurmd starts.
            "mounts": {n: t.mount.model_dump(mode="json")
                       for n, t in desc.storage_tiers.items() if t.mount is not None}}


# The instance metadata service (IPv4, and IPv6 where an instance enables it): the node
# role's credentials are one GET away there, and with them the munge key's secret and the
# checkpoints the role reaches. A job is a local process of its user, so only root may
# reach it: the user-data's table below, and the image's host firewall
# (roles/hardening: hardening_metadata_addresses; a test keeps them equal).
METADATA_ADDRESSES = ("169.254.169.254", "fd00:ec2::254")
METADATA_TABLE = "gpupool_metadata"


def metadata_root_only() -> list[str]:
    """An nftables ruleset in a table of its own (the hardening role replaces only its
    table): locally made packets to the metadata service leave only from root's sockets,
    and none is forwarded there (a container or pod on a bridge is never the host's root).
    Rejected, not dropped, so a caller fails at once instead of waiting out its timeout."""
    families = {a: "ip6" if ":" in a else "ip" for a in METADATA_ADDRESSES}
    return [
        f"table inet {METADATA_TABLE}",
        f"delete table inet {METADATA_TABLE}",
        f"table inet {METADATA_TABLE} {{",
        "  chain output {",
        "    type filter hook output priority filter; policy accept;",
        *(f"    {f} daddr {a} meta skuid != 0 reject" for a, f in families.items()),
        "  }",
        "  chain forward {",
        "    type filter hook forward priority filter; policy accept;",
        *(f"    {f} daddr {a} reject" for a, f in families.items()),
        "  }",
        "}",
    ]


def user_data(desc: Description, name: str, group: BurstGroup) -> str:
    """cloud-init's script for a burst group's instances: templates/burst-user-data.sh.tmpl
    (what it does, step by step, is told there) with the description's values, each one
    shell word. It leaves the facts onboarding needs on the node (the onboarding play finds
    nodes by their burst-group tag and reads these facts) and joins the node to Slurm by
    itself, within ResumeTimeout and without a person. With Kubernetes declared it also
    gives kubelet the labels and taints the node registers with (node_labels.py), picked
    by the capacity type the metadata service reports."""
    q = shlex.quote
    ctls = controller_addresses(desc)
    secret, run = munge_secret_name(desc), run_profile_name(desc, name)
    values: dict[str, shell_template.Value] = {
        "facts_dir": FACTS_PATH.rsplit("/", 1)[0], "facts_path": FACTS_PATH,
        "attempts": BOOT_ATTEMPTS, "retry_s": BOOT_RETRY_S,
        "node_tag_path": "tags/instance/" + TAG_SLURM_NODE, "name_re": NAME_RE,
        "region": group.region, "munge_secret": secret,
        "no_munge_key": f"gpupool: no munge key in {secret} (put it with --secret-binary)",
        "munge_key_new": MUNGE_KEY_PATH + ".new", "munge_key": MUNGE_KEY_PATH,
        "run_profile": run,
        "no_swap": f"gpupool: could not swap the boot profile for {run}: the boot fails",
        "node_exporter_defaults": NODE_EXPORTER_DEFAULTS,
        "node_exporter_unit": NODE_EXPORTER_UNIT,
        "dcgm_dropin_dir": DCGM_EXPORTER_DROPIN.rsplit("/", 1)[0],
        "dcgm_dropin": DCGM_EXPORTER_DROPIN, "dcgm_exporter_unit": DCGM_EXPORTER_UNIT,
        "gate_lib": GATE_LIB, "gate_timeout_s": GATE_TIMEOUT_S, "gate_reports": GATE_REPORTS,
        "client_conf_dir": CLIENT_CONF.rsplit("/", 1)[0], "client_conf": CLIENT_CONF,
        # What a node that failed its gate reports with: slurmd never read a configuration.
        "client_conf_lines": [f"ClusterName={desc.pool.name}",
                              *(f"SlurmctldHost={c}({a})" for c, a in ctls)],
        # slurmd --conf-server takes the controllers comma-separated, primary first.
        "conf_server": ",".join(
            f"[{a}]:{SLURMCTLD_PORT}" if ipaddress.ip_address(a).version == 6
            else f"{a}:{SLURMCTLD_PORT}" for _, a in ctls),
        "slurmd_dropin_dir": SLURMD_DROPIN.rsplit("/", 1)[0], "slurmd_dropin": SLURMD_DROPIN,
    }
    blocks: dict[str, list[str]] = {
        "metadata_rules": metadata_root_only(),
        # One line (json.dumps escapes newlines): it can never end its here-document.
        "facts": [json.dumps(burst_facts(desc, name, group), sort_keys=True)],
        "mount_starts": [f"timeout {MOUNT_TIMEOUT_S} systemctl start {q(unit)} || "
                         f"echo {q(f'gpupool: {unit} did not mount')} >&2"
                         for unit in mount_units(desc)],
    }
    if desc.kubernetes is not None:
        kinds = node_labels.burst_nodes(desc, name)
        # Unknown capacity (metadata unreachable): spot where the group may be spot.
        fallback = node_labels.SPOT if node_labels.SPOT in kinds else next(iter(kinds))
        blocks["kubelet_cases"] = [f"  {kind}) args={q(node_labels.kubelet_args(reg))} ;;"
                                   for kind, reg in kinds.items() if kind != fallback]
        values["kubelet_fallback_args"] = node_labels.kubelet_args(kinds[fallback])
    return shell_template.render_file(
        "burst-user-data.sh.tmpl", values, blocks=blocks,
        # Inside double quotes, where the shell expands $node: gpupool's own text.
        verbatim={"spot_watch_unit": SPOT_WATCH_UNIT.format("$node")},
        flags={"kubernetes": desc.kubernetes is not None})


@dataclass(frozen=True)
class BurstPlan:
    """What BurstPool declares for one burst group: its launch template's shape and
    user-data, its autoscaling group's bounds and capacity mix, and its two profiles
    (names, and what their policies need besides the roles' and buckets' ARNs)."""

    group: str
    region: str
    pool: str
    instance_types: list[str]  # the autoscaling group's overrides, in declared order
    min_nodes: int
    max_nodes: int
    zones: list[str]  # group_zones
    efa_interfaces: int  # efa_interfaces; 0: one plain interface, no placement group
    spot: bool  # spot allowed: on-demand only up to the base, capacity rebalancing
    on_demand_base: int
    # The root volume's key is the pool key where the group lives in the pool's cloud
    # region (the pool key lives there only); elsewhere the account's EBS key.
    pool_key_root: bool
    user_data: str  # user_data, the script itself
    run_profile: str  # run_profile_name
    boot_profile: str  # boot_profile_name
    datasets_tier: str | None  # the buckets the run role reads (iam.node_policy_for)
    checkpoints_tier: str | None
    teams: list[str]  # iam.group_teams: whose checkpoints the run role reaches
    key_region: str  # the pool key's
    tags: dict[str, str]


def burst_plan(desc: Description, name: str) -> BurstPlan:
    """BurstPool's args for a burst group."""
    group = desc.burst_groups[name]
    return BurstPlan(
        group=name, region=group.region, pool=desc.pool.name,
        instance_types=list(group.instance_types), min_nodes=group.min_nodes,
        max_nodes=group.max_nodes, zones=group_zones(group),
        efa_interfaces=efa_interfaces(group), spot=Capacity.SPOT in group.capacity,
        on_demand_base=group.on_demand_base if Capacity.ON_DEMAND in group.capacity else 0,
        pool_key_root=group.region == desc.pool.cloud_region,
        user_data=user_data(desc, name, group), run_profile=run_profile_name(desc, name),
        boot_profile=boot_profile_name(desc, name),
        datasets_tier=purpose_tier(desc, Purpose.DATASETS),
        checkpoints_tier=purpose_tier(desc, Purpose.CHECKPOINTS),
        teams=group_teams(desc, group), key_region=desc.pool.cloud_region,
        tags=tags(desc, group.team, **{"burst-group": name}))
