"""Numbers and digits in the pool description (issue 50): every number a description gives
is bounded where it enters, in ASCII digits, so none is an internal error and none reaches
a Slurm field it overflows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpupool import cli
from gpupool.spec import loader
from gpupool.spec.catalog import (
    GPU_MODELS,
    MIG_GEOMETRIES,
    SLURM_MAX_PRIORITY_TIER,
    SLURM_UINT32_MAX,
)
from gpupool.spec.errors import DescriptionError
from gpupool.spec.model import MAX_DURATION_S, MAX_GPUS, Description, duration_seconds
from tests.conftest import ROOT, mutate, raw_stack

# Every Duration field of the lab's description, as a mutate path.
DURATIONS = ["task_classes.interactive.max_runtime", "task_classes.deferred.grace_time",
             "task_classes.interactive.idle_reclaim.after", "health.interval", "health.window",
             "backup.interval", "failover.takeover_after"]


@pytest.mark.parametrize("digits", [9, 100, 4301, 5000])
def test_a_duration_of_any_length_is_a_problem_not_an_internal_error(
        tmp_path: Path, digits: int, capsys: pytest.CaptureFixture[str]) -> None:
    """int() refuses a decimal of over 4,300 digits with a ValueError: the digits are
    counted first, through the command a user runs."""
    text = loader.description_path("lab", ROOT).read_text()
    assert text.count("max_runtime: 1h\n") == 1
    path = tmp_path / "long.yaml"
    path.write_text(text.replace("max_runtime: 1h\n", f"max_runtime: '{'9' * digits}m'\n"))
    assert cli.main(["validate", "--file", str(path), "--json"]) == cli.EXIT_INVALID
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "internal error" not in captured.err
    assert [(p["path"], p["rule"]) for p in json.loads(captured.out)["problems"]] == [
        ("task_classes.interactive.max_runtime", "duration-range")]


@pytest.mark.parametrize("field", DURATIONS)
@pytest.mark.parametrize(("value", "rule"), [
    ("367d", "duration-range"), ("31622401s", "duration-range"), ("000000001s", "duration-range"),
    ("\u0663h", "duration"), ("\uff11m", "duration"), ("1\u0e51d", "duration")])
def test_every_duration_is_ascii_and_bounded(field: str, value: str, rule: str) -> None:
    with pytest.raises(DescriptionError) as info:
        loader.parse(mutate(raw_stack("lab"), [{"set": field, "value": value}]))
    assert [(p.path, p.rule) for p in info.value.problems] == [(field, rule)]


def test_the_longest_duration_is_accepted() -> None:
    assert duration_seconds(f"{MAX_DURATION_S // 86400}d") == MAX_DURATION_S
    desc = loader.parse(mutate(raw_stack("lab"), [
        {"set": "task_classes.training.max_runtime", "value": f"{MAX_DURATION_S}s"}]))
    assert duration_seconds(desc.task_classes["training"].max_runtime) == MAX_DURATION_S


def _patterns(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        own = [schema["pattern"]] if isinstance(schema.get("pattern"), str) else []
        return own + [p for v in schema.values() for p in _patterns(v)]
    if isinstance(schema, list):
        return [p for v in schema for p in _patterns(v)]
    return []


def test_no_pattern_of_the_schema_takes_unicode_classes() -> None:
    """\\d, \\w and \\s match any Unicode digit, letter or space in Python's and pydantic's
    regexes: a value passing such a pattern can still break int(), apt or AWS."""
    patterns = _patterns(Description.model_json_schema())
    assert len(patterns) > 10
    assert [p for p in patterns if re.search(r"\\[dwsDWS]", p)] == []


def test_numbers_that_reach_32_bit_slurm_fields_stay_below_them() -> None:
    """Slurm keeps time limits (minutes), GraceTime (seconds), Fairshare and GrpTRES counts
    in 32-bit fields: the schema's bounds keep the largest value a description can give
    each of them below SLURM_UINT32_MAX (gpupool/render/slurm.py accounting, partitions)."""
    assert MAX_DURATION_S // 60 + 1 <= SLURM_UINT32_MAX  # MaxTime, DefaultTime, MaxWall
    assert MAX_DURATION_S <= SLURM_UINT32_MAX  # GraceTime
    assert SLURM_MAX_PRIORITY_TIER <= SLURM_UINT32_MAX  # PriorityTier, QOS Priority
    # A team's GrpTRES: per model quota + borrowing, per MIG profile a quota of at most
    # 7 * MAX_GPUS, and their sum as gres/gpu; Fairshare is the sum of its quotas.
    profiles = {p for g in MIG_GEOMETRIES.values() for p in g.profiles}
    worst = len(GPU_MODELS) * 2 * MAX_GPUS + len(profiles) * 7 * MAX_GPUS
    assert worst <= SLURM_UINT32_MAX
