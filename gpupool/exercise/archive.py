"""Checkpoints to and from the archive tier (S3): archive a job's checkpoints in the
archive tier's bucket and storage class, and restore the newest valid one.

Bucket names and storage classes come from the same functions the Pulumi program uses.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import boto3

from gpupool.onhost import reference_train
from gpupool.render.cloud import names, storage
from gpupool.spec.model import Description, Purpose

RESTORE_WAIT_S = 60


def _tier(desc: Description) -> str:
    return next(n for n, t in storage.bucket_tiers(desc).items() if t.purpose is Purpose.ARCHIVE)


def _client(desc: Description, endpoint: str | None) -> Any:
    return boto3.client("s3", region_name=desc.pool.cloud_region, endpoint_url=endpoint)


def archive_job(desc: Description, endpoint: str | None, job_dir: Path, prefix: str) -> int:
    """Upload a job's checkpoints to the archive bucket; returns how many."""
    s3 = _client(desc, endpoint)
    tier = _tier(desc)
    bucket = names.bucket_name(desc, tier)
    if endpoint is not None:  # the local endpoint starts empty; Pulumi owns real buckets
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={
            "LocationConstraint": desc.pool.cloud_region})
    steps = storage.transitions(desc.storage_tiers[tier])
    storage_class = steps[0]["storageClass"] if steps and steps[0]["days"] == 0 else "STANDARD"
    files = sorted(job_dir.glob("ckpt-*.json"))
    for f in files:
        s3.upload_file(str(f), bucket, f"{prefix}/{f.name}",
                       ExtraArgs={"StorageClass": storage_class})
    return len(files)


def restore_newest(desc: Description, endpoint: str | None, prefix: str, dest: Path) -> str:
    """Restore the newest archived checkpoint whose checksum holds into dest."""
    s3 = _client(desc, endpoint)
    bucket = names.bucket_name(desc, _tier(desc))
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
                  .get("Contents", []))
    dest.mkdir(parents=True, exist_ok=True)
    for key in reversed(keys):
        head = s3.head_object(Bucket=bucket, Key=key)
        if head.get("StorageClass", "STANDARD") in ("GLACIER", "DEEP_ARCHIVE"):
            s3.restore_object(Bucket=bucket, Key=key, RestoreRequest={"Days": 1})
            deadline = time.monotonic() + RESTORE_WAIT_S
            while 'ongoing-request="false"' not in s3.head_object(
                    Bucket=bucket, Key=key).get("Restore", ""):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{key} not restored after {RESTORE_WAIT_S}s")
                time.sleep(1)
        target = dest / Path(key).name
        s3.download_file(bucket, key, str(target))
        if reference_train.load_latest(dest) is not None:
            return key
        target.unlink()  # corrupt in the archive too: try the one before
    raise FileNotFoundError(f"no valid checkpoint under s3://{bucket}/{prefix}/")
