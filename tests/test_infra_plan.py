"""`gpupool plan`: the preview-like tree, the stable JSON, and the reviewed golden plan of
the example stack (mocks fixture: gpupool.preview.pulumi_mock stands in for the engine)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpupool import cli
from gpupool.preview import plan
from gpupool.spec import loader
from tests._pulumi import declared
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden" / "example-plan.json"
UPDATE = "GPUPOOL_UPDATE_GOLDEN"


def test_example_plan_matches_the_reviewed_golden_file() -> None:
    """Every change to what the program declares shows as a diff of this file.
    Regenerate after review with GPUPOOL_UPDATE_GOLDEN=1."""
    text = json.dumps(plan.as_json(declared("example"), loader.load_stack("example", ROOT)),
                      indent=2, sort_keys=True) + "\n"
    if os.environ.get(UPDATE):
        GOLDEN.write_text(text)
    assert GOLDEN.read_text() == text, f"plan changed; review, then rerun with {UPDATE}=1"


def test_plan_json_is_stable_across_runs() -> None:
    first = plan.as_json(declared("lab"))
    again = plan.as_json(plan.declare(loader.load_stack("lab", ROOT), "lab"))
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    assert first["total"] == sum(first["counts"].values()) == len(first["resources"])


def test_cli_plan_prints_tree_and_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--stack", "lab"]) == 0
    text = capsys.readouterr().out
    assert "gpupool:infra:ClusterServices" in text
    assert "httpTokens=required" in text
    assert "Resources per type" in text
    total = plan.as_json(declared("lab"))["total"]
    assert f"{total} to create" in text


def test_cli_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--stack", "lab", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(json.dumps(plan.as_json(declared("lab"),
                                                      loader.load_stack("lab", ROOT))))


def test_cli_plan_rejects_an_invalid_description(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "pools" / "lab.yaml").read_text().replace(
        "admin_cidrs: [10.231.30.0/24]", "admin_cidrs: [0.0.0.0/0]"))
    assert cli.main(["plan", "--file", str(bad)]) == 1
    assert "admin-cidr-not-open" in capsys.readouterr().err
