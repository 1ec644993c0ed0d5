"""The health loop on a compute node: the quick tier of the acceptance gate, run on the
node itself from a timer (roles/acceptance_gate), and the verdict acted on in Slurm.

One run is one bounded step; the timer's next run takes the next one:

- pass: a node this loop drained returns to service (resume), unless it was isolated;
- fail: the node is drained with the failed checks and the advised action as the reason.
  `monitor` keeps it serving. Once its jobs are gone (they get `drain_timeout` to finish,
  then requeue-able ones are requeued), `reset` and `reboot` are taken as the description's
  `health` says (act, record, or drain only), and the node is gated again. `reconfigure`
  waits for on-call to re-run the roles; the first run that passes returns the node.
- a check that failed `isolate_after` separate times within `window` isolates the node:
  drained for good, returned only by on-call (playbooks/node_service.yml). A few cards
  cause most failures; resetting them again and again costs more jobs than keeping them out.
- could not run (the gate itself is broken): nothing is done to the node, and
  gpupool_health_up is 0, which alerts. A broken gate must not drain a whole pool.

Nodes drained by anyone else (a person, onboarding, an upgrade) are left alone: this loop
only ever resumes a drain whose reason starts with its own prefix.

    PYTHONPATH=<gate dir>/lib python3 -m gpupool.gate.health CONFIG.json

CONFIG is written by the role from the description (see `Config`). Series, for
node_exporter's textfile collector: gpupool_health_up, gpupool_health_passed,
gpupool_health_isolated, gpupool_health_failures_in_window, gpupool_health_last_run_seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.gate import runner
from gpupool.gate.actions import Action
from gpupool.gate.plugin import COULD_NOT_RUN, PASS
from gpupool.spec.model import NAME_RE, HealthStep

TIER = "quick"
# Version locks are the upgrade playbooks' to move, batch by batch: a loop that drained every
# node still on the old lock the moment the description changed would defeat their bound
# on unavailability. Those checks run at every join and upgrade (the admission gate).
EXCLUDE = ("software.locked_version_held", "gpu.driver_version")
PREFIX = "gpupool-health"
REASON_MAX = 200  # read in `sinfo -R`; the report has the rest
COMMAND_TIMEOUT_S = 30
RESET_TIMEOUT_S = 120
MAX_RECORDS = 500  # lines kept in the action record
USAGE = "usage: python -m gpupool.gate.health CONFIG.json"
# What one run writes for node_exporter's textfile collector, each labelled with the node.
SERIES = ("gpupool_health_up", "gpupool_health_passed", "gpupool_health_isolated",
          "gpupool_health_failures_in_window", "gpupool_health_last_run_seconds")
# What a check id may carry into a Slurm reason (scontrol's argument) and a record.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.,:/\[\] -]")
_PATH = re.compile(r"/[A-Za-z0-9._/-]+")
TEXTFILE_WRITER = "gpupool.onhost.prom_textfile"
# Records a successful reset in the XID check's cursor (a program: gpupool.gate.xid imports
# this module).
XID_RECORD = [sys.executable, "-m", "gpupool.gate.xid", "record", "reset"]

Run = Callable[[list[str], float], tuple[int, str]]


class ConfigError(ValueError):
    """The config file is not what the role writes."""


@dataclass(frozen=True)
class Config:
    node: str
    expect: Path  # the node's expectation (NodeExpect JSON), rendered by the role
    state_dir: Path  # failure history, reports, the action record
    textfile_dir: Path | None
    reset: HealthStep
    reboot: HealthStep
    drain_timeout_s: int
    isolate_after: int
    window_s: int
    gpus: int

    @classmethod
    def parse(cls, raw: Any) -> Config:
        if not isinstance(raw, dict):
            raise ConfigError("health config: not a JSON object")

        def get(key: str, kind: type) -> Any:
            value = raw.get(key)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
                raise ConfigError(f"health config: {key} must be a {kind.__name__}")
            return value

        def path(key: str) -> Path:
            value = get(key, str)
            if not _PATH.fullmatch(value) or ".." in value.split("/"):
                raise ConfigError(f"health config: {key} must be an absolute plain path")
            return Path(value)

        node = get("node", str)
        if not re.fullmatch(NAME_RE, node):
            raise ConfigError(f"health config: invalid node name {node!r}")
        try:
            steps = HealthStep(get("reset", str)), HealthStep(get("reboot", str))
        except ValueError as exc:
            raise ConfigError(f"health config: {exc}") from None
        numbers = [get(k, int) for k in ("drain_timeout_s", "isolate_after", "window_s", "gpus")]
        if any(n < 0 for n in numbers) or numbers[1] < 1:
            raise ConfigError("health config: counts and durations must be positive")
        return cls(node, path("expect"), path("state_dir"),
                   path("textfile_dir") if raw.get("textfile_dir") else None, *steps,
                   *numbers)


@dataclass(frozen=True)
class SlurmNode:
    state: str  # sinfo's long state: idle, mixed, allocated, draining, drained, down*, ...
    reason: str  # "" when none

    @property
    def ours(self) -> bool:
        return self.reason.startswith(PREFIX + ":")

    @property
    def isolated(self) -> bool:
        return self.reason.startswith(f"{PREFIX}: {Action.ISOLATE.value}")

    @property
    def drained(self) -> bool:
        """Drained or draining, by anyone."""
        return self.state.rstrip("*~#!%$@^-") in {"drained", "draining", "drain"}


def run_command(argv: list[str], timeout: float) -> tuple[int, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, f"{argv[0]}: {exc}"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def slurm_node(run: Run, node: str) -> SlurmNode | None:
    rc, out = run(["sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T %E"],
                  COMMAND_TIMEOUT_S)
    if rc != 0 or not out:
        return None
    state, _, reason = out.splitlines()[0].partition(" ")
    return SlurmNode(state.strip(), "" if reason.strip() == "none" else reason.strip())


def node_jobs(run: Run, node: str) -> list[str] | None:
    rc, out = run(["squeue", "--noheader", f"--nodelist={node}", "--format=%A"],
                  COMMAND_TIMEOUT_S)
    return [j for j in out.split() if j.isdigit()] if rc == 0 else None


def reason(action: str, checks: list[str]) -> str:
    text = f"{PREFIX}: {action}: " + ",".join(checks or ["-"])
    return _UNSAFE.sub("_", text)[:REASON_MAX]


def episodes(history: list[dict[str, Any]], now: float, window_s: int) -> dict[str, int]:
    """Separate failures of each check within the window."""
    counts: dict[str, int] = {}
    for entry in history:
        if now - entry["t"] <= window_s:
            for check in entry["checks"]:
                counts[check] = counts.get(check, 0) + 1
    return counts


class Loop:
    """One run of the loop for one node: reads and writes the state directory and Slurm."""

    def __init__(self, config: Config, run: Run = run_command,
                 gate: Callable[[Config], dict[str, Any]] | None = None,
                 now: Callable[[], float] = time.time) -> None:
        self.c, self.run, self.now = config, run, now
        self.gate = gate or self._gate
        self.state_file = config.state_dir / "state.json"
        self.state = self._load()
        self.did: list[str] = []
        self.node: SlurmNode | None = None

    def _load(self) -> dict[str, Any]:
        try:
            state = json.loads(self.state_file.read_text())
            history = [e for e in state["history"]
                       if isinstance(e["t"], int | float) and isinstance(e["checks"], list)
                       and all(isinstance(c, str) for c in e["checks"])]
            drained_at = state.get("drained_at")
            return {"history": history, "failing": bool(state.get("failing")),
                    "isolated": bool(state.get("isolated")),
                    "drained_at": drained_at if isinstance(drained_at, int | float) else None}
        except (OSError, ValueError, KeyError, TypeError):
            # A lost or damaged file forgets past failures: the next one counts afresh.
            return {"history": [], "failing": False, "isolated": False, "drained_at": None}

    def _gate(self, c: Config) -> dict[str, Any]:
        return runner.gate_node(None, runner.local_target(c.node), TIER, c.state_dir,
                                exclude=EXCLUDE, expect_file=c.expect)

    def _scontrol(self, *args: str) -> bool:
        rc, out = self.run(["scontrol", *args], COMMAND_TIMEOUT_S)
        if rc != 0:
            self.did.append(f"scontrol {args[0]} failed: {out[-200:]}")
        return rc == 0

    def _drain(self, why: str) -> None:
        if self._scontrol("update", f"NodeName={self.c.node}", "State=DRAIN", f"Reason={why}"):
            self.did.append(f"drained: {why}")
            self.state["drained_at"] = self.now()

    def _resume(self) -> None:
        if self._scontrol("update", f"NodeName={self.c.node}", "State=RESUME"):
            self.did.append("resumed")
            self.state["drained_at"] = None

    def step(self) -> dict[str, Any]:
        report = self.gate(self.c)
        node = self.node = slurm_node(self.run, self.c.node)
        verdict = report["verdict"]
        if node and self.state["isolated"] and not node.isolated:
            # On-call took the isolated node for service or returned it: its card was
            # looked at, so its past failures no longer count.
            self.state.update(history=[], failing=False, isolated=False)
            self.did.append("isolation lifted by on-call: failure history cleared")
        if verdict == COULD_NOT_RUN or node is None:
            self.did.append("no action: " + ("the gate could not run" if node else
                                             "Slurm did not answer"))
        elif node.drained and not node.ours:
            self.did.append(f"no action: drained by someone else ({node.reason[:80]})")
        elif verdict == PASS:
            self.state["failing"] = False
            if node.drained and not node.isolated:
                self._resume()
        else:
            self._failed(report, node)
        return self._finish(report)

    def _failed(self, report: dict[str, Any], node: SlurmNode) -> None:
        checks = [str(c) for c in report["failed"]]
        if not self.state["failing"]:  # a new episode, not the same failure seen again
            self.state["history"].append({"t": self.now(), "checks": checks})
            self.state["failing"] = True
        counts = episodes(self.state["history"], self.now(), self.c.window_s)
        repeated = [c for c in checks if counts.get(c, 0) >= self.c.isolate_after]
        action = Action.ISOLATE if repeated else Action(report["action"] or Action.ISOLATE)
        if node.isolated:
            return
        if action is Action.MONITOR:
            # Worth watching, not worth a node: one drained for an earlier failure returns.
            self.did.append("monitor: " + ",".join(checks))
            if node.drained:
                self._resume()
            return
        why = reason(action.value, checks)
        self.state["isolated"] = action is Action.ISOLATE
        if not node.drained or node.reason != why:
            self._drain(why)
            self.node = SlurmNode("draining", why)
        if action in (Action.RESET, Action.REBOOT):
            step = self.c.reset if action is Action.RESET else self.c.reboot
            if step is not HealthStep.DRAIN and self._idle():
                self._act(action, step)

    def _idle(self) -> bool:
        """True once the node runs no job; past the drain timeout its jobs are requeued."""
        jobs = node_jobs(self.run, self.c.node)
        if jobs is None:
            self.did.append("squeue failed: the action waits")
            return False
        if not jobs:
            return True
        drained_at = self.state["drained_at"] or self.now()
        self.state["drained_at"] = drained_at
        if self.now() - drained_at >= self.c.drain_timeout_s:
            for job in jobs:
                if self._scontrol("requeue", job):
                    self.did.append(f"requeued job {job}")
        else:
            self.did.append(f"waiting for jobs {','.join(jobs)}")
        return False

    def _act(self, action: Action, step: HealthStep) -> None:
        if step is HealthStep.RECORD:
            self.did.append(f"{action.value}: recorded, not taken (health.{action.value}: "
                            "record)")
        elif action is Action.RESET:
            reset = True
            for index in range(self.c.gpus):
                rc, out = self.run(["nvidia-smi", "-r", "-i", str(index)], RESET_TIMEOUT_S)
                self.did.append(f"reset GPU {index}: " + ("done" if rc == 0 else out[-120:]))
                reset = reset and rc == 0
            if reset:
                # The XIDs that asked for this reset become history (gpupool/gate/xid.py);
                # after a reset that failed they still count.
                rc, out = self.run(XID_RECORD, COMMAND_TIMEOUT_S)
                self.did.append("XID cursor: " + ("reset recorded" if rc == 0 else out[-120:]))
        else:
            # The next run after boot (the timer's OnBootSec) gates the node and returns it.
            self._save()
            self._record({"t": self.now(), "node": self.c.node, "did": ["rebooting"]})
            self.run(["systemctl", "reboot"], COMMAND_TIMEOUT_S)
            self.did.append("reboot requested")
            return
        again = self.gate(self.c)
        self.did.append(f"gated again: {again['verdict']}")
        if again["verdict"] == PASS:
            self.state["failing"] = False
            self._resume()

    def _save(self) -> None:
        self.c.state_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, sort_keys=True) + "\n")
        os.replace(tmp, self.state_file)

    def _record(self, entry: dict[str, Any]) -> None:
        path = self.c.state_dir / "actions.jsonl"
        try:
            lines = path.read_text().splitlines()[-(MAX_RECORDS - 1):]
        except OSError:
            lines = []
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join([*lines, json.dumps(entry, sort_keys=True)]) + "\n")
        os.replace(tmp, path)

    def _finish(self, report: dict[str, Any]) -> dict[str, Any]:
        now = self.now()
        self.state["history"] = [e for e in self.state["history"]
                                 if now - e["t"] <= self.c.window_s]
        self._save()
        entry = {"t": now, "node": self.c.node, "verdict": report["verdict"],
                 "failed": report["failed"], "action": report.get("action"), "did": self.did}
        try:
            self._metrics(report)
        except OSError as exc:  # node_exporter's directory missing: the loop still acts
            self.did.append(f"series not written: {exc}")
        (self.c.state_dir / "last.json").write_text(json.dumps(entry, sort_keys=True) + "\n")
        if self.did:
            self._record(entry)
        return entry

    def _metrics(self, report: dict[str, Any]) -> None:
        if self.c.textfile_dir is None:
            return
        counts = episodes(self.state["history"], self.now(), self.c.window_s)
        values = {
            "gpupool_health_up": int(report["verdict"] != COULD_NOT_RUN and bool(self.node)),
            "gpupool_health_passed": int(report["verdict"] == PASS),
            "gpupool_health_isolated": int(bool(self.node and self.node.isolated)),
            "gpupool_health_failures_in_window": max(counts.values(), default=0),
            "gpupool_health_last_run_seconds": round(self.now()),
        }
        text = "".join(f"# TYPE {k} gauge\n{k}{{node=\"{self.c.node}\"}} {v}\n"
                       for k, v in values.items())
        write_textfile(self.c.textfile_dir, "gpupool_health.prom", text)


def write_textfile(directory: Path, name: str, text: str) -> None:
    """directory/name written by gpupool/onhost/prom_textfile.py, run as a program: this
    loop is root, and that writer refuses a directory others may write and never follows a
    link planted in it (an open of `x.tmp` would write through one, as root). Run, not
    imported: the gate's layer may not import the onhost layer (tests/test_layers.py), and
    the gate's bundle carries the whole package, so `-m` finds it on the node."""
    try:
        proc = subprocess.run([sys.executable, "-m", TEXTFILE_WRITER, str(directory), name],
                              input=text.encode(), capture_output=True, check=False,
                              timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise OSError(f"{TEXTFILE_WRITER} timed out") from exc
    if proc.returncode != 0:
        raise OSError(proc.stderr.decode(errors="replace").strip()
                      or f"{TEXTFILE_WRITER} exited {proc.returncode}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        config = Config.parse(json.loads(Path(argv[0]).read_text()))
    except (OSError, ValueError) as exc:  # ConfigError and JSONDecodeError are ValueErrors
        print(f"gpupool-health: {exc}", file=sys.stderr)
        return 2
    try:
        entry = Loop(config).step()
    except OSError as exc:  # the state directory is not writable
        print(f"gpupool-health: {exc}", file=sys.stderr)
        return runner.EXIT[COULD_NOT_RUN]
    print(json.dumps(entry, sort_keys=True))
    # A failing node is the loop working; a gate that could not run is the unit failing.
    return runner.EXIT[COULD_NOT_RUN] if entry["verdict"] == COULD_NOT_RUN else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
