"""The figures are what the benchmarks wrote: every file in bench/results/ matches the SHAPE
of the bench module that writes it, carries its provenance, and its figures are the ones
written (digest); bench/RESULTS.md and the README's figures are rendered from those files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench
from bench import report
from bench.__main__ import names
from gpupool.preview.walk import walk

FILES = sorted(bench.RESULTS.glob("*.json"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_results_file_is_what_its_writer_wrote(path: Path) -> None:
    assert bench.problems(path) == []


@pytest.mark.parametrize("name", names())
def test_every_benchmark_has_a_shape_and_a_main(name: str) -> None:
    module = __import__(f"bench.{name}", fromlist=["SHAPE"])
    assert callable(module.main)
    assert module.SHAPE
    assert module.__doc__ and "python -m bench" in module.__doc__, "say how to run it"


def test_a_hand_edited_figure_is_caught(tmp_path: Path) -> None:
    figures = {"target_cpu_s": 0.3, "verbs": {"validate": {
        "cpu_s_median": 0.31, "cpu_s_max": 0.33, "runs": 7, "heavy_modules_loaded": []}}}
    data = {"provenance": bench.provenance("python -m bench cli_startup", figures),
            "figures": figures}
    path = tmp_path / "cli_startup.json"
    path.write_text(json.dumps(data))
    assert bench.problems(path) == []
    data["figures"]["verbs"]["validate"]["cpu_s_median"] = 0.2
    path.write_text(json.dumps(data))
    assert any("digest" in p for p in bench.problems(path))
    data["figures"]["note"] = "typed in"
    path.write_text(json.dumps(data))
    assert any("unexpected key 'note'" in p for p in bench.problems(path))
    del data["provenance"]
    path.write_text(json.dumps(data))
    assert bench.problems(path)


def test_a_file_no_benchmark_writes_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "typed_by_hand.json"
    path.write_text('{"provenance": {}, "figures": {}}')
    assert bench.problems(path) == ["typed_by_hand.json: no bench/typed_by_hand.py with a "
                                    "SHAPE writes it"]


@pytest.mark.parametrize(("value", "shape", "ok"), [
    (1, float, True), (True, float, False), (1.5, int, False), (None, (float, None), True),
    ({"a": 1}, {"a": int, "b?": int}, True), ({"a": 1, "c": 2}, {"a": int}, False),
    ({"x": [1, 2]}, {str: [int]}, True), ({"x": [1, "2"]}, {str: [int]}, False),
    ({"a": 1, "z": "free"}, {"a": int, ...: (str, float)}, True), ([{}], object, True),
])
def test_shapes(value: object, shape: object, ok: bool) -> None:
    assert (bench.mismatches(value, shape) == []) is ok


def test_a_writer_refuses_figures_that_do_not_match_its_shape() -> None:
    with pytest.raises(ValueError, match="do not match its SHAPE"):
        bench.write("rolling_upgrade", {"rollout_s": "fast"})


def test_results_md_is_rendered_from_the_files() -> None:
    assert report.RESULTS_MD.read_text() == report.results_md(report.load()), (
        "bench/RESULTS.md is stale: run python -m bench.report")


def test_readme_figures_are_rendered_from_the_files() -> None:
    text = report.README.read_text()
    assert report.readme_with(report.readme_block(report.load()), text) == text, (
        "the README's figures are stale: run python -m bench.report")


@pytest.mark.parametrize("name", sorted(report.RUNBOOK_FIGURES))
def test_runbook_figures_are_rendered_from_the_files(name: str) -> None:
    text = (report.RUNBOOKS / name).read_text()
    block = report.readme_block(report.load(), report.RUNBOOK_FIGURES[name])
    assert report.readme_with(block, text) == text, (
        f"runbooks/{name}'s figures are stale: run python -m bench.report")


def test_every_runbook_figure_is_in_its_results_file() -> None:
    """A figure a runbook quotes that its writer no longer produces would show as "not
    measured" unnoticed; a results file not written yet is the one allowed gap."""
    data = report.load()
    for name, figures in report.RUNBOOK_FIGURES.items():
        for _what, results, paths, _unit in figures:
            assert (bench.ROOT / "bench" / f"{results}.py").exists(), (name, results)
            if results in data:
                missing = [p for p in paths.split()
                           if walk(data[results]["figures"], p) is None]
                assert not missing, f"runbooks/{name}: {results}.json has no {missing}"


def test_plan_figures_are_of_todays_program() -> None:
    """plan.json's resource count at its smallest size is what the program declares today:
    a change to what the program declares makes the figures stale, and `python -m bench
    plan` writes them again."""
    from bench import plan as plan_bench  # noqa: PLC0415 - the program, only for this test
    from gpupool.preview import plan  # noqa: PLC0415

    recorded = json.loads((bench.RESULTS / "plan.json").read_text())["figures"]["sizes"][0]
    declared = plan.declare(plan_bench.synthetic(recorded["nodes"]), "stale-check")
    assert len(declared.resources) == recorded["resources"], (
        "bench/results/plan.json is stale: run `python -m bench plan`")
