"""The suite's Debian 13 lab (tests/conftest.py, debian13_lab_raw): a controller and a GPU
node booted from a debootstrapped trixie image, converged by playbooks/site.yml with the
lab stack's Debian 13 lock (Slurm 24.11, the NVIDIA 550 userspace), re-run for idempotence
and in check mode, gated at the standard tier, given a one-GPU job and a one-GPU job in
an OCI bundle through `srun --container` (role slurm_containers); wall seconds for each
step, and the versions the hosts report. The OCI figures: a small image (a few of the
node's binaries) made and unpacked into a bundle with umoci (`oci_bundle_s`), the first
job in it (`oci_job_s`) and a second one (`oci_job_again_s`); then the same image
declared, pushed to the pool's registry on the controller (role image_registry,
`registry_push_s`), pulled by the GPU node's pull program into a bundle
(`registry_pull_cold_s`: fetched over TLS and unpacked) and again (`registry_pull_cached_s`:
the version's bundle is there), with a job run in it after each (`registry_job_s`,
`registry_job_cached_s`); a version no declaration names deleted and its blobs collected
(`registry_prune_s`, the writable instance stopped and started again). The image is a few
MB: these are the mechanism's costs, not a CUDA image's.

tests/integration/test_debian13_lab.py measures these as it proves them and writes
bench/results/debian13_lab.json; this runs that test.

    python -m bench debian13_lab
"""

from __future__ import annotations

import sys

import bench

TEST = "tests/integration/test_debian13_lab.py"
SHAPE = {"hosts": int, "up_s": float, "converge_s": float, "idempotence_s": float,
         "check_s": float, "gate_s": float, "job_s": float, "oci_bundle_s": float,
         "oci_job_s": float, "oci_job_again_s": float, "registry_push_s": float,
         "registry_pull_cold_s": float, "registry_pull_cached_s": float,
         "registry_job_s": float, "registry_job_cached_s": float, "registry_prune_s": float,
         "debian_version": str,
         "slurm_version": str, "python_version": str}


def main() -> int:
    return bench.run_tests(TEST)


if __name__ == "__main__":
    sys.exit(main())
