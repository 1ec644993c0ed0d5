"""Names and sources held to what their consumers accept (issue 50): Unix groups, host
names, S3 buckets and the bucket prefixes teams share with the controller's backups, and
the Lustre client's repository and key, which come only from a server."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpupool.render.cloud import iam, names
from gpupool.spec import loader
from gpupool.spec.catalog import (
    CONTROLLER_BACKUP_PREFIX,
    ROLE_GROUP_PREFIX,
    TEAM_GROUP_PREFIX,
    UNIX_NAME_MAX,
)
from gpupool.spec.errors import DescriptionError
from gpupool.spec.model import BUCKET_PURPOSES, bucket_name
from tests.conftest import ROOT, mutate, raw_stack


def problems(ops: list[dict[str, Any]], stack: str = "lab") -> list[tuple[str, str]]:
    try:
        loader.parse(mutate(raw_stack(stack), ops))
    except DescriptionError as exc:
        return sorted((p.path, p.rule) for p in exc.problems)
    return []


def test_the_spec_names_what_the_roles_and_the_cloud_side_name() -> None:
    """One source of truth per name: validation computes from the same prefixes and the
    same bucket formula that the roles and the Pulumi program use."""
    common = yaml.safe_load((ROOT / "roles" / "common" / "defaults" / "main.yml").read_text())
    assert common["common_team_group_prefix"] == TEAM_GROUP_PREFIX
    assert common["common_role_group_prefix"] == ROLE_GROUP_PREFIX
    assert iam.BACKUP_PREFIX == CONTROLLER_BACKUP_PREFIX
    for stack in ("lab", "example"):
        desc = loader.load_stack(stack, ROOT)
        tiers = [n for n, t in desc.storage_tiers.items() if t.purpose in BUCKET_PURPOSES]
        assert tiers
        for tier in tiers:
            assert names.bucket_name(desc, tier) == bucket_name(
                desc.pool.name, tier, desc.pool.cloud_region)


def _team(name: str) -> list[dict[str, Any]]:
    return [{"set": f"teams.{name}", "value": {"cost_centre": "cc-x", "quota": {"l4": 0}}},
            {"set": f"ids.teams.{name}", "value": 30999}]


def test_a_team_name_is_as_long_as_its_unix_group_allows() -> None:
    longest = "t" * (UNIX_NAME_MAX - len(TEAM_GROUP_PREFIX))
    assert problems(_team(longest)) == []
    assert problems(_team(longest + "x")) == [(f"teams.{longest}x", "team-name-length")]


@pytest.mark.parametrize("user", ["team-vision", "team-x", "gpupool-oncall", "gpupool-admin"])
def test_a_member_is_never_named_as_a_group_gpupool_makes(user: str) -> None:
    assert problems([{"set": "teams.nlp.members.contractor", "value": [user]},
                     {"delete": "ids.users.frank"}]) == [
        ("teams.nlp.members.contractor[0]", "user-name-group")]


def test_a_burst_groups_node_names_are_host_names() -> None:
    name = "b" * 61  # nodes b...b-0 and b...b-1: 63 characters
    ok = [{"rename": "burst_groups.l4-burst", "to": name}]
    assert problems(ok) == []
    assert problems([*ok, {"set": f"burst_groups.{name}.max_nodes", "value": 11}]) == [
        (f"burst_groups.{name}", "burst-node-name-length")]


def test_a_bucket_name_fits_s3() -> None:
    # lab-<tier>-eu-west-1: 63 characters with a tier of 49.
    assert problems([{"rename": "storage_tiers.archive", "to": "a" * 49}]) == []
    assert problems([{"rename": "storage_tiers.archive", "to": "a" * 50}]) == [
        ("storage_tiers." + "a" * 50, "bucket-name-length")]
    # scratch keeps no bucket: its name is not bounded by S3's.
    assert problems([{"rename": "storage_tiers.scratch", "to": "s" * 63}]) == []


@pytest.mark.parametrize("team", ["controller", "default", "kube-system"])
def test_reserved_team_names(team: str) -> None:
    assert problems(_team(team)) == [(f"teams.{team}", "team-name-reserved")]


@pytest.mark.parametrize(("field", "value", "ok"), [
    ("repository", "https://packages.example.internal/lustre", True),
    ("repository", "http://packages.example.internal/lustre/", True),  # Release is signed
    ("repository", "file:/srv/mirror/lustre", False),
    ("repository", "file:///srv/mirror/lustre", False),
    ("key_url", "https://packages.example.internal:8443/key.asc", True),
    ("key_url", "file:///etc/apt/keyrings/lustre.asc", False),
    ("key_url", "http://packages.example.internal/key.asc", False),
])
def test_the_lustre_client_comes_only_from_a_server(field: str, value: str, ok: bool) -> None:
    found = problems([{"set": f"lustre_client.{field}", "value": value}], "example")
    assert found == ([] if ok else [(f"lustre_client.{field}", "string-pattern-mismatch")])


@pytest.mark.parametrize(("admin", "rule"), [
    (["10.231.30.0/24"], None),  # the lab's: its management segment
    (["10.231.30.128/25"], None),  # a part of management
    (["192.168.77.0/24"], None),  # outside the pool
    (["10.231.10.0/24"], "admin-cidr-overlaps-segment"),  # the training segment
    (["10.231.20.64/26"], "admin-cidr-overlaps-segment"),  # inside storage
    (["10.232.32.0/24"], "admin-cidr-overlaps-segment"),  # management's cloud block
    (["10.0.0.0/8"], "admin-cidr-overlaps-segment"),  # covers them all
])
def test_admin_ranges_stay_out_of_the_other_segments(admin: list[str], rule: str | None) -> None:
    found = problems([{"set": "network.admin_cidrs", "value": admin}])
    assert {r for _, r in found} == ({rule} if rule else set()), found
