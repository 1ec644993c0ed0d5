"""The NVIDIA roles installed from the lab's signed local mirror with no network at all.

The host runs with `--network none`: the Debian mirror and every other source are
unreachable, and the roles remove every other apt source (nvidia_repo_exclusive). The driver
packages are the real Debian non-free 535 packages; nvidia-container-toolkit and
datacenter-gpu-manager are FIXTURE packages built by gpupool/lab/mirror.py under those names
(no NVIDIA code): they exercise repository setup, pinning, holding and services only.

The host needs nothing from the lab's hosts, only the lab's image and mirror: its two
converges (the install, then again for idempotence) start on a thread before the session's
`site` fixture converges the lab, and run beside it, where both mostly wait on dpkg.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from gpupool.lab import hosts as labmod
from gpupool.render import inventory
from gpupool.spec.model import Description
from tests.integration.conftest import Run, SiteRuns, ansible_playbook

pytestmark = pytest.mark.integration

NODE = "lab-gpu1"  # the node whose variables the air-gapped host takes
RUN_TIMEOUT_S = 900  # each of the two converges


@pytest.fixture(scope="session")
def airgap_runs(lab: labmod.LabState, lab_desc: Description,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Future[Run]]]:
    """The air-gapped host, and its converge and idempotence run started on a thread.
    Session-scoped so that it is set up before `site`, which the test also asks for."""
    image = labmod.build_image(lambda _m: None, labmod.lab_recipe(lab_desc))
    key = labmod.ensure_mirror(lab_desc, image, lambda _m: None)
    name = f"{labmod.prefix(lab_desc)}-airgap"
    labmod.podman("rm", "-f", "-t", "0", name, check=False)
    labmod.podman("run", "-d", *labmod.labels(lab_desc), "--name", name, "--hostname", name,
                  "--systemd=always", "--network", "none",
                  "-v", f"{labmod.mirror_dir(lab_desc)}:{labmod.MIRROR_MOUNT}:ro", image)
    try:
        labmod.wait_for("systemd in the air-gapped host", lambda: labmod.podman(
            "exec", name, "systemctl", "is-system-running", check=False
        ).stdout.strip() in ("running", "degraded"), labmod.BOOT_WAIT_S)
        (labmod.lab_dir(lab_desc) / "airgap-key.asc").write_text(key)
        tmp = tmp_path_factory.mktemp("airgap")
        play = tmp / "airgap.yml"
        play.write_text(PLAY)
        inv = _inventory(lab_desc, name, tmp)
        with ThreadPoolExecutor(1, thread_name_prefix="airgap") as pool:
            yield name, pool.submit(_converge_twice, inv, play)
    finally:
        labmod.podman("rm", "-f", "-t", "0", name, check=False)


def _converge_twice(inv: Path, play: Path) -> Run:
    """The install, then (only if it passed) the same play again; the failing or the
    second run."""
    run = ansible_playbook(inv, str(play), timeout=RUN_TIMEOUT_S)
    return ansible_playbook(inv, str(play), timeout=RUN_TIMEOUT_S) if run.rc == 0 else run


def _inventory(lab_desc: Description, host: str, tmp: Path) -> Path:
    hv = inventory.host_vars(lab_desc, NODE)
    hv.pop("ansible_host")
    inv = {"all": {"hosts": {host: {**hv, "ansible_connection": "containers.podman.podman",
                                    "ansible_python_interpreter": "/usr/bin/python3"}},
                   "vars": {**inventory.pool_vars(lab_desc),
                            "nvidia_repo_source": "mirror",
                            "nvidia_repo_mirror_url": f"file:{labmod.MIRROR_MOUNT}",
                            "nvidia_repo_mirror_key": (labmod.lab_dir(lab_desc) /
                                                       "airgap-key.asc").read_text(),
                            "nvidia_repo_exclusive": True,
                            # Only loopback here, not the node's management address.
                            "dcgm_exporter_address": "127.0.0.1"},
                   "children": {"role_compute": {"hosts": {host: None}}}}}
    path = tmp / "airgap-inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


PLAY = """
- name: NVIDIA software from the air-gapped mirror
  hosts: all
  roles: [nvidia_driver, nvidia_container_toolkit, dcgm]
"""


def test_airgapped_install_from_signed_mirror(airgap_runs: tuple[str, Future[Run]],
                                              site: SiteRuns, lab_desc: Description) -> None:
    # `site` is asked for after airgap_runs so that the lab's converge runs beside this one.
    airgap_host, runs = airgap_runs

    def sh(cmd: str) -> subprocess.CompletedProcess[str]:
        return labmod.podman("exec", airgap_host, "sh", "-c", cmd, check=False)

    # Nothing but the mirror: no network interface besides loopback.
    assert sh("python3 -c 'import socket; socket.create_connection((\"deb.debian.org\", 80), 3)'"
              ).returncode != 0
    again = runs.result(timeout=2 * RUN_TIMEOUT_S + 60)
    assert again.rc == 0 and again.total("changed") == 0, again.output[-6000:]

    sources = sh("ls /etc/apt/sources.list.d; test -e /etc/apt/sources.list && echo LIST")
    assert sources.stdout.split() == ["gpupool-nvidia.sources"]
    version = sh("dpkg-query -W -f='${Version}' nvidia-smi libnvidia-ml1").stdout
    assert version.count(lab_desc.software.nvidia_driver + "-") == 2
    held = set(sh("apt-mark showhold").stdout.split())
    assert {"nvidia-smi", "nvidia-persistenced", "nvidia-container-toolkit",
            "datacenter-gpu-manager", "datacenter-gpu-manager-exporter"} <= held
    # The signature is checked: without the key apt refuses the mirror (exit 100).
    unsigned = sh("mkdir -p /tmp/l/partial && mv /etc/apt/keyrings/gpupool-nvidia.asc /tmp/k.asc"
                  " && apt-get update -o Dir::State::Lists=/tmp/l 2>&1; rc=$?;"
                  " mv /tmp/k.asc /etc/apt/keyrings/gpupool-nvidia.asc; exit $rc")
    assert unsigned.returncode == 100, unsigned.stdout
    # Services and configuration from the fixture packages.
    assert sh("systemctl is-active nvidia-dcgm").stdout.strip() == "active"
    assert sh("test -f /etc/nvidia-container-runtime/config.toml").returncode == 0
