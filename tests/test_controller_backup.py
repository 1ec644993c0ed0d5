"""gpupool/onhost/controller_backup.py: a backup taken and restored, retention, and every
archive or configuration it must refuse.

FIXTURE: MariaDB, systemd and Slurm do not run here. Their commands are answered by a
fixture runner (mysqldump prints a fixed dump, mysql, systemctl and sacctmgr are recorded);
tar, chown and openssl are the real ones, and S3 is moto in process. What is claimed
about the real services comes from the lab test (tests/integration/test_controller_lab.py).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
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


class FixtureHost:
    """FIXTURE runner: the database, systemd and Slurm commands, recorded."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.loaded: bytes | None = None

    def __call__(self, argv: list[str], stdin: Path | None = None, stdout: Path | None = None,
                 timeout: float = 60) -> str:
        self.calls.append(argv)
        if argv[0] == "mysqldump":
            assert stdout is not None
            stdout.write_bytes(DUMP)
            return ""
        if argv[0] == "mysql":
            assert stdin is not None
            self.loaded = stdin.read_bytes()
            return ""
        if argv[0] in ("systemctl", "sacctmgr"):
            return ""
        if argv[0] == "slurmctld":
            return "slurm 22.05.8\n"
        if argv[0] == "chown":  # the files are this user's already
            return ""
        return cb.run_command(argv, stdin, stdout)

    def touched(self) -> bool:
        return any(c[0] in ("systemctl", "mysql") for c in self.calls)


def raw_config(root: Path, **over: Any) -> dict[str, Any]:
    base = {"pool": "lab", "host": "lab-ctl", "staging_dir": str(root / "staging"),
            "keep": 2, "interval_s": 3600, "database": "slurm_acct_db",
            "state_dir": str(root / "state"), "munge_key": str(root / "munge.key"),
            "key_file": str(root / "backup.key"), "pool_dirs": [str(root / "etc-gpupool")],
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
    assert stops < fixture.calls.index(["mysql"]) < starts
    assert not (cfg.staging_dir / ".restore").exists()


def test_pool_files_a_rebuilt_controller_rendered_are_kept(host: Path) -> None:
    cfg = config(host)
    cb.backup(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    (host / "etc-gpupool" / "pool-description.yaml").write_text("pool: lab\nnewer: true\n")
    cb.restore(cfg, "latest", FixtureHost(), wait_s=1)
    assert "newer" in (host / "etc-gpupool" / "pool-description.yaml").read_text()


def test_the_backup_key_and_the_backups_are_not_in_the_pool_files(host: Path) -> None:
    cfg = config(host, pool_dirs=[str(host)], staging_dir=str(host / "staging"))
    path = cb.make_archive(cfg, 1_700_000_000, FixtureHost(), settle_s=0)
    with tarfile.open(path) as outer:
        inner = outer.extractfile("pool.tar.gz")
        assert inner is not None
        with tarfile.open(fileobj=io.BytesIO(inner.read())) as tar:
            names = tar.getnames()
    assert not any(n.endswith("backup.key") or "/staging/" in n for n in names)


def test_keep_counts_this_pools_backups_only(host: Path) -> None:
    cfg = config(host, keep=2)
    names = ["lab-lab-ctl-20260101T000000Z.tar", "lab-lab-ctl-20260102T000000Z.tar",
             "lab-lab-ctl-20260103T000000Z.tar", "other-lab-ctl-20250101T000000Z.tar",
             "lab-lab-ctl2-20250101T000000Z.tar", "notes.txt"]
    assert cb.to_prune(cfg, names) == ["lab-lab-ctl-20260101T000000Z.tar"]
    assert cb.to_prune(cfg, names[:2]) == []


def test_backups_go_to_the_bucket_and_the_oldest_beyond_keep_are_pruned(host: Path) -> None:
    with mock_aws():
        s3 = boto3.client("s3", region_name="eu-west-1")
        s3.create_bucket(Bucket=BUCKET,
                         CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
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


def _rewrite(archive: Path, member: str, data: bytes, manifest: bool = True) -> None:
    """Replace one member of a backup (and, unless told not to, its manifest entry)."""
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]
    files[member] = data
    if manifest:
        m = json.loads(files["manifest.json"])
        m["files"][member] = {"sha256": __import__("hashlib").sha256(data).hexdigest(),
                              "bytes": len(data)}
        files["manifest.json"] = json.dumps(m).encode()
    with tarfile.open(archive, "w") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))


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
    {"pool_dirs": ["/etc/../root"]}, {"region": "eu-west-1\n"}, {"database": "a b"},
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
