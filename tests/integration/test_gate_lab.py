"""The acceptance gate on the lab: healthy hosts pass, hosts broken on purpose fail with
exactly the right check named and are not admitted, and come back once repaired.

The lab hosts are converged with every role (site.yml) and the scheduler; breakages are
made by hand on the hosts, as an operator's mistake or a drifting host would make them.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

import bench.gate_lab
from gpupool.gate import runner
from gpupool.lab import hosts, slurm_cluster
from gpupool.render import flows
from tests.conftest import lab_description, mutate

pytestmark = pytest.mark.integration
DESC = lab_description()
COMPUTE = [n for n, node in DESC.nodes.items() if "compute" in node.roles]
CANARY = flows.canary_port(DESC)  # a port no flow names
FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module")
def pool(site: Any) -> slurm_cluster.SlurmLab:
    """The session's lab, every role converged (fixture `site`)."""
    return slurm_cluster.ready(DESC)


def gate(tmp: Path, nodes: list[str], tier: str, description: Path | None = None
         ) -> dict[str, dict[str, Any]]:
    inv = hosts.inventory_path(DESC)
    reports = runner.gate(description or DESC.source, [runner.ansible_target(n, inv)
                                                       for n in nodes], tier, tmp)
    return {r["node"]: r for r in reports}


def record(key: str, reports: dict[str, dict[str, Any]]) -> None:
    """Add one gate's verdicts to the figures; the file is rewritten with each, so a run
    that stops halfway still leaves what it measured."""
    FIGURES[key] = {n: {"verdict": r["verdict"], "failed": r["failed"],
                        "duration_s": r["duration_s"], "counts": r["counts"]}
                    for n, r in reports.items()}
    bench.write("gate_lab", FIGURES, f"pytest -m integration {bench.gate_lab.TEST}")


@pytest.mark.parametrize("tier", ["quick", "standard"])
def test_healthy_hosts_pass(pool: slurm_cluster.SlurmLab, tier: str, tmp_path: Path) -> None:
    reports = gate(tmp_path, list(DESC.nodes), tier)
    record(f"healthy_{tier}", reports)
    for node, r in reports.items():
        assert r["verdict"] == "pass", (node, r["failed"], r.get("error", "")[-2000:])
    gpu = [c for c in reports[COMPUTE[0]]["checks"] if c["suite"] == "gpu"]
    assert gpu and all(c["status"] == "skip" and c["message"].startswith("no NVIDIA GPU")
                       for c in gpu)


def test_wrong_driver_pin_fails_the_software_check(pool: slurm_cluster.SlurmLab,
                                                   tmp_path: Path) -> None:
    # The lock moves to a driver the hosts do not have: every GPU node must fail on it.
    assert DESC.source is not None
    data = mutate(yaml.safe_load(DESC.source.read_text()),
                  [{"set": "software.nvidia_driver", "value": "535.309.02"}])
    desc_file = tmp_path / "lab-new-driver.yaml"
    desc_file.write_text(yaml.safe_dump(data))
    reports = gate(tmp_path / "r", COMPUTE, "quick", desc_file)
    record("wrong_driver_pin", reports)
    for node in COMPUTE:
        assert reports[node]["failed"] == ["software.locked_version_held[nvidia_driver]"]


def test_a_runtime_that_lets_containers_choose_gpus_fails(pool: slurm_cluster.SlurmLab,
                                                         tmp_path: Path) -> None:
    """Issue 14: the toolkit's config edited on a node so that NVIDIA_VISIBLE_DEVICES from
    an unprivileged container is obeyed again: the node fails exactly that check."""
    node, config = COMPUTE[0], "/etc/nvidia-container-runtime/config.toml"
    pool.sh(f"cp -p {config} {config}.gpupool-test && sed -i "
            "'s/^accept-nvidia-visible-devices-envvar-when-unprivileged = false/"
            "accept-nvidia-visible-devices-envvar-when-unprivileged = true/' " + config, node)
    try:
        reports = gate(tmp_path, [node], "quick")
        assert reports[node]["failed"] == ["software.containers_cannot_choose_their_gpus"]
    finally:
        pool.sh(f"mv {config}.gpupool-test {config}", node)


TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
TOOLKIT_CHECK = "software.containers_cannot_choose_their_gpus"


def break_toolkit(pool: slurm_cluster.SlurmLab, node: str) -> None:
    pool.sh("sed -i 's/^accept-nvidia-visible-devices-envvar-when-unprivileged = false/"
            f"accept-nvidia-visible-devices-envvar-when-unprivileged = true/' {TOOLKIT_CONFIG}",
            node)


def health_run(pool: slurm_cluster.SlurmLab, node: str) -> dict[str, Any]:
    """One run of the health loop, started as its timer starts it; what it did."""
    pool.sh("systemctl start gpupool-health.service", node, timeout=600)
    return json.loads(pool.sh("cat /var/lib/gpupool/health/last.json", node))


def slurm_reason(pool: slurm_cluster.SlurmLab, node: str) -> str:
    # One line per partition the node is in, each the same.
    return pool.sh(f"sinfo -h -N -n {node} -o %E").splitlines()[0].strip()


def test_the_health_loop_drains_a_failing_node_and_returns_it_once_repaired(
        pool: slurm_cluster.SlurmLab) -> None:
    """Issue 17, the health loop closed: the timer's service on a node whose container
    runtime was loosened drains it with the check and the advised action (reconfigure),
    the advised repair (its role re-run) is made, and the next run returns the node with no
    other step. A second failure of the same check within the window isolates the node,
    and a run that passes no longer returns it; on-call's node_resume.yml does, and the
    loop then forgets the node's past failures."""
    node = COMPUTE[-1]
    timer = pool.sh("systemctl show -p ActiveState -p TimersMonotonic gpupool-health.timer",
                    node)
    assert "ActiveState=active" in timer, timer
    assert f"OnUnitActiveUSec={DESC.health.interval}" in timer, timer
    pool.sh("rm -f /var/lib/gpupool/health/state.json", node)
    assert health_run(pool, node)["did"] == []  # healthy: nothing to do
    break_toolkit(pool, node)
    try:
        did = health_run(pool, node)
        assert did["failed"] == [TOOLKIT_CHECK] and did["action"] == "reconfigure", did
        assert "drain" in pool.node_states()[node]
        assert slurm_reason(pool, node) == f"gpupool-health: reconfigure: {TOOLKIT_CHECK}"
        repair = slurm_cluster.playbook(DESC, "site.yml", "--limit", node,
                                        "--tags", "nvidia_container_toolkit")
        assert repair.returncode == 0, repair.stdout[-3000:]
        assert health_run(pool, node)["did"] == ["resumed"]
        assert "drain" not in pool.node_states()[node]

        break_toolkit(pool, node)  # the second failure within the lab's window: isolated
        health_run(pool, node)
        assert slurm_reason(pool, node) == f"gpupool-health: isolate: {TOOLKIT_CHECK}"
        metrics = pool.sh("cat /var/lib/prometheus/node-exporter/gpupool_health.prom", node)
        assert f'gpupool_health_isolated{{node="{node}"}} 1' in metrics, metrics
        assert f'gpupool_health_failures_in_window{{node="{node}"}} 2' in metrics, metrics
        repair = slurm_cluster.playbook(DESC, "site.yml", "--limit", node,
                                        "--tags", "nvidia_container_toolkit")
        assert repair.returncode == 0, repair.stdout[-3000:]
        assert health_run(pool, node)["verdict"] == "pass"
        assert slurm_reason(pool, node).startswith("gpupool-health: isolate")
    finally:
        pool.sh("sed -i 's/^accept-nvidia-visible-devices-envvar-when-unprivileged = true/"
                "accept-nvidia-visible-devices-envvar-when-unprivileged = false/' "
                + TOOLKIT_CONFIG, node)
        resumed = slurm_cluster.playbook(DESC, "node_resume.yml", "-e", f"node={node}")
        assert resumed.returncode == 0, resumed.stdout[-3000:]
    did = health_run(pool, node)
    assert did["did"] == ["isolation lifted by on-call: failure history cleared"], did
    metrics = pool.sh("cat /var/lib/prometheus/node-exporter/gpupool_health.prom", node)
    assert f'gpupool_health_failures_in_window{{node="{node}"}} 0' in metrics, metrics
    slurm_cluster.wait_for("the returned node answering slurmctld",
                           lambda: pool.node_states()[node] == "idle", 60)


BREAK = {
    COMPUTE[0]: ("system.sshd_hardened",
                 "printf 'PasswordAuthentication yes\\n' > /etc/ssh/sshd_config.d/00-oops.conf",
                 "rm -f /etc/ssh/sshd_config.d/00-oops.conf"),
    COMPUTE[1]: ("storage.mount_present[scratch]", "rm -rf /scratch",
                 "install -d -m 1777 /scratch"),
    COMPUTE[2]: ("network.undeclared_flows_closed",
                 f"nft insert rule inet gpupool input tcp dport {CANARY} accept",
                 "nft -f /etc/nftables.conf"),
}


def test_broken_hosts_fail_exactly_and_are_not_admitted(pool: slurm_cluster.SlurmLab,
                                                        tmp_path: Path) -> None:
    for node, (_, breakage, _) in BREAK.items():
        pool.sh(breakage, node=node)
    try:
        reports = gate(tmp_path, COMPUTE, "standard")
        record("broken_standard", reports)
        for node, (check, _, _) in BREAK.items():
            assert reports[node]["verdict"] == "fail"
            assert reports[node]["failed"] == [check], node
        proc = slurm_cluster.playbook(DESC, "gate.yml")
        assert proc.returncode == 0, proc.stdout[-3000:]
        for node, (check, _, _) in BREAK.items():
            assert "drain" in pool.node_states()[node]
            reason = pool.sh(f"sinfo -h -n {node} -o %E").strip()
            assert reason.startswith("gpupool-gate: fail") and check in reason, reason
            verdict = json.loads(pool.sh(f"cat /var/lib/gpupool/admission/{node}.json"))
            assert verdict["verdict"] == "fail" and verdict["failed"] == [check]
    finally:
        for node, (_, _, repair) in BREAK.items():
            pool.sh(repair, node=node)
    proc = slurm_cluster.playbook(DESC, "gate.yml")
    assert proc.returncode == 0, proc.stdout[-3000:]
    # Admitted at once; "idle*" (a slurmd slow to answer slurmctld's ping on a loaded
    # host) may show for a few seconds, so wait, bounded, for the nodes to answer too.
    states = pool.node_states()
    assert all(states[n].rstrip("*") == "idle" for n in COMPUTE), states
    slurm_cluster.wait_for("the admitted nodes answering slurmctld", lambda: all(
        pool.node_states()[n] == "idle" for n in COMPUTE), 60)


# Issue 51: a fixture XID line, from the recorded kernel log the unit tests read
# (tests/gate/fixtures/kernel-boot1.journal.log), as the driver prints it after "kernel: ".
XID_FIXTURE = next(ln.split(" kernel: ", 1)[1] for ln in (
    Path(__file__).parents[1] / "gate" / "fixtures" / "kernel-boot1.journal.log"
).read_text().splitlines() if "NVRM: Xid (PCI:0000:3b:00): 94," in ln)
XID_CHECK = "gpu.no_xid_errors"
RECORD_RESET = ("PYTHONPATH=/opt/gpupool/gate/lib python3 -m gpupool.gate.xid record reset")


def xid_check(report: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["id"] == XID_CHECK)


def test_an_xid_fails_the_gate_until_the_reset_is_recorded(pool: slurm_cluster.SlurmLab,
                                                          tmp_path: Path) -> None:
    """Issue 51, reset then pass. A fixture XID 94 (contained ECC error: `reset`) is put
    where the check reads it. The lab's hosts are containers sharing the lab machine's
    kernel ring, so not /dev/kmsg (that would put it in every host's log and the machine's):
    root's journal entry under the identifier `kernel`, which the check reads in the lab
    only, with the same `journalctl -b -o short-monotonic` stamps (gpupool/gate/xid.py).
    The gate fails on it with `reset` advised; the reset is recorded with the runbook's
    command (runbooks/gpu-xid-or-ecc-errors.md) and the gate passes, the XID now history;
    a new XID after the record fails the gate again. No GPU is reset: the lab has none."""
    node = COMPUTE[0]

    def inject() -> None:
        before = logged()
        pool.sh(f"logger -t kernel -- {shlex.quote(XID_FIXTURE)}", node)
        slurm_cluster.wait_for("the XID line in the node's journal",
                               lambda: logged() > before, 30)

    def logged() -> int:
        return pool.sh("journalctl -q -b --no-pager -o cat SYSLOG_IDENTIFIER=kernel _UID=0",
                       node).count("NVRM: Xid")

    inject()
    try:
        failed = gate(tmp_path / "xid", [node], "quick")[node]
        assert failed["verdict"] == "fail" and failed["failed"] == [XID_CHECK], failed
        assert failed["action"] == "reset", failed
        check = xid_check(failed)
        assert check["value"] == [94] and "('0000:3b:00', 94)" in check["message"], check

        printed = pool.sh(RECORD_RESET, node)
        assert "reset recorded" in printed, printed
        owner = pool.sh("stat -c '%U %a %F' /var/lib/gpupool/health/xid-cursor", node).strip()
        assert owner == "root 644 regular file", owner
        recorded = json.loads(pool.sh("cat /var/lib/gpupool/health/xid-cursor", node))
        assert recorded["why"] == "reset" and recorded["boot_id"] == pool.sh(
            "cat /proc/sys/kernel/random/boot_id", node).strip(), recorded

        passed = gate(tmp_path / "reset", [node], "quick")[node]
        assert passed["verdict"] == "pass", passed
        check = xid_check(passed)
        assert check["status"] == "skip" and check["message"].startswith("no NVIDIA GPU"), check
        assert "since the reset recorded" in check["message"], check
        assert "before it are history" in check["message"], check

        inject()  # a new fault after the reset counts again
        again = gate(tmp_path / "again", [node], "quick")[node]
        assert again["failed"] == [XID_CHECK] and xid_check(again)["value"] == [94], again
    finally:
        pool.sh(RECORD_RESET, node)  # the later proofs find the node passing
    assert gate(tmp_path / "after", [node], "quick")[node]["verdict"] == "pass"
