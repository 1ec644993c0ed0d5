"""MIG GRES in the lab's real Slurm (22.05): typed instances are counted, handed out one
per request, and a team's per-profile quota holds.

The lab has no GPU, let alone a MIG-capable one. Fixtures, named as such:
- the suite lab's GPU class is re-declared as an A100-80GB class split mixed 3g.40gb +
  2g.20gb + 2x 1g.10gb (only the description changes; the hosts stay the lab's containers);
- each MIG instance is a character device the slurm role creates from tmpfiles.d
  (/dev/nvidia-caps/nvidia-capN, major 240), listed in gres.conf with its profile as Type;
- cgroups are off in the lab (TaskPlugin=task/none), so "sees only it" is read from what
  Slurm tells the job (CUDA_VISIBLE_DEVICES, the GRES index in `scontrol show job -d`), not
  from a device cgroup.
Nothing about real MIG behaviour (isolation, NVML detection, CUDA's view of a MIG device)
is claimed from this lab: only Slurm's accounting and assignment of typed GRES.

The module converges the slurm role with the MIG description's policy, and converges it
back to the suite lab's policy when done, so later modules find the lab as it was: every
node idle again and a whole-GPU job given its devices (the role settles the GRES change,
roles/slurm/tasks/settle.yml).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.lab import hosts as lab_mod
from gpupool.lab import slurm_cluster
from gpupool.render import slurm
from gpupool.spec import loader
from gpupool.spec.model import Description
from tests.conftest import lab_description, mutate, suite_lab_raw
from tests.integration.conftest import Run, ansible_playbook

pytestmark = pytest.mark.integration

LAB = lab_description()
GPU_CLASS = next(n for n, nc in LAB.node_classes.items() if nc.gpu is not None)
LAYOUT = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
TEAMS = list(LAB.teams)
PROFILE = "1g.10gb"
QUOTA = 2  # the first team's cap on 1g.10gb instances
# The whole-GPU quotas move onto the burst L4s: the on-prem class is no longer whole L4s.
OPS: list[dict[str, Any]] = [
    {"set": f"node_classes.{GPU_CLASS}.gpu",
     "value": {"model": "a100", "count": 4, "memory_gib": 80, "mig_strategy": "mixed",
               "mig_profiles": LAYOUT}},
    *({"set": f"teams.{t}.{k}.l4", "value": 4} for t in TEAMS
      for k in ("quota", "borrowing_limit")),
    {"set": f"teams.{TEAMS[0]}.mig_quota", "value": {PROFILE: QUOTA}},
]
MIG = loader.parse(mutate(suite_lab_raw(), OPS), "mig-lab")
ONPREM = [n for n in slurm.nodes(MIG) if not n.cloud]
LOW = slurm.class_policies(MIG)[-1].name  # the preemptible class: nothing preempts it here

SHOW = """#!/bin/bash
echo "host=$(hostname) cvd=${CUDA_VISIBLE_DEVICES:-none}"
# JOB_GRES= comes first and has no index: the node line's GRES=...(IDX:n) is wanted.
scontrol show job -d $SLURM_JOB_ID | grep -o ' GRES=[^ ]*' | head -1
sleep ${WORK:-3}
"""


def converge(desc: Description, name: str) -> Run:
    path: Path = lab_mod.lab_dir(LAB) / name
    path.write_text(yaml.safe_dump({"gpupool_slurm": slurm.plan(desc)}))
    return ansible_playbook(lab_mod.inventory_path(LAB), "playbooks/slurm.yml", "-e",
                            f"@{path}")


@pytest.fixture(scope="module")
def cluster(lab: lab_mod.LabState):
    run = converge(MIG, "slurm-vars-mig.yml")
    assert run.rc == 0, run.output[-6000:]
    s = slurm_cluster.ready(MIG)
    s.reset_usage(TEAMS)
    try:
        yield s
    finally:
        s.cancel_all()
        back = converge(LAB, "slurm-vars.yml")
        assert back.rc == 0, back.output[-6000:]
        lab = slurm_cluster.ready(LAB)
        whole = lab.sbatch(f"-p {LOW}", f"-A {TEAMS[1]}", "--gpus=1", "-C onprem",
                           "-o /tmp/slurm-%j.out", script=SHOW, env={"WORK": "1"})
        slurm_cluster.wait_for("a whole-GPU job done", lambda: lab.state(whole) == "COMPLETED",
                               90)
        out = lab.sh(f"cat /tmp/slurm-{whole}.out", node=lab.sacct(whole)[-1]["NodeList"])
        # A device, not gpu:l4:0: slurmctld no longer holds the MIG layout.
        assert re.search(r"GRES=gpu:[^:]+:1\(IDX:\d+\)", out), out


def test_nodes_offer_the_layouts_instances(cluster):
    seen = dict(line.split("|") for line in
                cluster.sh("sinfo -N -h -o '%N|%G'").splitlines())
    for n in ONPREM:
        gres = sorted(seen[n.name].split(","))
        assert gres == sorted(f"gpu:{p}:{c}" for p, c in n.mig), (n.name, seen[n.name])
    tres = cluster.sh("sacctmgr -n -P show tres format=type,name")
    assert f"gres|gpu:{PROFILE}" in tres.splitlines()


def test_a_profile_request_gets_one_instance_of_that_profile(cluster):
    jid = cluster.sbatch(f"-p {LOW}", f"-A {TEAMS[1]}", f"--gres=gpu:{PROFILE}:1",
                         "-C onprem", "-o /tmp/slurm-%j.out", script=SHOW, env={"WORK": "2"})
    slurm_cluster.wait_for("the job done", lambda: cluster.state(jid) == "COMPLETED", 90)
    node = cluster.sacct(jid)[-1]["NodeList"]
    out = cluster.sh(f"cat /tmp/slurm-{jid}.out", node=node)
    cvd = re.search(r"cvd=(\S+)", out)
    gres = re.search(r"GRES=gpu:([^:(]+):1\(IDX:(\d+)\)", out)
    assert cvd and gres, out
    assert "," not in cvd.group(1) and cvd.group(1) != "none", out  # one device, no more
    # The index Slurm gave is one of the node's 1g.10gb fixture devices.
    profiles = slurm.fixture_mig_devices(MIG)[node]
    assert gres.group(1) == PROFILE and profiles[int(gres.group(2))] == PROFILE, out


def test_per_profile_quota_is_enforced(cluster):
    capped, other = TEAMS
    running = [cluster.sbatch(f"-p {LOW}", f"-A {capped}", f"--gres=gpu:{PROFILE}:1",
                              "-C onprem", script=SHOW, env={"WORK": "120"})
               for _ in range(QUOTA)]
    slurm_cluster.wait_for("the capped team's jobs running", lambda: all(
        cluster.state(j) == "RUNNING" for j in running), 60)
    over = cluster.sbatch(f"-p {LOW}", f"-A {capped}", f"--gres=gpu:{PROFILE}:1",
                          "-C onprem", script=SHOW, env={"WORK": "120"})
    reason = slurm_cluster.wait_for("a reason for the job over quota", lambda: (
        (r := cluster.job(over)["Reason"]) not in ("None", "Priority") and r), 30)
    assert reason == "AssocGrpGRES"
    # Instances are free (3 nodes x 8 1g.10gb): another team's request runs.
    free = cluster.sbatch(f"-p {LOW}", f"-A {other}", f"--gres=gpu:{PROFILE}:1",
                          "-C onprem", script=SHOW, env={"WORK": "120"})
    slurm_cluster.wait_for("the other team's job running",
                           lambda: cluster.state(free) == "RUNNING", 60)
    cluster.cancel_all()
