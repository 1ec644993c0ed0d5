"""The lab's signed local apt mirror for NVIDIA software (shared/notes/nvidia-airgap.md).

It carries the real NVIDIA driver userspace packages from Debian non-free (downloaded once
through a private apt configuration, never touching the host's own sources, and cached
under .cache/) plus FIXTURE packages under the names of NVIDIA-only software that no
reachable repository serves here (nvidia-container-toolkit, datacenter-gpu-manager,
datacenter-gpu-manager-exporter). The fixtures exist so that repository setup, pinning,
holding, services and configuration are exercised; they contain no NVIDIA code and
nothing about GPU behaviour follows from them.
"""

from __future__ import annotations

import filecmp
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import yaml

from gpupool.paths import PROJECT_ROOT
from gpupool.spec import os_release
from gpupool.spec.model import Description, OsRelease


def debian_sources(release: OsRelease) -> str:
    """apt's sources for a release's suites, non-free included (the driver's packages)."""
    c = release.codename
    return (f"deb http://deb.debian.org/debian {c} main contrib non-free non-free-firmware\n"
            f"deb http://deb.debian.org/debian {c}-updates main contrib non-free "
            "non-free-firmware\n"
            f"deb http://deb.debian.org/debian-security {c}-security main contrib non-free\n")

KEY_NAME = "gpupool-lab-mirror.asc"
FIXTURE_MARK = "FIXTURE built by gpupool for the lab: not NVIDIA software; no GPU behaviour"
LUSTRE_FIXTURE_MARK = "FIXTURE built by gpupool for the lab: not Lustre; mounts nothing"
# The Lustre client's packages as Whamcloud's Debian builds name them (roles/storage).
LUSTRE_PACKAGES = ("lustre-client-utils", "lustre-client-modules-dkms")


class MirrorError(RuntimeError):
    pass


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=900, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise MirrorError(f"{' '.join(argv[:3])} failed ({proc.returncode}): " + " | ".join(tail))
    return proc.stdout


def driver_packages() -> list[str]:
    """The driver role's own package list for Debian sources (roles/nvidia_driver/vars)."""
    data = yaml.safe_load((PROJECT_ROOT / "roles/nvidia_driver/vars/Debian.yml").read_text())
    return list(data["nvidia_driver_debian_packages"])


class PrivateApt:
    """apt-get/apt-cache against a Debian release with non-free enabled, in a directory of
    its own."""

    def __init__(self, root: Path, release: OsRelease) -> None:
        self.root = root
        (root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (root / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (root / "sources.list").write_text(debian_sources(release))
        self.opts = [f"-o=Dir::Etc::SourceList={root}/sources.list",
                     "-o=Dir::Etc::SourceParts=/dev/null",
                     f"-o=Dir::State::Lists={root}/lists", f"-o=Dir::Cache={root}/cache",
                     "-o=APT::Get::List-Cleanup=0"]

    def update(self) -> None:
        _run(["apt-get", *self.opts, "-qq", "update"])

    def closure(self, packages: list[str]) -> list[str]:
        out = _run(["apt-cache", *self.opts, "depends", "--recurse", "--no-recommends",
                    "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
                    "--no-enhances", *packages])
        return sorted({ln.strip() for ln in out.splitlines()
                       if ln and not ln.startswith(" ") and "<" not in ln})

    def download(self, packages: list[str], dest: Path) -> None:
        _run(["apt-get", *self.opts, "-qq", "download", *packages], cwd=dest)

    def versions(self, packages: list[str]) -> dict[str, list[str]]:
        """package -> every version the suites serve (apt-cache madison)."""
        out: dict[str, list[str]] = {p: [] for p in packages}
        for line in _run(["apt-cache", *self.opts, "madison", *packages]).splitlines():
            fields = [f.strip() for f in line.split("|")]
            if len(fields) == 3 and fields[0] in out and fields[1] not in out[fields[0]]:
                out[fields[0]].append(fields[1])
        return out


def _upstream(debian_version: str) -> str:
    """535.261.03-1 -> 535.261.03 (an epoch dropped)."""
    return debian_version.split(":", 1)[-1].rsplit("-", 1)[0]


def other_builds(versions: dict[str, list[str]], locked: str) -> list[str]:
    """The name=version of every package's build of each other driver version Debian's
    suites serve (a package with no build of that version, such as nvidia-modprobe or
    nvidia-persistenced with their own version streams, keeps its one build)."""
    others = sorted({_upstream(v) for v in versions.get("nvidia-smi", [])} - {locked})
    return sorted(f"{pkg}={v}" for pkg, vs in versions.items() for v in vs
                  if _upstream(v) in others)


def driver_versions(mirror_root: Path) -> list[str]:
    """The driver versions (nvidia-smi's upstream versions) a built mirror carries."""
    return sorted({_upstream(unquote(d.name.split("_")[1]))
                   for d in (mirror_root / "pool").glob("nvidia-smi_*.deb")})


def nvidia_debs(desc: Description, release: OsRelease, base_packages: set[str],
                report: Callable[[str], None]) -> list[Path]:
    """The driver packages and the dependencies a bare lab host lacks, cached by version:
    the locked build, and every other build of them that Debian's suites serve, so that an
    upgrade and a rollback between two real driver versions can be run in the lab (the
    locked one stays the only candidate: the role pins it)."""
    wanted = driver_packages()
    driver = os_release.versions(desc, release)["nvidia_driver"]
    key = hashlib.sha256(repr((wanted, sorted(base_packages), "other-builds")).encode()
                         ).hexdigest()[:12]
    cache = PROJECT_ROOT / ".cache" / "nvidia-debs" / f"{release.codename}-{driver}-{key}"
    if not (cache / ".complete").exists():
        report(f"downloading NVIDIA {driver} packages from Debian {release.codename} non-free")
        apt = PrivateApt(PROJECT_ROOT / ".cache" / f"apt-nonfree-{release.codename}", release)
        apt.update()
        needed = [p for p in apt.closure(wanted) if p not in base_packages]
        tmp = cache.with_name(cache.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        apt.download(needed, tmp)
        smi = list(tmp.glob("nvidia-smi_*.deb"))
        if not smi or not smi[0].name.startswith(f"nvidia-smi_{driver}-"):
            raise MirrorError(f"Debian {release.codename} non-free serves "
                              f"{[p.name for p in smi]}, the software lock says "
                              f"nvidia_driver {driver}")
        others = other_builds(apt.versions(needed), driver)
        if others:
            apt.download(others, tmp)
        (tmp / ".complete").write_text("\n".join(needed) + "\n")
        shutil.rmtree(cache, ignore_errors=True)
        tmp.rename(cache)
    return sorted(cache.glob("*.deb"))


# The lab's stand-in for /usr/bin/dcgm-exporter: gpupool/lab/fixture_dcgm_exporter.py, its
# FIXTURE banner filled in.
FIXTURE_DCGM_EXPORTER = Path(__file__).with_name("fixture_dcgm_exporter.py")


def _fixture_files(desc: Description, release: OsRelease | None = None
                   ) -> dict[str, tuple[str, dict[str, str]]]:
    """name -> (Debian version, {path: content}) of each fixture package, at the versions
    of the release's lock (release None: the pool's)."""
    sw = os_release.lock(desc, release)
    banner = f"#!/bin/sh\n# {FIXTURE_MARK}\n"
    return {
        "nvidia-container-toolkit": (f"{sw['container_toolkit']}-1", {
            "usr/bin/nvidia-ctk": banner + 'echo "nvidia-ctk fixture: $*" >&2\nexit 1\n',
        }),
        "datacenter-gpu-manager": (f"1:{sw['dcgm']}", {
            # A long-running process so that the service unit and its supervision are
            # exercised; it serves nothing.
            "usr/bin/nv-hostengine": banner + 'echo "nv-hostengine fixture" >&2\n'
                                              "exec sleep infinity\n",
            "usr/bin/dcgmi": banner + 'echo "dcgmi fixture: no DCGM in the lab" >&2\nexit 1\n',
            "lib/systemd/system/nvidia-dcgm.service":
                "[Unit]\nDescription=NVIDIA DCGM host engine (" + FIXTURE_MARK + ")\n"
                "[Service]\nExecStart=/usr/bin/nv-hostengine -n\nRestart=on-failure\n"
                "[Install]\nWantedBy=multi-user.target\n",
        }),
        "datacenter-gpu-manager-exporter": (f"{sw['dcgm_exporter']}-1", {
            "usr/bin/dcgm-exporter":
                FIXTURE_DCGM_EXPORTER.read_text().replace("@FIXTURE_MARK@", FIXTURE_MARK),
            # As the real package ships one (the dcgm role masks it and runs its own).
            "lib/systemd/system/nvidia-dcgm-exporter.service":
                "[Unit]\nDescription=NVIDIA DCGM exporter (" + FIXTURE_MARK + ")\n"
                "[Service]\nExecStart=/usr/bin/dcgm-exporter\n"
                "[Install]\nWantedBy=multi-user.target\n",
        }),
    }


def _deb(dest: Path, name: str, version: str, files: dict[str, str], mark: str) -> Path:
    """A package of files, built once into dest."""
    deb = dest / f"{name}_{version.replace(':', '%3a')}_amd64.deb"
    # Rebuilt when its content changes (a fixture program edited), not only when absent:
    # the digest of what went in is kept beside it.
    digest = hashlib.sha256(repr((name, version, sorted(files.items()), mark)).encode()
                            ).hexdigest()
    sidecar = deb.with_name(deb.name + ".sha256")
    if deb.exists() and sidecar.exists() and sidecar.read_text() == digest:
        return deb
    deb.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for rel, content in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            path.chmod(0o755 if rel.startswith("usr/bin") else 0o644)
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN" / "control").write_text(
            f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
            f"Maintainer: gpupool lab <lab@gpupool.invalid>\n"
            f"Description: {mark}\n")
        _run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)])
    sidecar.write_text(digest)
    return deb


def fixture_debs(desc: Description, release: OsRelease, dest: Path) -> list[Path]:
    return [_deb(dest, name, version, files, FIXTURE_MARK)
            for name, (version, files) in _fixture_files(desc, release).items()]


def lustre_fixture_debs(dest: Path, version: str) -> list[Path]:
    """FIXTURE packages named as the Lustre client's, at Debian version `version`-1: the
    lab has no Lustre (Debian packages none), so these prove how roles/storage installs,
    pins and holds the client from its repository, never what Lustre does."""
    banner = f"#!/bin/sh\n# {LUSTRE_FIXTURE_MARK}\n"
    files = {"lustre-client-utils": {"usr/bin/lctl": banner + 'echo "lctl fixture" >&2\nexit 1\n'},
             "lustre-client-modules-dkms": {f"usr/share/doc/{LUSTRE_PACKAGES[1]}/FIXTURE":
                                            LUSTRE_FIXTURE_MARK + "\n"}}
    return [_deb(dest, name, f"{version}-1", files[name], LUSTRE_FIXTURE_MARK)
            for name in LUSTRE_PACKAGES]


def _gpg_env(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return {**os.environ, "GNUPGHOME": str(home)}


def _signing_key(home: Path) -> dict[str, str]:
    env = _gpg_env(home)
    if not _run(["gpg", "--batch", "--list-secret-keys"], env=env).strip():
        _run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key",
              "gpupool lab mirror <lab@gpupool.invalid>", "ed25519", "sign", "never"], env=env)
    return env


def build(desc: Description, mirror: Path, debs: list[Path], gnupg: Path) -> str:
    """A flat, signed apt repository at mirror holding debs; returns the armored public key.

    Re-indexes only when the set of packages changed, so `lab up` stays idempotent."""
    pool = mirror / "pool"
    pool.mkdir(parents=True, exist_ok=True)
    names = {d.name for d in debs}
    for old in pool.glob("*.deb"):
        if old.name not in names:
            old.unlink()
    for deb in debs:
        target = pool / deb.name
        if target.exists() and not os.path.samefile(deb, target) \
                and not filecmp.cmp(deb, target, shallow=False):
            target.unlink()  # a fixture package rebuilt under the same name
        if not target.exists():
            try:
                os.link(deb, target)
            except OSError:
                shutil.copy2(deb, target)
    env = _signing_key(gnupg)
    # Names and sizes and times: a package rebuilt under its name is indexed again.
    stamp = hashlib.sha256(repr(sorted(
        (d.name, (pool / d.name).stat().st_size, (pool / d.name).stat().st_mtime_ns)
        for d in debs)).encode()).hexdigest()
    if (mirror / ".stamp").exists() and (mirror / ".stamp").read_text() == stamp:
        return (mirror / KEY_NAME).read_text()
    packages = _run(["apt-ftparchive", "packages", "pool"], cwd=mirror)
    (mirror / "Packages").write_text(packages)
    # Release is written via a temporary file, or it would list itself in its checksums.
    release = _run(["apt-ftparchive", "-o", f"APT::FTPArchive::Release::Origin=gpupool-"
                    f"{desc.pool.name}", "-o", "APT::FTPArchive::Release::Label=gpupool lab",
                    "release", "."], cwd=mirror)
    (mirror / "Release").write_text(release)
    for f in ("InRelease", "Release.gpg"):
        (mirror / f).unlink(missing_ok=True)
    _run(["gpg", "--batch", "--yes", "--clearsign", "-o", "InRelease", "Release"],
         env=env, cwd=mirror)
    _run(["gpg", "--batch", "--yes", "-abs", "-o", "Release.gpg", "Release"], env=env,
         cwd=mirror)
    key = _run(["gpg", "--batch", "--armor", "--export"], env=env)
    (mirror / KEY_NAME).write_text(key)
    (mirror / ".stamp").write_text(stamp)
    return key
