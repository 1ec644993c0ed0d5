"""The component-to-package map has one owner, gpupool/spec/packages.py (issue 55): the
Ansible copies, which stay YAML because roles and playbooks run without gpupool's Python,
must agree with it. Each test names the copy that drifted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpupool.spec.packages import COMPONENT_PACKAGES, GPU_ONLY

ROOT = Path(__file__).resolve().parents[1]


def _vars(path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / path).read_text())
    return loaded


def test_the_upgrade_moves_the_packages_the_owner_names() -> None:
    """playbooks/vars/nvidia_stack.yml: the rolling upgrade reads each component's version
    from the package the owner says stands for it, one of its held primary packages."""
    wanted = {c: p.upgrade for c, p in COMPONENT_PACKAGES.items() if p.upgrade is not None}
    assert _vars("playbooks/vars/nvidia_stack.yml")["upgrade_components"] == wanted
    for name, pkgs in COMPONENT_PACKAGES.items():
        assert pkgs.upgrade is None or pkgs.upgrade in pkgs.primary, name
    # The upgrade moves the NVIDIA stack, which GPU nodes alone carry.
    assert set(wanted) <= GPU_ONLY


def test_the_driver_role_installs_and_pins_the_driver_source() -> None:
    """roles/nvidia_driver: from every repository kind, the gate's primary packages are
    installed at the lock, and the pin matches the gate's source package."""
    pkgs = COMPONENT_PACKAGES["nvidia_driver"]
    role = _vars("roles/nvidia_driver/vars/Debian.yml")
    assert set(role["nvidia_driver_packages"]) == set(role["nvidia_driver_pin_match"])
    for kind, names in role["nvidia_driver_packages"].items():
        assert sorted(pkgs.primary - set(names)) == [], kind
        assert f"src:{pkgs.source}" in role["nvidia_driver_pin_match"][kind].split(), kind
    assert pkgs.primary <= set(role["nvidia_driver_debian_packages"])


def test_single_package_roles_install_the_owners_packages() -> None:
    """roles/nvidia_container_toolkit and roles/dcgm install exactly the primary packages."""
    copies = {
        "container_toolkit": ("roles/nvidia_container_toolkit/vars/Debian.yml",
                              "nvidia_container_toolkit_packages"),
        "dcgm": ("roles/dcgm/vars/Debian.yml", "dcgm_packages"),
        "dcgm_exporter": ("roles/dcgm/vars/Debian.yml", "dcgm_exporter_packages"),
    }
    for component, (path, name) in copies.items():
        assert sorted(_vars(path)[name]) == sorted(COMPONENT_PACKAGES[component].primary), \
            (component, path, name)
    # Every component is checked by one of these tests.
    assert set(COMPONENT_PACKAGES) == set(copies) | {"nvidia_driver", "slurm"}


def test_the_slurm_role_pins_and_holds_slurms_primary_packages() -> None:
    """roles/slurm: the packages it installs at the lock and holds include the primary ones
    (the role installs more of the source, libpam-slurm-adopt)."""
    role = _vars("roles/slurm/vars/Debian.yml")
    assert sorted(COMPONENT_PACKAGES["slurm"].primary - set(role["slurm_versioned_packages"])) == []
    assert not COMPONENT_PACKAGES["slurm"].gpu_only
