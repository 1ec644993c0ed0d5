"""Hardware facts the pool description refers to by name.

These are properties of products, not of a pool, so they live in code: a description
names `h100` or `p5.48xlarge` and gpupool knows what that means.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.paths import DATA


@dataclass(frozen=True)
class GpuModel:
    name: str
    product: str  # what nvidia-smi / NVML report, used by the acceptance gate
    memory_gib: tuple[int, ...]  # memory sizes the model ships with
    # Burn-in floors for the acceptance gate: a healthy card of this model does better.
    min_bf16_tflops: float
    min_mem_bw_gbps: float
    mig_capable: bool


GPU_MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("h200", "NVIDIA H200", (141,), 600.0, 3800.0, True),
        GpuModel("h100", "NVIDIA H100 80GB HBM3", (80, 94), 550.0, 2600.0, True),
        GpuModel("a100", "NVIDIA A100-SXM4-80GB", (40, 80), 230.0, 1500.0, True),
        GpuModel("l40s", "NVIDIA L40S", (48,), 250.0, 700.0, False),
        GpuModel("l4", "NVIDIA L4", (24,), 90.0, 230.0, False),
        GpuModel("a10g", "NVIDIA A10G", (24,), 50.0, 480.0, False),
    )
}


# -- MIG: each MIG-capable model's GPU instance profiles ----------------------------------
# Source: NVIDIA Multi-Instance GPU User Guide (docs.nvidia.com/datacenter/tesla/
# mig-user-guide, "Supported MIG Profiles" and "A100/H100/H200 MIG Profiles"), the same
# table `nvidia-smi mig -lgip` prints (name, instances free/total, memory) with its
# placements (`nvidia-smi mig -lgipp`: allowed start slots and size, in memory slices).
# Left out: the media-extension profiles (+me, +gfx, +me.all), which take a GPU's one set
# of decoders and whose names would also collide with the plain ones as Slurm GRES types
# (a type matches every detected MIG profile it is a substring of).


@dataclass(frozen=True)
class MigProfile:
    name: str  # as nvidia-smi, mig-parted and the device plugin name it: "3g.40gb"
    compute_slices: int  # GPU slices (GPCs) of the GPU's compute_slices
    memory_gb: int  # the memory in its name (NVIDIA's rounded GB)
    max_instances: int  # per GPU, alone
    size: int  # memory slices it occupies
    placements: tuple[int, ...]  # memory slices it may start at


@dataclass(frozen=True)
class MigGeometry:
    """A MIG-capable GPU (model and memory size): its slices and profiles."""

    compute_slices: int  # 7 on A100/H100/H200 (A30: 4)
    memory_slices: int  # 8 on A100/H100/H200 (A30: 4)
    profiles: dict[str, MigProfile]


def _geometry(gb: tuple[int, int, int, int, int, int]) -> MigGeometry:
    """The seven-slice, eight-memory-slice layout A100, H100 and H200 share; gb are the
    memory sizes of 1g, 1g (double memory), 2g, 3g, 4g and 7g, as in the profile names."""
    one, one_big, two, three, four, seven = gb
    rows = (
        ("1g", one, 1, 7, 1, (0, 1, 2, 3, 4, 5, 6)),
        ("1g", one_big, 1, 4, 2, (0, 2, 4, 6)),
        ("2g", two, 2, 3, 2, (0, 2, 4)),
        ("3g", three, 3, 2, 4, (0, 4)),
        ("4g", four, 4, 1, 4, (0,)),
        ("7g", seven, 7, 1, 8, (0,)),
    )
    profiles = {f"{g}.{mem}gb": MigProfile(f"{g}.{mem}gb", slices, mem, most, size, starts)
                for g, mem, slices, most, size, starts in rows}
    return MigGeometry(7, 8, profiles)


# (catalog model, memory GiB) -> geometry. H100 80 GB is the SXM5 and PCIe card, 94 GB the
# H100 NVL; the catalog has no A30 (4 slices: 1g.6gb x4, 2g.12gb x2, 4g.24gb x1).
MIG_GEOMETRIES: dict[tuple[str, int], MigGeometry] = {
    ("a100", 40): _geometry((5, 10, 10, 20, 20, 40)),
    ("a100", 80): _geometry((10, 20, 20, 40, 40, 80)),
    ("h100", 80): _geometry((10, 20, 20, 40, 40, 80)),
    ("h100", 94): _geometry((12, 24, 24, 47, 47, 94)),
    ("h200", 141): _geometry((18, 35, 35, 71, 71, 141)),
}


def mig_geometry(model: str, memory_gib: int) -> MigGeometry | None:
    return MIG_GEOMETRIES.get((model, memory_gib))


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu_model: str
    gpus: int
    gpu_memory_gib: int
    vcpus: int
    memory_gib: int
    efa_interfaces: int  # 0: no EFA support


INSTANCE_TYPES: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType("p5en.48xlarge", "h200", 8, 141, 192, 2048, 16),
        InstanceType("p5e.48xlarge", "h200", 8, 141, 192, 2048, 32),
        InstanceType("p5.48xlarge", "h100", 8, 80, 192, 2048, 32),
        InstanceType("p4de.24xlarge", "a100", 8, 80, 96, 1152, 4),
        InstanceType("p4d.24xlarge", "a100", 8, 40, 96, 1152, 4),
        InstanceType("g6e.48xlarge", "l40s", 8, 48, 192, 1536, 1),
        InstanceType("g6e.24xlarge", "l40s", 4, 48, 96, 768, 2),
        InstanceType("g6e.12xlarge", "l40s", 4, 48, 48, 384, 1),
        InstanceType("g6e.xlarge", "l40s", 1, 48, 4, 32, 0),
        InstanceType("g6.24xlarge", "l4", 4, 24, 96, 384, 0),
        InstanceType("g6.12xlarge", "l4", 4, 24, 48, 192, 0),
        InstanceType("g6.xlarge", "l4", 1, 24, 4, 16, 0),
        InstanceType("g5.12xlarge", "a10g", 4, 24, 48, 192, 0),
    )
}


# Names a description may not take, because something on a node or in a cluster already
# owns them.
# System users of a Debian host (base-passwd, systemd, the packages the roles install):
# a team member of that name would take over a service account.
RESERVED_USERS = frozenset({
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp",
    "proxy", "www-data", "backup", "list", "irc", "gnats", "nobody", "_apt",
    "systemd-network", "systemd-resolve", "systemd-timesync", "systemd-coredump",
    "messagebus", "sshd", "polkitd", "avahi", "statd", "_rpc", "_chrony", "chrony", "ntp",
    "slurm", "munge", "nvidia-persistenced", "prometheus", "node-exporter", "dcgm",
    "nvidia-dcgm", "ansible", "admin", "operator", "ubuntu", "debian", "ec2-user",
    # Debian's docker-registry package (role image_registry, on the registry's host).
    "docker-registry",
})
# Kubernetes namespaces of the system and of the operators gpupool deploys: a team's
# namespace (named as the team) must not be one of them.
RESERVED_NAMESPACES = frozenset({
    "default", "kube-system", "kube-public", "kube-node-lease", "gpu-operator",
    "kueue-system", "monitoring", "cert-manager", "ingress-nginx",
})
# Slurm's own names: the root account, the default QOS and partition keywords.
RESERVED_SLURM_NAMES = frozenset({"root", "normal", "default", "all"})
# Where controller backups go in their tier's bucket (roles/controller_backup; the IAM
# policy in gpupool/render/cloud/iam.py, whose BACKUP_PREFIX tests/test_spec_names.py holds
# equal to this). Teams' checkpoints share such a bucket under "<team>/", so a team named
# as this prefix would read, overwrite and prune the controller's backups.
CONTROLLER_BACKUP_PREFIX = "controller/"
RESERVED_BUCKET_PREFIXES = frozenset({CONTROLLER_BACKUP_PREFIX.rstrip("/")})
# The Unix groups roles/common makes from the description (common_team_group_prefix and
# common_role_group_prefix in roles/common/defaults/main.yml; tests/test_spec_names.py holds
# them in step): "team-<team>" per team, "gpupool-<role>" per member role, and one group
# per member named as the member.
TEAM_GROUP_PREFIX = "team-"
ROLE_GROUP_PREFIX = "gpupool-"
# The longest user or group name groupadd and useradd accept (shadow-utils, Debian).
UNIX_NAME_MAX = 32
# A DNS label, so a host name (a burst group's nodes are <group>-<index>).
DNS_LABEL_MAX = 63
# S3 bucket names (AWS's naming rules): 3 to 63 characters, and none starting with a prefix
# S3 keeps for itself.
BUCKET_NAME_LENGTH = (3, 63)
BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
# Directories of the operating system a storage tier must not be mounted over.
SYSTEM_DIRECTORIES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64",
                      "/libx32", "/proc", "/root", "/run", "/sbin", "/sys", "/usr", "/var")
# Mount options a tier may declare, per file system type; anything else is refused.
MOUNT_OPTIONS = {
    "local": frozenset({"defaults", "ro", "rw", "noatime", "relatime", "nodiratime",
                        "nodev", "nosuid", "noexec", "discard", "nofail"}),
    "nfs": frozenset({"defaults", "ro", "rw", "noatime", "relatime", "nodiratime", "nodev",
                      "nosuid", "noexec", "hard", "soft", "intr", "nofail", "_netdev",
                      "vers=3", "vers=4", "vers=4.0", "vers=4.1", "vers=4.2", "nconnect=2",
                      "nconnect=4", "nconnect=8", "nconnect=16", "proto=tcp", "proto=rdma",
                      "sec=sys", "sec=krb5", "sec=krb5i", "sec=krb5p", "lookupcache=positive",
                      "actimeo=0", "actimeo=30", "actimeo=60", "rsize=1048576",
                      "wsize=1048576", "async", "sync"}),
    "lustre": frozenset({"defaults", "ro", "rw", "noatime", "nodev", "nosuid", "noexec",
                         "flock", "localflock", "user_xattr", "nouser_xattr", "_netdev",
                         "nofail", "lazystatfs"}),
    "object": frozenset({"ro", "rw"}),
}
# Slurm's highest partition PriorityTier (slurm.conf(5)): task class priorities map to it.
SLURM_MAX_PRIORITY_TIER = 65533
# The largest value a 32-bit Slurm field holds as a number: 0xffffffff is INFINITE and
# 0xfffffffe NO_VAL (slurm.h). Time limits (MaxTime, MaxWall: minutes), GraceTime (seconds),
# Fairshare and the counts of a GrpTRES are such fields; the schema's bounds keep every
# value the description gives them below it (tests/test_spec_bounds.py).
SLURM_UINT32_MAX = 0xFFFFFFFD
# The exporters Prometheus (on the controller) scrapes on each node's management address,
# at the roles' default ports (roles node_exporter and dcgm; tests/test_dcgm.py holds
# them in step): node_exporter on every node, dcgm-exporter on the GPU nodes.
NODE_EXPORTER_PORT = 9100
DCGM_EXPORTER_PORT = 9400
# Slurm's defaults, which the rendered slurm.conf keeps (roles/slurm/defaults/main.yml
# slurm_ctld_port and slurm_slurmd_port; tests/test_burst_boot.py holds them in step):
# slurmd registers with slurmctld on the first, slurmctld reaches slurmd on the second.
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SLURMDBD_PORT = 6819
SSH_PORT = 22
# The management plane: what operators, the scheduler and the metrics reach a node on. A
# flow of protocol `all` opens them only from the management segment: east-west `all` on
# the training fabric is for NCCL and RDMA, and must not let one training node's address
# reach another's sshd, slurmd or exporters (nor the controller's slurmctld and slurmdbd).
# A flow that names one of these ports opens it from any segment.
MANAGEMENT_SEGMENT = "management"
# The segment whose subnets burst instances launch into (infra/burst.py): a burst node's
# one address, its kubelet's node IP and the source of its traffic to on-prem hosts.
BURST_SEGMENT = "training"
# srun's listening ports (slurm.conf SrunPortRange, the range Slurm's documentation
# suggests): slurmctld and every node's slurmstepd connect back to the srun that launched a
# step, so a host that runs srun (a login node, a batch script's host) admits them there.
SRUN_PORTS = (60001, 63000)
MANAGEMENT_PLANE_PORTS = (SSH_PORT, SLURMCTLD_PORT, SLURMD_PORT, SLURMDBD_PORT,
                          NODE_EXPORTER_PORT, DCGM_EXPORTER_PORT)
# Prometheus and Alertmanager on the controller (roles/monitoring/defaults/main.yml
# monitoring_prometheus_port and monitoring_alertmanager_port; tests/test_image_registry.py
# holds them in step).
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093
# Kubernetes' ports (kubernetes.io/docs/reference/networking/ports-and-protocols/), and the
# pod networks' node-to-node ports (gpupool/render/flows.py CNI_PORTS says which CNI uses
# which): flannel's and Cilium's VXLAN on the Linux default 8472 (not IANA's 4789),
# Calico's BGP, Cilium's agents' health checks.
API_SERVER_PORT = 6443
KUBELET_PORT = 10250
ETCD_PORTS = (2379, 2380)  # client, peer
VXLAN_PORT = 8472
BGP_PORT = 179
CILIUM_HEALTH_PORT = 4240


def closed_to_all_flows(source: str) -> tuple[int, ...]:
    """The TCP ports a protocol-`all` flow from segment `source` leaves closed."""
    return () if source == MANAGEMENT_SEGMENT else MANAGEMENT_PLANE_PORTS

# The first release of a component that fixes publicly known vulnerabilities a shared pool
# cannot live with: a lock below it is refused, whatever the description's blocklist says.
# Container toolkit: CVE-2024-0132/0133 (fixed in 1.16.2), CVE-2025-23359 (1.17.4) and
# CVE-2025-23266/23267 (1.17.8) let a container image escape to the host.
FIXED_IN = {
    "container_toolkit": ("1.17.8", "container escapes CVE-2024-0132, CVE-2025-23359 and "
                                    "CVE-2025-23266 are fixed only from 1.17.8"),
}

# The system and service accounts (users and groups) of gpupool's converged Debian hosts,
# read from their real passwd and group files (gpupool/lab/system_accounts.py; SOURCE.md):
# a member named as one would become, or join, it (sudo, adm, mysql, slurm, munge...).
SYSTEM_ACCOUNTS_FILE = DATA / "system-accounts" / "debian-12.txt"
SYSTEM_ACCOUNTS = frozenset(
    line.strip() for line in SYSTEM_ACCOUNTS_FILE.read_text().splitlines()
    if line.strip() and not line.startswith("#"))
