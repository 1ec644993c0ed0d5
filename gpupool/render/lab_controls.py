"""The controls a lab description weakens: the one list `gpupool validate` (and its --json)
prints as warnings and the policy pack reports as advisory violations.

A description with `pool.environment: lab` is rendered for podman hosts with no GPUs, no
cgroup writes and a local AWS (moto), and validation holds it to less. Each entry says what
is weaker than production, where the switch lives and what it means; entries whose switch is
a value of the description (controller_login, the health loop's `record`) or a finding
(version floors) are listed only when they hold. The roles' and the gate's own lab switches
are named by `where` (tests/test_lab_controls.py holds every lab branch in the roles, the
gate suites and this package's renderers to an entry here).

A production description weakens nothing here: the list is empty.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gpupool.render import slurm
from gpupool.spec import rules
from gpupool.spec.model import Description, HealthStep

# slurm.conf settings whose lab value confines or checks less than production's.
SLURM_CONFINEMENT = ("ProctrackType", "TaskPlugin", "SlurmdParameters")


@dataclass(frozen=True)
class Weakened:
    control: str  # stable identifier, e.g. "slurm-job-confinement"
    where: str  # the file (and name) holding the lab's switch
    detail: str  # what the lab does instead of production, in words

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.control}: {self.detail} ({self.where})"


def _slurm_confinement() -> str:
    lab, prod = slurm.TUNING["lab"], slurm.TUNING["production"]
    changed = [f"{k}={lab.get(k, '(unset)')} instead of {prod.get(k, '(unset)')}"
               for k in SLURM_CONFINEMENT if lab.get(k) != prod.get(k)]
    return ("jobs are not confined to their cgroups (" + ", ".join(changed) + "; cgroup.conf "
            "constrains no cores, devices, memory or swap): a job can use cores, memory and "
            "GPUs it was not given, and a login adopted by pam_slurm_adopt is not confined")


def weakened(desc: Description) -> list[Weakened]:
    """Every control this description weakens: empty for production."""
    if not slurm.is_lab(desc):
        return []
    found = [
        Weakened("slurm-job-confinement", "gpupool/render/slurm.py (TUNING, cgroup_conf)",
                 _slurm_confinement()),
        Weakened("fixture-gpus", "gpupool/render/slurm.py (fixture_gpu_devices, gres_conf)",
                 f"{sum(slurm.fixture_gpu_devices(desc).values())} GPUs are FIXTURE character "
                 "devices listed in gres.conf without AutoDetect=nvml (mode 0666, but the "
                 "lab host's own device cgroup refuses every open: EPERM): nothing checks "
                 "that a GPU is real, its model or its health, nor that a job opens only "
                 "its own (docs/lab-limits.md)"),
        Weakened("gate-gpu-checks", "gpupool/gate/suites/test_gpu.py (expect.lab)",
                 "the acceptance gate skips the loaded-driver check on a host without GPUs and "
                 "reads XIDs from a fixture kernel log: a node is admitted with no GPU proven"),
        Weakened("gate-storage-checks", "gpupool/gate/suites/test_storage.py (expect.lab)",
                 "network tiers are one shared host directory: the gate checks only that a "
                 "tier is mounted with its ro/rw mode, not its file system or options"),
        Weakened("ssh-root-login", "roles/hardening/defaults/main.yml "
                 "(hardening_ssh_permit_root), gpupool/gate/suites/test_system.py",
                 "sshd lets root in with a key (PermitRootLogin prohibit-password instead of "
                 "no); the lab's Ansible and tests log in as root"),
        Weakened("burst-through-relay", "roles/slurm/defaults/main.yml (slurm_burst_mode)",
                 "burst resume and suspend go through a relay file to the lab's containers, "
                 "not AWS: the burst launcher's IAM limits are proven only against moto, "
                 "which enforces no IAM"),
        Weakened("lab-keys-in-checkout", "gpupool/lab/hosts.py (lab_dir)",
                 "the lab's SSH key, controller backup key and backup manifest key are kept "
                 "together in the checkout's .lab folder, readable by whoever runs the lab"),
    ]
    if desc.pool.controller_login:
        found.append(Weakened(
            "controller-login", "pool.controller_login",
            "a controller is also the login host: researchers get a shell beside the munge "
            "key, slurmctld and the monitoring"))
    recorded = [step for step in ("reset", "reboot")
                if getattr(desc.health, step) is HealthStep.RECORD]
    if recorded:
        found.append(Weakened(
            "health-actions-recorded", "health." + "/".join(recorded),
            f"the health loop only records an advised {' or '.join(recorded)} instead of "
            "acting on it: the node is drained and left to on-call"))
    found += [Weakened("version-floors", p.path, f"{p.value}: {p.message}; allowed in a lab")
              for p in rules.floor_problems(desc)]
    return found
