"""The pool description: the one source of truth every other part of gpupool derives from.

The schema checks types and ranges of each field; rules.py checks how fields relate.
Named things are mappings keyed by name, so a name is unique by construction and error
paths read `nodes.gpu-a1.rack` rather than `nodes[7].rack`.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, StringConstraints
from pydantic import Strict as StrictType
from pydantic_core import PydanticCustomError

# A DNS-1123 label: valid as a hostname, a Slurm node/account name and a Kubernetes name.
NAME_RE = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
Name = Annotated[str, StringConstraints(pattern=NAME_RE)]
# Unix user names of team members.
USER_RE = r"^[a-z_][a-z0-9_-]{0,31}$"
User = Annotated[str, StringConstraints(pattern=USER_RE)]
# An exact version: digits and dots with an optional suffix; no wildcards, ranges or "latest".
# Digits are ASCII ([0-9], never \d): \d matches any Unicode digit (Arabic-Indic "٣"),
# which passes a pattern and then breaks apt, AWS or int() downstream.
VERSION_RE = r"^v?[0-9]+(\.[0-9]+){1,3}([-+~][0-9A-Za-z.+~-]+)?$"
Version = Annotated[str, StringConstraints(pattern=VERSION_RE)]
# A version a distribution package carries: Debian's versions never start with "v", so a
# "v" typed before one is dropped where it enters (apt would find no such version).
PackageVersion = Annotated[Version, AfterValidator(lambda v: v.removeprefix("v"))]


def version_key(version: str) -> tuple[tuple[int, ...], str]:
    """A version's numbers and its suffix, for comparing: "v1.17.8" and "1.17.8" are one
    version; a "~" suffix (Debian's pre-release) sorts before the release."""
    head = version.strip().removeprefix("v")
    cut = next((i for i, c in enumerate(head) if c in "-+~"), len(head))
    return tuple(int(n) for n in head[:cut].split(".") if n.isdigit()), head[cut:]


def older_than(version: str, fixed: str) -> bool:
    numbers, suffix = version_key(version)
    floor = version_key(fixed)[0]
    return numbers < floor or (numbers == floor and suffix.startswith("~"))
DURATION_RE = r"^[0-9]+[smhd]$"

_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# The longest duration a description may give. No job limit, interval, window or timeout of
# a pool is longer than a year: a larger value is a typo. The bound also keeps every value
# far inside the fields it ends in (Slurm's MaxTime/DefaultTime are 32-bit minutes, its
# GraceTime 32-bit seconds; Kubernetes and systemd take seconds; tests/test_spec_bounds.py
# holds this below them). Digits are counted before int() reads them: Python refuses a
# decimal of over 4,300 digits with a ValueError, which would be an internal error.
MAX_DURATION_S = 366 * 86400
MAX_DURATION_DIGITS = len(str(MAX_DURATION_S))  # 8: no spelling of a valid one is longer


def duration_seconds(value: str) -> int:
    """'90m' -> 5400."""
    return int(value[:-1]) * _DURATION_SECONDS[value[-1]]


def _duration_bounded(value: str) -> str:
    if len(value) - 1 > MAX_DURATION_DIGITS or duration_seconds(value) > MAX_DURATION_S:
        raise PydanticCustomError(
            "duration_range", "a duration is at most {days}d, in at most {digits} digits",
            {"days": MAX_DURATION_S // 86400, "digits": MAX_DURATION_DIGITS})
    return value


Duration = Annotated[str, StringConstraints(pattern=DURATION_RE),
                     AfterValidator(_duration_bounded)]


def duration_minutes(value: str) -> int:
    """Slurm time limits are whole minutes; round up so a limit is never shortened."""
    return max(1, -(-duration_seconds(value) // 60))


def _canonical(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    # An IPv4-mapped IPv6 address is written with its IPv4 part dotted, as Python 3.13
    # writes it and 3.11 does not: the same description gives the same text everywhere.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return f"::ffff:{ip.ipv4_mapped}"
    return str(ip)


def _network(value: str) -> str:
    # strict: a CIDR with host bits set is a typo more often than an intent.
    net = ipaddress.ip_network(value, strict=True)
    return f"{_canonical(net.network_address)}/{net.prefixlen}"


def _address(value: str) -> str:
    return _canonical(ipaddress.ip_address(value))


Cidr = Annotated[str, AfterValidator(_network)]
Address = Annotated[str, AfterValidator(_address)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# Numbers are numbers as YAML writes them: `true` (1 to pydantic), 2.0 or "8" where a count
# belongs is a mistake to name, not a value to coerce.
Int = Annotated[int, StrictType()]
Number = Annotated[float, StrictType()]  # an integer is a number too


Region = Annotated[str, StringConstraints(pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")]
CostCentre = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_]{1,63}$")]


MAX_MONTHLY_BUDGET_USD = 100_000_000  # a bound: no pool's cloud side is worth more a month


class Pool(Strict):
    name: Name
    environment: Annotated[str, StringConstraints(pattern=r"^(lab|production)$")]
    cost_centre: CostCentre
    # Home region of the pool's cloud storage (buckets, key, scratch file system).
    cloud_region: Region
    # DNS labels joined by dots: no empty label, none starting or ending with '-'.
    domain: Annotated[str, StringConstraints(
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$",
        max_length=253)] = "pool.internal"
    # The pool's operators: team admins who administer every host (sudo on the controllers
    # and every team's nodes). Any other team admin administers only the nodes their team
    # owns (roles/common).
    operators: list[User] = []
    # Whether a controller may also be a login host: researchers would then have a shell
    # where slurmctld, the munge key, Prometheus and Alertmanager live. Said here, never
    # implied by a node's roles (rule controller-login-declared).
    controller_login: bool = False
    # The most the pool's cloud side may cost a month, in US dollars: the policy pack
    # refuses a plan whose cost ceiling (gpupool.render.cost: instances at max nodes for a
    # whole month, file systems, buckets at their tiers' sizes, NAT, endpoints, links) is
    # above it, or that it cannot price. Absent: no budget is held.
    monthly_budget_usd: Annotated[Int, Field(ge=1, le=MAX_MONTHLY_BUDGET_USD)] | None = None


class LeafSwitch(Strict):
    racks: Annotated[list[Name], Field(min_length=1)]


class Site(Strict):
    leaf_switches: Annotated[dict[Name, LeafSwitch], Field(min_length=1)]


class Interconnect(StrEnum):
    PCIE = "pcie"
    NVLINK = "nvlink"
    NVSWITCH = "nvswitch"


class MigStrategy(StrEnum):
    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


# A MIG profile as NVIDIA names it (compute slices, memory): "1g.10gb", "7g.141gb". Each
# is checked against the GPU's profile table (catalog.MIG_GEOMETRIES) by the rules.
MIG_PROFILE_RE = r"^[1-8]g\.[1-9][0-9]{0,2}gb$"
MigProfileName = Annotated[str, StringConstraints(pattern=MIG_PROFILE_RE)]


class Gpu(Strict):
    model: str
    count: Annotated[Int, Field(ge=1, le=16)]
    memory_gib: Annotated[Int, Field(ge=1, le=1024)]
    interconnect: Interconnect = Interconnect.PCIE
    mig_strategy: MigStrategy = MigStrategy.NONE
    # MIG profile -> instances on every GPU of the class, e.g. {"1g.10gb": 7}
    mig_profiles: dict[MigProfileName, Annotated[Int, Field(ge=1, le=7)]] = {}


class NicType(StrEnum):
    ETHERNET = "ethernet"
    RDMA = "rdma"
    EFA = "efa"


class Nic(Strict):
    type: NicType
    count: Annotated[Int, Field(ge=1, le=32)]
    speed_gbps: Annotated[Int, Field(ge=1, le=3200)]


# An NVMe model number as the kernel reports it (/sys/block/nvme*/device/model, 40 ASCII
# characters at most) and a device's stable path: how roles/storage finds the scratch
# devices (gpupool/onhost/scratch_devices.py), never from kernel names guessed from a count.
NVME_MODEL_RE = r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,39}$"
DEVICE_PATH_RE = r"^/dev/disk/by-(id|path)/[A-Za-z0-9][A-Za-z0-9:._-]{0,127}$"


class Nvme(Strict):
    count: Annotated[Int, Field(ge=0, le=32)] = 0
    size_gib: Annotated[Int, Field(ge=0, le=1_048_576)] = 0
    # Which devices are scratch: every NVMe device of this model, or exactly these.
    model: Annotated[str, StringConstraints(pattern=NVME_MODEL_RE)] | None = None
    devices: list[Annotated[str, StringConstraints(pattern=DEVICE_PATH_RE)]] = []


class NodeClass(Strict):
    description: str = ""
    gpu: Gpu | None = None
    nics: list[Nic] = []
    cpus: Annotated[Int, Field(ge=1, le=4096)]
    memory_gib: Annotated[Int, Field(ge=1, le=65536)]
    nvme: Nvme = Nvme()


class NodeRole(StrEnum):
    COMPUTE = "compute"
    CONTROLLER = "controller"
    LOGIN = "login"


class Node(Strict):
    class_: str = Field(alias="class")
    rack: str
    roles: Annotated[list[NodeRole], Field(min_length=1)] = [NodeRole.COMPUTE]
    # The team a node was historically pinned to; the baseline policy replays that.
    owner_team: str | None = None
    addresses: Annotated[dict[str, Address], Field(min_length=1)]


class Capacity(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class BurstGroup(Strict):
    region: Region
    availability_zones: Annotated[list[Annotated[str, StringConstraints(
        pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9][a-z]$")]], Field(min_length=1)]
    instance_types: Annotated[list[str], Field(min_length=1)]
    capacity: Annotated[list[Capacity], Field(min_length=1)]
    on_demand_base: Annotated[Int, Field(ge=0, le=1000)] = 0
    min_nodes: Annotated[Int, Field(ge=0, le=1000)] = 0
    max_nodes: Annotated[Int, Field(ge=0, le=1000)]
    efa: bool = False
    team: str | None = None  # None: shared by every team


class Role(StrEnum):
    RESEARCHER = "researcher"
    ONCALL = "oncall"
    CONTRACTOR = "contractor"
    ADMIN = "admin"


MAX_GPUS = 1_000_000  # a bound on any GPU count: no quota is worth more than every GPU


class Team(Strict):
    cost_centre: CostCentre
    quota: Annotated[dict[str, Annotated[Int, Field(ge=0, le=MAX_GPUS)]], Field(min_length=1)]
    borrowing_limit: dict[str, Annotated[Int, Field(ge=0, le=MAX_GPUS)]] = {}
    # MIG profile -> the most instances of it the team may hold at once (Slurm GrpTRES
    # gres/gpu:<profile>); only profiles some node class offers.
    mig_quota: dict[MigProfileName, Annotated[Int, Field(ge=0, le=7 * MAX_GPUS)]] = {}
    members: dict[Role, list[User]] = {}


# A Unix id the description fixes, the same on every host: a job runs under its
# submitter's uid on every node and NFS compares numbers, so they must agree everywhere.
# Debian's range for people (login.defs UID_MIN..UID_MAX).
UnixId = Annotated[Int, Field(ge=1000, le=59999)]


class Ids(Strict):
    """Fixed ids: a member's uid (their own group takes it as its gid) and a team group's
    gid. Without them each host numbers accounts in the order it creates them."""

    users: dict[User, UnixId] = {}
    teams: dict[Name, UnixId] = {}


class ReclaimAction(StrEnum):
    CANCEL = "cancel"
    REQUEUE = "requeue"


class IdleReclaim(Strict):
    """GPUs a class's job holds but does not use are given back: a job whose every GPU
    stayed at or below `threshold_percent` utilization for `after` is warned, and ended or
    requeued `warn` later if they are still idle (gpupool/onhost/idle_reclaim.py, run on
    the controller by roles/idle_reclaim from dcgm-exporter's per-job series)."""

    after: Duration
    warn: Duration = "10m"
    action: ReclaimAction = ReclaimAction.CANCEL
    threshold_percent: Annotated[Int, Field(ge=0, le=50)] = 0


class TaskClass(Strict):
    priority: Annotated[Int, Field(ge=1, le=1_000_000)]
    max_runtime: Duration
    preemptible: bool
    grace_time: Duration = "0s"
    requeue: bool = False
    preempts: list[str] = []
    idle_reclaim: IdleReclaim | None = None
    description: str = ""


class Purpose(StrEnum):
    SCRATCH = "scratch"
    DATASETS = "datasets"
    CHECKPOINTS = "checkpoints"
    ARCHIVE = "archive"
    HOME = "home"  # the members' home directories: a shared on-prem mount


class Location(StrEnum):
    """Where a storage tier lives. Nothing is declared in the cloud unless a tier says so.

    onprem: served on-prem only (its mount); the cloud side declares nothing for it. Burst
      nodes reach it, if at all, over the hybrid link.
    cloud: lives in the cloud only: a bucket (datasets, checkpoints, archive) or an FSx for
      Lustre file system (scratch).
    both: an on-prem mount for the on-prem nodes and a bucket in the cloud for the burst
      nodes (checkpoints they write, datasets FSx imports): gpupool declares both sides and
      copies nothing between them; keeping them in step is the site's transfer job.
    """

    ONPREM = "onprem"
    CLOUD = "cloud"
    BOTH = "both"


class Temperature(StrEnum):
    HOT = "hot"
    WARM = "warm"
    ARCHIVE = "archive"


class FsType(StrEnum):
    LOCAL = "local"
    NFS = "nfs"
    LUSTRE = "lustre"
    OBJECT = "object"


# The file systems several hosts mount at once (the lab shares a host directory for them).
SHARED_FSTYPES = (FsType.NFS, FsType.LUSTRE)


MOUNT_PATH_RE = r"^(/[A-Za-z0-9_][-A-Za-z0-9_.]*)+$"  # absolute; no '//', no trailing '/'
# host:/export (NFS) or nid@net[:nid@net]:/fsname (Lustre)
MOUNT_SOURCE_RE = r"^([A-Za-z0-9][-A-Za-z0-9_.@:,]*:/[-A-Za-z0-9_./]*)?$"
MOUNT_OPTION_RE = r"^[a-z_][a-z0-9_]*(=[A-Za-z0-9_.,:/-]+)?$"


class Mount(Strict):
    path: Annotated[str, StringConstraints(pattern=MOUNT_PATH_RE, max_length=255)]
    fstype: FsType
    source: Annotated[str, StringConstraints(pattern=MOUNT_SOURCE_RE, max_length=255)] = ""
    options: list[Annotated[str, StringConstraints(pattern=MOUNT_OPTION_RE,
                                                   max_length=64)]] = []


# An apt repository's base URL as a sources file carries it, nothing a deb822 field or a
# shell would read as more than one value. Only from a server: https, or http since apt
# checks every index against the Release file the key (https only, below) signs. Never a
# node's own file (file:, file://): whatever wrote that file on the node would choose the
# packages, or the key that vouches for them, that the pool then installs as root.
REPO_URL_RE = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%+-]+)*/?$"
KEY_URL_RE = r"^https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%+-]+)+$"
# A suite as apt reads it: a codename or a path ("./" for a flat repository).
APT_SUITE_RE = r"^(\./|[A-Za-z0-9][A-Za-z0-9._/-]{0,63})$"
APT_COMPONENT_RE = r"^[a-z0-9][a-z0-9._-]{0,31}$"
DEB_NAME_RE = r"^[a-z0-9][a-z0-9.+-]{1,62}$"


class LustreClient(Strict):
    """Where the Lustre client comes from. Debian carries none (bookworm, its backports and
    trixie have no Lustre package), so a pool whose nodes mount Lustre names the apt
    repository that has it (Whamcloud's, or a site build of lustre-release's `make debs`),
    the key that signs the repository and the version every node is pinned to."""

    repository: Annotated[str, StringConstraints(pattern=REPO_URL_RE, max_length=512)]
    suite: Annotated[str, StringConstraints(pattern=APT_SUITE_RE)] = "./"
    components: list[Annotated[str, StringConstraints(pattern=APT_COMPONENT_RE)]] = []
    # The ASCII-armoured public key that signs the repository's Release file, over https
    # only (an air-gapped pool serves it from its own mirror's https server).
    key_url: Annotated[str, StringConstraints(pattern=KEY_URL_RE, max_length=512)]
    version: PackageVersion
    # The client's packages, each pinned to `version`: the tools and the kernel modules
    # (DKMS here; a vendor's prebuilt modules package in its place).
    packages: Annotated[list[Annotated[str, StringConstraints(pattern=DEB_NAME_RE)]],
                        Field(min_length=1)] = ["lustre-client-utils",
                                                "lustre-client-modules-dkms"]


class Transition(Strict):
    after_days: Annotated[Int, Field(ge=1, le=36500)]
    temperature: Temperature


class StorageTier(Strict):
    purpose: Purpose
    temperature: Temperature
    size_tib: Annotated[Number, Field(gt=0, le=100_000)]
    retention_days: Annotated[Int, Field(ge=1, le=36500)]
    mount: Mount | None = None
    versioning: bool = False
    lifecycle: list[Transition] = []
    # Where the tier lives (Location). Absent: a tier without a mount is a bucket in the
    # cloud (all it can be) and a mounted tier is on-prem; a mounted tier with a cloud side
    # says so. Never inferred from a server's address: a Lustre tier served on-prem is
    # never declared again as an FSx file system.
    location: Location | None = None

    @property
    def located(self) -> Location:
        if self.location is not None:
            return self.location
        return Location.CLOUD if self.mount is None else Location.ONPREM

    @property
    def in_cloud(self) -> bool:
        return self.located is not Location.ONPREM


class Segment(Strict):
    cidr: Cidr
    cloud_cidr: Cidr | None = None
    vlan: Annotated[Int, Field(ge=1, le=4094)]
    mtu: Annotated[Int, Field(ge=1280, le=9216)] = 1500
    rdma: bool = False


class Flow(Strict):
    from_: str = Field(alias="from")
    to: str
    protocol: Annotated[str, StringConstraints(pattern=r"^(tcp|udp|all)$")]
    ports: list[Annotated[Int, Field(ge=1, le=65535)]] = []
    description: str = ""


# AWS resource ids as AWS writes them: a prefix and 8 or 17 lowercase hex digits. A Direct
# Connect gateway id is a lowercase UUID.
TRANSIT_GATEWAY_ID_RE = r"^tgw-([0-9a-f]{8}|[0-9a-f]{17})$"
DX_GATEWAY_ID_RE = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
# A customer gateway's BGP ASN as EC2 takes it (BgpAsn): 1 to 2^31-1.
BGP_ASN_MAX = 2_147_483_647


class Vpn(Strict):
    """A site-to-site VPN (two IPsec tunnels, BGP) to the on-prem customer gateway."""

    customer_gateway: Address  # the on-prem device's public IPv4 address
    bgp_asn: Annotated[Int, Field(ge=1, le=BGP_ASN_MAX)]


class Egress(StrEnum):
    """How private subnets reach AWS APIs: interface endpoints (no internet path at all),
    or a NAT gateway."""

    ENDPOINTS = "endpoints"
    NAT = "nat"


class HybridLink(Strict):
    """A burst region's path to on-prem: exactly one of a site-to-site VPN, an existing
    Transit Gateway (attached to the burst VPC) or an existing Direct Connect gateway
    (associated through a virtual private gateway)."""

    vpn: Vpn | None = None
    transit_gateway: Annotated[str, StringConstraints(pattern=TRANSIT_GATEWAY_ID_RE)] | None = None
    direct_connect_gateway: Annotated[str, StringConstraints(
        pattern=DX_GATEWAY_ID_RE)] | None = None
    egress: Egress = Egress.ENDPOINTS

    @property
    def kind(self) -> str | None:
        kinds = [k for k in LINK_KINDS if getattr(self, k) is not None]
        return kinds[0] if len(kinds) == 1 else None


LINK_KINDS = ("vpn", "transit_gateway", "direct_connect_gateway")


class Network(Strict):
    admin_cidrs: Annotated[list[Cidr], Field(min_length=1)]
    segments: Annotated[dict[Name, Segment], Field(min_length=1)]
    flows: list[Flow] = []
    # burst region -> its hybrid link to on-prem; every region with burst groups has one.
    hybrid_links: dict[Region, HybridLink] = {}


class Software(Strict):
    nvidia_driver: PackageVersion
    cuda: PackageVersion
    container_toolkit: PackageVersion
    dcgm: PackageVersion
    # dcgm-exporter. NVIDIA pairs each exporter release with a DCGM release (container tags
    # <dcgm>-<exporter>, e.g. 3.3.9-3.6.1 and 4.2.3-4.1.3): lock the exporter built for
    # `dcgm`. Its Debian/RPM package (datacenter-gpu-manager-exporter) carries this version.
    dcgm_exporter: PackageVersion
    nccl: PackageVersion
    gpu_operator: Version  # a Helm chart's version, written as NVIDIA tags it (v26.7.0)
    slurm: PackageVersion
    # component (a field above) -> versions never to install (apt pins them out, so as
    # Debian writes them)
    blocklist: dict[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z_]{0,31}$")],
                    list[PackageVersion]] = {}


class HealthStep(StrEnum):
    """What the health loop does when the gate advises a reset or a reboot."""

    ACT = "act"  # drain, wait for the node's jobs (bounded), act, gate again, return it
    DRAIN = "drain"  # drain and leave the action to on-call
    RECORD = "record"  # as act, but only record the action (a lab host cannot reboot)


class Health(Strict):
    """The health loop: every compute node gates itself at the quick tier from a timer
    (gpupool/gate/health.py, installed by roles/acceptance_gate) and acts on the verdict."""

    interval: Duration = "10m"
    reset: HealthStep = HealthStep.ACT
    reboot: HealthStep = HealthStep.ACT
    # How long a drained node's jobs may run before they are requeued (or, where they
    # cannot be, the node is left drained for on-call) so the advised action can be taken.
    drain_timeout: Duration = "30m"
    # This many failures of one check within the window isolate the node: the few cards
    # that cause most failures are kept out instead of being reset again and again.
    isolate_after: Annotated[Int, Field(ge=1, le=100)] = 3
    window: Duration = "24h"


class Backup(Strict):
    """Backups of the Slurm controller (roles/controller_backup, from a timer) to a bucket
    tier: the accounting database, Slurm's saved state, the munge key (encrypted) and the
    pool's own state; playbooks/controller_restore.yml puts one back."""

    # The storage tier whose bucket holds them. Its objects must stay retrievable at once
    # for as long as backups are kept: a restore does not wait hours on Deep Archive.
    tier: Name
    interval: Duration = "6h"
    keep: Annotated[Int, Field(ge=1, le=1000)] = 28


class Failover(Strict):
    """A backup Slurm controller: the second node with the controller role (in description
    order) runs slurmctld too, and takes over when the first stops answering. Both keep
    Slurm's saved state on one network tier, so the backup resumes the same queue."""

    # The storage tier (an NFS or Lustre mount) that holds Slurm's StateSaveLocation; both
    # controllers mount it. It should not live on either controller.
    state_tier: Name
    # How long the backup waits on a silent primary before it takes over (SlurmctldTimeout).
    takeover_after: Duration = "120s"


class Cni(StrEnum):
    """The pod network, which decides the ports nodes open to each other."""

    FLANNEL = "flannel"  # VXLAN overlay, UDP 8472
    CALICO = "calico"  # BGP between nodes (TCP 179), pods routed without encapsulation
    CILIUM = "cilium"  # VXLAN overlay (UDP 8472) and its health checks (TCP 4240)


class Kubernetes(Strict):
    """A Kubernetes cluster over the pool's nodes: the control plane runs the API server
    and etcd; every compute node and burst node is a worker. Absent: no cluster."""

    cni: Cni
    control_plane: Annotated[list[str], Field(min_length=1)]


class Description(Strict):
    """A whole pool. `version` is the schema version, for migrations."""

    version: Annotated[Int, Field(ge=1, le=1)]
    pool: Pool
    sites: Annotated[dict[Name, Site], Field(min_length=1)]
    node_classes: Annotated[dict[Name, NodeClass], Field(min_length=1)]
    nodes: Annotated[dict[Name, Node], Field(min_length=1)]
    burst_groups: dict[Name, BurstGroup] = {}
    teams: Annotated[dict[Name, Team], Field(min_length=1)]
    task_classes: Annotated[dict[Name, TaskClass], Field(min_length=1)]
    storage_tiers: Annotated[dict[Name, StorageTier], Field(min_length=1)]
    lustre_client: LustreClient | None = None
    network: Network
    software: Software
    kubernetes: Kubernetes | None = None
    health: Health = Health()
    backup: Backup | None = None
    failover: Failover | None = None
    ids: Ids = Ids()
    # Where the description was read from (set by the loader), for tools run later that
    # must read the same file (the gate run by the admission role).
    _source: Path | None = PrivateAttr(default=None)

    @property
    def source(self) -> Path | None:
        return self._source


SEGMENT_NAMES = ("training", "storage", "management")
# Purposes the cloud side keeps in S3 buckets, where a tier of them lives in the cloud
# (location cloud or both); scratch in the cloud is an FSx file system, home never is.
BUCKET_PURPOSES = (Purpose.DATASETS, Purpose.CHECKPOINTS, Purpose.ARCHIVE)


def is_bucket_tier(tier: StorageTier) -> bool:
    return tier.purpose in BUCKET_PURPOSES and tier.in_cloud


def bucket_name(pool: str, tier: str, region: str) -> str:
    """A bucket tier's S3 bucket: globally unique by pool, tier and home region. The one
    formula: validation bounds its length (rule `bucket-name`) and the cloud side names
    the bucket by it (gpupool/render/cloud.py bucket_name)."""
    return f"{pool}-{tier}-{region}"


RE_NAME = re.compile(NAME_RE)
