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
])
def test_read_checks_every_value(tmp_path: Path, row: str, says: str) -> None:
    """A trace's values reach sbatch on the lab's controller: each is checked where it is
    read, and the line is named."""
    path = tmp_path / "t.csv"
    path.write_text(f"{','.join(trace.HEADER)}\nok,vision,training,2,0,10\n{row}\n")
    with pytest.raises(TraceError, match=rf"t.csv:3: .*{says}"):
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


def test_preemptible_first_fills_the_pool_before_the_rest_arrives() -> None:
    """The lab replay's sample re-timed (--preemptible-first): the deferred pods arrive in
    the first quarter of the horizon, enough of them to fill the lab's 12 GPUs, and every
    other pod after, so interactive and training work finds the pool full of preemptible
    work. The jobs, and so the offered load, are the same."""
    desc = lab_description()
    jobs = trace.sample_alibaba(TRACE, list(desc.teams), jobs=24, horizon_s=45, max_gpus=4,
                                load=1.5, capacity_gpus=12)
    preemptible = {n for n, c in desc.task_classes.items() if c.preemptible}
    timed = trace.preemptible_first(jobs, preemptible, 45)
    cut = 45 * trace.PREEMPTIBLE_FIRST_SHARE
    first = [j for j in timed if j.task_class in preemptible]
    assert all(j.submit_s <= cut for j in first)
    assert all(j.submit_s >= cut for j in timed if j.task_class not in preemptible)
    assert sum(j.gpus for j in first) >= 12
    # Running when the first other job arrives: the pool is full of preemptible work.
    assert sum(j.gpus for j in first if j.submit_s + j.duration_s > cut) >= 12
    key = sorted((j.job_id, j.gpus, j.duration_s, j.task_class) for j in jobs)
    assert sorted((j.job_id, j.gpus, j.duration_s, j.task_class) for j in timed) == key
    assert trace.preemptible_first(timed, preemptible, 45) == timed
    assert trace.preemptible_first([], preemptible, 45) == []
