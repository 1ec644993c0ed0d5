"""The monthly cost ceiling of a plan (gpupool/render/cost.py) from the vendored price table
(gpupool/data/prices), `gpupool plan`'s report of it and the policy pack's budget check
(mocks fixture: tests/_pulumi.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from gpupool import cli
from gpupool.preview import plan
from gpupool.render import cost
from gpupool.spec import loader
from gpupool.spec.catalog import INSTANCE_TYPES
from gpupool.spec.model import Description
from tests._policy import messages, recorded, violations
from tests._pulumi import declared, declared_mutated
from tests.conftest import ROOT, mutate, raw_stack
from tests.test_storage_location import ONPREM_LUSTRE

HOURS = 730
BUDGET = "stack-cost-within-budget"
PRICED = "stack-cost-priced"


def _ceiling(stack: str) -> cost.Ceiling:
    run = declared(stack)
    return cost.ceiling(((r.type, r.name, r.inputs) for r in run.resources),
                        loader.load_stack(stack, ROOT))


def _with_budget(stack: str, usd: int) -> Description:
    return loader.parse(mutate(raw_stack(stack), [{"set": "pool.monthly_budget_usd",
                                                   "value": usd}]), stack)


def test_the_price_table_has_its_date_sources_and_only_catalog_types() -> None:
    data = yaml.safe_load(cost.PRICES_FILE.read_text())
    p = cost.prices()
    assert p.read == data["read"] and p.hours == HOURS
    assert set(p.sources) == {"instances", "fsx_lustre", "s3_standard", "nat_gateway_hour",
                              "interface_endpoint_hour", "vpn_connection_hour",
                              "transit_gateway_attachment_hour"}
    for region, types in p.instances.items():
        assert set(types) <= set(INSTANCE_TYPES), region
        assert all(isinstance(v, float) and v > 0 for v in types.values()), region
    assert all(v > 0 for r in p.fsx_lustre.values() for v in r.values())
    assert all(v > 0 for v in p.s3_standard.values())
    source = (cost.PRICES_FILE.parent / "SOURCE.md").read_text()
    assert data["read"] in source and "Left out" in source


def test_example_ceiling_is_max_nodes_all_month_fsx_and_buckets_at_tier_size() -> None:
    p, desc = cost.prices(), loader.load_stack("example", ROOT)
    c = _ceiling("example")
    us = p.instances["us-east-1"]
    h100 = 6 * us["p5.48xlarge"] * HOURS
    l40s = 4 * max(us["g6e.12xlarge"], us["g6e.24xlarge"]) * HOURS
    assert c.per_kind["instances"] == pytest.approx(h100 + l40s)
    fsx = next(r for r in declared("example").resources if r.type == cost.FSX_LUSTRE)
    assert c.per_kind["file systems"] == pytest.approx(
        fsx.inputs["storageCapacity"] * p.fsx_lustre["us-east-1"]["SCRATCH_2"])
    tib = sum(desc.storage_tiers[t].size_tib for t in ("datasets", "checkpoints", "archive"))
    assert c.per_kind["buckets"] == pytest.approx(tib * 1024 * p.s3_standard["us-east-1"])
    # Five interface endpoints in each of three zones, one Transit Gateway attachment.
    assert c.per_kind["endpoints"] == pytest.approx(
        5 * 3 * HOURS * p.interface_endpoint_hour["us-east-1"])
    assert c.per_kind["links"] == pytest.approx(
        HOURS * p.transit_gateway_attachment_hour["us-east-1"])
    assert c.unpriced == [] and c.open_ended == []
    assert c.total == pytest.approx(sum(c.per_kind.values()))


def test_an_on_prem_lustre_tier_costs_nothing_in_the_cloud() -> None:
    """The issue's 500 TiB on-prem Lustre tier: no file system, so no line for one."""
    run = declared_mutated("example", ONPREM_LUSTRE)
    desc = loader.parse(mutate(raw_stack("example"), ONPREM_LUSTRE), "example")
    c = cost.ceiling(((r.type, r.name, r.inputs) for r in run.resources), desc)
    assert "file systems" not in c.per_kind


def test_lab_instances_in_a_region_without_a_rate_leave_the_ceiling_open() -> None:
    c = _ceiling("lab")
    assert c.per_kind["instances"] is None
    # Neither g6 instances nor S3 have a rate read for eu-west-1.
    assert [x.resource for x in c.open_ended] == [
        "lab-l4-burst", "lab-archive", "lab-checkpoints", "lab-datasets"]


def test_a_budget_below_the_ceiling_is_refused() -> None:
    found = violations(recorded("example"), _with_budget("example", 100_000))
    [message] = messages(found, BUDGET)
    assert "above pool.monthly_budget_usd 100,000" in message
    assert "instances 285,067" in message
    assert {v.level for v in found if v.policy == BUDGET} == {"mandatory"}


def test_a_budget_above_the_ceiling_passes() -> None:
    found = violations(recorded("example"), _with_budget("example", 400_000))
    assert messages(found, BUDGET) == messages(found, PRICED) == []


def test_unpriced_hourly_fees_are_named_not_guessed() -> None:
    """eu-west-1 has no network rate read: a bounded fee without a price is advisory."""
    c = _ceiling("lab")
    assert {x.kind for x in c.unpriced} >= {"endpoints", "links"}
    assert c.per_kind["endpoints"] is None and c.per_kind["links"] is None


def test_a_budget_over_instances_without_a_price_is_refused() -> None:
    found = violations(recorded("lab"), _with_budget("lab", 1_000_000))
    found = messages(found, BUDGET)
    assert any(m.startswith("instances lab-l4-burst (eu-west-1: 2 x g6.12xlarge|g6.24xlarge")
               for m in found)
    assert len(found) == 4 and all("has no price" in m for m in found)


def test_no_budget_no_cost_policy() -> None:
    found = violations(recorded("example"), "example")
    assert messages(found, BUDGET) == messages(found, PRICED) == []


def test_cli_plan_shows_the_ceiling_per_kind_and_in_json(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--stack", "example"]) == 0
    text = capsys.readouterr().out
    assert "Monthly cost ceiling" in text and "gpupool/data/prices/SOURCE.md" in text
    assert "285,066.72" in text and "353,503.92" in text
    assert cli.main(["plan", "--stack", "lab"]) == 0
    assert "not priced" in capsys.readouterr().out
    assert cli.main(["plan", "--stack", "example", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cost"]["per_kind"]["instances"] == pytest.approx(285_066.72)
    assert out["cost"]["prices_read"] == cost.prices().read
    assert out["cost"] == plan.as_json(declared("example"),
                                       loader.load_stack("example", ROOT))["cost"]
