"""Slurm's view of a node's GPUs: what slurmd detects (`slurmd -G`) and what slurmctld
registered (`scontrol show node`), against the description's GPU count, model and MIG
layout (the parsers: gpupool/gate/slurm_gres.py).

These run with or without a GPU: in the lab slurmd counts the fixture devices gres.conf
names, exactly as production counts /dev/nvidiaN or what NVML finds. A host without
slurmd (or whose controller cannot be asked) skips, saying so.
"""

from __future__ import annotations

import pytest

from gpupool.gate import slurm_gres
from gpupool.gate.actions import Action
from gpupool.gate.expect import GpuExpect, NodeExpect
from gpupool.gate.plugin import Measure

SLURM_CONF = "/etc/slurm/slurm.conf"  # the slurm role's slurm_conf_dir


def _gres_expected(gpu_expect: GpuExpect) -> dict[str, int]:
    """The GPU GRES the description gives the node, as slurm.conf's Gres: the model's
    whole GPUs, or every MIG instance typed by its profile."""
    if gpu_expect.mig:
        return {p: n * gpu_expect.count for p, n in gpu_expect.mig}
    return {gpu_expect.model: gpu_expect.count}


@pytest.mark.action(Action.RECONFIGURE)
def test_slurmd_detects_the_gpus(host, gpu_expect: GpuExpect,  # type: ignore[no-untyped-def]
                                 measure: Measure) -> None:
    """The GPUs slurmd detects (`slurmd -G`: gres.conf's device files and, where the NVML
    plugin is installed, what NVML finds) are the description's: count, model and MIG
    layout. A MIG node whose plugin is missing or fails reports none. Runs where slurmd is
    installed, with or without a GPU (the lab's are fixture devices)."""
    if host.run("command -v slurmd").rc != 0:
        pytest.skip("slurmd is not installed on this host")
    if not host.file(SLURM_CONF).exists:
        # A burst node runs slurmd configless: it has no slurm.conf of its own to read.
        pytest.skip(f"no {SLURM_CONF} on this host (slurmd runs configless or unconfigured)")
    out = host.run("slurmd -G 2>&1")
    records = slurm_gres.parse_slurmd_gres(out.stdout)
    if out.rc != 0:
        pytest.fail(f"slurmd -G failed (exit {out.rc}): {out.stdout.strip()[-300:]}")
    if not records:
        # Some Slurm builds log the records only at a higher level; the controller's view
        # (test_slurm_registered_the_gpus, below) still catches a node that registers too few.
        pytest.skip("slurmd -G printed no GRES records: " + out.stdout.strip()[-200:])
    want = _gres_expected(gpu_expect)
    got = slurm_gres.gpu_counts(records)
    wrong = slurm_gres.compare(want, got)
    measure(got, want, not wrong, "slurmd detects " + "; ".join(wrong))


@pytest.mark.action(Action.RECONFIGURE)
def test_slurm_registered_the_gpus(host, gpu_expect: GpuExpect,  # type: ignore[no-untyped-def]
                                   expect: NodeExpect, measure: Measure) -> None:
    """slurmctld's view of the node (`scontrol show node`): its Gres are the description's
    and it is not drained for reporting fewer GRES than configured (what slurmctld does when
    slurmd detects fewer GPUs or MIG instances than slurm.conf gives the node). Skips where
    the controller cannot be asked (a lent machine with no pool)."""
    if host.run("command -v scontrol").rc != 0:
        pytest.skip("scontrol is not installed on this host")
    out = host.run(f"scontrol show node {expect.node}")
    if out.rc != 0:
        pytest.skip(f"scontrol cannot show node {expect.node}: {out.stderr.strip()[:200]}")
    node = slurm_gres.parse_scontrol_node(out.stdout)
    want = _gres_expected(gpu_expect)
    got = slurm_gres.parse_gres_spec(node.get("Gres", ""))
    wrong = slurm_gres.compare(want, got)
    reason = node.get("Reason", "")
    if slurm_gres.GRES_REASON.search(reason):
        wrong.append(f"drained: {reason}")
    measure({"gres": got, "state": node.get("State", ""), "reason": reason}, want,
            not wrong, "slurmctld holds " + "; ".join(wrong))
