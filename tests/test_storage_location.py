"""Where a storage tier lives (model.Location) decides what the cloud side declares for it:
nothing for an on-prem tier, a bucket for a cloud or both tier of a bucket purpose, FSx for
Lustre for cloud scratch (issue 51; mocks fixture: tests/_pulumi.py)."""

from __future__ import annotations

import pytest

from gpupool.render.cloud import names, storage
from gpupool.spec import loader
from gpupool.spec.errors import DescriptionError
from gpupool.spec.model import Location, StorageTier
from tests._pulumi import declared, declared_mutated, of_type
from tests.conftest import ROOT, mutate, raw_stack

ONPREM_LUSTRE = [{"delete": "storage_tiers.scratch.location"},
                 {"set": "storage_tiers.scratch.mount.source", "value": "10.20.9.50@tcp:/scratch"},
                 {"set": "storage_tiers.scratch.size_tib", "value": 500}]


def _buckets(run: object) -> set[str]:
    return {r.inputs["bucket"] for r in of_type(run, ":Bucket")}  # type: ignore[arg-type]


def test_the_default_is_a_bucket_without_a_mount_and_on_prem_with_one() -> None:
    bare = {"purpose": "archive", "temperature": "archive", "size_tib": 1, "retention_days": 30}
    assert StorageTier.model_validate(bare).located is Location.CLOUD
    mounted = {**bare, "purpose": "datasets",
               "mount": {"path": "/d", "fstype": "nfs", "source": "nas:/d"}}
    assert StorageTier.model_validate(mounted).located is Location.ONPREM
    assert StorageTier.model_validate({**mounted, "location": "both"}).located is Location.BOTH


def test_an_on_prem_lustre_scratch_tier_declares_no_file_system() -> None:
    """The issue's case: 500 TiB of Lustre served at 10.20.9.50 is not declared in AWS."""
    run = declared_mutated("example", ONPREM_LUSTRE)
    assert of_type(run, ":LustreFileSystem") == []
    assert "scratch_dns" not in run.outputs
    assert of_type(declared("example"), ":LustreFileSystem")  # the example's FSx stays


def test_a_cloud_lustre_tier_naming_an_on_prem_server_is_refused() -> None:
    data = mutate(raw_stack("example"),
                  [*ONPREM_LUSTRE[1:], {"set": "storage_tiers.scratch.location", "value": "cloud"}])
    with pytest.raises(DescriptionError) as e:
        loader.parse(data, "example")
    assert [p.rule for p in e.value.problems] == ["cloud-tier-onprem-source"]


def test_an_on_prem_tier_gets_no_bucket_and_a_both_tier_keeps_its_own() -> None:
    desc = loader.load_stack("lab", ROOT)
    run = declared_mutated("lab", [{"set": "storage_tiers.archive.location", "value": "onprem"},
                                   {"set": "storage_tiers.archive.mount",
                                    "value": {"path": "/archive", "fstype": "nfs",
                                              "source": "lab-filer:/export/archive"}}])
    assert _buckets(run) == {names.bucket_name(desc, t) for t in ("datasets", "checkpoints")}
    assert _buckets(declared("lab")) == {names.bucket_name(desc, t)
                                         for t in ("datasets", "checkpoints", "archive")}


def test_no_bucket_at_all_where_every_tier_is_on_prem() -> None:
    """Without burst groups or backups nothing needs a bucket: none is declared."""
    run = declared_mutated("lab", [
        {"set": "burst_groups", "value": {}}, {"set": "teams.vision.quota.l4", "value": 8},
        {"set": "teams.vision.borrowing_limit.l4", "value": 4},
        {"set": "teams.nlp.quota.l4", "value": 4},
        {"set": "teams.nlp.borrowing_limit.l4", "value": 4},
        {"delete": "backup"},
        {"set": "storage_tiers.datasets.location", "value": "onprem"},
        {"set": "storage_tiers.checkpoints.location", "value": "onprem"},
        {"delete": "storage_tiers.datasets.sync"}, {"delete": "storage_tiers.checkpoints.sync"},
        {"delete": "storage_tiers.archive"}])
    assert _buckets(run) == set()


def test_shipped_stacks_say_where_every_tier_lives() -> None:
    for stack in ("example", "lab"):
        data = raw_stack(stack)
        assert all("location" in t for t in data["storage_tiers"].values()), stack


def test_a_home_tier_is_mounted_and_has_no_cloud_side() -> None:
    home = {"purpose": "home", "temperature": "warm", "size_tib": 2, "retention_days": 3650,
            "mount": {"path": "/home", "fstype": "nfs", "source": "lab-filer:/export/home"}}
    desc = loader.parse(mutate(raw_stack("lab"), [{"set": "storage_tiers.home", "value": home}]),
                        "lab")
    assert "home" not in storage.bucket_tiers(desc)
    assert desc.storage_tiers["home"].located is Location.ONPREM
