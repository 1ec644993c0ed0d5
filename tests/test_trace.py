"""Trace format, synthetic generator and the Alibaba sampler."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.workload import trace
from gpupool.workload.audit import TraceError
from tests.conftest import lab_description
from tests.test_audit import TRACE


def test_synthetic_is_reproducible_and_hits_the_load(tmp_path: Path) -> None:
    knobs = trace.Knobs(jobs=200, horizon_s=1000, load=1.2, capacity_gpus=12, seed=3)
    jobs = trace.synthetic(knobs)
    assert jobs == trace.synthetic(knobs)
    offered = sum(j.gpus * j.duration_s for j in jobs)
    assert offered == pytest.approx(1.2 * 12 * 1000, rel=1e-3)
    assert {j.task_class for j in jobs} == {"interactive", "training", "deferred"}
    assert all(0 <= j.submit_s <= 1000 for j in jobs)
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
    path = tmp_path / "t.csv"
    trace.write(jobs, path)
    assert trace.read(path) == [
        trace.TraceJob(j.job_id, j.team, j.task_class, j.gpus, round(j.submit_s, 3),
                       round(j.duration_s, 3)) for j in jobs]


def test_read_rejects_a_foreign_header(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("id,gpus\n1,2\n")
    with pytest.raises(TraceError, match="missing column"):
        trace.read(path)


@pytest.mark.parametrize(("row", "says"), [
    ("x;touch /tmp/p,vision,training,1,0,10", "job_id"),
    ("$(id),vision,training,1,0,10", "job_id"),
    (f"{'a' * 65},vision,training,1,0,10", "job_id"),
    ("j1,vision,training,0,0,10", "gpus"),
    ("j1,vision,training,1.5,0,10", "ValueError"),
    ("j1,vision,training,1,nan,10", "submit_s"),
    ("j1,vision,training,1,-5,10", "submit_s"),
    ("j1,vision,training,1,0,0", "duration_s"),
    ("j1,vision,training,1,0,inf", "duration_s"),
    ("j1,vision,training,1" + "0" * 40 + ",0,10", "gpus"),
    ("j1,vision,training,100001,0,10", "gpus"),
    ("j1,vision,training,1_000,0,10", "gpus"),
    ("j1,vision,training,\u0663,0,10", "gpus"),
    ("ok,vision,training,1,0,10", "job_id 'ok' is already the job on line 2"),
    ("j1,vision,training", "fewer fields"),
])
def test_read_checks_every_value(tmp_path: Path, row: str, says: str) -> None:
    """A trace's values reach sbatch on the lab's controller: each is checked where it is
    read, and the line is named."""
    path = tmp_path / "t.csv"
    path.write_text(f"{','.join(trace.HEADER)}\nok,vision,training,2,0,10\n{row}\n")
    with pytest.raises(TraceError, match=rf"t.csv:3: .*{says}"):
        trace.read(path)


def test_a_trace_without_jobs_is_refused(tmp_path: Path) -> None:
    """A replay of nothing would still take the lab and report on nothing."""
    path = tmp_path / "t.csv"
    path.write_text(f"{','.join(trace.HEADER)}\n")
    with pytest.raises(TraceError, match="no jobs"):
        trace.read(path)


def test_alibaba_sample_fits_the_pool() -> None:
    jobs = trace.sample_alibaba(TRACE, ["vision", "nlp"], jobs=150, horizon_s=300, max_gpus=4)
    assert len(jobs) == 150
    assert {j.team for j in jobs} == {"vision", "nlp"}
    assert all(1 <= j.gpus <= 4 and 5 <= j.duration_s <= 300 for j in jobs)
    assert max(j.submit_s for j in jobs) == pytest.approx(300, abs=0.01)


def test_an_alibaba_sample_can_be_made_to_saturate_the_pool() -> None:
    paced = trace.sample_alibaba(TRACE, ["vision", "nlp"], jobs=60, horizon_s=150, max_gpus=4)
    dense = trace.sample_alibaba(TRACE, ["vision", "nlp"], jobs=60, horizon_s=150, max_gpus=4,
                                 load=1.6, capacity_gpus=12)
    # The same pods arriving at the same moments; only the durations are stretched.
    assert [(j.job_id, j.gpus, j.submit_s) for j in dense] == [
        (j.job_id, j.gpus, j.submit_s) for j in paced]
    assert trace.offered_load(dense, 12, 150) == pytest.approx(1.6)
    with pytest.raises(trace.TraceError, match="capacity"):
        trace.sample_alibaba(TRACE, ["vision"], jobs=10, horizon_s=10, max_gpus=4, load=1.0)


def test_the_lab_replay_sample_mixes_the_three_classes() -> None:
    """The sample tests/integration/test_replay_lab.py replays (24 pods over 45 s at load
    1.5, seed 1) holds every task class, so preemption has work to take back and work that
    takes it."""
    desc = lab_description()
    jobs = trace.sample_alibaba(TRACE, list(desc.teams), jobs=24, horizon_s=45, max_gpus=4,
                                load=1.5, capacity_gpus=12)
    assert {j.task_class for j in jobs} == set(desc.task_classes)
    assert trace.offered_load(jobs, 12, 45) == pytest.approx(1.5, rel=1e-3)


def _full_at(jobs: list[trace.TraceJob], t: float, capacity: int) -> bool:
    """The jobs alone, first come first served, hold every GPU at time t."""
    timed = [(j.submit_s, j.duration_s, j.gpus) for j in jobs]
    starts = trace.fifo_starts(timed, capacity)
    return sum(g for (_, d, g), s in zip(timed, starts, strict=True)
               if s is not None and s <= t < s + d) >= capacity


@pytest.mark.parametrize(("jobs", "horizon", "load"), [(24, 45, 1.5), (60, 150, 1.6)])
def test_preemptible_first_fills_the_pool_before_the_rest_arrives(
        jobs: int, horizon: float, load: float) -> None:
    """The lab replays' samples re-timed (--preemptible-first): the deferred pods arrive
    first, over a window short enough that they alone still fill the lab's 12 GPUs at its
    end (the bench's 60 pods are short: over a quarter of the horizon they ended before the
    rest arrived, and nothing was preempted), and every other pod after, so interactive and
    training work finds the pool full of preemptible work. The jobs, and so the offered
    load, are the same."""
    desc = lab_description()
    sample = trace.sample_alibaba(TRACE, list(desc.teams), jobs=jobs, horizon_s=horizon,
                                  max_gpus=4, load=load, capacity_gpus=12)
    preemptible = {n for n, c in desc.task_classes.items() if c.preemptible}
    timed = trace.preemptible_first(sample, preemptible, horizon, 12)
    first = [j for j in timed if j.task_class in preemptible]
    cut = max(j.submit_s for j in first)
    assert cut <= horizon * trace.PREEMPTIBLE_FIRST_SHARE
    assert all(j.submit_s >= cut for j in timed if j.task_class not in preemptible)
    assert _full_at(first, cut, 12)
    key = sorted((j.job_id, j.gpus, j.duration_s, j.task_class) for j in sample)
    assert sorted((j.job_id, j.gpus, j.duration_s, j.task_class) for j in timed) == key
    assert trace.preemptible_first(timed, preemptible, horizon, 12) == timed
    assert trace.preemptible_first([], preemptible, horizon, 12) == []


def test_preemptible_work_too_small_to_fill_the_pool_keeps_the_longest_window() -> None:
    jobs = [trace.TraceJob("a", "vision", "deferred", 1, 0.0, 5.0),
            trace.TraceJob("b", "vision", "deferred", 1, 3.0, 5.0),
            trace.TraceJob("c", "nlp", "interactive", 1, 1.0, 5.0)]
    timed = {j.job_id: j.submit_s for j in trace.preemptible_first(jobs, {"deferred"}, 40, 12)}
    assert timed == {"a": 0.0, "b": 10.0, "c": 10.0}


def test_first_come_first_served_starts() -> None:
    """Each job as soon as its GPUs are free, never before the job ahead of it; a job wider
    than the pool never starts."""
    jobs = [(0.0, 10.0, 2), (1.0, 5.0, 2), (2.0, 1.0, 1), (2.5, 1.0, 1), (3.0, 1.0, 9)]
    assert trace.fifo_starts(jobs, 4) == [0.0, 1.0, 6.0, 6.0, None]
    assert trace.fifo_starts([(5.0, 1.0, 1), (0.0, 1.0, 1)], 1) == [5.0, 0.0]
    assert trace.fifo_starts([], 4) == []


