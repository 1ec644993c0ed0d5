"""The local lab pool: one podman host (systemd as PID 1) per on-prem node of a description.

Everything is derived from the description: one podman network per network segment with the
segment's CIDR, one host per node named after it, attached to the segments it has
addresses on with those addresses. The hosts boot an image of the Debian release their
node classes declare (one release per lab: Slurm 22.05 and 24.11 cannot share a pool),
built with debootstrap (no container registry) and cached as a tarball keyed by the hash
of its recipe. Ansible
reaches the hosts over SSH with a key generated into .lab/<pool>/.

Facts this module relies on are measured in shared/notes/lab-hosts.md (runc not crun,
cgroupfs, a containers.conf capping ulimits below the host's hard limit).

Public API (reused by the Slurm role tests and the acceptance gate):
    up(desc) -> LabState, down(desc), status(desc) -> LabState, inventory_path(desc),
    exec_(desc, node, argv), ssh(desc, node, command), lab_lock().
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from gpupool.lab import mirror
from gpupool.paths import PROJECT_ROOT
from gpupool.render import ansible_yaml, inventory
from gpupool.spec import os_release
from gpupool.spec.model import DEFAULT_RELEASE, SHARED_FSTYPES, Description, OsRelease

Report = Callable[[str], None]
T = TypeVar("T")

LOCK_PATH = Path("/tmp/gpupool-lab.lock")  # noqa: S108 - shared by every checkout on this machine
LOCK_WAIT_S = 1800
MIRROR = "http://deb.debian.org/debian"
IMAGE_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "python3", "python3-apt", "openssh-server",
    "iproute2", "sudo", "ca-certificates", "procps", "gnupg",
)
# Run inside the debootstrapped rootfs (chroot). Units that cannot work in a container are
# masked; host keys are generated per host at first boot, never shared through the image.
# systemd-sysctl is masked because /proc/sys is writable in lab hosts (so that hardening can
# apply namespaced net.* settings): at boot it would write kernel.* settings into the HOST.
CUSTOMIZE = """set -eu
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
for u in getty@tty1.service console-getty.service systemd-udevd.service \
         systemd-udevd-control.socket systemd-udevd-kernel.socket \
         systemd-modules-load.service sys-kernel-config.mount sys-kernel-debug.mount \
         systemd-remount-fs.service systemd-sysctl.service; do
  ln -sf /dev/null /etc/systemd/system/$u
done
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*
mkdir -p /etc/systemd/system/ssh.service.d /root/.ssh
chmod 700 /root/.ssh
printf '%s\\n' '[Service]' 'ExecStartPre=' 'ExecStartPre=/usr/bin/ssh-keygen -A' \
  'ExecStartPre=/usr/sbin/sshd -t' \
  > /etc/systemd/system/ssh.service.d/lab-hostkeys.conf
systemctl enable ssh.service
"""
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
MIRROR_MOUNT = "/srv/gpupool-mirror"
BOOT_WAIT_S = 60
SSH_WAIT_S = 60
POLL_S = 0.5


class LabError(RuntimeError):
    """The lab could not be brought to the requested state; the message says what failed."""


@dataclass
class HostState:
    name: str
    container: str
    state: str  # podman state: running, exited, ... or "absent"
    systemd: str = "unknown"
    addresses: dict[str, str] = field(default_factory=dict)


@dataclass
class LabState:
    pool: str
    image: str
    networks: dict[str, str]  # podman network -> subnet
    hosts: dict[str, HostState]
    inventory: str
    key: str
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return bool(self.hosts) and all(
            h.state == "running" and h.systemd in ("running", "degraded")
            for h in self.hosts.values())

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "ready": self.ready}


# -- a second lab beside the first ------------------------------------------------------

def relocate(raw: dict[str, Any], pool: str, second_octet_shift: int) -> dict[str, Any]:
    """A copy of a raw description as another lab: pool name `pool` (so its containers,
    networks and lab folder differ) and every IPv4 address and network moved by
    `second_octet_shift` in the second octet (10.231.30.11 -> 10.241.30.11 for 10), so both
    labs can run at once. Values that are not addresses are left as they are."""

    def move(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, list):
            return [move(v) for v in value]
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                if "/" in value:
                    net = ipaddress.IPv4Network(value)
                    return str(ipaddress.IPv4Network(
                        (int(net.network_address) + (second_octet_shift << 16), net.prefixlen)))
                return str(ipaddress.IPv4Address(value) + (second_octet_shift << 16))
        return value

    out = move(raw)
    out["pool"] = {**out["pool"], "name": pool}
    return out


# -- names and paths, all derived from the description ----------------------------------

def prefix(desc: Description) -> str:
    return f"gpupool-{desc.pool.name}"


def container_name(desc: Description, node: str) -> str:
    return f"{prefix(desc)}-{node}"


def network_name(desc: Description, segment: str) -> str:
    return f"{prefix(desc)}-{segment}"


def lab_dir(desc: Description) -> Path:
    return PROJECT_ROOT / ".lab" / desc.pool.name


def key_path(desc: Description) -> Path:
    return lab_dir(desc) / "id_ed25519"


def backup_key_path(desc: Description) -> Path:
    """The lab's controller backup key (roles/controller_backup), kept beside the SSH key
    and outside the hosts, so a rebuilt controller restores with it."""
    return lab_dir(desc) / "controller-backup.key"


def mirror_dir(desc: Description) -> Path:
    """The lab's local apt mirror (gpupool/lab/mirror.py), mounted read-only into each host."""
    return lab_dir(desc) / "mirror"


def inventory_path(desc: Description) -> Path:
    return lab_dir(desc) / "inventory.yml"


def cache_dir() -> Path:
    return Path(os.environ.get("GPUPOOL_CACHE", PROJECT_ROOT / ".cache"))


class Recipe(NamedTuple):
    """A debootstrapped image: its name, Debian suite and packages, and the script run in
    its root to finish it."""

    name: str
    suite: str
    packages: tuple[str, ...]
    customize: str


def base_recipe(release: OsRelease) -> Recipe:
    """The lab hosts' image for a Debian release (each its own name, so that one release's
    image never prunes another's: a Debian 12 and a Debian 13 lab can stand side by side)."""
    return Recipe(f"gpupool-base-{release.codename}", release.codename, IMAGE_PACKAGES,
                  CUSTOMIZE)


def lab_release(desc: Description) -> OsRelease:
    """The one Debian release a lab's hosts run: its node classes' (`os`)."""
    releases = os_release.releases_in_use(desc)
    if len(releases) > 1:
        raise LabError(f"the lab runs one Debian release, the description declares nodes "
                       f"on {', '.join(r.value for r in releases)}: give each release a lab "
                       "of its own")
    return releases[0] if releases else DEFAULT_RELEASE


def lab_recipe(desc: Description) -> Recipe:
    """The image a lab's hosts boot."""
    return base_recipe(lab_release(desc))


def image_hash(recipe: Recipe) -> str:
    data = json.dumps([recipe.suite, MIRROR, sorted(recipe.packages), recipe.customize])
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def image_ref(recipe: Recipe) -> str:
    return f"localhost/{recipe.name}:{image_hash(recipe)}"


def image_tarball(recipe: Recipe) -> Path:
    return cache_dir() / "lab-image" / f"{recipe.name}-{image_hash(recipe)}.tar.gz"


def labels(desc: Description) -> list[str]:
    return ["--label", f"gpupool.pool={desc.pool.name}"]


# -- running things ----------------------------------------------------------------------

def _containers_conf() -> Path:
    path = cache_dir() / "lab-containers.conf"
    if not path.exists() or path.read_text() != CONTAINERS_CONF:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(CONTAINERS_CONF)
    return path


def podman(*args: str, check: bool = True, timeout: float = 300
           ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": str(_containers_conf())}
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"podman {' '.join(args)} failed ({proc.returncode}): "
                       f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _run(argv: list[str], timeout: float = 600) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise LabError(f"{argv[0]} failed ({proc.returncode}): " + " | ".join(tail))


def require_tools() -> None:
    missing = [t for t in ("podman", "runc", "debootstrap", "ssh", "ssh-keygen")
               if shutil.which(t) is None]
    if missing:
        raise LabError(f"missing tools: {', '.join(missing)} (run scripts/bootstrap.sh)")
    if os.geteuid() != 0:
        raise LabError("the lab needs root (rootful podman with static addresses)")


_LOCK_DEPTH = 0  # this process already holds the lock: nested users just go on


@contextlib.contextmanager
def lab_lock(wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Exclusive lock serialising every lab user on this machine (tests, bench, CLI).
    Re-entrant within a process, so a command run inside a locked test does not wait
    for itself."""
    global _LOCK_DEPTH  # noqa: PLW0603 - one lock per process
    if _LOCK_DEPTH:
        _LOCK_DEPTH += 1
        try:
            yield
        finally:
            _LOCK_DEPTH -= 1
        return
    with LOCK_PATH.open("a") as fh:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LabError(f"another lab user held {LOCK_PATH} for more than "
                                   f"{wait_s:.0f}s; giving up") from None
                time.sleep(1)
        _LOCK_DEPTH = 1
        try:
            yield
        finally:
            _LOCK_DEPTH = 0
            fcntl.flock(fh, fcntl.LOCK_UN)


def wait_for(what: str, probe: Callable[[], T], timeout: float) -> T:
    """Poll probe until it returns something true (and return that); bounded."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(POLL_S)
    return value


# -- the image ---------------------------------------------------------------------------

def build_image(report: Report, recipe: Recipe) -> str:
    """A recipe's image: present in podman, else imported from the cached tarball, else
    built."""
    r = recipe
    ref = image_ref(r)
    if podman("image", "exists", ref, check=False).returncode == 0:
        return ref
    tarball = image_tarball(r)
    if not tarball.exists():
        report(f"building image {ref} with debootstrap (cold: about a minute)")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tarball.parent, prefix="rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            _run(["debootstrap", "--variant=minbase", f"--include={','.join(r.packages)}",
                  r.suite, str(rootfs), MIRROR], timeout=900)
            _run(["chroot", str(rootfs), "/bin/sh", "-c", r.customize])
            partial = tarball.with_suffix(".partial")
            _run(["sh", "-c", f'tar -C "{rootfs}" --numeric-owner -cf - . | gzip -1 > "{partial}"'])
            partial.rename(tarball)
    _prune_stale_images(r.name, ref, tarball, report)
    report(f"importing {tarball.name}")
    podman("import", "--change", 'CMD ["/sbin/init"]', "--change", "STOPSIGNAL=SIGRTMIN+3",
           str(tarball), ref, timeout=600)
    return ref


def _prune_stale_images(name: str, ref: str, tarball: Path, report: Report) -> None:
    """Images and tarballs of older recipes are dead weight (240 MB each): drop them."""
    for old in tarball.parent.glob(f"{name}-*.tar.gz"):
        if old != tarball:
            old.unlink()
    proc = podman("images", "--format", "{{.Repository}}:{{.Tag}}", f"localhost/{name}")
    stale = [i for i in proc.stdout.split() if i != ref]
    if stale:
        report(f"removing stale images {', '.join(stale)}")
        podman("rmi", "-f", *stale, check=False)


# -- up / down / status ------------------------------------------------------------------

def ensure_key(desc: Description) -> Path:
    key = key_path(desc)
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"gpupool-{desc.pool.name}-lab",
              "-f", str(key)])
    return key


def ensure_backup_key(desc: Description, path: Path | None = None) -> Path:
    """A lab key of the controller backups, kept in the lab's folder (a pool keeps its
    keys in Ansible Vault): the backup's encryption key, or the one its manifest is
    signed with (manifest_key_path), which a controller rebuilt from bare must have too."""
    path = path or backup_key_path(desc)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(48))
    return path


def manifest_key_path(desc: Description) -> Path:
    return lab_dir(desc) / "backup-manifest.key"


def known_hosts_path(desc: Description) -> Path:
    return lab_dir(desc) / "known_hosts"


# The key type the lab records and its SSH clients accept: one per host, so a host that
# offers another type is refused rather than trusted on first use.
HOST_KEY_TYPE = "ssh-ed25519"
HOST_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"


def _known_hosts_line(desc: Description, node: str, public_key: str) -> str:
    """One known_hosts line for a node: its name and every address it is reached at. The
    key is checked to be one ed25519 public key (type, base64), nothing more."""
    text = public_key.strip()
    parts = text.split()
    plain = len(parts) >= 2 and parts[1].isascii() and all(
        c.isalnum() or c in "+/=" for c in parts[1])
    if "\n" in text or not plain or parts[0] != HOST_KEY_TYPE:
        raise LabError(f"{node}: {HOST_KEY_FILE} holds no {HOST_KEY_TYPE} public key")
    names = [node, *desc.nodes[node].addresses.values()]
    return f"{','.join(names)} {parts[0]} {parts[1]}"


def record_host_key(desc: Description, node: str) -> None:
    """Record a host's SSH host key, read through podman (the lab's trusted channel, as a
    site reads a key from its provisioning or cloud-init's console output), so that every
    SSH connection to it, Ansible's and the gate's, verifies the host instead of trusting
    whoever answers at its address. Its former line, a former host's, is replaced."""
    def read() -> str:
        proc = exec_(desc, node, ["cat", HOST_KEY_FILE], timeout=30)
        return proc.stdout if proc.returncode == 0 else ""

    # sshd's unit makes the host keys before it starts (ssh-keygen -A): bounded wait.
    line = _known_hosts_line(desc, node, wait_for(f"the host key of {node}", read,
                                                  SSH_WAIT_S))
    path = known_hosts_path(desc)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    kept = [ln for ln in (path.read_text().splitlines() if path.exists() else [])
            if ln.split(",", 1)[0].split(" ", 1)[0] != node]
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text("".join(f"{ln}\n" for ln in [*kept, line]))
    tmp.replace(path)


def ssh_args(desc: Description) -> list[str]:
    # Three tries at a connection (ssh waits a second between them): on the 2-core lab a
    # host busy with a drill can miss one 5 s connect, and one lost SYN then failed a whole
    # health-check round (CI at 14b11ee). Bounded: at most 3 x 5 s plus 2 s.
    return ["-i", str(key_path(desc)), "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts_path(desc)}",
            "-o", f"HostKeyAlgorithms={HOST_KEY_TYPE}", "-o", "LogLevel=ERROR",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ConnectionAttempts=3"]


def ensure_networks(desc: Description) -> dict[str, str]:
    nets: dict[str, str] = {}
    for seg_name, seg in desc.network.segments.items():
        name = network_name(desc, seg_name)
        proc = podman("network", "inspect", name, check=False)
        if proc.returncode == 0:
            subnets = [s["subnet"] for s in json.loads(proc.stdout)[0].get("subnets", [])]
            if seg.cidr not in subnets:
                raise LabError(f"network {name} exists with {subnets}, description says "
                               f"{seg.cidr}: run `gpupool lab down` first")
        else:
            podman("network", "create", *labels(desc), "--subnet", seg.cidr, name)
        nets[name] = seg.cidr
    return nets


def _inspect(name: str) -> dict[str, object] | None:
    proc = podman("container", "inspect", name, check=False)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def shared_mounts(desc: Description) -> list[str]:
    """podman -v arguments: one host directory per network file system tier, shared by
    every lab host at the tier's mount point. It stands in for the NFS or Lustre server
    the lab cannot run (no kernel NFS server in unprivileged containers), so checkpoints
    written on one host are read on another, as on a real pool."""
    args = []
    for name, tier in desc.storage_tiers.items():
        if tier.mount is None or tier.mount.fstype not in SHARED_FSTYPES:
            continue
        src = lab_dir(desc) / "storage" / name
        src.mkdir(parents=True, exist_ok=True)
        mode = "ro" if "ro" in tier.mount.options else "rw"
        args += ["-v", f"{src}:{tier.mount.path}:{mode}"]
    return args


# What every lab host runs with, whatever its node: systemd as PID 1, and these privileges.
HOST_SYSTEMD = "--systemd=always"
HOST_PRIVILEGES = (
    # NET_ADMIN acts on the host's own network namespace only (nftables, net.*);
    # /proc/sys is unmasked so the hardening role can apply net.* sysctls.
    "--cap-add", "NET_ADMIN", "--security-opt", "unmask=/proc/sys",
    # Root on a real node holds every capability; the checkpoint-age collector's unit
    # keeps these two (role storage), which podman's default set lacks.
    "--cap-add", "SYS_PTRACE", "--cap-add", "DAC_READ_SEARCH",
)


def base_host_args() -> list[str]:
    """podman create's arguments that every lab host has, whatever its node and lab
    (_create_args adds the node's name, networks and mounts)."""
    return [HOST_SYSTEMD, *HOST_PRIVILEGES]


def _create_args(desc: Description, node: str, image: str) -> list[str]:
    """podman create's arguments for a node's host, less its name and labels."""
    nets = [a for seg, addr in desc.nodes[node].addresses.items()
            for a in ("--network", f"{network_name(desc, seg)}:ip={addr}")]
    hosts = [a for n, other in desc.nodes.items()
             for a in ("--add-host", f"{n}:{other.addresses['management']}")]
    return ["--hostname", node, HOST_SYSTEMD, *nets, *hosts, *HOST_PRIVILEGES,
            "-v", f"{key_path(desc)}.pub:/root/.ssh/authorized_keys:ro",
            "-v", f"{mirror_dir(desc)}:{MIRROR_MOUNT}:ro",
            *shared_mounts(desc),
            image]


def ensure_host(desc: Description, node: str, image: str, replace: bool = False) -> bool:
    """Create and start a node's host, reusing one made from the same arguments; returns
    whether it was (re)created. A host made from other arguments (another checkout's key,
    mirror or storage, an older image or layout) is replaced, never reused: a lab left by
    another clone on this machine mounts that clone's files."""
    name = container_name(desc, node)
    args = _create_args(desc, node, image)
    made = hashlib.sha256(json.dumps(args).encode()).hexdigest()[:16]
    info = _inspect(name)
    if info is not None and (replace or _label(info, "gpupool.create") != made):
        podman("rm", "-f", "-t", "0", name)
        info = None
    if info is None:
        podman("create", *labels(desc), "--label", f"gpupool.node={node}",
               "--label", f"gpupool.create={made}", "--name", name, *args)
    if info is None or info["State"]["Status"] != "running":  # type: ignore[index]
        podman("start", name)
    return info is None


# A gratuitous ARP on each of the host's IPv4 addresses, sent from inside it. A host made
# anew at an address an old one had (a node replaced, or re-imaged for repair) has a new
# MAC; its peers keep the old one in their neighbour caches until it goes stale, a minute
# or so in which the acceptance gate's flow probes toward it time out as if firewalled. A
# real host's network stack announces itself at boot; podman's does not, so the lab does.
_ANNOUNCE = """
import json, socket, struct, subprocess
for link in json.loads(subprocess.check_output(["ip", "-j", "addr", "show"])):
    if link["ifname"] == "lo" or not link.get("address"):
        continue
    mac = bytes.fromhex(link["address"].replace(":", ""))
    for addr in link.get("addr_info", []):
        if addr["family"] == "inet":
            ip = socket.inet_aton(addr["local"])
            arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + ip + bytes(6) + ip
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
                s.bind((link["ifname"], 0))
                s.send(b"\\xff" * 6 + mac + b"\\x08\\x06" + arp)
"""


def announce(desc: Description, node: str) -> None:
    """Tell the host's segments its addresses' MACs (_ANNOUNCE), so no peer keeps an old
    host's."""
    proc = exec_(desc, node, ["python3", "-c", _ANNOUNCE], timeout=30)
    if proc.returncode != 0:
        raise LabError(f"{node}: announcing its addresses failed: {proc.stderr.strip()[-500:]}")


def _label(info: dict[str, object], key: str) -> str:
    config = info.get("Config")
    found = config.get("Labels") if isinstance(config, dict) else None
    return str(found.get(key, "")) if isinstance(found, dict) else ""


def systemd_state(desc: Description, node: str) -> str:
    proc = podman("exec", container_name(desc, node), "systemctl", "is-system-running",
                  check=False, timeout=30)
    return proc.stdout.strip() or "unknown"


def exec_(desc: Description, node: str, argv: list[str], timeout: float = 120
          ) -> subprocess.CompletedProcess[str]:
    """Run argv inside a lab host through podman (no SSH); never raises on exit status."""
    return podman("exec", container_name(desc, node), *argv, check=False, timeout=timeout)


def ssh(desc: Description, node: str, command: str, timeout: float = 60
        ) -> subprocess.CompletedProcess[str]:
    """Run a shell command on a lab host over SSH, as Ansible does."""
    addr = desc.nodes[node].addresses["management"]
    return subprocess.run(["ssh", *ssh_args(desc), f"root@{addr}", command],
                          capture_output=True, text=True, timeout=timeout, check=False)


def _base_packages(image: str, recipe: Recipe) -> set[str]:
    """Packages a bare lab host already has (the mirror need not carry them)."""
    path = image_tarball(recipe).with_suffix(".packages")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)  # the image may predate this cache
        proc = podman("run", "--rm", "--network", "none", image, "dpkg-query", "-W",
                      "-f=${Package}\n")
        path.write_text(proc.stdout)
    return set(path.read_text().split())


def ensure_mirror(desc: Description, image: str, report: Report) -> str:
    """The lab's signed NVIDIA package mirror (see gpupool/lab/mirror.py); returns its key."""
    release = lab_release(desc)
    debs = mirror.nvidia_debs(desc, release, _base_packages(image, base_recipe(release)),
                              report)
    # One folder per release: its fixtures carry that release's lock under the same file
    # names, and two releases' mirrors may be made at once (the suite's Debian 13 lane).
    fixtures = cache_dir() / "fixture-debs" / release.codename
    fixtures.mkdir(parents=True, exist_ok=True)
    debs += mirror.fixture_debs(desc, release, fixtures)
    try:
        return mirror.build(desc, mirror_dir(desc), debs, lab_dir(desc) / "gnupg")
    except mirror.MirrorError as exc:
        raise LabError(str(exc)) from exc


def mirror_vars(mirror_key: str) -> dict[str, str]:
    """NVIDIA's repositories are unreachable here: the lab's NVIDIA software comes from its
    own signed mirror (real driver packages, fixture toolkit and DCGM), mounted at
    MIRROR_MOUNT in every lab host and the burst image's builder."""
    return {"nvidia_repo_source": "mirror", "nvidia_repo_mirror_url": f"file:{MIRROR_MOUNT}",
            "nvidia_repo_mirror_key": mirror_key}


def write_inventory(desc: Description, mirror_key: str) -> Path:
    inv = inventory.build(desc, {
        **mirror_vars(mirror_key),
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(key_path(desc)),
        "ansible_ssh_common_args": " ".join(ssh_args(desc)[2:]),
        "ansible_python_interpreter": "/usr/bin/python3",
        # The lab has no S3: backups stay on the controller's disk (the suite gives them a
        # local endpoint). The key is the lab's own, kept in its folder (a pool keeps its in
        # Ansible Vault); the inventory beside it is no more public.
        "controller_backup_upload": False,
        # Nor do the declared tier copies run: rclone and their units are installed; the
        # suite runs one against a local endpoint (test_storage_sync_lab).
        "storage_sync_start": False,
        "controller_backup_key": ensure_backup_key(desc).read_text().strip(),
        "controller_backup_manifest_key": ensure_backup_key(
            desc, manifest_key_path(desc)).read_text().strip(),
    }, cache_dir=cache_dir())
    path = inventory_path(desc)
    text = "# Written by `gpupool lab up`; regenerated on every run.\n" + ansible_yaml.dump(inv)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
        path.chmod(0o600)  # it holds the lab's backup key
    return path


def up(desc: Description, report: Report = lambda _m: None, nodes: list[str] | None = None
       ) -> LabState:
    """Bring the lab to its described state; a second call changes nothing.

    nodes: start only these hosts (the benchmark onboards subsets); default all."""
    chosen = list(desc.nodes) if nodes is None else nodes
    require_tools()
    t: dict[str, float] = {}
    start = time.monotonic()
    ensure_key(desc)
    image = build_image(report, lab_recipe(desc))
    t["image_s"] = time.monotonic() - start
    report(f"image {image} ready ({t['image_s']:.1f}s)")
    key = ensure_mirror(desc, image, report)
    report(f"package mirror {mirror_dir(desc).relative_to(PROJECT_ROOT)} ready")
    nets = ensure_networks(desc)
    report(f"networks {', '.join(f'{n} {c}' for n, c in nets.items())}")
    fresh = {node: ensure_host(desc, node, image) for node in chosen}
    for node in chosen:
        def booted(n: str = node) -> bool:
            return systemd_state(desc, n) in ("running", "degraded")

        try:
            wait_for(f"systemd on {node}", booted, BOOT_WAIT_S)
        except LabError:
            if fresh[node]:
                raise
            # A reused host that no longer boots (its processes killed under it, say) is
            # made anew, once.
            report(f"host {node} did not answer; recreating it")
            fresh[node] = ensure_host(desc, node, image, replace=True)
            wait_for(f"systemd on {node}", booted, BOOT_WAIT_S)
        record_host_key(desc, node)
        wait_for(f"ssh on {node}", lambda n=node: ssh(desc, n, "true").returncode == 0, SSH_WAIT_S)
        if fresh[node]:
            announce(desc, node)
        report(f"host {node} up ({', '.join(desc.nodes[node].addresses.values())})")
    inv = write_inventory(desc, key)
    t["up_s"] = time.monotonic() - start
    report(f"inventory {inv.relative_to(PROJECT_ROOT)}; lab up in {t['up_s']:.1f}s")
    state = status(desc)
    state.timings = t
    return state


def status(desc: Description) -> LabState:
    hosts: dict[str, HostState] = {}
    for node, n in desc.nodes.items():
        name = container_name(desc, node)
        info = _inspect(name)
        st = str(info["State"]["Status"]) if info else "absent"  # type: ignore[index]
        hosts[node] = HostState(node, name, st, systemd_state(desc, node) if st == "running"
                                else "down", dict(n.addresses))
    nets = {}
    for seg_name, seg in desc.network.segments.items():
        name = network_name(desc, seg_name)
        if podman("network", "exists", name, check=False).returncode == 0:
            nets[name] = seg.cidr
    inv = inventory_path(desc)
    return LabState(desc.pool.name, image_ref(lab_recipe(desc)), nets, hosts,
                    str(inv) if inv.exists() else "", str(key_path(desc)))


def fingerprint(desc: Description) -> list[str]:
    """What identifies this lab's hosts and networks as they run now (ids, state, start
    times): two equal fingerprints mean nothing was recreated or restarted in between."""
    if shutil.which("podman") is None:
        return []
    label = f"label=gpupool.pool={desc.pool.name}"
    # StartedAt is epoch seconds; State would read "Up 3 minutes ago" and change by itself.
    hosts = podman("ps", "-a", "--filter", label, "--format",
                   "{{.Names}} {{.ID}} {{.StartedAt}}", check=False).stdout
    nets = podman("network", "ls", "--filter", label, "--format", "{{.Name}} {{.ID}}",
                  check=False).stdout
    return sorted(line.strip() for line in (hosts + nets).splitlines() if line.strip())


def host_cpu_s(desc: Description, node: str) -> float | None:
    """CPU seconds a running lab host has used since it started, from its cgroup's own
    accounting (cgroup v1 cpuacct or v2 cpu.stat); None when it is not running."""
    info = _inspect(container_name(desc, node))
    if not info or info["State"]["Status"] != "running":  # type: ignore[index]
        return None
    path = str(info["State"]["CgroupPath"]).lstrip("/")  # type: ignore[index]
    v1 = Path("/sys/fs/cgroup/cpuacct") / path / "cpuacct.usage"
    if v1.exists():
        return int(v1.read_text()) / 1e9
    stat = dict(line.split() for line in (Path("/sys/fs/cgroup") / path / "cpu.stat")
                .read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


def _cgroup_leftovers(ids: list[str]) -> list[Path]:
    """cgroup directories (v1 hierarchies and v2) that still carry one of our container ids."""
    found: list[Path] = []
    root = Path("/sys/fs/cgroup")
    for parent in [root, *(p for p in root.iterdir() if p.is_dir())]:
        lp = parent / "libpod_parent"
        if lp.is_dir():
            found += [d for d in lp.iterdir() if any(i in d.name for i in ids)]
    return found


def _rmdir_tree(path: Path) -> None:
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


def down(desc: Description, report: Report = lambda _m: None) -> list[str]:
    """Remove every host, network and cgroup the lab created; returns what was removed."""
    require_tools()
    removed: list[str] = []
    proc = podman("ps", "-a", "--filter", f"label=gpupool.pool={desc.pool.name}",
                  "--format", "{{.ID}} {{.Names}}")
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()]
    ids = [r[0] for r in rows]
    full_ids = [str(i["Id"]) for n in (r[1] for r in rows) if (i := _inspect(n))]
    if rows:
        podman("rm", "-f", "-t", "5", *ids, timeout=120)
        removed += [r[1] for r in rows]
        report(f"removed hosts {', '.join(r[1] for r in rows)}")
    proc = podman("network", "ls", "--filter", f"label=gpupool.pool={desc.pool.name}",
                  "--format", "{{.Name}}")
    nets = proc.stdout.split()
    if nets:
        podman("network", "rm", "-f", *nets)
        removed += nets
        report(f"removed networks {', '.join(nets)}")
    # Images built for this lab alone (its burst image, gpupool/lab/burst_hosts.py).
    images = podman("images", "-q", "--filter",
                    f"label=gpupool.pool={desc.pool.name}").stdout.split()
    if images:
        podman("rmi", "-f", *sorted(set(images)), timeout=300)
        removed += images
        report(f"removed images {', '.join(images)}")
    for d in _cgroup_leftovers(full_ids):
        _rmdir_tree(d)
        removed.append(str(d))
    left = _cgroup_leftovers(full_ids)
    if left:
        raise LabError(f"cgroups left behind: {', '.join(map(str, left))}")
    return removed
