"""The Debian 13 lane: the roles converge, re-run without a change (and in check mode) and
gate on Debian 13 (trixie) hosts, and Slurm 24.11 from trixie's archive runs a GPU job.

The suite's Debian 13 lab (tests/conftest.py, debian13_lab_raw) is the lab stack's primary
controller and one GPU node with their classes on `os: debian-13`, brought up beside the
suite's Debian 12 lab from its own debootstrapped trixie image and its own mirror of
trixie's NVIDIA 550 userspace (gpupool/lab/hosts.py, mirror.py). Its figures go to
bench/results/debian13_lab.json (bench/debian13_lab.py). The Debian 12 lab carries the
rest of the suite's proofs (drills, failover, monitoring, the replay).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

import bench
import bench.debian13_lab
from gpupool.gate import runner as gate_runner
from gpupool.lab import hosts as labmod
from gpupool.render import environment_image
from gpupool.render.cloud import launch
from gpupool.spec import os_release
from gpupool.spec.model import Description, OsRelease
from tests.conftest import DEBIAN13_IMAGE
from tests.integration.conftest import PROFILE_ROLES, Run, ansible_playbook

pytestmark = pytest.mark.integration

CONTROLLER, GPU_NODE = "lab-ctl", "lab-gpu1"
PREPARE_TIMEOUT_S = 1800  # a debootstrap and a driver's downloads, on a slow mirror


@pytest.fixture(scope="module")
def lab13(lab_lock: None, debian13_prepared: tuple[Path, Description, Future[None] | None]
          ) -> Iterator[tuple[Path, Description, float]]:
    """Fresh Debian 13 hosts for this module: their description's file, the description
    and the seconds they took to come up (once the session's thread made their image and
    mirror: up_s is the hosts' own time)."""
    path, desc, prepared = debian13_prepared
    assert labmod.lab_release(desc) is OsRelease.DEBIAN_13
    if prepared is not None:
        with contextlib.suppress(Exception):  # up() makes it again, and says what failed
            prepared.result(timeout=PREPARE_TIMEOUT_S)
    labmod.down(desc)
    # The shared tiers' host folders outlive the hosts: the registry starts empty, as a new
    # pool's does (the gate's image check is proven before and after the first push).
    assert desc.image_registry is not None
    shutil.rmtree(labmod.lab_dir(desc) / "storage" / desc.image_registry.tier
                  / environment_image.REGISTRY_DIR, ignore_errors=True)
    start = time.monotonic()
    state = labmod.up(desc)
    assert state.ready, state
    try:
        yield path, desc, round(time.monotonic() - start, 1)
    finally:
        labmod.down(desc)


# The OCI proof's bundle: an image made on the GPU node with umoci (init, new, insert, then
# unpack --rootless into role slurm_containers' bundle directory) from a root file system
# of a few of the node's own binaries with their libraries, and a file only it has.
BUNDLE = "/var/lib/gpupool/oci-bundles/lane-proof"
BUNDLE_MARKER = "gpupool-lane-proof"
LAYOUT = "/var/tmp/lane-layout"  # the image's OCI layout, kept to push to the registry
IMAGE_CHECK = "software.declared_images_pull"  # the gate's check of the declared images
BUILD_BUNDLE = f"""set -eu
r=$(mktemp -d); img=$(mktemp -d)
mkdir -p $r/usr/bin $r/usr/lib $r/usr/lib64 $r/etc $r/proc $r/sys $r/dev $r/tmp $r/run \\
  $r/var/run/slurm
ln -s usr/bin $r/bin; ln -s usr/lib $r/lib; ln -s usr/lib64 $r/lib64
for f in /usr/bin/sh /usr/bin/id /usr/bin/ls /usr/bin/cat; do
  for l in $f $(ldd $f | grep -o '/[^ ]*'); do
    d=$r/usr${{l#/usr}}; mkdir -p $(dirname $d); cp -L $l $d
  done
done
: > $r/etc/resolv.conf; echo {BUNDLE_MARKER} > $r/etc/gpupool-proof
umoci init --layout $img/layout; umoci new --image $img/layout:proof
umoci insert --rootless --image $img/layout:proof $r /
rm -rf {BUNDLE}; umoci unpack --rootless --image $img/layout:proof {BUNDLE}
chmod -R a+rX {BUNDLE}; rm -rf {LAYOUT}; mv $img/layout {LAYOUT}; rm -rf $r $img
umoci config --image {LAYOUT}:proof --tag older --config.label gpupool.lane=older"""
# Run inside the bundle (its sh, ls and cat): what the job sees.
IN_BUNDLE = ("echo uid=$(id -u); echo marker=$(cat /etc/gpupool-proof); "
             "echo gpus=$SLURM_STEP_GPUS; echo dev=$(ls /dev); "
             "[ -e /etc/debian_version ] && echo host_root=yes || echo host_root=no")


def _failed(run: Run) -> str:
    """What failed in a playbook run (each failed task with what it said), else its end."""
    failed = [m.start() for m in re.finditer(r"^fatal: |^failed: ", run.output, re.M)]
    return "\n---\n".join(run.output[max(0, i - 1500):i + 2500] for i in failed[:3]) \
        or run.output[-6000:]


def _on(desc: Description, node: str, command: str) -> str:
    proc = labmod.ssh(desc, node, command, timeout=120)
    assert proc.returncode == 0, f"{node}: {command}: {proc.stderr or proc.stdout}"
    return proc.stdout.strip()


def test_debian13_converges_idempotently_gates_and_runs_a_gpu_job(
        lab13: tuple[Path, Description, float], tmp_path: Path) -> None:
    path, desc, up_s = lab13
    inv = labmod.inventory_path(desc)
    first = ansible_playbook(inv, "playbooks/site.yml", env=PROFILE_ROLES)
    assert first.rc == 0, _failed(first)
    second = ansible_playbook(inv, "playbooks/site.yml")
    assert second.rc == 0, _failed(second)
    assert second.total("changed") == 0, second.output[-6000:]
    check = ansible_playbook(inv, "playbooks/site.yml", "--check")
    assert check.rc == 0 and check.total("changed") == 0, check.output[-6000:]

    # The hosts run what the Debian 13 lock names, from trixie's archive.
    lock = os_release.versions(desc, OsRelease.DEBIAN_13)
    debian = _on(desc, GPU_NODE, "cat /etc/debian_version")
    assert debian.startswith("13.")
    slurm = _on(desc, CONTROLLER, "sinfo --version").split()[-1]
    assert slurm.startswith(lock["slurm"]), slurm
    smi = _on(desc, GPU_NODE, "dpkg-query -W -f='${Version}' nvidia-smi")
    assert smi.startswith(lock["nvidia_driver"] + "-"), smi
    python = _on(desc, GPU_NODE, "python3 -c 'import sys; print(sys.version.split()[0])'")
    assert python.startswith(OsRelease.DEBIAN_13.python + ".")
    # The node's gate is the archive packed for its Python: its compiled wheels load.
    _on(desc, GPU_NODE, f"PYTHONPATH={launch.GATE_LIB} python3 -c "
                        "'import pydantic_core, gpupool.gate.health'")

    # Every node passes the standard gate, its OS check included (debian 13 declared).
    start = time.monotonic()
    reports = gate_runner.gate(path, [
        gate_runner.ansible_target(n, inv) for n in desc.nodes], "standard", tmp_path)
    gate_s = round(time.monotonic() - start, 1)
    failed = {r["node"]: r.get("failed") or r.get("error") for r in reports
              if r["verdict"] != "pass"}
    assert not failed, failed
    # The declared image is not pushed yet: its check says so and holds no node out.
    pulled = [c for r in reports if r["node"] == GPU_NODE for c in r["checks"]
              if c["id"] == IMAGE_CHECK]
    assert [c["status"] for c in pulled] == ["skip"], pulled
    assert "not in the registry yet" in pulled[0]["message"], pulled

    # A job asking one fixture GPU runs through Slurm 24.11 and is handed one.
    start = time.monotonic()
    out = _on(desc, CONTROLLER, "su - alice -c \"srun -p interactive --gres=gpu:1 -t 5 "
                                "-w lab-gpu1 printenv CUDA_VISIBLE_DEVICES\"")
    job_s = round(time.monotonic() - start, 1)
    assert out == "0", out

    # A job runs in an OCI bundle through srun --container (role slurm_containers: Slurm
    # 24.11's oci.conf, rootless crun): an image made with umoci from a few of the node's
    # binaries and a file of its own, unpacked into the node's bundle directory. Another
    # job holds the first fixture GPU meanwhile, so the container's is not the first.
    start = time.monotonic()
    _on(desc, GPU_NODE, BUILD_BUNDLE)
    bundle_s = round(time.monotonic() - start, 1)
    uid = _on(desc, GPU_NODE, "id -u alice")
    holder = _on(desc, CONTROLLER, "su - alice -c 'sbatch --parsable -p interactive "
                                   "--gres=gpu:1 -t 5 -w lab-gpu1 --wrap \"sleep 120\"'")
    try:
        deadline = time.monotonic() + 30
        while _on(desc, CONTROLLER, f"squeue -h -j {holder} -o %T") != "RUNNING":
            assert time.monotonic() < deadline, f"job {holder} did not start in 30 s"
            time.sleep(0.5)
        srun = ("srun -p interactive --gres=gpu:1 -t 5 -w lab-gpu1 "
                f"--container={BUNDLE} sh -c {shlex.quote(IN_BUNDLE)}")
        start = time.monotonic()
        inside = _on(desc, CONTROLLER, f"su - alice -c {shlex.quote(srun)}")
        container_job_s = round(time.monotonic() - start, 1)
        # The same bundle again: what a second job on the node pays (nothing to unpack).
        start = time.monotonic()
        again = _on(desc, CONTROLLER, f"su - alice -c {shlex.quote(srun)}")
        container_again_s = round(time.monotonic() - start, 1)
    finally:
        _on(desc, CONTROLLER, f"scancel {holder}")
    assert again.splitlines()[0] == inside.splitlines()[0], (inside, again)
    seen = dict(line.split("=", 1) for line in inside.splitlines() if "=" in line)
    assert seen["uid"] == uid, inside  # the job's own user, not root
    assert seen["marker"] == BUNDLE_MARKER and seen["host_root"] == "no", inside
    assert seen["gpus"] in {"1", "2", "3"}, inside  # one GPU, not the holder's
    # Its own GPU only, of the node's four fixture devices.
    devices = [d for d in seen["dev"].split() if d.startswith("nvidia")]
    assert devices == [f"nvidia{seen['gpus']}"], inside

    registry = _registry_proof(path, desc, inside.splitlines()[0], tmp_path)

    bench.write("debian13_lab", {
        "hosts": len(desc.nodes), "up_s": up_s, "converge_s": first.seconds,
        "idempotence_s": second.seconds, "check_s": check.seconds, "gate_s": gate_s, "job_s": job_s,
        "oci_bundle_s": bundle_s, "oci_job_s": container_job_s,
        "oci_job_again_s": container_again_s, **registry,
        "debian_version": debian, "slurm_version": slurm, "python_version": python},
        f"pytest -m integration {bench.debian13_lab.TEST}")


def _registry_proof(path: Path, desc: Description, first_line: str,
                    tmp_path: Path) -> dict[str, float]:
    """The declared image through the pool's registry (role image_registry): pushed on the
    registry's host to its loopback instance, refused to a node's credential and to no
    credential, pulled by the GPU node's pull program into a bundle (cold), a job run in
    it through Slurm, then pulled again (cached: nothing fetched) and run again."""
    plan = environment_image.registry_plan(desc)
    assert plan is not None
    image = next(i for i in plan["images"] if i["name"] == DEBIAN13_IMAGE[0])
    # The layout made on the GPU node goes to the registry's host, which alone may push.
    staging = tmp_path / "layout"
    for argv in (["podman", "cp", f"{labmod.container_name(desc, GPU_NODE)}:{LAYOUT}",
                  str(staging)],
                 ["podman", "cp", str(staging), f"{labmod.container_name(desc, CONTROLLER)}:"
                  f"{LAYOUT}"]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, (argv, proc.stderr)
    loopback = image["reference"].replace(plan["registry"], f"127.0.0.1:{plan['port']}", 1)
    start = time.monotonic()
    proc = labmod.ssh(desc, CONTROLLER, "skopeo copy --quiet --dest-creds "
                                        "push:$(cat /etc/gpupool/registry/push.password) "
                                        f"oci:{LAYOUT}:proof docker://{shlex.quote(loopback)}",
                      timeout=120)
    push_s = round(time.monotonic() - start, 1)
    # On failure, what the registry's units said: the lane runs where nobody can look.
    if proc.returncode != 0:
        units = labmod.ssh(desc, CONTROLLER, "systemctl --no-pager status gpupool-registry-push "
                                             "gpupool-registry; journalctl --no-pager -n 40 "
                                             "-u gpupool-registry-push -u gpupool-registry",
                           timeout=60).stdout
        pytest.fail(f"push refused: {proc.stderr}\n{units}")
    # A version no declaration names (another manifest, the same layer), pushed beside it:
    # the prune program deletes it and collects its blobs, and keeps the declared one.
    undeclared = loopback.rsplit(":", 1)[0] + ":0.9.0"
    _on(desc, CONTROLLER, "skopeo copy --quiet --dest-creds "
                          "push:$(cat /etc/gpupool/registry/push.password) "
                          f"oci:{LAYOUT}:older docker://{shlex.quote(undeclared)}")
    dry = [json.loads(line) for line in _on(
        desc, CONTROLLER, "gpupool-registry-prune --dry-run --json").splitlines()]
    assert [(d["tag"], d["state"]) for d in dry[:-1]] == [("0.9.0", "would delete")], dry
    start = time.monotonic()
    pruned = [json.loads(line) for line in _on(
        desc, CONTROLLER, "gpupool-registry-prune --collect --json").splitlines()]
    prune_s = round(time.monotonic() - start, 1)
    assert pruned[-1]["summary"]["deleted"] == 1 and pruned[-1]["summary"]["collected"], pruned
    inspect = ("skopeo inspect --raw --creds push:$(cat /etc/gpupool/registry/push.password) "
               "docker://")
    assert labmod.ssh(desc, CONTROLLER, inspect + shlex.quote(undeclared),
                      timeout=60).returncode != 0
    _on(desc, CONTROLLER, inspect + shlex.quote(loopback))
    # A node holds the read-only account: its push is refused, as is one with no account,
    # and the writable instance is not reachable from it at all.
    target = f"docker://{plan['registry']}/{plan['images'][0]['repository']}:refused"
    for creds in ("--dest-authfile /etc/gpupool/registry-auth.json", "--dest-no-creds"):
        proc = labmod.ssh(desc, GPU_NODE, f"skopeo copy --quiet {creds} "
                                          f"oci:{LAYOUT}:proof {shlex.quote(target)}",
                          timeout=120)
        assert proc.returncode != 0, (creds, proc.stdout, proc.stderr)
    # Pulled cold: fetched and unpacked into the bundle directory.
    name = f"{image['name']}:{image['version']}"
    pulled = json.loads(_on(desc, GPU_NODE, f"gpupool-image-pull --json {name}"))
    assert pulled["state"] == "pulled", pulled
    bundle = pulled["detail"]
    srun = ("srun -p interactive --gres=gpu:1 -t 5 -w lab-gpu1 "
            f"--container={bundle} sh -c {shlex.quote(IN_BUNDLE)}")
    start = time.monotonic()
    inside = _on(desc, CONTROLLER, f"su - alice -c {shlex.quote(srun)}")
    job_s = round(time.monotonic() - start, 1)
    assert inside.splitlines()[0] == first_line, inside  # the same user, in the image
    assert f"marker={BUNDLE_MARKER}" in inside.splitlines(), inside
    # Cached: the version's bundle is there, nothing is fetched again.
    again = json.loads(_on(desc, GPU_NODE, f"gpupool-image-pull --json {name}"))
    assert again["state"] == "cached" and again["detail"] == bundle, again
    start = time.monotonic()
    inside_again = _on(desc, CONTROLLER, f"su - alice -c {shlex.quote(srun)}")
    job_again_s = round(time.monotonic() - start, 1)
    assert inside_again == inside, (inside, inside_again)
    # Now pushed, the gate's check pulls it (cached) and passes.
    inv = labmod.inventory_path(desc)
    [report] = gate_runner.gate(path, [gate_runner.ansible_target(GPU_NODE, inv)], "standard",
                                tmp_path / "gate-again", suites=("software",))
    checks = {c["id"]: c for c in report["checks"]}
    assert checks[IMAGE_CHECK]["status"] == "pass", checks[IMAGE_CHECK]
    # An image the description does not declare is no pull: the program refuses it.
    proc = labmod.ssh(desc, GPU_NODE, "gpupool-image-pull other:1.0.0", timeout=60)
    assert proc.returncode == 2 and "not a declared image" in proc.stderr, proc.stderr
    return {"registry_push_s": push_s, "registry_pull_cold_s": pulled["seconds"],
            "registry_pull_cached_s": again["seconds"], "registry_job_s": job_s,
            "registry_job_cached_s": job_again_s, "registry_prune_s": prune_s}
