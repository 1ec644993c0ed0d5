"""GPU detection in the lab's real Slurm (Debian 12's 22.05.8), issue 51.

What the lab can prove, with no GPU:
- the NVML plugin question is answered by Debian's own archive, not by gpupool's table
  alone: on a lab compute node, apt (a private configuration listing bookworm's main and
  contrib, so the host's sources stay as they are) refuses slurm-wlm-nvml-plugin beside
  the Slurm the role installed from the lock, for the reason the vendored facts give
  (gpupool/data/slurm-gpu-detection), and the role installed no plugin;
- gres.conf names the fixture devices (File=), never AutoDetect;
- the gate's slurm suite (gpupool/gate/suites/test_slurm.py) reads what slurmd detects
  (`slurmd -G`) and what slurmctld registered (`scontrol show node`) and passes against
  the description, and fails when the description says one GPU more.

Nothing about NVML detecting a real GPU is claimed here: that needs a GPU host
(scripts/gpu-gate.sh records `slurmd -G` where one has slurmd).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.gate import runner
from gpupool.lab import hosts, slurm_cluster
from gpupool.render import slurm
from gpupool.spec import gpu_detection
from tests.conftest import lab_description

pytestmark = pytest.mark.integration
DESC = lab_description()
NODE = next(n.name for n in slurm.nodes(DESC) if not n.cloud)
DETECTION = gpu_detection.resolve(DESC.software.slurm)
# A private apt configuration on the node: bookworm's main and contrib (and its security
# suite, where Slurm's fixed builds are), its own lists and cache.
APT_DIR = "/tmp/gpupool-nvml-apt"  # inside the lab container
APT = (f"-o Dir::Etc::SourceList={APT_DIR}/sources.list -o Dir::Etc::SourceParts=/dev/null "
       f"-o Dir::State::Lists={APT_DIR}/lists -o Dir::Cache={APT_DIR}/cache")
SOURCES = ("deb http://deb.debian.org/debian bookworm main contrib\n"
           "deb http://deb.debian.org/debian-security bookworm-security main contrib\n")


@pytest.fixture(scope="module")
def pool(site: Any) -> slurm_cluster.SlurmLab:
    """The session's lab, every role converged (fixture `site`)."""
    return slurm_cluster.ready(DESC)


def test_the_lock_resolves_to_no_installable_plugin_on_debian_12() -> None:
    assert DETECTION.suite is not None and DETECTION.suite.codename == "bookworm"
    assert not DETECTION.available
    assert slurm.plan(DESC)["gpu_detection"]["plugin_version"] is None


def test_debian_refuses_the_plugin_beside_the_locked_slurm(pool: slurm_cluster.SlurmLab
                                                            ) -> None:
    installed = pool.sh("dpkg-query -W -f='${Version}' slurm-wlm-basic-plugins",
                        node=NODE).strip()
    assert installed == DETECTION.installed, (installed, DETECTION.installed)
    # The role installed no plugin where none fits.
    absent = pool.sh("dpkg-query -W -f='${Status}' slurm-wlm-nvml-plugin 2>&1 || true",
                     node=NODE)
    assert "install ok installed" not in absent, absent
    pool.sh(f"mkdir -p {APT_DIR}/lists/partial {APT_DIR}/cache/archives/partial && "
            f"printf %s {shlex.quote(SOURCES)} > {APT_DIR}/sources.list && "
            f"apt-get {APT} -qq update", node=NODE, timeout=300)
    try:
        policy = pool.sh(f"apt-cache {APT} policy slurm-wlm-nvml-plugin", node=NODE)
        assert DETECTION.suite is not None and DETECTION.suite.plugin in policy, policy
        show = pool.sh(f"apt-cache {APT} show slurm-wlm-nvml-plugin={DETECTION.suite.plugin}",
                       node=NODE)
        depends = next(line for line in show.splitlines() if line.startswith("Depends:"))
        for op, version in DETECTION.suite.requires:  # the vendored facts are the archive's
            assert f"slurm-wlm-basic-plugins ({op} {version})" in depends, depends
        # Simulated: nothing on the node changes. apt must refuse (the installed Slurm is
        # held at the lock, and no suite serves the build the plugin pins).
        sim = pool.sh(f"apt-get {APT} -s install slurm-wlm-nvml-plugin 2>&1; echo rc=$?",
                      node=NODE, check=False)
        assert "rc=0" not in sim and "slurm-wlm-basic-plugins" in sim, sim
    finally:
        pool.sh(f"rm -rf {APT_DIR}", node=NODE, check=False)


def test_gres_conf_names_the_fixture_devices(pool: slurm_cluster.SlurmLab) -> None:
    conf = pool.sh("cat /etc/slurm/gres.conf", node=NODE)
    assert "AutoDetect" not in conf, conf
    lines = [ln for ln in conf.splitlines() if ln.startswith("NodeName=")]
    assert lines == slurm.gres_conf(DESC), conf


def _gate(tmp: Path, description: Path) -> dict[str, Any]:
    target = runner.ansible_target(NODE, hosts.inventory_path(DESC))
    (report,) = runner.gate(description, [target], "quick", tmp, suites=("slurm",))
    return report


def test_the_gate_reads_what_slurm_detects(pool: slurm_cluster.SlurmLab, tmp_path: Path
                                           ) -> None:
    assert DESC.source is not None
    report = _gate(tmp_path / "right", DESC.source)
    checks = {c["id"]: c for c in report["checks"] if c["suite"] == "slurm"}
    assert report["verdict"] == "pass", (report["failed"], report.get("error", "")[-2000:])
    # Both ran (neither skipped): the lab's slurmd and slurmctld answered.
    assert {checks[k]["status"] for k in ("slurm.slurmd_detects_the_gpus",
                                          "slurm.slurm_registered_the_gpus")} == {"pass"}, checks
    # One GPU more in the description than slurmd finds: both checks name it.
    raw = yaml.safe_load(DESC.source.read_text())
    for c in raw["node_classes"].values():
        if c.get("gpu"):
            c["gpu"]["count"] += 1
    for t in raw["teams"].values():  # quotas within the larger capacity stay valid
        t["quota"] = {m: 0 for m in t["quota"]}
        t.pop("borrowing_limit", None)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(raw))
    bad = _gate(tmp_path / "wrong", wrong)
    assert bad["verdict"] == "fail", json.dumps(bad)[-2000:]
    assert set(bad["failed"]) == {"slurm.slurmd_detects_the_gpus",
                                  "slurm.slurm_registered_the_gpus"}, bad["failed"]
