"""Backup and restore of the Slurm controller: what a rebuilt controller needs to carry on
where the old one stopped.

A backup is one tar file, `<pool>-<host>-<UTC time>.tar`, holding:
- `db.sql.gz`: the accounting database (accounts, associations, QOS, job history), dumped
  consistently with `mysqldump --single-transaction` while slurmdbd keeps running;
- `state.tar.gz`: slurmctld's StateSaveLocation (queued and running jobs, reservations,
  fairshare usage). slurmctld writes each state file to a new name and renames it, so a
  copy taken while it runs holds whole files;
- `munge.key.enc`: the pool's munge key, encrypted with the backup key (openssl,
  AES-256-CBC, PBKDF2): every node and every burst node's secret carry this key, and a
  rebuilt controller with another would be locked out of its own pool;
- `pool.tar.gz`: the pool's own state on the controller (/etc/gpupool, where the role puts
  the description the pool runs under, and /var/lib/gpupool: gate verdicts, health and
  idle-reclaim records), the two keys, the service's credentials and the backups
  themselves left out;
- `manifest.json`: each file's SHA-256 and size, the backup's name, the host, the time,
  Slurm's version;
- `manifest.hmac`: HMAC-SHA256 of manifest.json's bytes under the manifest key, a root-only
  file on the controller that never goes into a backup. Whoever can write the bucket (its
  S3 credentials, a burst node's role) cannot forge a backup the restore accepts: the
  checksums alone would only catch damage.

Backups go to the archive tier's bucket (S3; the lab gives a local endpoint), under a
prefix; the newest `keep` of this pool and host are kept there, and the newest one on the
controller's disk. Without a bucket they stay on disk, `keep` of them.

Retention orders this host's backups by S3's LastModified (by the time in the name on
disk); a name that claims a time in the future or does not parse is never counted, so an
object planted under a far-future name neither becomes `latest` nor pushes a real backup
out.

`restore` fetches one (the newest, a name, or a local file) and, before it touches
anything, verifies the manifest's HMAC, that the members are exactly the manifest's (names,
sizes, checksums) and that the manifest names this backup, decrypts the munge key, and
refuses a dump holding a mysql client command (`\\!`, `system`, `source`, `tee`, `pager`...).
Then it stops slurmctld and slurmdbd, loads the database (`mysql --binary-mode`, and
`--sandbox` where the client has it), puts the state directory and the munge key back,
restores pool files that are missing (a rebuilt controller's freshly rendered
configuration is kept), restarts munge and starts slurmdbd, then slurmctld once the
database answers. Every archive member is checked before extraction: regular files and
directories only, relative, no `..`.

Series for node_exporter's textfile collector (the ControllerBackupFailing alert):
gpupool_controller_backup_up, _last_success_seconds, _bytes, _duration_seconds,
_interval_seconds.

    python3 controller_backup.py --config /etc/gpupool/controller-backup.json backup
    python3 controller_backup.py --config /etc/gpupool/controller-backup.json restore --from latest

Runs as root on the controller with the system python3, python3-boto3 (only when a bucket
is configured) and python3-prometheus-client: it is copied to the host as is.
"""

from __future__ import annotations

import argparse
import calendar
import dataclasses
import gzip
import hashlib
import hmac
import json
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

log = logging.getLogger("gpupool-controller-backup")

DATA = ("db.sql.gz", "state.tar.gz", "munge.key.enc", "pool.tar.gz")
MEMBERS = (*DATA, "manifest.json", "manifest.hmac")
# Domain separation: the manifest key signs nothing else, and a later format gets v2.
HMAC_CONTEXT = b"gpupool-controller-backup-manifest-v1\n"
MANIFEST_MAX = 1 << 20  # bytes of manifest.json read before it is authenticated
MIN_KEY = 32  # bytes of a key file
# A name may claim a time this far past the clock (controllers' clocks disagree a little);
# beyond it the name is a plant or a broken clock, and retention ignores it.
CLOCK_SKEW_S = 300.0
# mysql client commands a dump must not hold at the start of a line: mysqldump writes none,
# and these run programs (\!, system, edit), read files (\., source) or write them (\T,
# tee, pager). Every backslash command is refused there, and the long forms that reach the
# shell or the file system (the client parses long forms at the start of a line only).
CLIENT_COMMAND_RE = re.compile(
    rb"[ \t\r\f\v]*(\\|(system|source|tee|pager|edit)([ \t\r\f\v;]|$))", re.IGNORECASE)
HELP_TIMEOUT_S = 30.0
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}-[0-9]{8}T[0-9]{6}Z")
SAFE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
PREFIX_RE = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*/){0,4}")
PATH_RE = re.compile(r"(/[A-Za-z0-9_][-A-Za-z0-9_.]*)+")
URL_RE = re.compile(r"https?://[A-Za-z0-9.:\[\]-]+/?")
REGION_RE = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]")
COMMAND_TIMEOUT_S = 900.0
# Dumping or loading years of job records takes long; still bounded (the unit's own
# TimeoutStartSec bounds a backup as a whole).
DATABASE_TIMEOUT_S = 4 * 3600.0
DBD_WAIT_S = 120.0  # slurmdbd answering after its start
# slurmctld writes a change to StateSaveLocation within SAVE_MAX_WAIT (5 s) of making it
# (src/slurmctld/state_save.c): the state is copied this long after the backup began, so
# it holds every change made before then (a job submitted a second before is not lost).
STATE_SETTLE_S = 10.0
POLL_S = 2.0
MAX_MEMBERS = 100_000  # files in the state archive
PBKDF2_ITER = "200000"
SEALED = ("openssl", "enc", "-aes-256-cbc", "-pbkdf2", "-iter", PBKDF2_ITER, "-salt")


class BackupError(RuntimeError):
    """A step failed; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class Config:
    pool: str
    host: str
    staging_dir: Path
    keep: int
    database: str
    state_dir: Path
    munge_key: Path
    key_file: Path
    manifest_key_file: Path
    pool_dirs: tuple[Path, ...]
    textfile: Path | None
    interval_s: int
    bucket: str | None = None
    prefix: str = "controller/"
    region: str | None = None
    endpoint_url: str | None = None
    # Files under pool_dirs a backup must not carry (the service's root-only credentials).
    exclude: tuple[Path, ...] = ()


def _field(raw: dict[str, Any], key: str, pattern: re.Pattern[str] | None = None,
           kind: type = str, optional: bool = False) -> Any:
    value = raw.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise BackupError(f"config: {key} must be a {kind.__name__}")
    if pattern is not None and not pattern.fullmatch(value):
        raise BackupError(f"config: {key} {value!r} is malformed")
    return value


def load_config(path: Path) -> Config:
    """The role's JSON configuration, every value checked: it names paths root writes."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"config {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise BackupError(f"config {path}: not a JSON object")
    keep = _field(raw, "keep", kind=int)
    interval = _field(raw, "interval_s", kind=int)
    if not 1 <= keep <= 1000 or not 60 <= interval <= 31 * 86400:
        raise BackupError("config: keep must be 1-1000 and interval_s 60 s to 31 days")
    dirs = raw.get("pool_dirs", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) and PATH_RE.fullmatch(d)
                                             for d in dirs):
        raise BackupError("config: pool_dirs must be a list of absolute paths")
    exclude = raw.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(d, str) and PATH_RE.fullmatch(d)
                                                for d in exclude):
        raise BackupError("config: exclude must be a list of absolute paths")
    textfile = _field(raw, "textfile", PATH_RE, optional=True)
    return Config(
        pool=_field(raw, "pool", SAFE_NAME_RE), host=_field(raw, "host", SAFE_NAME_RE),
        staging_dir=Path(_field(raw, "staging_dir", PATH_RE)), keep=keep,
        database=_field(raw, "database", SAFE_NAME_RE),
        state_dir=Path(_field(raw, "state_dir", PATH_RE)),
        munge_key=Path(_field(raw, "munge_key", PATH_RE)),
        key_file=Path(_field(raw, "key_file", PATH_RE)),
        manifest_key_file=Path(_field(raw, "manifest_key_file", PATH_RE)),
        pool_dirs=tuple(Path(d) for d in dirs),
        textfile=Path(textfile) if textfile else None, interval_s=interval,
        bucket=_field(raw, "bucket", BUCKET_RE, optional=True),
        prefix=_field(raw, "prefix", PREFIX_RE, optional=True) or "",
        region=_field(raw, "region", REGION_RE, optional=True),
        endpoint_url=_field(raw, "endpoint_url", URL_RE, optional=True),
        exclude=tuple(Path(d) for d in exclude))


Run = Callable[..., str]


def run_command(argv: list[str], stdin: Path | None = None, stdout: Path | None = None,
                timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Run argv; stdin and stdout may be files. Returns what it printed (when not to a
    file); a failure is a BackupError with what the command said."""
    with (open(stdin, "rb") if stdin else open(os.devnull, "rb")) as fin, \
            (open(stdout, "wb") if stdout else open(os.devnull, "wb")) as fout:
        try:
            proc = subprocess.run(argv, stdin=fin, stdout=fout if stdout else subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackupError(f"{argv[0]}: {exc}") from exc
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace").strip().splitlines()
        raise BackupError(f"{argv[0]} exited {proc.returncode}: {' '.join(said[-3:])}")
    return "" if stdout else proc.stdout.decode(errors="replace")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_key(cfg: Config) -> bytes:
    """The manifest key: a secret only if no one but root can read it, so a file others can
    read or write, or one too short to resist guessing, is refused."""
    path = cfg.manifest_key_file
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            key = f.read(4096).strip()
    except OSError as exc:
        raise BackupError(f"manifest key {path}: {exc}") from exc
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise BackupError(f"manifest key {path}: must be a regular file only its owner "
                          "(root) can read")
    if len(key) < MIN_KEY:
        raise BackupError(f"manifest key {path}: shorter than {MIN_KEY} bytes")
    return key


def sign(key: bytes, manifest: bytes) -> str:
    return hmac.new(key, HMAC_CONTEXT + manifest, hashlib.sha256).hexdigest()


def backup_name(cfg: Config, now: float) -> str:
    return f"{cfg.pool}-{cfg.host}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}"


def name_time(name: str) -> float | None:
    """The UTC time a backup's name claims, or None where it does not parse (NAME_RE lets
    month 13 through)."""
    stamp = name.removesuffix(".tar")[-16:]
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ")))
    except ValueError:
        return None


def _ours(cfg: Config, name: str) -> bool:
    """A backup this pool's controller host wrote (the only ones retention removes)."""
    stem = name.removesuffix(".tar")
    return name.endswith(".tar") and stem.startswith(f"{cfg.pool}-{cfg.host}-") \
        and NAME_RE.fullmatch(stem) is not None


def ranked(cfg: Config, objects: Mapping[str, float | None], now: float) -> list[str]:
    """This pool's and host's backups, oldest first: by when S3 says each was written
    (the value; None on disk), then by the time in the name. Anyone who can write the bucket
    chooses names, not LastModified: a name that claims a time past now (beyond the clock
    skew) or none at all is left out, so it is never `latest` and never pushes a real
    backup out of the newest `keep`."""
    order = []
    for name, modified in objects.items():
        if not _ours(cfg, name):
            continue
        taken = name_time(name)
        if taken is None or taken > now + CLOCK_SKEW_S:
            log.warning("ignoring %s: its name claims no time or one in the future", name)
            continue
        order.append((taken if modified is None else modified, taken, name))
    return [name for _, _, name in sorted(order)]


def to_prune(cfg: Config, objects: Mapping[str, float | None], now: float,
             protect: str | None = None) -> list[str]:
    """The backups beyond the newest `keep` (ranked); never `protect`, the one just taken."""
    mine = ranked(cfg, objects, now)
    old = mine[:-cfg.keep] if len(mine) > cfg.keep else []
    return [n for n in old if n != protect]


def tar_tree(out: Path, roots: list[Path], base: Path, skip: tuple[Path, ...]) -> int:
    """Regular files under roots into a gzipped tar, named relative to base; returns how
    many. Each file is read through one open descriptor and sized by it, so a file that a
    running daemon replaces meanwhile (slurmctld renames new state over old) is copied
    whole, old or new, and never fails the backup as GNU tar's "file changed" does."""
    count = 0
    with tarfile.open(out, "w:gz") as tar:
        for root in roots:
            if not root.is_dir():
                continue
            for dirpath, dirnames, filenames in os.walk(root):
                here = Path(dirpath)
                dirnames[:] = sorted(d for d in dirnames if here / d not in skip)
                for name in sorted(filenames):
                    path = here / name
                    if path in skip:
                        continue
                    try:
                        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                    except OSError:  # gone, or a link: nothing to keep
                        continue
                    with os.fdopen(fd, "rb") as f:
                        st = os.fstat(f.fileno())
                        if not stat.S_ISREG(st.st_mode):
                            continue
                        info = tarfile.TarInfo(str(path.relative_to(base)))
                        info.size, info.mode, info.mtime = st.st_size, st.st_mode & 0o7777, \
                            int(st.st_mtime)
                        info.uid, info.gid = st.st_uid, st.st_gid
                        tar.addfile(info, f)
                        count += 1
                        if count > MAX_MEMBERS:
                            raise BackupError(f"more than {MAX_MEMBERS} files under {root}")
    return count


def make_archive(cfg: Config, now: float, run: Run = run_command,
                 settle_s: float = STATE_SETTLE_S) -> Path:
    """Write one backup into the staging directory; returns its path. The database first,
    then slurmctld's state once settled: slurmctld is the source of truth, and sends
    slurmdbd the records of jobs the database lacks when it starts."""
    began = time.monotonic()
    name = backup_name(cfg, now)
    work = cfg.staging_dir / ".partial"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700, parents=True)
    dump = work / "db.sql"
    run(["mysqldump", "--single-transaction", "--quick", "--routines", "--add-drop-database",
         "--databases", cfg.database], stdout=dump, timeout=DATABASE_TIMEOUT_S)
    with dump.open("rb") as fin, gzip.open(work / "db.sql.gz", "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    dump.unlink()
    time.sleep(max(0.0, settle_s - (time.monotonic() - began)))
    tar_tree(work / "state.tar.gz", [cfg.state_dir], cfg.state_dir, ())
    key = manifest_key(cfg)  # before the long steps: a missing key fails the backup at once
    run([*SEALED, "-in", str(cfg.munge_key), "-out", str(work / "munge.key.enc"),
         "-pass", f"file:{cfg.key_file}"])
    # Neither key may reach the bucket: one would decrypt the munge key, the other forge;
    # nor the excluded (the S3 credentials the role writes under /etc/gpupool).
    tar_tree(work / "pool.tar.gz", list(cfg.pool_dirs), Path("/"),
             (cfg.staging_dir, cfg.key_file, cfg.manifest_key_file, *cfg.exclude))
    files = {m: {"sha256": sha256(work / m), "bytes": (work / m).stat().st_size}
             for m in DATA}
    try:
        version = run(["slurmctld", "-V"]).strip()
    except BackupError:
        version = "unknown"
    manifest = (json.dumps({
        "name": name, "pool": cfg.pool, "host": cfg.host, "created": int(now),
        "slurm": version, "files": files}, indent=2) + "\n").encode()
    (work / "manifest.json").write_bytes(manifest)
    (work / "manifest.hmac").write_text(sign(key, manifest) + "\n")
    out = cfg.staging_dir / f"{name}.tar"
    with tarfile.open(out.with_suffix(".tar.partial"), "w") as tar:
        for m in MEMBERS:
            tar.add(work / m, arcname=m)
    out.with_suffix(".tar.partial").rename(out)
    out.chmod(0o600)
    shutil.rmtree(work)
    return out


def s3_client(cfg: Config) -> Any:
    import boto3  # noqa: PLC0415 - only a controller with a bucket needs it

    return boto3.client("s3", region_name=cfg.region, endpoint_url=cfg.endpoint_url)


def remote_objects(cfg: Config, s3: Any) -> dict[str, float | None]:
    """The objects right under the prefix: name -> LastModified (S3's clock, which no
    writer of the bucket sets)."""
    objects: dict[str, float | None] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=cfg.bucket, Prefix=cfg.prefix, PaginationConfig={"MaxItems": 100_000}):
        for o in page.get("Contents", []):
            name, modified = o["Key"][len(cfg.prefix):], o.get("LastModified")
            if "/" not in name:
                objects[name] = modified.timestamp() if modified is not None else None
    return objects


def backup(cfg: Config, now: float, run: Run = run_command, s3: Any = None,
           settle_s: float = STATE_SETTLE_S) -> dict[str, Any]:
    """One backup, shipped and pruned; returns what was done."""
    cfg.staging_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    start = time.monotonic()
    path = make_archive(cfg, now, run, settle_s)
    report: dict[str, Any] = {"backup": path.name, "bytes": path.stat().st_size}
    local = sorted(p.name for p in cfg.staging_dir.glob("*.tar"))
    if cfg.bucket:
        s3 = s3 or s3_client(cfg)
        s3.upload_file(str(path), cfg.bucket, cfg.prefix + path.name)
        pruned = to_prune(cfg, remote_objects(cfg, s3), now, protect=path.name)
        for name in pruned:
            s3.delete_object(Bucket=cfg.bucket, Key=cfg.prefix + name)
        report |= {"uploaded": f"s3://{cfg.bucket}/{cfg.prefix}{path.name}",
                   "pruned": pruned}
        local_pruned = [n for n in local if _ours(cfg, n) and n != path.name]
    else:
        local_pruned = to_prune(cfg, dict.fromkeys(local), now, protect=path.name)
        report["pruned"] = local_pruned
    for name in local_pruned:
        (cfg.staging_dir / name).unlink()
    report["duration_s"] = round(time.monotonic() - start, 2)
    return report


# Restore.

def _check_members(tar: tarfile.TarFile, allowed: tuple[str, ...] | None) -> list[tarfile.TarInfo]:
    """Members that are safe to extract as root, or a BackupError naming the first that
    is not: regular files and directories only, relative, no `..`, no more than MAX. With
    `allowed` (the outer archive): only those names, regular files, each once (a second
    copy of a name would be what extraction leaves)."""
    members = []
    seen: set[str] = set()
    for i, m in enumerate(tar):
        if i >= MAX_MEMBERS:
            raise BackupError(f"more than {MAX_MEMBERS} members")
        parts = Path(m.name).parts
        if (m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir())
                or (allowed is not None and (m.name not in allowed or not m.isfile()
                                             or m.name in seen))):
            raise BackupError(f"refusing archive member {m.name!r}")
        seen.add(m.name)
        members.append(m)
    return members


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> bytes:
    if member.size > limit:
        raise BackupError(f"refusing archive member {member.name!r}: over {limit} bytes")
    f = tar.extractfile(member)
    return f.read() if f is not None else b""


NO_HMAC = ("{name}: no authenticated manifest (manifest.hmac): it was taken before backups "
           "were signed, or someone removed it. Restore one taken since (name it with "
           "--from, or controller_restore_from), or take one now: systemctl start "
           "gpupool-controller-backup.service")


def unpack(archive: Path, dest: Path, key: bytes, expect_name: str | None) -> dict[str, Any]:
    """Verify a backup and extract its files into dest; returns its manifest. The manifest
    is authenticated before anything but it is read, and the other members are extracted
    only when their names and sizes are the manifest's: a planted archive is refused
    before it can fill the disk. `expect_name`: the name it was fetched under, which the
    signed manifest must carry (an old backup re-uploaded as a newer name is refused)."""
    label = archive.name
    try:
        with tarfile.open(archive, "r:") as tar:
            members = {m.name: m for m in _check_members(tar, MEMBERS)}
            if "manifest.json" not in members:
                raise BackupError(f"{label}: no manifest (manifest.json)")
            if "manifest.hmac" not in members:
                raise BackupError(NO_HMAC.format(name=label))
            raw = _read_member(tar, members["manifest.json"], MANIFEST_MAX)
            given = _read_member(tar, members["manifest.hmac"], 1024).strip()
            if not hmac.compare_digest(sign(key, raw).encode(), given):
                raise BackupError(
                    f"{label}: the manifest's HMAC does not verify under the manifest key: "
                    "the backup was forged or altered, or taken under another key (a "
                    "controller rebuilt from bare needs the key its backups were taken "
                    "with: controller_backup_manifest_key)")
            try:
                manifest = json.loads(raw)
                files = manifest["files"]
                sizes = {m: int(files[m]["bytes"]) for m in files}
            except (ValueError, KeyError, TypeError) as exc:
                raise BackupError(f"{label}: no readable manifest ({exc})") from exc
            if sorted(files) != sorted(DATA) or sorted(members) != sorted(MEMBERS):
                raise BackupError(f"{label}: its members are not the manifest's "
                                  f"({sorted(members)} against {sorted(files)})")
            if expect_name is not None and manifest.get("name") != expect_name:
                raise BackupError(f"{label}: its manifest names {manifest.get('name')!r}, "
                                  f"not {expect_name!r}")
            for m in DATA:
                if members[m].size != sizes[m]:
                    raise BackupError(f"{label}: {m} does not match the manifest (size)")
                tar.extract(members[m], dest, set_attrs=False)
    except (OSError, tarfile.TarError) as exc:
        raise BackupError(f"{label}: {exc}") from exc
    for m in DATA:
        if not hmac.compare_digest(sha256(dest / m), str(files[m].get("sha256"))):
            raise BackupError(f"{label}: {m} does not match the manifest")
    return manifest


def check_dump(sql: Path) -> None:
    """Refuse a dump holding a mysql client command at the start of a line: loaded as root
    over root's socket, `\\! cmd` or `system cmd` would run cmd as root, and `source`,
    `tee` or `pager` reach files. --binary-mode (and --sandbox) stop them in the client
    too; this says which line, before anything is stopped."""
    with sql.open("rb") as f:
        for number, line in enumerate(f, 1):
            if CLIENT_COMMAND_RE.match(line):
                shown = line[:60].decode(errors="replace").strip()
                raise BackupError(f"the database dump holds a mysql client command at line "
                                  f"{number} ({shown!r}): refusing to load it")


def mysql_argv(run: Run) -> list[str]:
    """The client that loads the dump: --binary-mode parses no client command but
    DELIMITER and \\C in piped input; --sandbox (MariaDB 10.11.8+) refuses those that
    reach the shell or files, where the installed client knows it."""
    try:
        helptext = run(["mysql", "--help"], timeout=HELP_TIMEOUT_S)
    except BackupError:
        helptext = ""
    return ["mysql", "--binary-mode", *(["--sandbox"] if "--sandbox" in helptext else [])]


def fetch(cfg: Config, source: str, dest: Path, s3: Any = None) -> Path:
    """The backup to restore as a local file: a path, a name, or `latest`."""
    if source.startswith("/"):
        return Path(source)
    local = ranked(cfg, dict.fromkeys(p.name for p in cfg.staging_dir.glob("*.tar")),
                   time.time())
    if cfg.bucket:
        s3 = s3 or s3_client(cfg)
        names = ranked(cfg, remote_objects(cfg, s3), time.time()) \
            if source == "latest" else [source]
        if not names:
            raise BackupError(f"no backup of {cfg.pool}-{cfg.host} in s3://{cfg.bucket}/"
                              f"{cfg.prefix}")
        name = names[-1].removesuffix(".tar") + ".tar"
        if not _ours(cfg, name):
            raise BackupError(f"{source!r} is not a backup name of {cfg.pool}-{cfg.host}")
        out = dest / name
        s3.download_file(cfg.bucket, cfg.prefix + name, str(out))
        return out
    name = (local[-1] if local else "") if source == "latest" else source + ".tar"
    if not _ours(cfg, name) or not (cfg.staging_dir / name).is_file():
        raise BackupError(f"no backup {source!r} in {cfg.staging_dir}")
    return cfg.staging_dir / name


def _owner(path: Path, fallback: Path) -> tuple[int, int]:
    st = (path if path.exists() else fallback).stat()
    return st.st_uid, st.st_gid


def restore(cfg: Config, source: str, run: Run = run_command, s3: Any = None,
            wait_s: float = DBD_WAIT_S) -> dict[str, Any]:
    """Put a backup back on this controller; returns what was restored."""
    start = time.monotonic()
    cfg.staging_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    work = cfg.staging_dir / ".restore"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    key = manifest_key(cfg)
    archive = fetch(cfg, source, work, s3)
    files = work / "files"
    # A file named by path may have been renamed by whoever copied it: its manifest's name
    # is taken as is. Fetched by name or as latest, the name must be the signed one.
    manifest = unpack(archive, files, key,
                      None if source.startswith("/") else archive.name.removesuffix(".tar"))
    munge = work / "munge.key"
    run([*SEALED, "-d", "-in", str(files / "munge.key.enc"), "-out", str(munge),
         "-pass", f"file:{cfg.key_file}"])
    with tarfile.open(files / "state.tar.gz", "r:gz") as tar:
        _check_members(tar, None)
    with tarfile.open(files / "pool.tar.gz", "r:gz") as tar:
        _check_members(tar, None)
    sql = work / "db.sql"
    with gzip.open(files / "db.sql.gz", "rb") as fin, sql.open("wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    check_dump(sql)
    mysql = mysql_argv(run)
    # Nothing is touched before every file has been read and verified.
    run(["systemctl", "stop", "slurmctld.service", "slurmdbd.service"])
    run(mysql, stdin=sql, timeout=DATABASE_TIMEOUT_S)
    uid, gid = _owner(cfg.state_dir, cfg.state_dir.parent)
    cfg.state_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
    for entry in cfg.state_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    run(["tar", "-C", str(cfg.state_dir), "--no-same-owner", "-xzf",
         str(files / "state.tar.gz")])
    run(["chown", "-R", f"{uid}:{gid}", str(cfg.state_dir)])
    kuid, kgid = _owner(cfg.munge_key, cfg.munge_key.parent)
    os.chown(munge, kuid, kgid)
    munge.chmod(0o400)
    os.replace(munge, cfg.munge_key)
    run(["tar", "-C", "/", "--skip-old-files", "-xzf", str(files / "pool.tar.gz")])
    run(["systemctl", "restart", "munge.service"])
    run(["systemctl", "start", "slurmdbd.service"])
    deadline = time.monotonic() + wait_s
    while True:
        try:
            run(["sacctmgr", "--noheader", "--parsable2", "list", "cluster"])
            break
        except BackupError:
            if time.monotonic() >= deadline:
                raise BackupError(f"slurmdbd did not answer within {wait_s:.0f} s "
                                  "of its start") from None
            time.sleep(POLL_S)
    run(["systemctl", "start", "slurmctld.service"])
    shutil.rmtree(work)
    return {"restored": manifest.get("name"), "created": manifest.get("created"),
            "slurm": manifest.get("slurm"), "duration_s": round(time.monotonic() - start, 2)}


# Metrics.

PREFIX = "gpupool_controller_backup_"
SERIES = {f"{PREFIX}{k}": doc for k, doc in (
    ("up", "1 when the last backup was written and shipped"),
    ("last_success_seconds", "When the last good backup finished"),
    ("bytes", "Size of the last good backup"),
    ("duration_seconds", "How long the last good backup took"),
    ("interval_seconds", "How often backups are taken"))}

def write_metrics(cfg: Config, ok: bool, report: dict[str, Any], now: float) -> None:
    if cfg.textfile is None:
        return
    state = cfg.staging_dir / "last-success.json"
    if ok:
        state.write_text(json.dumps({"time": now, "bytes": report["bytes"],
                                     "duration_s": report["duration_s"]}))
    try:
        last = json.loads(state.read_text())
        figures = {k: float(last[k]) for k in ("time", "bytes", "duration_s")}
    except (OSError, ValueError, KeyError, TypeError):
        figures = {"time": 0.0, "bytes": 0.0, "duration_s": 0.0}
    values = {"up": 1.0 if ok else 0.0, "last_success_seconds": figures["time"],
              "bytes": figures["bytes"], "duration_seconds": figures["duration_s"],
              "interval_seconds": float(cfg.interval_s)}
    registry = CollectorRegistry()
    for name, doc in SERIES.items():
        Gauge(name, doc, registry=registry).set(values[name.removeprefix(PREFIX)])
    write_to_textfile(str(cfg.textfile), registry)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("backup", help="take one backup, ship it and prune old ones")
    rest = sub.add_parser("restore", help="put a backup back on this controller")
    rest.add_argument("--from", dest="source", default="latest",
                      help="latest (default), a backup name, or the path of a backup file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        cfg = load_config(args.config)
    except BackupError as exc:
        log.error("%s", exc)
        return 1
    if args.command == "restore" and not (
            args.source == "latest" or args.source.startswith("/")
            or NAME_RE.fullmatch(args.source)):
        log.error("--from %r: expected latest, a backup name or an absolute path", args.source)
        return 2
    now = time.time()
    try:
        report = backup(cfg, now) if args.command == "backup" else restore(cfg, args.source)
    except Exception as exc:  # the steps', the files' and boto3's errors, in one line
        detail = str(exc) if isinstance(exc, BackupError) else f"{type(exc).__name__}: {exc}"
        log.error("%s failed: %s", args.command, detail)
        if args.command == "backup":
            write_metrics(cfg, False, {}, now)
        return 1
    if args.command == "backup":
        write_metrics(cfg, True, report, now)
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(60)  # every S3 request is bounded
    sys.exit(main())
