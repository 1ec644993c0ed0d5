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

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
)
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
# A switch is YAML's true or false: "yes", "off" or 1 where a switch belongs is named, not
# guessed at (a quoted "false" would otherwise be a value someone has to read twice).
Bool = Annotated[bool, StrictType()]


Region = Annotated[str, StringConstraints(pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")]
CostCentre = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_]{1,63}$")]


MAX_MONTHLY_BUDGET_USD = 100_000_000  # a bound: no pool's cloud side is worth more a month


class Pool(Strict):
    name: Name  # The pool's name: it names the cloud resources and buckets.
    # lab or production.
    environment: Annotated[str, StringConstraints(pattern=r"^(lab|production)$")]
    cost_centre: CostCentre  # The cost centre the pool's cloud resources are billed to.
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
    controller_login: Bool = False
    # The most the pool's cloud side may cost a month, in US dollars: the policy pack
    # refuses a plan whose cost ceiling (gpupool.render.cost: instances at max nodes for a
    # whole month, file systems, buckets at their tiers' sizes, NAT, endpoints, links) is
    # above it, or that it cannot price. Absent: no budget is held.
    monthly_budget_usd: Annotated[Int, Field(ge=1, le=MAX_MONTHLY_BUDGET_USD)] | None = None


class LeafSwitch(Strict):
    # The racks under this switch; a rack is under one switch only.
    racks: Annotated[list[Name], Field(min_length=1)]


class Site(Strict):
    # Leaf switch name -> the racks under it (Slurm's topology).
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
    model: str  # The GPU model, one gpupool knows (`gpupool validate` lists them).
    count: Annotated[Int, Field(ge=1, le=16)]  # GPUs per node.
    # Memory per GPU, GiB: one size the model ships with.
    memory_gib: Annotated[Int, Field(ge=1, le=1024)]
    interconnect: Interconnect = Interconnect.PCIE  # How the node's GPUs are linked to each other.
    # How MIG devices are exposed; not none only on a MIG-capable model, and one strategy
    # for every MIG class.
    mig_strategy: MigStrategy = MigStrategy.NONE
    # MIG profile -> instances on every GPU of the class, e.g. {"1g.10gb": 7}
    mig_profiles: dict[MigProfileName, Annotated[Int, Field(ge=1, le=7)]] = {}


class NicType(StrEnum):
    ETHERNET = "ethernet"
    RDMA = "rdma"
    EFA = "efa"


class Nic(Strict):
    type: NicType  # The kind of interface.
    count: Annotated[Int, Field(ge=1, le=32)]  # Interfaces of this kind per node.
    speed_gbps: Annotated[Int, Field(ge=1, le=3200)]  # Each interface's speed, Gb/s.


# An NVMe model number as the kernel reports it (/sys/block/nvme*/device/model, 40 ASCII
# characters at most) and a device's stable path: how roles/storage finds the scratch
# devices (gpupool/onhost/scratch_devices.py), never from kernel names guessed from a count.
NVME_MODEL_RE = r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,39}$"
DEVICE_PATH_RE = r"^/dev/disk/by-(id|path)/[A-Za-z0-9][A-Za-z0-9:._-]{0,127}$"


class Nvme(Strict):
    count: Annotated[Int, Field(ge=0, le=32)] = 0  # Scratch NVMe devices per node.
    size_gib: Annotated[Int, Field(ge=0, le=1_048_576)] = 0  # Each device's size, GiB.
    # Which devices are scratch: every NVMe device of this model, or exactly these.
    model: Annotated[str, StringConstraints(pattern=NVME_MODEL_RE)] | None = None
    # The scratch devices' stable paths (/dev/disk/by-id or by-path), one per device; or
    # `model` instead.
    devices: list[Annotated[str, StringConstraints(pattern=DEVICE_PATH_RE)]] = []


class OsRelease(StrEnum):
    """A Debian release a node runs (as os-release's ID-VERSION_ID)."""

    DEBIAN_12 = "debian-12"
    DEBIAN_13 = "debian-13"

    @property
    def number(self) -> str:
        """Debian's release number ("12"), as os-release's VERSION_ID and AMI names write it."""
        return self.value.removeprefix("debian-")

    @property
    def codename(self) -> str:
        """The release's Debian suite ("bookworm"), as apt sources and debootstrap name it."""
        return {"debian-12": "bookworm", "debian-13": "trixie"}[self.value]

    @property
    def python(self) -> str:
        """The release's CPython (major.minor): what the nodes' gate is packed for."""
        return {"debian-12": "3.11", "debian-13": "3.13"}[self.value]


# The release a node class runs when it names none, and so a lab's and the burst nodes'
# where no class or controller says otherwise: written here once.
DEFAULT_RELEASE = OsRelease.DEBIAN_12


class NodeClass(Strict):
    description: str = ""  # Free text for people.
    # The Debian release the class's nodes run; its packages are `software`'s, with that
    # release's entry of `software.per_release` in place of any it names.
    os: OsRelease = DEFAULT_RELEASE
    gpu: Gpu | None = None  # The class's GPUs; absent: a node without GPUs.
    nics: list[Nic] = []  # The network interfaces, one entry per kind.
    cpus: Annotated[Int, Field(ge=1, le=4096)]  # CPU cores per node.
    memory_gib: Annotated[Int, Field(ge=1, le=65536)]  # Memory per node, GiB.
    nvme: Nvme = Nvme()  # The local NVMe devices used for scratch.


class NodeRole(StrEnum):
    COMPUTE = "compute"
    CONTROLLER = "controller"
    LOGIN = "login"


class Node(Strict):
    class_: str = Field(alias="class")  # The node's class: a key of `node_classes`.
    rack: str  # The node's rack: one listed under a site's leaf switch.
    # What the node is: compute, controller, login (each once).
    roles: Annotated[list[NodeRole], Field(min_length=1)] = [NodeRole.COMPUTE]
    # The team a node was historically pinned to; the baseline policy replays that.
    owner_team: str | None = None
    # Segment name -> the node's address in it; every node has a management address.
    addresses: Annotated[dict[str, Address], Field(min_length=1)]


class Capacity(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class BurstGroup(Strict):
    region: Region  # The AWS region the group's instances run in.
    # The zones of the region the instances may use.
    availability_zones: Annotated[list[Annotated[str, StringConstraints(
        pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9][a-z]$")]], Field(min_length=1)]
    # EC2 instance types, in order of preference; all carry the same GPUs (model and count).
    instance_types: Annotated[list[str], Field(min_length=1)]
    capacity: Annotated[list[Capacity], Field(min_length=1)]  # Spot, on-demand or both (each once).
    # Nodes always bought on demand before any spot; needs on-demand in capacity.
    on_demand_base: Annotated[Int, Field(ge=0, le=1000)] = 0
    # The fewest nodes the group runs; at most max_nodes.
    min_nodes: Annotated[Int, Field(ge=0, le=1000)] = 0
    max_nodes: Annotated[Int, Field(ge=0, le=1000)]  # The most nodes the group runs at once.
    efa: Bool = False  # Give the instances EFA interfaces (every type must have EFA).
    team: str | None = None  # None: shared by every team


class Role(StrEnum):
    RESEARCHER = "researcher"
    ONCALL = "oncall"
    CONTRACTOR = "contractor"
    ADMIN = "admin"


MAX_GPUS = 1_000_000  # a bound on any GPU count: no quota is worth more than every GPU


class Team(Strict):
    cost_centre: CostCentre  # The cost centre the team's usage is charged to.
    # GPU model -> the GPUs the team is guaranteed.
    quota: Annotated[dict[str, Annotated[Int, Field(ge=0, le=MAX_GPUS)]], Field(min_length=1)]
    # GPU model -> how many GPUs beyond its quota the team may borrow when others leave them
    # idle.
    borrowing_limit: dict[str, Annotated[Int, Field(ge=0, le=MAX_GPUS)]] = {}
    # MIG profile -> the most instances of it the team may hold at once (Slurm GrpTRES
    # gres/gpu:<profile>); only profiles some node class offers.
    mig_quota: dict[MigProfileName, Annotated[Int, Field(ge=0, le=7 * MAX_GPUS)]] = {}
    # Role -> the team's members (Unix user names) in that role.
    members: dict[Role, list[User]] = {}


# A Unix id the description fixes, the same on every host: a job runs under its
# submitter's uid on every node and NFS compares numbers, so they must agree everywhere.
# Debian's range for people (login.defs UID_MIN..UID_MAX).
UnixId = Annotated[Int, Field(ge=1000, le=59999)]


class Ids(Strict):
    """Fixed ids: a member's uid (their own group takes it as its gid) and a team group's
    gid. Without them each host numbers accounts in the order it creates them."""

    users: dict[User, UnixId] = {}  # Member -> uid (their own group's gid too).
    teams: dict[Name, UnixId] = {}  # Team -> its group's gid.


class ReclaimAction(StrEnum):
    CANCEL = "cancel"
    REQUEUE = "requeue"


class IdleReclaim(Strict):
    """GPUs a class's job holds but does not use are given back: a job whose every GPU
    stayed at or below `threshold_percent` utilization for `after` is warned, and ended or
    requeued `warn` later if they are still idle (gpupool/onhost/idle_reclaim.py, run on
    the controller by roles/idle_reclaim from dcgm-exporter's per-job series)."""

    after: Duration  # How long a job's GPUs must stay idle before it is warned.
    warn: Duration = "10m"  # How long after the warning the job is ended or requeued if still idle.
    # What is done to an idle job: cancel, or requeue (only in a class with requeue).
    action: ReclaimAction = ReclaimAction.CANCEL
    # GPU utilization at or below which a GPU counts as idle.
    threshold_percent: Annotated[Int, Field(ge=0, le=50)] = 0


class TaskClass(Strict):
    # The class's priority; unique among classes.
    priority: Annotated[Int, Field(ge=1, le=1_000_000)]
    max_runtime: Duration  # The longest a job of the class may run.
    preemptible: Bool  # Whether jobs of higher classes may preempt this class's jobs.
    # How long a preempted job has to save its work before it is stopped; preemptible
    # classes only, shorter than max_runtime.
    grace_time: Duration = "0s"
    # Requeue a preempted job instead of cancelling it; preemptible classes only.
    requeue: Bool = False
    # The task classes whose jobs this class preempts: each preemptible and of lower
    # priority.
    preempts: list[str] = []
    # Reclaim the GPUs of this class's jobs that leave them idle; absent: never.
    idle_reclaim: IdleReclaim | None = None
    description: str = ""  # Free text for people.


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
      nodes (checkpoints they write, datasets FSx imports): gpupool declares both sides, and
      copies between them only what the tier's `sync` declares (TierSync).
    """

    ONPREM = "onprem"
    CLOUD = "cloud"
    BOTH = "both"


class SyncDirection(StrEnum):
    """Which side of a `both` tier is the source a sync copies from.

    to_cloud: the on-prem mount to the bucket (datasets the burst nodes read).
    from_cloud: the bucket to the on-prem mount (checkpoints the burst nodes wrote, so an
      on-prem node can resume from them).
    """

    TO_CLOUD = "to_cloud"
    FROM_CLOUD = "from_cloud"


class TierSync(Strict):
    """A copy between a `both` tier's two sides, one way, on a timer on the primary
    controller (roles/storage_sync: rclone). One way only: a two-way sync would have to
    choose between two changed copies of a file, and a wrong choice loses work."""

    direction: SyncDirection  # Which side is the source.
    # How often the copy runs, minutes; a run still going when the next is due is not
    # started twice.
    every_minutes: Annotated[Int, Field(ge=5, le=1440)] = 60
    # Remove at the destination what the source no longer has (rclone sync). Off: copy
    # new and changed files only (rclone copy), never delete.
    delete: Bool = False


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
    # Where the tier is mounted on the nodes; unique among tiers.
    path: Annotated[str, StringConstraints(pattern=MOUNT_PATH_RE, max_length=255)]
    fstype: FsType  # The file system type.
    # What is mounted: server:/export (NFS) or nid@net:/fsname (Lustre); empty for local and
    # object.
    source: Annotated[str, StringConstraints(pattern=MOUNT_SOURCE_RE, max_length=255)] = ""
    # Mount options, among those gpupool allows for the fstype (such as noatime or
    # vers=4.2), each once.
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

    # The apt repository's base URL (https, or http: apt checks what it serves against the
    # signed Release file).
    repository: Annotated[str, StringConstraints(pattern=REPO_URL_RE, max_length=512)]
    # The repository's suite: a codename, or ./ for a flat repository.
    suite: Annotated[str, StringConstraints(pattern=APT_SUITE_RE)] = "./"
    # The repository's components; none for a flat repository.
    components: list[Annotated[str, StringConstraints(pattern=APT_COMPONENT_RE)]] = []
    # The ASCII-armoured public key that signs the repository's Release file, over https
    # only (an air-gapped pool serves it from its own mirror's https server).
    key_url: Annotated[str, StringConstraints(pattern=KEY_URL_RE, max_length=512)]
    version: PackageVersion  # The client version every node is pinned to.
    # The client's packages, each pinned to `version`: the tools and the kernel modules
    # (DKMS here; a vendor's prebuilt modules package in its place).
    packages: Annotated[list[Annotated[str, StringConstraints(pattern=DEB_NAME_RE)]],
                        Field(min_length=1)] = ["lustre-client-utils",
                                                "lustre-client-modules-dkms"]


class Transition(Strict):
    # Days after an object is written that it moves; transitions come in increasing days,
    # before retention ends.
    after_days: Annotated[Int, Field(ge=1, le=36500)]
    temperature: Temperature  # The colder temperature it moves to.


class StorageTier(Strict):
    purpose: Purpose  # What the tier holds.
    temperature: Temperature  # How quickly its data must be reachable.
    size_tib: Annotated[Number, Field(gt=0, le=100_000)]  # Its size, TiB.
    retention_days: Annotated[Int, Field(ge=1, le=36500)]  # How many days data is kept.
    mount: Mount | None = None  # How nodes mount it; absent: a bucket only.
    versioning: Bool = False  # Keep earlier versions of a bucket's objects.
    lifecycle: list[Transition] = []  # When a bucket's objects move to colder storage.
    # Where the tier lives (Location). Absent: a tier without a mount is a bucket in the
    # cloud (all it can be) and a mounted tier is on-prem; a mounted tier with a cloud side
    # says so. Never inferred from a server's address: a Lustre tier served on-prem is
    # never declared again as an FSx file system.
    location: Location | None = None
    # Keep a `both` tier's two sides in step (TierSync); absent: nothing is copied.
    sync: TierSync | None = None

    @property
    def located(self) -> Location:
        if self.location is not None:
            return self.location
        return Location.CLOUD if self.mount is None else Location.ONPREM

    @property
    def in_cloud(self) -> bool:
        return self.located is not Location.ONPREM


class Segment(Strict):
    cidr: Cidr  # The segment's on-prem network.
    # The segment's network in the burst VPC; required when there are burst groups.
    cloud_cidr: Cidr | None = None
    vlan: Annotated[Int, Field(ge=1, le=4094)]  # The segment's VLAN id; unique among segments.
    mtu: Annotated[Int, Field(ge=1280, le=9216)] = 1500  # The segment's MTU.
    rdma: Bool = False  # Whether the segment carries RDMA.


class Flow(Strict):
    from_: str = Field(alias="from")  # The segment the traffic comes from.
    to: str  # The segment it goes to.
    protocol: Annotated[str, StringConstraints(pattern=r"^(tcp|udp|all)$")]  # tcp, udp or all.
    # The ports allowed; required for tcp and udp.
    ports: list[Annotated[Int, Field(ge=1, le=65535)]] = []
    description: str = ""  # Free text for people.


# AWS resource ids as AWS writes them: a prefix and 8 or 17 lowercase hex digits. A Direct
# Connect gateway id is a lowercase UUID.
TRANSIT_GATEWAY_ID_RE = r"^tgw-([0-9a-f]{8}|[0-9a-f]{17})$"
DX_GATEWAY_ID_RE = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
# A customer gateway's BGP ASN as EC2 takes it (BgpAsn): 1 to 2^31-1.
BGP_ASN_MAX = 2_147_483_647


class Vpn(Strict):
    """A site-to-site VPN (two IPsec tunnels, BGP) to the on-prem customer gateway."""

    customer_gateway: Address  # the on-prem device's public IPv4 address
    bgp_asn: Annotated[Int, Field(ge=1, le=BGP_ASN_MAX)]  # The customer gateway's BGP ASN.


class Egress(StrEnum):
    """How private subnets reach AWS APIs: interface endpoints (no internet path at all),
    or a NAT gateway."""

    ENDPOINTS = "endpoints"
    NAT = "nat"


class HybridLink(Strict):
    """A burst region's path to on-prem: exactly one of a site-to-site VPN, an existing
    Transit Gateway (attached to the burst VPC) or an existing Direct Connect gateway
    (associated through a virtual private gateway)."""

    vpn: Vpn | None = None  # A site-to-site VPN to the on-prem customer gateway.
    # An existing Transit Gateway's id (tgw-...).
    transit_gateway: Annotated[str, StringConstraints(pattern=TRANSIT_GATEWAY_ID_RE)] | None = None
    # An existing Direct Connect gateway's id.
    direct_connect_gateway: Annotated[str, StringConstraints(
        pattern=DX_GATEWAY_ID_RE)] | None = None
    egress: Egress = Egress.ENDPOINTS

    @property
    def kind(self) -> str | None:
        kinds = [k for k in LINK_KINDS if getattr(self, k) is not None]
        return kinds[0] if len(kinds) == 1 else None


LINK_KINDS = ("vpn", "transit_gateway", "direct_connect_gateway")


class Network(Strict):
    # The networks administrators reach the pool from; never the whole internet.
    admin_cidrs: Annotated[list[Cidr], Field(min_length=1)]
    # Segment name -> its network; training, storage and management are required.
    segments: Annotated[dict[Name, Segment], Field(min_length=1)]
    flows: list[Flow] = []  # The traffic allowed between segments; anything else is refused.
    # burst region -> its hybrid link to on-prem; every region with burst groups has one.
    hybrid_links: dict[Region, HybridLink] = {}


class ReleaseLock(Strict):
    """Versions that differ on one Debian release; a component left out is the pool's."""

    nvidia_driver: PackageVersion | None = None  # The NVIDIA driver's version there.
    cuda: PackageVersion | None = None  # CUDA's version there.
    container_toolkit: PackageVersion | None = None  # The Container Toolkit's there.
    dcgm: PackageVersion | None = None  # DCGM's version there.
    dcgm_exporter: PackageVersion | None = None  # dcgm-exporter's, built for that DCGM.
    nccl: PackageVersion | None = None  # NCCL's version there.
    slurm: PackageVersion | None = None  # Slurm's version there: one its archive carries.


class Software(Strict):
    nvidia_driver: PackageVersion  # The NVIDIA driver's version.
    cuda: PackageVersion  # CUDA's version.
    container_toolkit: PackageVersion  # The NVIDIA Container Toolkit's version.
    dcgm: PackageVersion  # DCGM's version.
    # dcgm-exporter. NVIDIA pairs each exporter release with a DCGM release (container tags
    # <dcgm>-<exporter>, e.g. 3.3.9-3.6.1 and 4.2.3-4.1.3): lock the exporter built for
    # `dcgm`. Its Debian/RPM package (datacenter-gpu-manager-exporter) carries this version.
    dcgm_exporter: PackageVersion
    nccl: PackageVersion  # NCCL's version.
    gpu_operator: Version  # a Helm chart's version, written as NVIDIA tags it (v26.7.0)
    slurm: PackageVersion  # Slurm's version.
    # component (a field above) -> versions never to install (apt pins them out, so as
    # Debian writes them)
    blocklist: dict[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z_]{0,31}$")],
                    list[PackageVersion]] = {}
    # Debian release -> the versions that differ on it (each release's archive carries its
    # own Slurm and drivers): a node runs `software` with its class's release's entry in
    # place (gpupool/spec/os_release.py); validate checks Slurm's releases can talk.
    per_release: dict[OsRelease, ReleaseLock] = {}


class HealthStep(StrEnum):
    """What the health loop does when the gate advises a reset or a reboot."""

    ACT = "act"  # drain, wait for the node's jobs (bounded), act, gate again, return it
    DRAIN = "drain"  # drain and leave the action to on-call
    RECORD = "record"  # as act, but only record the action (a lab host cannot reboot)


class Health(Strict):
    """The health loop: every compute node gates itself at the quick tier from a timer
    (gpupool/gate/health.py, installed by roles/acceptance_gate) and acts on the verdict."""

    interval: Duration = "10m"  # How often each node gates itself.
    reset: HealthStep = HealthStep.ACT
    reboot: HealthStep = HealthStep.ACT
    # How long a drained node's jobs may run before they are requeued (or, where they
    # cannot be, the node is left drained for on-call) so the advised action can be taken.
    drain_timeout: Duration = "30m"
    # This many failures of one check within the window isolate the node: the few cards
    # that cause most failures are kept out instead of being reset again and again.
    isolate_after: Annotated[Int, Field(ge=1, le=100)] = 3
    window: Duration = "24h"  # The window in which isolate_after failures isolate a node.


class Backup(Strict):
    """Backups of the Slurm controller (roles/controller_backup, from a timer) to a bucket
    tier: the accounting database, Slurm's saved state, the munge key (encrypted) and the
    pool's own state; playbooks/controller_restore.yml puts one back."""

    # The storage tier whose bucket holds them. Its objects must stay retrievable at once
    # for as long as backups are kept: a restore does not wait hours on Deep Archive.
    tier: Name
    interval: Duration = "6h"  # How often a backup is taken (10 minutes to 7 days).
    keep: Annotated[Int, Field(ge=1, le=1000)] = 28  # How many backups are kept.


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
    # The nodes (keys of `nodes`) that run the control plane, each once.
    control_plane: Annotated[list[str], Field(min_length=1)]


# Environment images (issue 54). Every value below ends up in a Containerfile and an image
# reference, so each is held to what its consumer accepts and nothing else: no whitespace,
# quote, `$` or shell metacharacter passes any of these patterns.
# An image's name: one path component of an OCI repository name, as the distribution spec
# allows it (lowercase letters and digits, single separators inside).
IMAGE_NAME_RE = r"^[a-z0-9]+([._-][a-z0-9]+)*$"
IMAGE_NAME_MAX = 63  # with the registry host and pool name, far below the 255 of a reference
# An image's own version, the tag it is pushed with: MAJOR.MINOR.PATCH with an optional
# pre-release, nothing a tag refuses (no "+": OCI tags have no build metadata).
IMAGE_VERSION_RE = r"^[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}(-[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?$"
# A base image reference: [host[:port]/]repository[:tag][@sha256:digest], with a tag or a
# digest (never an implicit "latest"). Repository components as the OCI distribution spec
# writes them; the host as a DNS name or IPv4 address with an optional port (unanchored:
# the renderer holds the registry it pushes to to the same).
_REF_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
REGISTRY_HOST = rf"{_REF_LABEL}(\.{_REF_LABEL})*(:[0-9]{{1,5}})?"
_REF_COMPONENT = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
_REF_TAG = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"
_REF_DIGEST = r"sha256:[0-9a-f]{64}"
IMAGE_REF_RE = (rf"^({REGISTRY_HOST}/)?{_REF_COMPONENT}(/{_REF_COMPONENT})*"
                rf"(:{_REF_TAG}(@{_REF_DIGEST})?|@{_REF_DIGEST})$")
# A Debian package version ([epoch:]upstream[-revision], Debian Policy 5.6.12): with the
# name (DEB_NAME_RE), what `apt-get install name=version` takes as one word.
DEB_VERSION_RE = r"^([0-9]{1,9}:)?[0-9][A-Za-z0-9.+~]*(-[A-Za-z0-9.+~]+)*$"
# A Python requirement pinned to one exact version, `name==version`: a PEP 508 name and a
# PEP 440 public version (release, pre-, post-, dev-release), no extras, markers, ranges
# or local versions.
PYTHON_PIN_RE = (r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,62}[A-Za-z0-9])?=="
                 r"[0-9]{1,9}(\.[0-9]{1,9}){0,5}((a|b|rc)[0-9]{1,9})?(\.post[0-9]{1,9})?"
                 r"(\.dev[0-9]{1,9})?$")
# The CUDA user-space release an image carries: major.minor[.patch] ("12.4" is 12.4 GA).
CUDA_RELEASE_RE = r"^[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,3})?$"


def _version_text(value: object) -> object:
    """A version is text: YAML reads `12.4` as a number, which would lose `12.10`'s zero."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise PydanticCustomError(
            "version-text", "write the version in quotes ('{value}'): YAML reads it as a "
            "number", {"value": value})
    return value


def _pinned(value: object) -> object:
    if value is None or value == "":
        raise PydanticCustomError(
            "package-pinned", "a package is pinned to one exact version (`name: version`)")
    return _version_text(value)


ImageName = Annotated[str, StringConstraints(pattern=IMAGE_NAME_RE, max_length=IMAGE_NAME_MAX)]
DebPackage = Annotated[str, StringConstraints(pattern=DEB_NAME_RE)]
DebVersion = Annotated[str, BeforeValidator(_pinned),
                       StringConstraints(pattern=DEB_VERSION_RE, max_length=128)]
PythonPin = Annotated[str, StringConstraints(pattern=PYTHON_PIN_RE, max_length=128)]


class EnvironmentImage(Strict):
    """An image jobs run in: a base, pinned packages and a CUDA user-space release, built
    into a Containerfile (gpupool/render/environment_image.py) whose label carries the
    declaration's digest, so an image is rebuilt only when its declaration changes."""

    # The image's version, the tag it is pushed with: MAJOR.MINOR.PATCH[-pre-release].
    version: Annotated[str, BeforeValidator(_version_text),
                       StringConstraints(pattern=IMAGE_VERSION_RE, max_length=64)]
    # The image it is built FROM: [host/]repository with a :tag, an @sha256: digest or both.
    base: Annotated[str, StringConstraints(pattern=IMAGE_REF_RE, max_length=512)]
    # The CUDA user-space release it carries (major.minor[.patch]); the locked driver
    # must be one that release's toolkit needs at least (rule image-cuda-driver).
    cuda: Annotated[str, BeforeValidator(_version_text),
                    StringConstraints(pattern=CUDA_RELEASE_RE)]
    # Debian package -> the exact version installed (apt-get install name=version).
    packages: Annotated[dict[DebPackage, DebVersion], Field(max_length=512)] = {}
    # Python packages, each pinned `name==version`, installed with pip after the Debian
    # packages; each name once.
    python_packages: Annotated[list[PythonPin], Field(max_length=512)] = []
    # The teams (keys of `teams`) whose jobs use the image.
    teams: list[str] = []
    # The task classes (keys of `task_classes`) whose jobs use the image; an image names
    # teams, classes or both.
    task_classes: list[str] = []


# The registry's port: unprivileged, and none of the ports the pool's daemons already use
# (rule image-registry-port).
REGISTRY_PORT_RANGE = (1024, 65535)


class ImageRegistry(Strict):
    """The pool's own registry for its environment images (role image_registry): Debian's
    docker-registry on one on-prem node, over TLS with a certificate the pool's CA signs
    and password authentication. Nodes pull from it on the registry host's management
    address, read-only; images are pushed only on the registry host itself (a second,
    writable instance on its loopback). Absent: no registry; images are pushed wherever
    `gpupool images --registry` names."""

    # The node (a key of `nodes`) that serves the registry; it needs a management address.
    host: Name
    # The TCP port nodes pull from, on the host's management address.
    port: Annotated[Int, Field(ge=REGISTRY_PORT_RANGE[0], le=REGISTRY_PORT_RANGE[1])] = 5000
    # The storage tier (a key of `storage_tiers`, mounted on-prem) that holds the images:
    # under <mount path>/gpupool-registry.
    tier: Name
    # The space the registry may take on the tier, GiB; the tier must hold it.
    size_gib: Annotated[Int, Field(ge=1, le=10_000_000)]


class Description(Strict):
    """A whole pool. `version` is the schema version, for migrations."""

    version: Annotated[Int, Field(ge=1, le=1)]  # The schema version of the description: 1.
    pool: Pool  # The pool's identity and its pool-wide settings.
    # The on-prem sites: site name -> its leaf switches and racks.
    sites: Annotated[dict[Name, Site], Field(min_length=1)]
    # The kinds of on-prem node: class name -> its hardware.
    node_classes: Annotated[dict[Name, NodeClass], Field(min_length=1)]
    # The on-prem nodes: node name (its host name) -> class, rack, roles and addresses.
    nodes: Annotated[dict[Name, Node], Field(min_length=1)]
    # Cloud capacity the pool bursts into: group name -> its instances.
    burst_groups: dict[Name, BurstGroup] = {}
    # The teams that share the pool: team name -> quotas and members.
    teams: Annotated[dict[Name, Team], Field(min_length=1)]
    # The kinds of job: class name -> priority, limits and preemption.
    task_classes: Annotated[dict[Name, TaskClass], Field(min_length=1)]
    # The storage tiers: tier name -> purpose, size, retention and where it lives.
    storage_tiers: Annotated[dict[Name, StorageTier], Field(min_length=1)]
    # Where the Lustre client comes from; needed when a tier mounts Lustre.
    lustre_client: LustreClient | None = None
    # The network segments, the flows allowed between them and the burst regions' links to
    # on-prem.
    network: Network
    software: Software  # The exact version of every component installed.
    kubernetes: Kubernetes | None = None  # A Kubernetes cluster over the pool's nodes.
    # Images jobs run in: image name -> its base, pinned packages, CUDA release and users.
    # Absent: none.
    environment_images: dict[Annotated[str, StringConstraints(
        pattern=IMAGE_NAME_RE, max_length=IMAGE_NAME_MAX)], EnvironmentImage] = {}
    # The pool's own registry that serves the environment images. Absent: none.
    image_registry: ImageRegistry | None = None
    health: Health = Health()  # The health loop on every compute node.
    backup: Backup | None = None  # Backups of the Slurm controller.
    failover: Failover | None = None  # A backup Slurm controller.
    ids: Ids = Ids()  # Fixed Unix ids of members and team groups.
    # The merge gate's budgets (`gpupool replay --compare`, docs/measuring.md): replay figure
    # -> how far a revision of this description may move it on the same trace, e.g.
    # `interactive.wait_p95: "+10%"` (may not grow by more than 10%), `makespan_s: "+30"`
    # (seconds), `gpu_utilization_saturated: "-5%"`. Kept with the policy they guard, so
    # a policy change and what it may cost are reviewed together.
    replay_budgets: Annotated[dict[Annotated[str, Field(max_length=80)],
                                   Annotated[str, Field(max_length=40)]],
                              Field(max_length=50)] = {}
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
    the bucket by it (gpupool/render/cloud/names.py bucket_name)."""
    return f"{pool}-{tier}-{region}"


RE_NAME = re.compile(NAME_RE)
