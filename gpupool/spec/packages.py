"""How each component of the software lock shows up among a Debian host's packages: the
one owner of the component-to-package map (issue 55).

Packaging facts, not pool values: the source package whose binaries must all carry the
locked version, the primary packages that must also be held (their exact-version
dependencies keep the rest in step), and the package whose installed version stands for
the component in a rolling upgrade. cuda, nccl and the GPU operator live in containers and
the cluster, so they have no entry.

The gate's software suite (gpupool/gate/suites/test_software.py) reads this module. The
Ansible copies stay YAML, because roles and playbooks run without gpupool's Python on the
node; tests/test_component_packages.py fails when any of them disagrees with this map:
playbooks/vars/nvidia_stack.yml (upgrade_components), roles/nvidia_driver,
roles/nvidia_container_toolkit, roles/dcgm and roles/slurm (their vars/Debian.yml).
Standard library only: a GPU node running the gate imports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ComponentPackages:
    source: str  # the Debian source package; every installed binary of it is at the lock
    primary: frozenset[str]  # installed at the lock and held (apt-mark hold)
    # The package whose version the rolling upgrade reads as the component's; None where
    # the upgrade does not move the component (Slurm has its own procedure).
    upgrade: str | None
    gpu_only: bool  # installed on GPU nodes only


COMPONENT_PACKAGES: dict[str, ComponentPackages] = {
    "nvidia_driver": ComponentPackages(
        "nvidia-graphics-drivers", frozenset({"nvidia-smi", "libnvidia-ml1", "libcuda1"}),
        "nvidia-smi", gpu_only=True),
    "container_toolkit": ComponentPackages(
        "nvidia-container-toolkit", frozenset({"nvidia-container-toolkit"}),
        "nvidia-container-toolkit", gpu_only=True),
    "dcgm": ComponentPackages(
        "datacenter-gpu-manager", frozenset({"datacenter-gpu-manager"}),
        "datacenter-gpu-manager", gpu_only=True),
    "dcgm_exporter": ComponentPackages(
        "datacenter-gpu-manager-exporter", frozenset({"datacenter-gpu-manager-exporter"}),
        "datacenter-gpu-manager-exporter", gpu_only=True),
    "slurm": ComponentPackages(
        "slurm-wlm", frozenset({"slurmd", "slurmctld", "slurmdbd", "slurm-client"}),
        None, gpu_only=False),
}
GPU_ONLY = frozenset(name for name, pkgs in COMPONENT_PACKAGES.items() if pkgs.gpu_only)
