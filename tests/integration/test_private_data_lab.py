"""Issue 50, PrivateData=jobs on the lab's real Slurm (roles slurm and slurm_exporter, played
by slurm.yml): a researcher's job is listed to that researcher and to root, never to a
researcher of another team nor to the exporter's own user (squeue, scontrol, and sacct,
which slurmdbd answers by its own PrivateData), while the exporter still counts it: root's
sandboxed snapshot lists every job, writes it without following a planted link into a
directory only root writes and only the exporter's group reads, and the exporter serves it.
The units as rendered: tests/test_slurm_exporter_role.py; the two halves:
tests/test_slurm_exporter.py."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.lab import slurm_cluster
from gpupool.spec.model import Description, Role

pytestmark = pytest.mark.integration
wait_for = slurm_cluster.wait_for
EXPORTER, SNAPSHOT_UNIT = "gpupool-slurm-exporter", "gpupool-slurm-snapshot"
EXPORTER_USER = "gpupool-exporter"
SNAPSHOT_DIR = "/var/lib/gpupool-slurm-snapshot"  # roles/slurm_exporter/vars/Debian.yml
SNAPSHOT = f"{SNAPSHOT_DIR}/slurm.json"
PORT = 9815


@pytest.fixture(scope="module")
def pool(site: Any, lab_desc: Description) -> slurm_cluster.SlurmLab:
    """The session's lab, every role converged (fixture `site`, which plays slurm.yml)."""
    s = slurm_cluster.ready(lab_desc)
    s.cancel_all()
    return s


def researcher(desc: Description, team: str) -> str:
    return desc.teams[team].members[Role.RESEARCHER][0]


def as_user(pool: slurm_cluster.SlurmLab, user: str, cmd: str, check: bool = True) -> str:
    return pool.sh(f"runuser -u {shlex.quote(user)} -- {cmd}", check=check)


def allocated(pool: slurm_cluster.SlurmLab) -> list[dict[str, str]]:
    """gpupool_job_gpu_allocated's labels in one scrape of the exporter."""
    text = pool.http_get(PORT, "/metrics")
    return [dict(x.labels) for f in text_string_to_metric_families(text) for x in f.samples
            if x.name == "gpupool_job_gpu_allocated"]


def test_the_snapshot_is_roots_and_the_exporter_serves_from_it(
        pool: slurm_cluster.SlurmLab) -> None:
    assert pool.sh(f"systemctl is-active {SNAPSHOT_UNIT}.timer").strip() == "active"
    assert pool.sh(f"systemctl show -p User --value {SNAPSHOT_UNIT}").strip() in ("", "root")
    assert pool.sh(f"systemctl show -p User --value {EXPORTER}").strip() == EXPORTER_USER
    pool.sh(f"systemctl start {SNAPSHOT_UNIT}.service")  # a oneshot: returns when it ended
    assert pool.sh(f"systemctl show -p Result --value {SNAPSHOT_UNIT}").strip() == "success"
    assert pool.sh(f"stat -c '%U:%G %a' {SNAPSHOT_DIR}").strip() == f"root:{EXPORTER_USER} 750"
    text = pool.http_get(PORT, "/metrics")
    assert "gpupool_slurm_up 1.0" in text.splitlines()


def test_root_writes_the_snapshot_over_a_planted_link_never_through_it(
        pool: slurm_cluster.SlurmLab) -> None:
    victim = "/etc/gpupool-snapshot-victim"
    pool.sh(f"echo untouched > {victim} && ln -sfn {victim} {SNAPSHOT}")
    try:
        pool.sh(f"systemctl start {SNAPSHOT_UNIT}.service")
        assert pool.sh(f"test -L {SNAPSHOT} && echo link || echo file").strip() == "file"
        assert pool.sh(f"cat {victim}").strip() == "untouched"
    finally:
        pool.sh(f"rm -f {victim}")


def test_a_member_sees_only_their_own_jobs_while_the_exporter_counts_every_one(
        pool: slurm_cluster.SlurmLab) -> None:
    desc = pool.desc
    team, other = list(desc.teams)[:2]
    me, them = researcher(desc, team), researcher(desc, other)
    klass = next(iter(desc.task_classes))
    job = as_user(pool, me, f"sbatch --parsable -p {klass} -A {team} --gpus=1 -C onprem "
                            "-o /dev/null --chdir=/tmp --wrap 'sleep 300'").strip().split(";")[0]
    try:
        wait_for("the member's job running", lambda: pool.state(job) == "RUNNING", 60)
        assert job in pool.sh("squeue -h -a -o %i").split()  # root sees every job
        assert job in as_user(pool, me, "squeue -h -a -o %i").split()  # its owner sees it
        for user in (them, EXPORTER_USER):  # another team's researcher, the exporter itself
            assert job not in as_user(pool, user, "squeue -h -a -o %i").split(), user
            shown = as_user(pool, user, "scontrol -o show job", check=False)
            assert f"JobId={job} " not in shown, user
            # slurmdbd answers sacct by its own PrivateData (slurmdbd.conf).
            assert job not in as_user(pool, user, "sacct -a -X -n -P -o JobID -S now-1hour"
                                      ).split(), user
            # Nor can they read root's snapshot of every job; the exporter's group can.
            rc = as_user(pool, user, f"cat {SNAPSHOT} >/dev/null 2>&1; echo $?", check=False)
            assert (rc.strip() == "0") == (user == EXPORTER_USER), user
        held = wait_for("the exporter counting the member's job", lambda: [
            x for x in allocated(pool) if x["job_id"] == job] or None, 60)
        assert {(x["team"], x["class"]) for x in held} == {(team, klass)}
    finally:
        pool.sh(f"scancel {job}", check=False)
