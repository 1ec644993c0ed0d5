"""gpupool/onhost/controller_backup.py: a backup taken and restored, retention, and every
archive or configuration it must refuse.

FIXTURE: MariaDB, systemd and Slurm do not run here. Their commands are answered by a
fixture runner (mysqldump prints a fixed dump, mysql, systemctl and sacctmgr are recorded);
tar, chown and openssl are the real ones, and S3 is moto in process. What is claimed
about the real services comes from the lab test (tests/integration/test_controller_lab.py).
"""

from __future__ import annotations

import contextlib
import datetime
import gzip
import hashlib
import io
import json
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from moto import mock_aws

from gpupool.onhost import controller_backup as cb
from tests.conftest import ROOT

DUMP = b"-- FIXTURE dump\nCREATE DATABASE slurm_acct_db;\n"
BUCKET = "lab-checkpoints-eu-west-1"
MANIFEST_KEY = b"h" * 48


class FixtureHost:
    """FIXTURE runner: the database, systemd and Slurm commands, recorded."""

    def __init__(self, mysql_help: str = "") -> None:
        self.calls: list[list[str]] = []
        self.loaded: bytes | None = None
        self.mysql_help = mysql_help  # what `mysql --help` prints

    def __call__(self, argv: list[str], stdin: Path | None = None, stdout: Path | None = None,
                 timeout: float = 60) -> str:
        self.calls.append(argv)
        if argv[0] == "mysqldump":
            assert stdout is not None
            stdout.write_bytes(DUMP)
            return ""
        if argv == ["mysql", "--help"]:
            return self.mysql_help
        if argv[0] == "mysql":
            assert stdin is not None
            self.loaded = stdin.read_bytes()
            return ""
        # chown: the files are this user's already.
        answers = {"systemctl": "", "sacctmgr": "", "chown": "", "slurmctld": "slurm 22.05.8\n"}
        if argv[0] in answers:
            return answers[argv[0]]
        return cb.run_command(argv, stdin, stdout)

    def touched(self) -> bool:
        """Whether anything was stopped or loaded (asking the client's --help is neither)."""
        return any(c[0] in ("systemctl", "mysql") and c != ["mysql", "--help"]
                   for c in self.calls)


def raw_config(root: Path, **over: Any) -> dict[str, Any]:
    base = {"pool": "lab", "host": "lab-ctl", "staging_dir": str(root / "staging"),
            "keep": 2, "interval_s": 3600, "database": "slurm_acct_db",
            "state_dir": str(root / "state"), "munge_key": str(root / "munge.key"),
            "key_file": str(root / "backup.key"), "manifest_key_file": str(root / "manifest.key"),
            "pool_dirs": [str(root / "etc-gpupool")],
            "textfile": str(root / "textfile" / "gpupool_controller_backup.prom"),
            "bucket": None, "prefix": "controller/", "region": "eu-west-1",
            "endpoint_url": None}
    return {**base, **over}


@pytest.fixture
def host(tmp_path: Path) -> Path:
    (tmp_path / "state" / "hash.0").mkdir(parents=True)
    (tmp_path / "state" / "job_state").write_bytes(b"jobs")
    (tmp_path / "state" / "assoc_usage").write_bytes(b"usage")
    (tmp_path / "state" / "hash.0" / "job.1").write_bytes(b"script")
    (tmp_path / "munge.key").write_bytes(b"M" * 1024)
    (tmp_path / "backup.key").write_text("k" * 48 + "\n")
    (tmp_path / "manifest.key").write_bytes(MANIFEST_KEY + b"\n")
    (tmp_path / "manifest.key").chmod(0o600)
    (tmp_path / "etc-gpupool").mkdir()
    (tmp_path / "etc-gpupool" / "pool-description.yaml").write_text("pool: lab\n")
    (tmp_path / "textfile").mkdir()
    return tmp_path


def config(root: Path, **over: Any) -> cb.Config:
    path = root / "config.json"
    path.write_text(json.dumps(raw_config(root, **over)))
    return cb.load_config(path)


def test_a_backup_restores_database_state_key_and_pool_files(host: Path) -> None:
    cfg = config(host)
    fixture = FixtureHost()
    report = cb.backup(cfg, 1_700_000_000, fixture, settle_s=0)
    assert report["backup"] == "lab-lab-ctl-20231114T221320Z.tar"
    with tarfile.open(cfg.staging_dir / report["backup"]) as tar:
        assert sorted(tar.getnames()) == sorted(cb.MEMBERS)
        sealed = tar.extractfile("munge.key.enc")
        assert sealed is not None and b"M" * 16 not in sealed.read()  # the key is encrypted
    # The controller is lost: state, key and pool files differ or are gone.
    (host / "state" / "job_state").write_bytes(b"other")
    (host / "state" / "stray").write_bytes(b"left by the new controller")
    (host / "munge.key").write_bytes(b"N" * 1024)
    (host / "etc-gpupool" / "pool-description.yaml").unlink()
    fixture = FixtureHost()
    out = cb.restore(cfg, "latest", fixture, wait_s=1)
    assert out["restored"] == report["backup"].removesuffix(".tar")
    assert fixture.loaded == DUMP
    assert (host / "state" / "job_state").read_bytes() == b"jobs"
    assert (host / "state" / "hash.0" / "job.1").read_bytes() == b"script"
    assert not (host / "state" / "stray").exists()
    assert (host / "munge.key").read_bytes() == b"M" * 1024
    assert (host / "munge.key").stat().st_mode & 0o777 == 0o400
    assert (host / "etc-gpupool" / "pool-description.yaml").read_text() == "pool: lab\n"
    stops = fixture.calls.index(["systemctl", "stop", "slurmctld.service", "slurmdbd.service"])
    starts = fixture.calls.index(["systemctl", "start", "slurmctld.service"])
    # No client command is parsed in the dump; this client has no --sandbox.
    assert stops < fixture.calls.index(["mysql", "--binary-mode"]) < starts
    assert not (cfg.staging_dir / ".restore").exists()


def test_pool_files_a_rebuilt_controller_rendered_are_kept(host: Path) -> None:
    cfg = config(host)
    cb.backup(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    (host / "etc-gpupool" / "pool-description.yaml").write_text("pool: lab\nnewer: true\n")
    cb.restore(cfg, "latest", FixtureHost(), wait_s=1)
    assert "newer" in (host / "etc-gpupool" / "pool-description.yaml").read_text()


def test_the_keys_and_the_backups_are_not_in_the_pool_files(host: Path) -> None:
    (host / "backup.env").write_text("AWS_SECRET_ACCESS_KEY=fixture\n")
    cfg = config(host, pool_dirs=[str(host)], staging_dir=str(host / "staging"),
                 exclude=[str(host / "backup.env")])
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    with tarfile.open(path) as outer:
        inner = outer.extractfile("pool.tar.gz")
        assert inner is not None
        with tarfile.open(fileobj=io.BytesIO(inner.read())) as tar:
            names = tar.getnames()
    assert not any(n.endswith(("backup.key", "manifest.key", "backup.env")) or "/staging/" in n
                   for n in names)
    assert any(n.endswith("pool-description.yaml") for n in names)


NOW = 1_767_400_000.0  # 2026-01-03T00:26:40Z


def test_keep_counts_this_pools_backups_only(host: Path) -> None:
    cfg = config(host, keep=2)
    names = dict.fromkeys(["lab-lab-ctl-20260101T000000Z.tar", "lab-lab-ctl-20260102T000000Z.tar",
                           "lab-lab-ctl-20260103T000000Z.tar", "other-lab-ctl-20250101T000000Z.tar",
                           "lab-lab-ctl2-20250101T000000Z.tar", "notes.txt"])
    assert cb.to_prune(cfg, names, NOW) == ["lab-lab-ctl-20260101T000000Z.tar"]
    assert cb.to_prune(cfg, dict(list(names.items())[:2]), NOW) == []


@pytest.mark.parametrize("planted", [
    "lab-lab-ctl-20991231T235959Z.tar",  # far future
    "lab-lab-ctl-20260103T010000Z.tar",  # past the clock skew
    "lab-lab-ctl-20261399T999999Z.tar",  # matches the name's pattern, no time
])
def test_a_name_in_the_future_or_without_a_time_steers_nothing(host: Path, planted: str) -> None:
    cfg = config(host, keep=2)
    real = ["lab-lab-ctl-20260101T000000Z.tar", "lab-lab-ctl-20260102T000000Z.tar"]
    objects = dict.fromkeys([*real, planted])
    assert cb.to_prune(cfg, objects, NOW) == []  # two real ones, keep 2: nothing goes
    assert cb.ranked(cfg, objects, NOW) == real  # latest is the real newest
    # S3's LastModified (which a writer of the bucket does not choose) orders them.
    s3_times = {real[0]: NOW - 60, real[1]: NOW - 30, planted: NOW}
    assert cb.to_prune(cfg, s3_times, NOW) == []
    assert cb.ranked(cfg, s3_times, NOW) == real


def test_a_name_within_the_clock_skew_counts(host: Path) -> None:
    cfg = config(host, keep=1)
    objects = dict.fromkeys(["lab-lab-ctl-20260103T000000Z.tar",
                             "lab-lab-ctl-20260103T002800Z.tar"])  # 80 s ahead
    assert cb.to_prune(cfg, objects, NOW) == ["lab-lab-ctl-20260103T000000Z.tar"]
    # The one just taken is never pruned, whatever sorts after it.
    assert cb.to_prune(cfg, objects, NOW, protect="lab-lab-ctl-20260103T000000Z.tar") == []


def test_last_modified_orders_before_the_name(host: Path) -> None:
    cfg = config(host, keep=1)
    old, new = "lab-lab-ctl-20260101T000000Z.tar", "lab-lab-ctl-20260102T000000Z.tar"
    # new was written first (its name is the newer): S3's clock decides.
    assert cb.to_prune(cfg, {old: NOW - 10, new: NOW - 20}, NOW) == [new]


@contextlib.contextmanager
def _bucket() -> Iterator[Any]:
    """The backup tier's bucket in a local S3 (moto), empty."""
    with mock_aws():
        s3 = boto3.client("s3", region_name="eu-west-1")
        s3.create_bucket(Bucket=BUCKET,
                         CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        yield s3


def test_backups_go_to_the_bucket_and_the_oldest_beyond_keep_are_pruned(host: Path) -> None:
    with _bucket() as s3:
        s3.put_object(Bucket=BUCKET, Key="controller/other-ctl-20200101T000000Z.tar", Body=b"")
        cfg = config(host, bucket=BUCKET, keep=2)
        taken = [cb.backup(cfg, t, FixtureHost(), s3, settle_s=0)["backup"]
                 for t in (1_700_000_000, 1_700_003_600, 1_700_007_200)]
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"])
        assert keys == sorted(["controller/other-ctl-20200101T000000Z.tar",
                               *(f"controller/{n}" for n in taken[1:])])
        assert sorted(p.name for p in cfg.staging_dir.glob("*.tar")) == [taken[-1]]
        for p in cfg.staging_dir.glob("*.tar"):  # the controller's disk is lost
            p.unlink()
        out = cb.restore(cfg, "latest", FixtureHost(), s3, wait_s=1)
        assert out["restored"] == taken[-1].removesuffix(".tar")
        out = cb.restore(cfg, taken[1].removesuffix(".tar"), FixtureHost(), s3, wait_s=1)
        assert out["restored"] == taken[1].removesuffix(".tar")


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]


def _write(archive: Path, files: dict[str, bytes] | list[tuple[str, bytes]]) -> None:
    with tarfile.open(archive, "w") as tar:
        for name, body in (files.items() if isinstance(files, dict) else files):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))


def _rewrite(archive: Path, member: str, data: bytes, manifest: bool = True,
             key: bytes | None = MANIFEST_KEY) -> None:
    """Replace one member of a backup and, unless told not to, its manifest entry, signed
    with `key` (the controller's own: what a compromised controller could write)."""
    files = _members(archive)
    files[member] = data
    if manifest:
        m = json.loads(files["manifest.json"])
        m["files"][member] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        files["manifest.json"] = json.dumps(m).encode()
        if key is not None:
            files["manifest.hmac"] = cb.sign(key, files["manifest.json"]).encode()
    _write(archive, files)


def _inner(entries: list[tarfile.TarInfo]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in entries:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return buf.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize("entry", [
    _entry("../../etc/cron.d/evil"), _entry("/etc/shadow"),
    _entry("job_state", tarfile.SYMTYPE, "/etc/shadow"),
    _entry("job_state", tarfile.LNKTYPE, "/etc/shadow"),
    _entry("null", tarfile.CHRTYPE), _entry("fifo", tarfile.FIFOTYPE),
], ids=["dotdot", "absolute", "symlink", "hardlink", "device", "fifo"])
@pytest.mark.parametrize("member", ["state.tar.gz", "pool.tar.gz"])
def test_a_hostile_archive_is_refused_before_anything_is_touched(
        host: Path, member: str, entry: tarfile.TarInfo) -> None:
    cfg = config(host)
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    _rewrite(path, member, _inner([entry]))
    fixture = FixtureHost()
    with pytest.raises(cb.BackupError, match="refusing archive member"):
        cb.restore(cfg, "latest", fixture, wait_s=1)
    assert not fixture.touched()
    assert (host / "state" / "job_state").read_bytes() == b"jobs"


def test_a_damaged_backup_is_refused_before_anything_is_touched(host: Path) -> None:
    cfg = config(host)
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    _rewrite(path, "db.sql.gz", gzip.compress(b"DROP DATABASE mysql;"), manifest=False)
    fixture = FixtureHost()
    with pytest.raises(cb.BackupError, match="does not match the manifest"):
        cb.restore(cfg, "latest", fixture, wait_s=1)
    assert not fixture.touched()


def test_an_outer_member_that_is_not_a_backup_file_is_refused(host: Path) -> None:
    cfg = config(host)
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    with tarfile.open(path, "a") as tar:
        info = tarfile.TarInfo("authorized_keys")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(cb.BackupError, match="refusing archive member 'authorized_keys'"):
        cb.restore(cfg, "latest", FixtureHost(), wait_s=1)


def test_a_wrong_backup_key_is_refused_before_anything_is_touched(host: Path) -> None:
    cfg = config(host)
    cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    (host / "backup.key").write_text("w" * 48 + "\n")
    fixture = FixtureHost()
    with pytest.raises(cb.BackupError, match="openssl"):
        cb.restore(cfg, "latest", fixture, wait_s=1)
    assert not fixture.touched()


@pytest.mark.parametrize("over", [
    {"state_dir": "/var/lib/slurm/../../etc"}, {"state_dir": "relative/path"},
    {"staging_dir": "/var/lib/gpupool\n/etc"}, {"keep": 0}, {"keep": True},
    {"keep": "2"}, {"interval_s": 5}, {"pool": "lab;rm -rf /"}, {"bucket": "UPPER"},
    {"prefix": "../x/"}, {"endpoint_url": "file:///etc/passwd"}, {"pool_dirs": "/etc"},
    {"pool_dirs": ["/etc/../root"]}, {"exclude": "/etc"}, {"exclude": ["rel"]},
    {"region": "eu-west-1\n"}, {"database": "a b"},
], ids=lambda o: next(iter(o)))
def test_a_malformed_configuration_is_one_line_and_exit_1(
        host: Path, over: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    path = host / "config.json"
    path.write_text(json.dumps(raw_config(host, **over)))
    with pytest.raises(cb.BackupError):
        cb.load_config(path)
    assert cb.main(["--config", str(path), "backup"]) == 1
    [record] = caplog.records
    assert record.getMessage().startswith("config: ") and record.exc_info is None


def test_restore_from_must_name_a_backup(host: Path) -> None:
    path = host / "config.json"
    path.write_text(json.dumps(raw_config(host)))
    assert cb.main(["--config", str(path), "restore", "--from", "../../etc/shadow"]) == 2
    assert cb.main(["--config", str(path), "restore", "--from", "lab-lab-ctl-2026"]) == 2


def test_a_failed_backup_keeps_the_last_success_and_says_down(host: Path) -> None:
    cfg = config(host)
    report = cb.backup(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    cb.write_metrics(cfg, True, report, 1_700_000_000)
    cb.write_metrics(cfg, False, {}, 1_700_003_600)
    text = (host / "textfile" / "gpupool_controller_backup.prom").read_text()
    assert "gpupool_controller_backup_up 0.0" in text
    assert "gpupool_controller_backup_last_success_seconds 1.7e+09" in text
    assert "gpupool_controller_backup_interval_seconds 3600.0" in text


def test_a_failing_step_is_one_line_and_exit_1(
        host: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = host / "config.json"
    path.write_text(json.dumps(raw_config(host, munge_key=str(host / "missing.key"))))
    assert cb.main(["--config", str(path), "backup"]) == 1  # mysqldump is not here either
    [record] = caplog.records
    assert record.getMessage().startswith("backup failed: ") and record.exc_info is None
    assert "gpupool_controller_backup_up 0.0" in (
        host / "textfile" / "gpupool_controller_backup.prom").read_text()


def test_the_state_is_copied_once_slurmctld_has_saved_what_came_before(
        host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmctld saves a change within 5 s: the copy waits out the settle time from the
    backup's start, so a job submitted just before is in it."""
    slept: list[float] = []
    monkeypatch.setattr(cb.time, "sleep", slept.append)
    cb.make_archive(config(host), 1_700_000_000, FixtureHost())
    # time.sleep is the process's: other waits (the test runner's) may show up too.
    assert [s for s in slept if s > 1] and all(
        cb.STATE_SETTLE_S - 5 < s <= cb.STATE_SETTLE_S for s in slept if s > 1)


def test_the_role_backs_up_the_key_and_database_the_slurm_role_keeps() -> None:
    """controller_backup runs without the slurm role (its own tag, the restore play), so it
    carries the two paths as its own defaults: they must be the slurm role's."""
    root = ROOT / "roles"
    backup = yaml.safe_load((root / "controller_backup/defaults/main.yml").read_text())
    slurm = {**yaml.safe_load((root / "slurm/defaults/main.yml").read_text()),
             **yaml.safe_load((root / "slurm/vars/Debian.yml").read_text())}
    assert (backup["controller_backup_munge_key"], backup["controller_backup_database"]) == (
        slurm["slurm_munge_key"], slurm["slurm_db_name"])


# Authenticated manifests: whoever can write the bucket cannot make a backup the restore takes.

def _refused(cfg: cb.Config, match: str, source: str = "latest") -> None:
    fixture = FixtureHost()
    with pytest.raises(cb.BackupError, match=match):
        cb.restore(cfg, source, fixture, wait_s=1)
    assert not fixture.touched()
    assert not any(c[0] == "openssl" for c in fixture.calls)  # refused before the key is used


@pytest.mark.parametrize("key", [b"w" * 48, None], ids=["another-key", "old-hmac"])
def test_a_forged_backup_is_refused_before_anything_is_touched(
        host: Path, key: bytes | None) -> None:
    """A writer of the bucket rewrites the dump and its manifest entry: without the
    manifest key its HMAC is another key's, or the one it found."""
    cfg = config(host)
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    _rewrite(path, "db.sql.gz", gzip.compress(b"DROP DATABASE mysql;\n"), key=key)
    _refused(cfg, "HMAC does not verify")


def test_a_backup_without_a_signed_manifest_is_refused_naming_the_fix(host: Path) -> None:
    """A backup taken before manifests were signed (or one whose HMAC was removed)."""
    cfg = config(host)
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    _write(path, {n: b for n, b in _members(path).items() if n != "manifest.hmac"})
    _refused(cfg, r"no authenticated manifest .*systemctl start gpupool-controller-backup")


def test_a_backup_without_a_manifest_is_refused(host: Path) -> None:
    cfg = config(host)
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    _write(path, {n: b for n, b in _members(path).items() if n != "manifest.json"})
    _refused(cfg, r"no manifest \(manifest.json\)")


@pytest.mark.parametrize("change", ["member-dropped", "manifest-entry-added"])
def test_members_that_are_not_the_manifests_are_refused(host: Path, change: str) -> None:
    cfg = config(host)
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    files = _members(path)
    if change == "member-dropped":
        del files["pool.tar.gz"]
    else:
        m = json.loads(files["manifest.json"])
        m["files"]["authorized_keys"] = {"sha256": "0" * 64, "bytes": 1}
        files["manifest.json"] = json.dumps(m).encode()
        files["manifest.hmac"] = cb.sign(MANIFEST_KEY, files["manifest.json"]).encode()
    _write(path, files)
    _refused(cfg, "members are not the manifest's")


def test_a_second_copy_of_a_member_is_refused(host: Path) -> None:
    """tar extracts the last copy of a name: the first would be the one checked."""
    cfg = config(host)
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    files = _members(path)
    _write(path, [*files.items(), ("db.sql.gz", gzip.compress(b"DROP DATABASE mysql;\n"))])
    _refused(cfg, "refusing archive member 'db.sql.gz'")


def test_a_real_backup_under_a_newer_name_is_refused(host: Path) -> None:
    """An old backup copied to a newer name (to roll the accounting back) is signed under
    its own name."""
    cfg = config(host)
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    newer = path.with_name("lab-lab-ctl-20231115T000000Z.tar")
    path.rename(newer)
    _refused(cfg, "its manifest names 'lab-lab-ctl-20231114T221320Z'")
    # Named by path, a copy the operator renamed restores.
    assert cb.restore(cfg, str(newer), FixtureHost(), wait_s=1)["restored"] == \
        "lab-lab-ctl-20231114T221320Z"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620], ids=["group", "other", "group-write"])
def test_a_manifest_key_others_can_reach_is_refused(host: Path, mode: int) -> None:
    cfg = config(host)
    cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    (host / "manifest.key").chmod(mode)
    _refused(cfg, "only its owner")
    with pytest.raises(cb.BackupError, match="only its owner"):
        cb.make_archive(cfg, 1_700_003_600, FixtureHost(), settle_s=0)


def test_a_missing_or_short_manifest_key_fails_the_backup(host: Path) -> None:
    cfg = config(host)
    (host / "manifest.key").write_bytes(b"short\n")
    with pytest.raises(cb.BackupError, match="shorter than 32"):
        cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    (host / "manifest.key").unlink()
    with pytest.raises(cb.BackupError, match="manifest key"):
        cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)


# The dump is loaded as root: no mysql client command in it may run.

@pytest.mark.parametrize("line", [
    b"\\! touch /tmp/pwned\n", b"system touch /tmp/pwned\n", b"SYSTEM id;\n",
    b"  \\. /etc/shadow\n", b"source /etc/shadow\n", b"\\T /tmp/out\n", b"tee /tmp/out\n",
    b"pager cat > /root/.ssh/authorized_keys\n", b"\\P sh -c id\n", b"\tedit\n",
    b"\\r other-host\n", b"system\n",
])
def test_a_dump_with_a_client_command_is_refused_before_anything_is_touched(
        host: Path, line: bytes) -> None:
    """Signed with the controller's own key: what a compromised controller (or a database
    value that broke out of its quotes) could put in a dump."""
    cfg = config(host)
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    _rewrite(path, "db.sql.gz", gzip.compress(DUMP + line + b"SELECT 1;\n"))
    fixture = FixtureHost()
    with pytest.raises(cb.BackupError, match="mysql client command at line 3"):
        cb.restore(cfg, "latest", fixture, wait_s=1)
    assert not fixture.touched()


def test_a_dump_with_lookalike_lines_loads(tmp_path: Path) -> None:
    """Data and SQL that only look like client commands are not refused."""
    sql = tmp_path / "db.sql"
    sql.write_bytes(b"/*M!999999\\- enable the sandbox mode */\nDELIMITER ;;\n"
                    b"INSERT INTO t VALUES ('a\\\\! b','\\\\. c');\n  `system` varchar(20),\n"
                    b"systemd_unit INT,\nteeth INT,\nUSE `slurm_acct_db`;\n")
    cb.check_dump(sql)


def test_the_client_runs_sandboxed_where_it_can(host: Path) -> None:
    cfg = config(host)
    cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    fixture = FixtureHost(mysql_help="  --sandbox           Disallow commands that access "
                                     "the file system\n")
    cb.restore(cfg, "latest", fixture, wait_s=1)
    assert ["mysql", "--binary-mode", "--sandbox"] in fixture.calls
    assert fixture.loaded == DUMP


def test_a_far_future_object_in_the_bucket_is_neither_latest_nor_prunes(host: Path) -> None:
    with _bucket() as s3:
        planted = "controller/lab-lab-ctl-20991231T235959Z.tar"
        s3.put_object(Bucket=BUCKET, Key=planted, Body=b"not a backup")
        cfg = config(host, bucket=BUCKET, keep=2)
        now = time.time()
        taken = [cb.backup(cfg, now + t, FixtureHost(), s3, settle_s=0)["backup"]
                 for t in (-7200, -3600, 0)]
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"])
        assert keys == sorted([planted, *(f"controller/{n}" for n in taken[1:])])
        out = cb.restore(cfg, "latest", FixtureHost(), s3, wait_s=1)
        assert out["restored"] == taken[-1].removesuffix(".tar")


def test_remote_objects_carry_s3s_time(host: Path) -> None:
    with _bucket() as s3:
        s3.put_object(Bucket=BUCKET, Key="controller/lab-lab-ctl-20991231T235959Z.tar", Body=b"")
        s3.put_object(Bucket=BUCKET, Key="controller/deeper/x.tar", Body=b"")
        [(name, modified)] = cb.remote_objects(config(host, bucket=BUCKET), s3).items()
        assert name == "lab-lab-ctl-20991231T235959Z.tar"
        assert modified is not None and abs(
            modified - datetime.datetime.now(datetime.UTC).timestamp()) < 120
