"""Slurm policy rendered from the scheduling model and the description's facts.

Pure functions: a Description in, configuration lines and an accounting plan out. The
`slurm` Ansible role writes them into files next to its own daemon settings (ports, paths,
users), so every value that comes from the pool description is computed here once.

Policy choices (see roles/slurm/README.md for the why):
- one partition per task class; PriorityTier = class priority and
  preempt/partition_prio: a higher tier preempts a lower one only where the lower
  partition is preemptible (PreemptMode=REQUEUE, GraceTime from the description);
- one QOS per class (partition QOS) carrying MaxWall, so limits show in sacctmgr;
- one account per team: GrpTRES = quota + borrowing limit (the most GPUs a team may hold
  at once, as Kueue's nominal quota + borrowing limit), fairshare shares = quota, usage
  counted in GPU-seconds (TRESBillingWeights); a team's MIG quota adds
  gres/gpu:<profile> caps (every MIG instance is one gres/gpu, and bills as one);
- MIG-partitioned nodes offer their instances as GRES typed by profile
  (Gres=gpu:1g.10gb:28), never whole GPUs;
- burst groups as State=CLOUD nodes with power saving; on-prem nodes never suspend. Cloud
  nodes serve every class but the top one: its jobs must start in seconds, so on a full
  pool they preempt rather than wait minutes for a cloud node to boot (Slurm would pick a
  powered-down node over preemption).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpupool.render.cloud import launch, names
from gpupool.render.cloud.launch import controller_addresses
from gpupool.render.scheduling import ClassPolicy, class_policies, preemption_pairs, team_share
from gpupool.spec import gpu_detection as gpu_detection_spec
from gpupool.spec import os_release
from gpupool.spec.catalog import BURST_SEGMENT, SLURM_MAX_PRIORITY_TIER, SRUN_PORTS
from gpupool.spec.facts import (
    burst_capacity_split,
    burst_gpus_per_node,
    burst_instance_types,
    burst_model,
    controller,
    gpu_nodes,
    preemption_slurm_expressible,
    rack_places,
)
from gpupool.spec.mig import is_partitioned
from gpupool.spec.model import Capacity, Description, NodeRole, duration_seconds

# Slurm caps PriorityTier and PriorityJobFactor at this value.
MAX_TIER = SLURM_MAX_PRIORITY_TIER
# Usable memory is below the installed amount (kernel, firmware, daemons); a node that
# reports less than RealMemory is drained, so declare a little less than installed.
USABLE_MEMORY = 0.95
# Where the role installs the burst programs on the controller.
RESUME_PROGRAM = "/usr/local/sbin/gpupool-burst-resume"
SUSPEND_PROGRAM = "/usr/local/sbin/gpupool-burst-suspend"
BURST_CONFIG = "/etc/slurm/gpupool-burst.json"
# How long a burst node that found no capacity in any declared type and market stays
# DOWN before Slurm may pick it again (AWS ParallelCluster's insufficient_capacity_timeout
# default): long enough for Slurm to place the jobs elsewhere, short enough that capacity
# coming back is used within minutes.
BURST_CAPACITY_BLACKOUT_S = 600
# Slurm's saved state under the failover state tier's mount, one directory per pool, so
# pools sharing a filer never share a queue.
STATE_DIR = "{mount}/slurmctld-{pool}"
BILLING = "CPU=0,GRES/gpu=1"  # fairshare on GPU-seconds only
# slurm.conf PrivateData (Slurm 22.05): what a user sees of others' jobs (squeue, scontrol
# show job), usage (sprio, sshare), users and accounts and reservations is nothing; the slurm
# role's slurmdbd.conf carries the same flags, for sacct and sacctmgr (slurmdbd answers them
# by its own PrivateData). Only root, SlurmUser, AdminLevel operators and coordinators (their
# accounts') see others' jobs, and each may also change them, so the scheduler exporter
# (roles/slurm_exporter) never lists jobs as itself: root's sandboxed snapshot runs the
# fixed read-only commands and the unprivileged exporter serves from it.
PRIVATE_DATA = ("accounts", "jobs", "reservations", "usage", "users")
GPU_DEVICE = "/dev/nvidia{}"
# Lab only: the character devices standing in for GPUs take the NVIDIA driver's own major
# for /dev/nvidia<N>, so slurmd counts them where gres.conf names them.
GPU_FIXTURE_MAJOR = 195
# Lab only: the character devices standing in for MIG instances, named like the driver's
# MIG capability devices (real ones have a dynamic major; the fixture takes 240, the first
# of Linux's local/experimental character majors).
MIG_FIXTURE_DEVICE = "/dev/nvidia-caps/nvidia-cap{}"
MIG_FIXTURE_MAJOR = 240

# Daemon tuning by environment. The lab runs in unprivileged containers (no cgroup
# writes, fewer cores than declared) and wants fast turnaround for its tests.
TUNING: dict[str, dict[str, str]] = {
    "lab": {
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "SlurmdParameters": "config_overrides",
        "SchedulerParameters": ("sched_interval=2,bf_interval=1,bf_resolution=1,bf_continue,"
                                "batch_sched_delay=0,sched_min_interval=0,"
                                "default_queue_depth=1000"),
        "AuthInfo": "cred_expire=10",
        "SlurmdTimeout": "10",
        "MessageTimeout": "5",
        "KillWait": "2",
        "MinJobAge": "600",
        "PriorityCalcPeriod": "1",
        "PriorityDecayHalfLife": "1-0",
        "SuspendTime": "30",
        "SuspendTimeout": "30",
        "ResumeTimeout": "180",
    },
    "production": {
        "ProctrackType": "proctrack/cgroup",
        "TaskPlugin": "task/cgroup,task/affinity",
        "SchedulerParameters": "bf_continue,bf_max_job_test=1000,default_queue_depth=1000",
        "SlurmdTimeout": "300",
        "MessageTimeout": "30",
        "KillWait": "30",
        "MinJobAge": "300",
        "PriorityCalcPeriod": "5",
        "PriorityDecayHalfLife": "7-0",
        "SuspendTime": "600",
        "SuspendTimeout": "120",
        "ResumeTimeout": "900",
    },
}


class SlurmPolicyError(ValueError):
    """The description asks for something this Slurm rendering cannot express."""


@dataclass(frozen=True)
class SlurmNode:
    name: str
    addr: str | None  # None: a cloud node, whose address comes when it registers
    cpus: int
    real_memory_mb: int
    gpu_model: str
    gpus: int
    features: tuple[str, ...]
    weight: int
    cloud: bool
    leaf: str  # leaf switch, or the burst group for cloud nodes
    # MIG-partitioned nodes: (profile, instances on the node), sorted by profile; their
    # GRES are these instances, typed by profile, instead of whole GPUs.
    mig: tuple[tuple[str, int], ...] = ()

    @property
    def gres(self) -> list[tuple[str, int]]:
        """(GRES type, count): the GPU model for whole GPUs, else one per MIG profile."""
        return list(self.mig) if self.mig else [(self.gpu_model, self.gpus)]


def is_lab(desc: Description) -> bool:
    return desc.pool.environment == "lab"


SCHED_INTERVAL_DEFAULT_S = 60  # slurm.conf(5): sched_interval


def sched_interval_s(desc: Description) -> int:
    """Seconds between the main scheduler's full passes in the rendered slurm.conf."""
    params = TUNING["lab" if is_lab(desc) else "production"]["SchedulerParameters"]
    given = dict(p.split("=", 1) for p in params.split(",") if "=" in p)
    return int(given.get("sched_interval", SCHED_INTERVAL_DEFAULT_S))


def hostlist(names: Iterable[str]) -> str:
    """Compress names the way Slurm writes them: gpu1,gpu2,gpu3,x -> gpu[1-3],x."""
    runs: dict[str, list[int]] = defaultdict(list)
    order: list[str] = []
    for name in names:
        m = re.fullmatch(r"(.*?)(0|[1-9]\d*)", name)
        key = m[1] if m else name
        if key not in runs and key not in order:
            order.append(key)
        if m:
            runs[key].append(int(m[2]))
    out = []
    for key in order:
        nums = sorted(runs.get(key, []))
        if not nums:
            out.append(key)
            continue
        spans: list[tuple[int, int]] = []
        for n in nums:
            if spans and n == spans[-1][1] + 1:
                spans[-1] = (spans[-1][0], n)
            else:
                spans.append((n, n))
        if len(nums) == 1:
            out.append(f"{key}{nums[0]}")
            continue
        inner = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
        out.append(f"{key}[{inner}]")
    return ",".join(out)


def time_limit(seconds: int) -> str:
    """Seconds as Slurm's D-HH:MM:SS."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def burst_node_names(group: str, max_nodes: int) -> list[str]:
    return [f"{group}-{i}" for i in range(max_nodes)]


def nodes(desc: Description) -> list[SlurmNode]:
    """On-prem GPU nodes first (weight 1), then every burst group's cloud nodes."""
    places = rack_places(desc)
    out = []
    for name in gpu_nodes(desc):
        node = desc.nodes[name]
        cls = desc.node_classes[node.class_]
        if cls.gpu is None:  # gpu_nodes() only returns GPU nodes
            continue
        leaf = places[node.rack].leaf
        mig = tuple(sorted((p, n * cls.gpu.count) for p, n in cls.gpu.mig_profiles.items())
                    ) if is_partitioned(cls.gpu) else ()
        out.append(SlurmNode(
            name, node.addresses["management"], cls.cpus,
            int(cls.memory_gib * 1024 * USABLE_MEMORY), cls.gpu.model, cls.gpu.count,
            ("onprem", node.class_, cls.gpu.model, leaf), 1, False, leaf, mig))
    for group_name, group in desc.burst_groups.items():
        types = burst_instance_types(group)
        # Any fallback type must satisfy the node definition: declare the smallest.
        cpus = min(t.vcpus for t in types)
        mem = int(min(t.memory_gib for t in types) * 1024 * USABLE_MEMORY)
        model = burst_model(group)
        out.extend(
            SlurmNode(n, None, cpus, mem, model, burst_gpus_per_node(group),
                      ("burst", group_name, model), 1000, True, group_name)
            for n in burst_node_names(group_name, group.max_nodes))
    return out


# Slurm's configuration files have one record per line of KEY=VALUE words split at
# whitespace; `#` starts a comment anywhere, quotes group words, and `=` in a name reads as
# another key. A value from the description holding any of these (or anything but printable
# ASCII) is refused, never quoted: validation allows none of them, so benign files stay the
# same and a value that got past it still cannot add a key, a record or a line.
_UNSAFE = re.compile(r"""[^\x21-\x7e]|[#="'\\]""")
_BILLING_QUOTED = f'"{BILLING}"'


def _word(value: Any, what: str) -> str:
    text = str(value)
    if not text or _UNSAFE.search(text):
        raise SlurmPolicyError(f"gpupool refuses {what} {text!r} in Slurm's configuration: "
                               "only printable ASCII without spaces, #, =, quotes or \\")
    return text


def _line(pairs: Iterable[tuple[str, Any]]) -> str:
    # TRESBillingWeights is the one quoted value, and it is a constant of this module.
    return " ".join(f"{k}={v if v == _BILLING_QUOTED else _word(v, k)}"
                    for k, v in pairs if v is not None and v != "")


def _check_preemption(desc: Description, classes: list[ClassPolicy]) -> None:
    """partition_prio lets every higher tier preempt every preemptible lower tier. Refuse
    a description whose preemption pairs differ, rather than render a different policy."""
    # Validation refuses these already (rules.preemption); a renderer handed an unchecked
    # model still refuses rather than render a different policy.
    expressible = preemption_slurm_expressible(desc)
    wanted = preemption_pairs(desc)
    if wanted != expressible:
        raise SlurmPolicyError(
            "task classes: Slurm partition priority preemption needs every class to "
            "preempt exactly the preemptible classes of lower priority; wanted "
            f"{sorted(wanted)}, expressible {sorted(expressible)}")
    for c in classes:
        if c.priority > MAX_TIER:
            raise SlurmPolicyError(f"task class {c.name}: priority {c.priority} is above "
                                   f"Slurm's maximum PriorityTier {MAX_TIER}")
        if c.preemptible and not c.requeue:
            raise SlurmPolicyError(f"task class {c.name}: preemptible classes are requeued "
                                   "in this policy; set requeue: true")


def gpu_models(desc: Description) -> list[str]:
    return sorted({n.gpu_model for n in nodes(desc)})


def mig_types(desc: Description) -> list[str]:
    """The MIG profiles some node offers, as GRES types. A type is matched as a substring
    of the profile NVML reports (nvidia_a100_3g.40gb), so the plain profile name serves
    every model that has it."""
    return sorted({p for n in nodes(desc) for p, _ in n.mig})


def tres(desc: Description) -> list[str]:
    """TRES accounting must know before limits can name them (gres/gpu, per model and per
    MIG profile)."""
    return ["gres/gpu", *(f"gres/gpu:{m}" for m in gpu_models(desc)),
            *(f"gres/gpu:{p}" for p in mig_types(desc))]


def slurm_conf(desc: Description) -> list[str]:
    """The description-derived part of slurm.conf (the role adds daemon settings)."""
    classes = class_policies(desc)
    _check_preemption(desc, classes)
    ctl_addr = desc.nodes[controller(desc)].addresses["management"]
    tuning = TUNING[desc.pool.environment]
    all_nodes = nodes(desc)
    cloud = [n for n in all_nodes if n.cloud]
    onprem = [n for n in all_nodes if not n.cloud]
    min_mem_per_cpu = min(n.real_memory_mb // n.cpus for n in all_nodes)
    lines = [
        f"ClusterName={_word(desc.pool.name, 'ClusterName')}",
        # Primary first: the second takes over when the first is silent SlurmctldTimeout.
        *(f"SlurmctldHost={_word(c, 'SlurmctldHost')}({_word(a, 'SlurmctldHost')})"
          for c, a in controller_addresses(desc)),
        f"AccountingStorageHost={_word(ctl_addr, 'AccountingStorageHost')}",
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageTRES={_word(','.join(tres(desc)), 'AccountingStorageTRES')}",
        "AccountingStorageEnforce=associations,limits,qos",
        "GresTypes=gpu",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={min_mem_per_cpu}",
        "TopologyPlugin=topology/tree",
        "PriorityType=priority/multifactor",
        "PriorityWeightFairshare=10000",
        "PriorityWeightPartition=1000",
        "PriorityWeightQOS=1000",
        "PriorityWeightAge=100",
        "PriorityMaxAge=7-0",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "JobRequeue=1",
        "EnforcePartLimits=ALL",
        # The firewall admits steps' daemons to srun only on these (render/flows.py).
        f"SrunPortRange={SRUN_PORTS[0]}-{SRUN_PORTS[1]}",
        "ReturnToService=2",
        # Researchers see their own jobs, usage, user and accounts (their coordinators their
        # accounts'), never another team's: root, SlurmUser and AdminLevel operators see all.
        # `cloud` is no privacy flag but the opposite: powered-down burst nodes listed.
        "PrivateData=" + ",".join([*PRIVATE_DATA, *(["cloud"] if cloud else [])]),
    ]
    lines += [f"{k}={v}" for k, v in tuning.items()
              if k not in {"SuspendTime", "SuspendTimeout", "ResumeTimeout"}]
    if desc.failover:
        lines.append(f"SlurmctldTimeout={duration_seconds(desc.failover.takeover_after)}")
    if cloud:
        lines += [
            f"ResumeProgram={RESUME_PROGRAM}",
            f"SuspendProgram={SUSPEND_PROGRAM}",
            *(f"{k}={tuning[k]}" for k in ("SuspendTime", "SuspendTimeout", "ResumeTimeout")),
            "ResumeRate=0",
            "SuspendRate=0",
            "TreeWidth=65533",
            # enable_configless: a burst node boots with `slurmd --conf-server` and takes
            # slurm.conf, gres.conf and the rest from the controller, so an image never
            # carries a stale copy of the pool's configuration.
            "SlurmctldParameters=enable_configless,idle_on_node_suspend,cloud_reg_addrs",
            f"SuspendExcNodes={_word(hostlist(n.name for n in onprem), 'SuspendExcNodes')}",
        ]
    for n in all_nodes:
        lines.append(_line([
            ("NodeName", n.name), ("NodeAddr", n.addr), ("CPUs", n.cpus),
            ("RealMemory", n.real_memory_mb),
            ("Gres", ",".join(f"gpu:{t}:{c}" for t, c in n.gres)),
            ("Feature", ",".join(n.features)), ("Weight", n.weight),
            ("State", "CLOUD" if n.cloud else "UNKNOWN")]))
    for i, c in enumerate(classes):
        members = onprem if i == 0 else all_nodes
        lines.append(_line([
            ("PartitionName", c.name), ("Nodes", hostlist(n.name for n in members)),
            ("Default", "YES" if i == len(classes) - 1 else None),
            ("PriorityTier", c.priority), ("PriorityJobFactor", c.priority),
            ("QOS", c.name), ("MaxTime", time_limit(c.max_runtime_s)),
            ("DefaultTime", time_limit(c.max_runtime_s)),
            ("PreemptMode", "REQUEUE" if c.preemptible else "OFF"),
            ("GraceTime", c.grace_s if c.preemptible and c.grace_s else None),
            ("OverSubscribe", "NO"), ("TRESBillingWeights", _BILLING_QUOTED),
            ("State", "UP")]))
    return lines


def _range(first: int, count: int) -> str:
    return f"[{first}-{first + count - 1}]" if count > 1 else str(first)


def gpu_detection(desc: Description) -> gpu_detection_spec.Detection:
    """How slurmd finds GPUs with the locked Slurm of the pool's release
    (gpupool/spec/gpu_detection.py, os_release.slurm_lock): NVML autodetection where the
    plugin fits the lock, else the device files gres.conf names."""
    return gpu_detection_spec.resolve(os_release.slurm_lock(desc))


def nvml_plugin_version(desc: Description) -> str | None:
    """The NVML plugin build the slurm role installs on GPU nodes (None: none). The lab
    installs none: its gres.conf names fixture devices, and its hosts' apt sources are the
    lab mirror and Debian's main, without the plugin's contrib."""
    return None if is_lab(desc) else gpu_detection(desc).plugin_version


def gres_conf(desc: Description) -> list[str]:
    """Which devices each node's GPUs are, for slurmd.

    Production with the NVML plugin installable beside the locked Slurm
    (gpu_detection): `AutoDetect=nvml`; whole GPUs are named too (/dev/nvidiaN, which NVML
    then confirms), MIG nodes not: NVML finds the instances, their capability device files
    and UUIDs, and slurm.conf's typed Gres (gpu:1g.10gb:28) is all Slurm needs.

    Production without it (Debian 12: its plugin pins a Slurm build below the version
    floor): `AutoDetect=off` and a comment saying why; every whole GPU is named by its
    device file, typed by model. A MIG node cannot be named (the driver numbers its
    capability files when it makes the instances): validation refuses that description
    (rule mig-needs-nvml) and this refuses to render it.

    The lab's nodes have no GPUs: they name character devices the lab creates as a
    fixture (/dev/nvidiaN, major 195), each MIG instance a fixture device of its own
    (MIG_FIXTURE_DEVICE), numbered per node in the order of these lines.
    """
    lab = is_lab(desc)
    detection = None if lab else gpu_detection(desc)
    lines: list[str] = []
    if detection is not None and detection.available:
        lines.append("AutoDetect=nvml")
    elif detection is not None:
        lines += [f"# No NVML autodetection: {detection.reason}.",
                  "# Each GPU is named by its device file instead.", "AutoDetect=off"]
    # Nodes with the same devices share a line; a whole-GPU shape is one (model, count).
    by_shape: dict[tuple[bool, tuple[tuple[str, int], ...]], list[str]] = defaultdict(list)
    for n in nodes(desc):
        if n.mig and not lab:
            if detection is not None and not detection.available:
                raise SlurmPolicyError(
                    f"node {n.name}: its MIG instances can only be found by NVML "
                    f"autodetection, which this Slurm lock cannot install ({detection.reason})")
            continue
        by_shape[(bool(n.mig), tuple(n.gres))].append(n.name)
    for (is_mig, shape), hosts in by_shape.items():
        first = 0
        for gres_type, count in shape:
            files = (MIG_FIXTURE_DEVICE if is_mig else GPU_DEVICE).format(_range(first, count))
            lines.append(_line([("NodeName", hostlist(hosts)), ("Name", "gpu"),
                                ("Type", gres_type), ("File", files)]))
            first += count
    return lines


def topology_conf(desc: Description) -> list[str]:
    """A tree: leaf switches under their site; several sites under the pool. Burst groups
    get a switch of their own, so no job spans on-prem and cloud nodes."""
    leaves: dict[str, list[str]] = defaultdict(list)
    for n in nodes(desc):
        leaves[n.leaf].append(n.name)
    lines = [_line([("SwitchName", leaf), ("Nodes", hostlist(names))])
             for leaf, names in leaves.items()]
    sites = [site for site, s in desc.sites.items()
             if any(leaf in leaves for leaf in s.leaf_switches)]
    for site in sites:
        children = [leaf for leaf in desc.sites[site].leaf_switches if leaf in leaves]
        lines.append(_line([("SwitchName", site), ("Switches", hostlist(children))]))
    if len(sites) > 1:
        lines.append(_line([("SwitchName", desc.pool.name), ("Switches", hostlist(sites))]))
    return lines


def cgroup_conf(desc: Description) -> list[str]:
    if is_lab(desc):
        # Unprivileged lab hosts cannot write cgroups; the plugins that read this are off.
        return ["CgroupPlugin=autodetect", "IgnoreSystemd=yes"]
    return ["CgroupPlugin=autodetect", "ConstrainCores=yes", "ConstrainDevices=yes",
            "ConstrainRAMSpace=yes", "ConstrainSwapSpace=yes"]


def accounting(desc: Description) -> dict[str, Any]:
    """What sacctmgr must hold: QOS per class, account per team, users per membership.

    `limits` are applied only after slurmctld has registered the TRES they name.
    """
    classes = class_policies(desc)
    qos = [{"name": c.name, "Priority": c.priority, "MaxWall": time_limit(c.max_runtime_s)}
           for c in classes]
    accounts, limits = [], []
    for team, t in desc.teams.items():
        share = team_share(desc, team)
        accounts.append({"name": team, "Organization": t.cost_centre,
                         "Description": f"team {team}", "Fairshare": share.fair_share})
        caps = {f"gres/gpu:{q.model}": q.nominal + q.borrowing for q in share.quotas}
        # A MIG quota caps instances of a profile; each instance counts as one gres/gpu,
        # so the team's total grows by it. Profiles without one are bounded by the total.
        caps |= {f"gres/gpu:{p}": n for p, n in share.mig}
        grp = {"gres/gpu": sum(caps.values()), **caps}
        limits.append({"account": team,
                       "GrpTRES": ",".join(f"{k}={v}" for k, v in grp.items())})
    users: list[dict[str, Any]] = []
    default_account: dict[str, str] = {}
    for team, t in desc.teams.items():
        for role, members in t.members.items():
            for user in members:
                default_account.setdefault(user, team)
                users.append({"name": user, "account": team, "role": role.value,
                              "DefaultAccount": default_account[user]})
    coordinators = [{"account": u["account"], "name": u["name"]}
                    for u in users if u["role"] == "admin"]
    return {"cluster": desc.pool.name, "tres": tres(desc), "qos": qos,
            "accounts": accounts, "users": users, "coordinators": coordinators,
            "limits": limits}


def burst_config(desc: Description) -> dict[str, Any]:
    """What the resume/suspend programs need, per burst group (see gpupool.onhost.burst)."""
    return {"resume_program": RESUME_PROGRAM, "suspend_program": SUSPEND_PROGRAM,
            "config": BURST_CONFIG, "pool": desc.pool.name,
            # slurm.conf's: the suspend program drains a gate's failure again after it.
            "suspend_timeout_s": int(TUNING[desc.pool.environment]["SuspendTimeout"]),
            "groups": {
        name: {"region": g.region, "nodes": burst_node_names(name, g.max_nodes),
               "instance_types": list(g.instance_types),
               # The name infra/program.py gives the group's BurstPool and launch template.
               "launch_template": names.burst_name(desc, name),
               "capacity": [c.value for c in g.capacity],
               # How many of its nodes start on-demand, as its Auto Scaling distribution.
               "on_demand_nodes": burst_capacity_split(g).get(Capacity.ON_DEMAND.value, 0),
               # Where its instances go: the pool's subnets of this segment in these zones
               # (one zone with EFA), in the cluster placement group when EFA is declared.
               "zones": launch.group_zones(g),
               "subnet_segment": BURST_SEGMENT,
               "placement_group": names.burst_name(desc, name) if launch.efa_interfaces(g)
               else None,
               "capacity_blackout_s": BURST_CAPACITY_BLACKOUT_S,
               # The tags the Pulumi program puts on everything of the group.
               "tags": names.tags(desc, g.team, **{"burst-group": name})}
        for name, g in desc.burst_groups.items()}}


def fixture_gpu_devices(desc: Description) -> dict[str, int]:
    """Lab only: how many fixture GPU character devices each node needs, on-prem (the
    slurm role makes them) and cloud (the lab's burst hosts get them at boot)."""
    if not is_lab(desc):
        return {}
    return {n.name: n.gpus for n in nodes(desc)}


def fixture_mig_devices(desc: Description) -> dict[str, list[str]]:
    """Lab only: per MIG node, the profile of each fixture MIG device, in device order
    (device i is MIG_FIXTURE_DEVICE.format(i), Slurm's GRES index i on that node)."""
    if not is_lab(desc):
        return {}
    return {n.name: [p for p, count in n.mig for _ in range(count)]
            for n in nodes(desc) if n.mig and not n.cloud}


def fixture_gpus_conf(desc: Description, node: str) -> str:
    """Lab only: a node's systemd-tmpfiles file of fixture devices, device i where gres.conf
    names it: written by the slurm role on the on-prem hosts (the plan's fixture_devices)
    and into the lab's burst hosts, so both have one major and one naming."""
    gpus = fixture_gpu_devices(desc).get(node, 0)
    mig = fixture_mig_devices(desc).get(node, [])
    lines = ["# FIXTURE (lab only): character devices standing in for GPUs, so slurmd",
             "# can count and hand them out (gpupool/render/slurm.py). Nothing here",
             "# behaves like a GPU.",
             *(f"c {GPU_DEVICE.format(i)} 0666 root root - {GPU_FIXTURE_MAJOR}:{i}"
               for i in range(gpus))]
    if mig:
        lines += [f"d {MIG_FIXTURE_DEVICE.rsplit('/', 1)[0]} 0755 root root -",
                  *(f"c {MIG_FIXTURE_DEVICE.format(i)} 0666 root root - {MIG_FIXTURE_MAJOR}:{i}"
                    for i in range(len(mig)))]
    return "\n".join(lines) + "\n"


def state_dir(desc: Description) -> str | None:
    """Where both controllers keep Slurm's saved state (failover declared), else None: the
    role's local directory."""
    if desc.failover is None:
        return None
    mount = desc.storage_tiers[desc.failover.state_tier].mount
    if mount is None:  # rules.failover refuses this; a description built in code may not
        raise SlurmPolicyError(f"failover state tier {desc.failover.state_tier} has no mount")
    return STATE_DIR.format(mount=mount.path, pool=desc.pool.name)


def plan(desc: Description) -> dict[str, Any]:
    """Everything the `slurm` role needs, as the Ansible variable `gpupool_slurm`."""
    ctls = [{"name": c, "addr": a} for c, a in controller_addresses(desc)]
    return {
        "cluster": desc.pool.name,
        "environment": desc.pool.environment,
        # The primary (database, accounting, metrics, backups), then every slurmctld host.
        "controller": ctls[0],
        "controllers": ctls,
        "state_dir": state_dir(desc),
        "compute_nodes": [n.name for n in nodes(desc) if not n.cloud],
        "login_nodes": [n for n, node in desc.nodes.items() if NodeRole.LOGIN in node.roles],
        "slurm_conf": slurm_conf(desc),
        "gres_conf": gres_conf(desc),
        # The NVML plugin the role installs on GPU nodes (plugin_version None: none; the lab
        # installs none either, its gres.conf names fixture devices) and why.
        "gpu_detection": {**gpu_detection(desc).plan(),
                          "plugin_version": nvml_plugin_version(desc),
                          **({"autodetect": None} if is_lab(desc) else {})},
        "topology_conf": topology_conf(desc),
        "cgroup_conf": cgroup_conf(desc),
        "accounting": accounting(desc),
        "burst": burst_config(desc),
        # Lab only: each node's fixture devices file, as the role writes it.
        "fixture_devices": {n: fixture_gpus_conf(desc, n) for n in fixture_gpu_devices(desc)},
    }


FILES = ("slurm_conf", "gres_conf", "topology_conf", "cgroup_conf")


def render_files(desc: Description) -> dict[str, str]:
    """The policy parts as files, for `gpupool slurm render` and for review."""
    p = plan(desc)
    head = (f"# Rendered by gpupool from pool '{desc.pool.name}'. The slurm role adds "
            "daemon settings.\n")
    return {key.replace("_conf", ".conf"): head + "\n".join(p[key]) + "\n" for key in FILES}


def records(lines: Iterable[str], kind: str) -> dict[str, dict[str, str]]:
    """Lines starting with `kind=NAME` as {NAME: {key: value}} (for checks and tests)."""
    out = {}
    for line in lines:
        pairs = dict(p.split("=", 1) for p in line.split() if "=" in p)
        if kind in pairs:
            out[pairs[kind]] = {k: v.strip('"') for k, v in pairs.items()}
    return out
