"""Slurm confines a job to its allocated GPUs, and an adopted SSH login to its job (issue 51).

What it proves, on one lab host made for this test alone (docs/lab-limits.md, A):

- `srun --gres=gpu:1` opens its own GPU and is refused the other; `--gres=gpu:2` opens both;
  a job with no GRES opens neither;
- two concurrent `sbatch --gres=gpu:1` jobs get disjoint GPUs;
- an SSH login by a user with a running job is adopted by pam_slurm_adopt into that job's
  extern step (/proc/self/cgroup shows job_N/step_extern) and reaches that job's GPU only;
  a login by the same user with no job is refused.

What stands in for what:

- The GPUs are fixture character devices (mknod, the driver's major GPU_FIXTURE_MAJOR,
  minors 0 and 1) with no driver behind them: open() gives ENXIO where the job's devices
  cgroup allows the device and EPERM where it denies it. That difference is the assertion.
- One host runs slurmctld and slurmd, from bookworm's packages, with a minimal slurm.conf
  written here rather than the slurm role's. The settings under test are production's:
  ProctrackType and TaskPlugin from TUNING["production"], PrologFlags from the role's
  template, cgroup.conf from gpupool's renderer for a production description, and
  pam_slurm_adopt's line from the role's tasks.
- The host is the lab's image and base arguments plus the confinement recipe of
  docs/lab-limits.md: a private cgroup namespace, SYS_ADMIN (to remount the cgroup v1
  controllers rw), SYS_NICE (task/affinity), and a device rule for each fixture minor
  exactly (a wildcard would let every job through). It sits on podman's default network and
  installs Slurm with apt, and touches nothing of the shared lab (gpupool-lab-*).

What a real site differs in: real drivers (an allowed open succeeds), many nodes and a
controller of their own, and on cgroup v2 hosts Slurm's cgroup/v2 plugin, which confines
devices with eBPF programs rather than v1's devices.allow lists: this test proves the v1
path only, and skips where the machine has no cgroup v1 devices controller.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.lab import hosts as labmod
from gpupool.render import slurm
from gpupool.spec import loader
from gpupool.spec.model import OsRelease
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

NODE = "confine1"  # the host's name, Slurm's NodeName
USER = "alice"
GPUS = (0, 1)
DEVICES = tuple(slurm.GPU_DEVICE.format(i) for i in GPUS)
CONTROLLERS = ("devices", "freezer", "cpuset", "memory")
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "libpam-slurm-adopt")
EXEC_S = 120
INSTALL_S = 600
WAIT_S = 90

# Prints one line per fixture GPU, "<device> <errno name or OK>", then the devices cgroup.
PROBE = f"""#!/usr/bin/python3
import errno, os
for dev in {list(DEVICES)!r}:
    try:
        os.close(os.open(dev, os.O_RDONLY))
        print(dev, "OK")
    except OSError as e:
        print(dev, errno.errorcode[e.errno])
print("cgroup", [l for l in open("/proc/self/cgroup").read().split() if ":devices:" in l][0])
"""


def _missing_prerequisite() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/bootstrap.sh installs it)"
    if os.geteuid() != 0:
        return "the confinement host needs rootful podman (device cgroup rules, SYS_ADMIN)"
    if not Path("/sys/fs/cgroup/devices/devices.list").exists():
        return ("no cgroup v1 devices controller at /sys/fs/cgroup/devices: this test proves "
                "Slurm's cgroup v1 device confinement (cgroup v2 confines with eBPF programs)")
    return None


class Host:
    """The test's host: run commands in it through podman, each bounded."""

    def __init__(self, name: str) -> None:
        self.name = name

    def sh(self, script: str, timeout: float = EXEC_S, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
        proc = labmod.podman("exec", self.name, "bash", "-ec", script, check=False,
                             timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"in {self.name}: {script!r} failed ({proc.returncode}):\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def as_user(self, command: str, timeout: float = EXEC_S, check: bool = True
                ) -> subprocess.CompletedProcess[str]:
        return self.sh(f"runuser -u {USER} -- bash -lc {shlex.quote(command)}", timeout, check)

    def write(self, path: str, text: str, mode: str = "0644") -> None:
        self.sh(f"cat > {path} <<'EOF_CONFINE'\n{text}EOF_CONFINE\nchmod {mode} {path}")

    def wait(self, what: str, script: str, timeout: float = WAIT_S) -> str:
        """Run script until it exits 0 with some output; returns that output (bounded)."""
        def probe() -> str:
            proc = self.sh(script, check=False)
            return proc.stdout.strip() if proc.returncode == 0 else ""

        try:
            return labmod.wait_for(f"{what} in {self.name}", probe, timeout)
        except labmod.LabError as err:
            logs = self.sh("tail -n 30 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log;"
                           " squeue; sinfo -N", check=False)
            raise AssertionError(f"{err}\n{logs.stdout}{logs.stderr}") from None


def parse_probe(output: str) -> dict[str, str]:
    """{device: errno name or OK} from PROBE's lines."""
    return {f[0]: f[1] for line in output.splitlines()
            if (f := line.split()) and f[0] in DEVICES}


def allowed(result: dict[str, str]) -> set[str]:
    """The devices the devices cgroup let through: ENXIO (no driver) or OK; anything but
    ENXIO/OK/EPERM is an error of the test, not a verdict."""
    assert set(result) == set(DEVICES), result
    assert set(result.values()) <= {"ENXIO", "EPERM", "OK"}, result
    return {d for d, e in result.items() if e != "EPERM"}


# -- configuration from gpupool and the slurm role -------------------------------------

def prolog_flags() -> str:
    """PrologFlags as the slurm role's slurm.conf template sets it (not in TUNING)."""
    text = (ROOT / "roles/slurm/templates/slurm.conf.j2").read_text()
    found = re.findall(r"^PrologFlags=(\S+)$", text, re.M)
    assert len(found) == 1, found
    return found[0]


def pam_adopt_line() -> str:
    """The pam_slurm_adopt line the slurm role puts in sshd's account stage."""
    text = (ROOT / "roles/slurm/tasks/adopt.yml").read_text()
    found = [ln.strip() for ln in text.splitlines()
             if "pam_slurm_adopt.so" in ln and ln.strip().startswith("account")]
    assert len(found) == 1, found
    return found[0]


def slurm_conf() -> str:
    production = slurm.TUNING["production"]
    return "\n".join([
        "ClusterName=confine",
        f"SlurmctldHost={NODE}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        f"ProctrackType={production['ProctrackType']}",
        f"TaskPlugin={production['TaskPlugin']}",
        f"PrologFlags={prolog_flags()}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "ReturnToService=2",
        f"NodeName={NODE} CPUs=2 RealMemory=1000 Gres=gpu:{len(GPUS)} State=UNKNOWN",
        f"PartitionName=main Nodes={NODE} Default=YES MaxTime=10 State=UP",
    ]) + "\n"


def cgroup_conf() -> str:
    desc = loader.load_stack("example", ROOT)
    assert not slurm.is_lab(desc), "the example stack is a production description"
    return "\n".join(slurm.cgroup_conf(desc)) + "\n"


def gres_conf() -> str:
    files = slurm.GPU_DEVICE.format(f"[{GPUS[0]}-{GPUS[-1]}]")
    return f"NodeName={NODE} Name=gpu File={files}\n"


# -- the host ----------------------------------------------------------------------------

def _image() -> str:
    """The Debian 12 lab hosts' base image, reused; built (under the lab lock) only when
    missing. Debian 12 whatever release the suite's lab runs: the configuration this file
    writes is Slurm 22.05's, on cgroup v1's controllers."""
    recipe = labmod.base_recipe(OsRelease.DEBIAN_12)
    ref = labmod.image_ref(recipe)
    if labmod.podman("image", "exists", ref, check=False).returncode == 0:
        return ref
    with labmod.lab_lock():
        return labmod.build_image(lambda _m: None, recipe)


def _remove(name: str) -> None:
    info = labmod._inspect(name)
    labmod.podman("rm", "-f", "-t", "0", "--ignore", name, check=False, timeout=120)
    if info:
        # Slurm's job groups, made below the container's own cgroup (private namespace).
        for d in labmod._cgroup_leftovers([str(info["Id"])]):
            labmod._rmdir_tree(d)


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    reason = _missing_prerequisite()
    if reason:
        pytest.skip(reason)
    image = _image()
    name = f"gpupool-confine-{secrets.token_hex(3)}"
    rules = [a for i in GPUS
             for a in ("--device-cgroup-rule", f"c {slurm.GPU_FIXTURE_MAJOR}:{i} rwm")]
    try:
        labmod.podman("run", "-d", "--name", name, "--hostname", NODE,
                      *labmod.base_host_args(),
                      "--cgroupns=private", "--cap-add", "SYS_ADMIN", "--cap-add", "SYS_NICE",
                      *rules, image, timeout=120)
        h = Host(name)
        h.wait("systemd", "systemctl is-system-running | grep -Ex 'running|degraded'")
        provision(h)
        yield h
    finally:
        _remove(name)


def provision(h: Host) -> None:
    # Fixture GPUs, and the cgroup v1 controllers writable before slurmd starts.
    h.sh("".join(f"mknod -m 0666 {dev} c {slurm.GPU_FIXTURE_MAJOR} {i}\n"
                 for i, dev in zip(GPUS, DEVICES, strict=True)))
    h.sh("".join(f"mount -o remount,bind,rw /sys/fs/cgroup/{c}\n" for c in CONTROLLERS))
    h.sh("apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -q -y "
         f"--no-install-recommends {' '.join(PACKAGES)}", timeout=INSTALL_S)
    h.write("/etc/slurm/slurm.conf", slurm_conf())
    h.write("/etc/slurm/cgroup.conf", cgroup_conf())
    h.write("/etc/slurm/gres.conf", gres_conf())
    h.write("/usr/local/bin/gpu-probe", PROBE, mode="0755")
    # sshd's account stage as the slurm role makes it; pam_systemd (where present) would
    # move the login out of the job's cgroup, so it goes as the role takes it out.
    h.sh(f"sed -i '/^@include common-account/a {pam_adopt_line()}' /etc/pam.d/sshd\n"
         "sed -i -E 's/^(session\\s+optional\\s+pam_systemd\\.so.*)$/# \\1/' "
         "/etc/pam.d/common-session")
    h.sh(f"grep -qx '{pam_adopt_line()}' /etc/pam.d/sshd")
    h.sh(f"useradd -m -s /bin/bash {USER}")
    h.as_user("ssh-keygen -q -t ed25519 -N '' -f ~/.ssh/id_ed25519 && "
              "cp ~/.ssh/id_ed25519.pub ~/.ssh/authorized_keys && "
              "ssh-keyscan -t ed25519 localhost > ~/.ssh/known_hosts 2>/dev/null")
    h.sh("systemctl restart munge && systemctl restart slurmctld && systemctl restart slurmd")
    h.wait("the node idle", f"sinfo -h -N -n {NODE} -o %T | grep -x idle")


# -- the assertions ----------------------------------------------------------------------

def srun(h: Host, *args: str) -> dict[str, str]:
    proc = h.as_user(f"timeout {WAIT_S} srun -N1 -n1 {' '.join(args)} gpu-probe",
                     timeout=WAIT_S + 30)
    print(f"--- srun {' '.join(args)}\n{proc.stdout}", end="")
    return parse_probe(proc.stdout)


def test_one_gpu_job_opens_its_own_device_and_is_refused_the_other(host: Host) -> None:
    result = srun(host, "--gres=gpu:1")
    assert len(allowed(result)) == 1, result
    assert sorted(result.values()) == ["ENXIO", "EPERM"], result


def test_two_gpu_job_opens_both(host: Host) -> None:
    result = srun(host, "--gres=gpu:2")
    assert allowed(result) == set(DEVICES), result


def test_job_without_gres_opens_neither(host: Host) -> None:
    result = srun(host)
    assert allowed(result) == set(), result


def _hold(h: Host, tag: str) -> str:
    """Submit a --gres=gpu:1 job that probes, then holds its GPU until /tmp/release-<tag>
    appears (or its 2-minute limit); returns its id."""
    job = h.as_user(f"sbatch --parsable --gres=gpu:1 --time=2 -o ~/{tag}.out --wrap "
                    f"'gpu-probe; while [ ! -e /tmp/release-{tag} ]; do sleep 1; done'")
    return job.stdout.strip().split(";")[0]


def _running(h: Host, job: str) -> None:
    h.wait(f"job {job} running", f"squeue -h -j {job} -o %T | grep -x RUNNING")


def test_concurrent_one_gpu_jobs_get_disjoint_devices(host: Host) -> None:
    tags = ("c1", "c2")
    jobs = [_hold(host, t) for t in tags]
    try:
        for job in jobs:
            _running(host, job)
        # Both run at once: each holds its GPU until released.
        both = host.sh(f"squeue -h -t RUNNING -j {','.join(jobs)} -o %i").stdout.split()
        assert sorted(both) == sorted(jobs), both
        results = [parse_probe(host.wait(f"{t}.out", f"grep cgroup ~{USER}/{t}.out >/dev/null"
                                         f" && cat ~{USER}/{t}.out")) for t in tags]
        print(f"--- two concurrent jobs {jobs}: {results}")
        got = [allowed(r) for r in results]
        assert all(len(g) == 1 for g in got), results
        assert got[0].isdisjoint(got[1]), results
    finally:
        host.sh(f"touch {' '.join(f'/tmp/release-{t}' for t in tags)}; "
                f"scancel {' '.join(jobs)}", check=False)
        host.wait("the node idle", f"sinfo -h -N -n {NODE} -o %T | grep -x idle")


def ssh_login(h: Host, command: str) -> subprocess.CompletedProcess[str]:
    return h.as_user("ssh -o BatchMode=yes -o ConnectTimeout=10 localhost "
                     + shlex.quote(command), timeout=60, check=False)


def test_login_without_a_job_is_refused(host: Host) -> None:
    assert host.sh(f"squeue -h -u {USER}").stdout.strip() == ""
    proc = ssh_login(host, "gpu-probe")
    print(f"--- ssh with no job: rc {proc.returncode} {proc.stdout.strip()} {proc.stderr.strip()}")
    assert proc.returncode == 255, proc
    assert "cgroup" not in proc.stdout, proc
    assert "pam_slurm_adopt" in proc.stdout + proc.stderr, proc


def test_login_is_adopted_into_its_job_and_confined_to_its_device(host: Host) -> None:
    job = _hold(host, "adopt")
    try:
        _running(host, job)
        job_probe = parse_probe(host.wait("adopt.out", f"grep cgroup ~{USER}/adopt.out "
                                          f">/dev/null && cat ~{USER}/adopt.out"))
        proc = ssh_login(host, "gpu-probe")
        print(f"--- ssh during job {job} (job's own probe {job_probe}):\n{proc.stdout}", end="")
        assert proc.returncode == 0, proc
        cgroup = next(ln for ln in proc.stdout.splitlines() if ln.startswith("cgroup "))
        assert re.search(rf"/job_{job}/step_extern(/|$)", cgroup), cgroup
        login = parse_probe(proc.stdout)
        assert len(allowed(login)) == 1, login
        assert allowed(login) == allowed(job_probe), (login, job_probe)
    finally:
        host.sh(f"touch /tmp/release-adopt; scancel {job}", check=False)
        with contextlib.suppress(AssertionError):
            host.wait("the node idle", f"sinfo -h -N -n {NODE} -o %T | grep -x idle")
