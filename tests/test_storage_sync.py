"""A `both` tier's declared copy between its on-prem mount and its bucket (model.TierSync,
rules._tier_sync, inventory.sync_plan, roles/storage_sync): refused where it cannot run,
planned for the primary controller, and written as a unit whose rclone command copies the
declared way. tests/integration/test_storage_sync_lab.py runs one against a local S3."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from gpupool.render import inventory
from gpupool.render.cloud import names
from gpupool.spec import loader
from gpupool.spec.errors import DescriptionError
from tests.conftest import ROOT, mutate, raw_stack

pytest.importorskip("ansible")
TEMPLATES = ROOT / "roles" / "storage_sync" / "templates"


def _refused(edits: list[dict[str, Any]]) -> list[tuple[str, str]]:
    with pytest.raises(DescriptionError) as e:
        loader.parse(mutate(raw_stack("lab"), edits), "lab")
    return [(p.path, p.rule) for p in e.value.problems]


def test_the_lab_plans_its_two_both_tiers_copies() -> None:
    desc = loader.load_stack("lab", ROOT)
    plan = inventory.sync_plan(desc)
    assert plan == [
        {"tier": "datasets", "path": "/datasets", "bucket": names.bucket_name(desc, "datasets"),
         "region": desc.pool.cloud_region, "direction": "to_cloud", "interval_s": 3600,
         "delete": False},
        {"tier": "checkpoints", "path": "/checkpoints",
         "bucket": names.bucket_name(desc, "checkpoints"), "region": desc.pool.cloud_region,
         "direction": "from_cloud", "interval_s": 900, "delete": False}]
    assert inventory.pool_vars(desc)["gpupool_storage_sync"] == plan


def test_no_sync_declared_plans_nothing() -> None:
    desc = loader.parse(mutate(raw_stack("lab"), [
        {"delete": "storage_tiers.datasets.sync"},
        {"delete": "storage_tiers.checkpoints.sync"}]), "lab")
    assert inventory.sync_plan(desc) == []


def test_a_sync_on_a_tier_that_is_not_both_is_refused() -> None:
    assert _refused([{"set": "storage_tiers.scratch.sync",
                      "value": {"direction": "to_cloud"}}]) == [
        ("storage_tiers.scratch.sync", "tier-sync-needs-both")]
    assert _refused([{"set": "storage_tiers.archive.sync",
                      "value": {"direction": "from_cloud"}}]) == [
        ("storage_tiers.archive.sync", "tier-sync-needs-both")]


def test_a_copy_into_a_read_only_mount_is_refused() -> None:
    assert _refused([{"set": "storage_tiers.datasets.sync.direction",
                      "value": "from_cloud"}]) == [
        ("storage_tiers.datasets.sync.direction", "tier-sync-read-only")]


@pytest.mark.parametrize("sync", [
    {"direction": "both"}, {"direction": "to_cloud; rm -rf /"}, {"every_minutes": 60},
    {"direction": "to_cloud", "every_minutes": 4}, {"direction": "to_cloud", "every_minutes": 1441},
    {"direction": "to_cloud", "every_minutes": "60"}, {"direction": "to_cloud", "delete": "yes"},
    {"direction": "to_cloud", "schedule": "@hourly"}, "to_cloud", []])
def test_malformed_syncs_are_refused_naming_the_field(sync: Any) -> None:
    problems = _refused([{"set": "storage_tiers.checkpoints.sync", "value": sync}])
    assert problems and all(p.startswith("storage_tiers.checkpoints.sync") for p, _ in problems)


def _unit(kind: str, sync: dict[str, Any], endpoint: str = "") -> str:
    """The role's unit template rendered by Ansible's own Templar (its tests and filters)."""
    from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415
    from ansible.template import Templar, trust_as_template  # noqa: PLC0415

    templar = Templar(loader=DataLoader(), variables={
        "ansible_managed": "managed", "sync": sync, "storage_sync_endpoint_url": endpoint,
        "storage_sync_env_file": "/etc/gpupool/storage-sync.env",
        "storage_sync_rclone": "/usr/bin/rclone"})
    text = (TEMPLATES / f"tier-sync.{kind}.j2").read_text()
    return str(templar.template(trust_as_template(text), escape_backslashes=False))


def _exec(unit: str) -> list[str]:
    [line] = [ln for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


@pytest.mark.parametrize("plan", inventory.sync_plan(loader.load_stack("lab", ROOT)),
                         ids=lambda p: p["tier"])
def test_the_unit_copies_the_declared_way_and_only_when_mounted(plan: dict[str, Any]) -> None:
    unit = _unit("service", plan)
    argv = _exec(unit)
    local, remote = f"{plan['path']}/", f":s3:{plan['bucket']}/"
    src, dst = (local, remote) if plan["direction"] == "to_cloud" else (remote, local)
    assert argv[:4] == ["/usr/bin/rclone", "copy", src, dst]
    assert "--s3-provider=AWS" in argv and f"--s3-region={plan['region']}" in argv
    assert f"RequiresMountsFor={plan['path']}" in unit
    # Only a copy into the mount may write to it.
    assert (f"ReadWritePaths={plan['path']}" in unit) == (plan["direction"] == "from_cloud")
    assert f"TimeoutStartSec={plan['interval_s']}" in unit
    assert f"OnUnitActiveSec={plan['interval_s']}s" in _unit("timer", plan)


def test_delete_makes_it_a_sync_and_an_endpoint_is_spoken_path_style() -> None:
    plan = {**inventory.sync_plan(loader.load_stack("lab", ROOT))[0], "delete": True}
    argv = _exec(_unit("service", plan, endpoint="http://10.241.30.1:5000"))
    assert argv[1] == "sync"
    assert {"--s3-provider=Other", "--s3-force-path-style",
            "--s3-endpoint=http://10.241.30.1:5000"} <= set(argv)


@pytest.mark.parametrize("field,value", [
    ("path", "/datasets /etc"), ("bucket", "b\nExecStartPre=/bin/id"), ("tier", "d%n"),
    ("region", "eu-west-1 --s3-endpoint=http://evil")])
def test_the_unit_refuses_a_value_that_would_add_a_word(field: str, value: str) -> None:
    plan = {**inventory.sync_plan(loader.load_stack("lab", ROOT))[0], field: value}
    with pytest.raises(Exception, match="gpupool refuses"):
        _unit("service", plan)
