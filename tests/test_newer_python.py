"""gpupool on Debian trixie's CPython 3.13, with every dependency at its locked version.

The rest of the suite runs on this machine's CPython 3.11. Here the unit tests that cover
the description and its rules, the renderers (inventory, Slurm, the Pulumi program under
mocks), the policy pack, the CLI, the trace and replay, and the gate run on 3.13: gpupool
supports every Python from 3.11 up that the locked dependencies allow. 3.12 is in no Debian
suite the lab reaches, so nothing here runs it.

The host has no network. It installs the wheels that scripts/wheelhouse.sh downloaded (make
test runs it first) and reads the checkout through an overlay, so nothing it writes stays.
make test runs it in the lane of lint and the unit tests (marker newer_python), beside the
shared lab's integration tests rather than after them.
"""

from __future__ import annotations

import os

import pytest

from gpupool.lab import hosts
from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.newer_python]

TRIXIE = hosts.Recipe("gpupool-trixie-python", "trixie", ("python3", "python3-venv"),
                      "set -eu\napt-get clean\nrm -rf /var/lib/apt/lists/*\n")
WHEELS = ROOT / ".cache" / "wheelhouse" / "cp313"
MODULES = (
    "tests/test_description.py", "tests/test_hostile_inputs.py", "tests/test_cli.py",
    "tests/test_inventory.py", "tests/test_inventory_plugin.py", "tests/test_slurm_render.py",
    "tests/test_infra_program.py", "tests/test_policy_pack.py", "tests/test_trace.py",
    "tests/test_replay.py", "tests/test_spot_watch.py", "tests/gate",
)
RUN_TIMEOUT_S = 2400  # bounded, yet long enough for a weight of 110 on a busy machine
CPU_SHARES = 110  # the weight of `nice -n 10` against a nice-0 task
SCRIPT = f"""set -eu
python3 --version
python3 -m venv /venv
/venv/bin/pip install --quiet --no-index --find-links /wheels -r /wheels/requirements.txt
cd /src
exec /venv/bin/python -m pytest -q -p no:cacheprovider -m "not integration" {' '.join(MODULES)}
"""


def test_the_unit_tests_pass_on_cpython_3_13() -> None:
    if os.geteuid() != 0:
        pytest.skip("building the trixie host needs root (debootstrap, chroot)")
    if not (WHEELS / "requirements.txt").is_file():
        pytest.fail("no wheels for CPython 3.13: run scripts/wheelhouse.sh (make test does)")
    image = hosts.build_image(lambda _m: None, TRIXIE)
    # The container's processes are in a cgroup of their own, which make test's `nice` does
    # not reach: without a weight of its own it took an equal share of the two cores from
    # the lab's hosts (1024 each) while the integration tests ran beside it.
    proc = hosts.podman(
        "run", "--rm", "--network", "none", "--cpu-shares", str(CPU_SHARES),
        "-v", f"{ROOT}:/src:O", "-v", f"{WHEELS}:/wheels:ro",
        "-e", "PYTHONPATH=/src", "-e", "PYTHONDONTWRITEBYTECODE=1",
        "-e", "PATH=/venv/bin:/usr/bin:/bin",
        image, "sh", "-c", SCRIPT, check=False, timeout=RUN_TIMEOUT_S)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert out.startswith("Python 3.13."), out[:200]
