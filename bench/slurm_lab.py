"""Slurm lab figures: Slurm ready on the converged lab, interactive start on a full pool
(by preemption), requeue-to-complete of the victim, a burst node's life on the lab's burst
hosts (launch, boot to the job running and its split into boot, the gate at boot and
registration, resume to done, idle to suspended; the burst image's build) and a spot
notice to the job requeued and running again.

The integration proofs (tests/integration/test_slurm_lab.py) measure these while they run
real jobs and write bench/results/slurm_lab.json; this runs them.

    python -m bench slurm_lab
"""

from __future__ import annotations

import sys

import bench

TEST = "tests/integration/test_slurm_lab.py"
SHAPE = {"lab_up_s": (float, None), "slurm_up_s": float,
         # Only in files written before the module shared site.yml's converge.
         "converge_s?": float, "reconverge_s?": float, "exclusive_gpu_pairs?": int,
         "interactive_start_on_full_pool_s?": float, "requeue_to_complete_s?": float,
         "interactive_victim_requeued_itself?": bool,
         "fairshare?": {str: float}, "burst_resume_to_job_done_s?": float,
         "burst_idle_to_suspended_s?": float, "burst_image_ready_s?": float,
         "burst_launch_s?": float, "burst_boot_to_job_running_s?": float,
         "burst_gate_s?": float, "burst_boot_s?": float, "burst_registration_s?": float,
         "spot_notice_to_requeued_s?": float, "spot_notice_to_running_again_s?": float}


def main() -> int:
    return bench.run_tests(TEST)


if __name__ == "__main__":
    sys.exit(main())
