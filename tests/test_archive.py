"""Checkpoints to and from the archive tier, against a local S3 (moto on 127.0.0.1: a
fixture standing in for AWS)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from gpupool.exercise import archive
from gpupool.lab import localaws
from gpupool.onhost import reference_train
from gpupool.render.cloud import names, storage
from gpupool.spec import loader
from tests.conftest import ROOT


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    job = tmp_path / "job"
    env = {**os.environ, "GPUPOOL_CKPT_DIR": str(job), "GPUPOOL_STEPS": "30",
           "GPUPOOL_CKPT_EVERY": "10"}
    subprocess.run([sys.executable, reference_train.__file__], env=env, check=True,
                   capture_output=True, timeout=60)
    return job


def test_archive_then_restore_the_newest_valid(job_dir: Path, tmp_path: Path) -> None:
    desc = loader.load_stack("lab", ROOT)
    newest = sorted(job_dir.glob("ckpt-*.json"))[-1]
    with localaws.endpoint() as url:
        assert archive.archive_job(desc, url, job_dir, "vision/run") == 3
        s3 = boto3.client("s3", region_name=desc.pool.cloud_region, endpoint_url=url)
        bucket = names.bucket_name(desc, "archive")
        head = s3.head_object(Bucket=bucket, Key=f"vision/run/{newest.name}")
        # The archive tier's own storage class, as the Pulumi lifecycle declares it.
        assert head["StorageClass"] == storage.transitions(desc.storage_tiers["archive"])[0][
            "storageClass"]
        # Corrupt the newest copy in the archive: the restore falls back to the one before.
        s3.put_object(Bucket=bucket, Key=f"vision/run/{newest.name}", Body=b"{}")
        key = archive.restore_newest(desc, url, "vision/run", tmp_path / "restored")
    assert key == f"vision/run/{sorted(job_dir.glob('ckpt-*.json'))[-2].name}"
    restored = reference_train.load_latest(tmp_path / "restored")
    assert restored is not None and restored["step"] == 20
