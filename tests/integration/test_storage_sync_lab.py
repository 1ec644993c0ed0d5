"""A `both` tier's declared copies on the lab (roles/storage_sync, rclone from Debian): the
primary controller copies the datasets tier's mount into its bucket (to_cloud) and the
checkpoints tier's bucket into its mount (from_cloud), against moto, the local S3 the lab
hosts reach (a FIXTURE for AWS S3: it proves the units, the rclone command and the
direction, not AWS's own behaviour or credentials).

`make lab` installs rclone and the units without starting the timers (the lab has no S3:
storage_sync_start is false); here the role is converged again with the local endpoint and
each copy is started by hand, as its timer would, then converged back as `make lab` left it.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from gpupool.lab import burst_hosts, localaws
from gpupool.lab import hosts as labmod
from gpupool.render import inventory
from gpupool.spec.facts import controller
from gpupool.spec.model import Description
from tests.integration.conftest import ansible_playbook

pytestmark = pytest.mark.integration
UNIT = "gpupool-tier-sync-{}.service"


def _converge(desc: Description, **extra: Any) -> None:
    run = ansible_playbook(labmod.inventory_path(desc), "playbooks/site.yml",
                           "--tags", "storage_sync", "--limit", controller(desc),
                           "-e", json.dumps(extra))
    assert run.rc == 0, run.output[-4000:]


@pytest.fixture(scope="module")
def s3(site: Any, lab_desc: Description) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The local S3 with the tiers' buckets, and the role converged against it."""
    plan = {p["tier"]: p for p in inventory.sync_plan(lab_desc)}
    assert set(plan) == {"datasets", "checkpoints"}, plan
    with localaws.endpoint(burst_hosts.aws_address(lab_desc)) as url:
        client = boto3.client("s3", region_name=lab_desc.pool.cloud_region, endpoint_url=url)
        for p in plan.values():
            client.create_bucket(Bucket=p["bucket"], CreateBucketConfiguration={
                "LocationConstraint": p["region"]})
        try:
            _converge(lab_desc, storage_sync_endpoint_url=url, storage_sync_environment={
                # FIXTURE: moto's credentials, not secrets
                "AWS_ACCESS_KEY_ID": "fixture", "AWS_SECRET_ACCESS_KEY": "fixture"})
            yield client, plan
        finally:
            _converge(lab_desc)  # the units as `make lab` leaves them: no endpoint


def _start(desc: Description, tier: str) -> None:
    # A oneshot unit: `systemctl start` returns when the copy has finished (or failed).
    done = labmod.exec_(desc, controller(desc), ["systemctl", "start", UNIT.format(tier)],
                        timeout=300)
    log = labmod.exec_(desc, controller(desc), ["journalctl", "-u", UNIT.format(tier),
                                                "-n", "30", "--no-pager"])
    assert done.returncode == 0, done.stderr + log.stdout


def test_the_datasets_mount_is_copied_into_its_bucket(
        s3: tuple[Any, dict[str, Any]], lab_desc: Description) -> None:
    client, plan = s3
    name, body = f"sync-{secrets.token_hex(4)}/sample.bin", secrets.token_bytes(70_000)
    # The lab's filer for the datasets tier: the host directory every lab host mounts (ro).
    src = labmod.lab_dir(lab_desc) / "storage" / "datasets" / name
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(body)
    _start(lab_desc, "datasets")
    got = client.get_object(Bucket=plan["datasets"]["bucket"], Key=name)["Body"].read()
    assert got == body


def test_what_burst_nodes_saved_comes_back_to_the_checkpoints_mount(
        s3: tuple[Any, dict[str, Any]], lab_desc: Description) -> None:
    client, plan = s3
    name, body = f"sync-{secrets.token_hex(4)}/step-100.ckpt", secrets.token_bytes(50_000)
    client.put_object(Bucket=plan["checkpoints"]["bucket"], Key=name, Body=body)
    _start(lab_desc, "checkpoints")
    copied = labmod.exec_(lab_desc, controller(lab_desc),
                          ["sha256sum", f"{plan['checkpoints']['path']}/{name}"])
    assert copied.stdout.split()[:1] == [hashlib.sha256(body).hexdigest()], copied.stderr
