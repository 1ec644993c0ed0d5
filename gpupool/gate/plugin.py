"""pytest plugin that turns the gate's testinfra suites into one JSON report per node.

Each check records what it measured and what it expected through the `measure` fixture;
the report keeps both, the check's duration and the action advised when it fails.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpupool.gate.actions import Action, worst
from gpupool.gate.expect import NodeExpect, node_expect, with_locks
from gpupool.spec import loader

TIERS = ("quick", "standard", "burn-in")
PASS, FAIL, COULD_NOT_RUN = "pass", "fail", "could-not-run"

Measure = Callable[..., None]
# One pytest session gates one node, so module state is per report.
_RESULTS: list[dict[str, Any]] = []
_HOST_IDS: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("gpupool gate")
    g.addoption("--gate-file", help="pool description file")
    g.addoption("--gate-expect", help="the node's expectation as JSON (NodeExpect.to_json), "
                                      "instead of --gate-file: a burst node has no description")
    g.addoption("--gate-node", help="the node under test")
    g.addoption("--gate-tier", default="quick", choices=TIERS)
    g.addoption("--gate-report", help="where to write the JSON report")
    g.addoption("--gate-suite", action="append", default=[],
                help="run only these suites (system, software, gpu, storage, network, ...)")
    g.addoption("--gate-exclude", action="append", default=[],
                help="leave out checks whose id starts with this (recorded in the report)")
    g.addoption("--gate-probes", help="the peers' probe output as JSON, peer -> output "
                                      "(gpupool/gate/probes.py), for a gate run on the node")
    g.addoption("--gate-lock", action="append", default=[],
                help="COMPONENT=VERSION expected instead of the description's lock")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tier(name): the lowest tier that runs this check")
    config.addinivalue_line("markers", "action(name): advised action when the check fails")
    config._gate_started = time.time()  # type: ignore[attr-defined]
    # The ids testinfra gives its hosts: "local", or "<backend>://<host>" without options.
    _HOST_IDS[:] = [h.split("?", 1)[0].rstrip("/") if "://" in h and h.split("://", 1)[1]
                    else "local" for h in (config.getoption("--hosts") or "").split(",") if h]


def runs_at(check_tier: str, tier: str) -> bool:
    """Whether a check marked check_tier runs in a gate of tier: every tier runs its own
    checks and those of the tiers below it."""
    return TIERS.index(check_tier) <= TIERS.index(tier)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    level = config.getoption("--gate-tier")
    suites = set(config.getoption("--gate-suite"))
    excluded = tuple(config.getoption("--gate-exclude"))
    keep, drop = [], []
    for item in items:
        mark = item.get_closest_marker("tier")
        tier = mark.args[0] if mark else "quick"
        suite, name = _check_id(item.nodeid)
        wanted = (runs_at(tier, level) and (not suites or suite in suites)
                  and not (excluded and f"{suite}.{name}".startswith(excluded)))
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def node_expectation(config: pytest.Config) -> NodeExpect:
    """The node's expectations, built once per run (collection needs them too)."""
    cached: NodeExpect | None = getattr(config, "_gate_expect", None)
    if cached is None:
        if config.getoption("--gate-expect"):
            cached = NodeExpect.from_json(Path(config.getoption("--gate-expect")).read_text())
        else:
            desc = loader.load_file(Path(config.getoption("--gate-file")))
            cached = node_expect(desc, config.getoption("--gate-node"))
        cached = with_locks(cached, config.getoption("--gate-lock"))  # checked by gate --lock
        config._gate_expect = cached  # type: ignore[attr-defined]
    return cached


@pytest.fixture(scope="session")
def expect(pytestconfig: pytest.Config) -> NodeExpect:
    return node_expectation(pytestconfig)


@pytest.fixture
def measure(request: pytest.FixtureRequest) -> Measure:
    """measure(value, expected, ok, message=...): record the measurement, fail if not ok."""
    mark = request.node.get_closest_marker("action")
    default_action = mark.args[0] if mark else Action.RECONFIGURE.value

    def record(value: Any, expected: Any, ok: bool, message: str = "",
               action: str | None = None) -> None:
        message = message or f"measured {value!r}, expected {expected!r}"
        request.node.user_properties.append(("gate", {
            "value": value, "expected": expected, "ok": ok, "message": message,
            "action": action or default_action}))
        assert ok, message  # noqa: S101 - this is how a pytest check fails

    return record


def _check_id(nodeid: str) -> tuple[str, str]:
    path, _, name = nodeid.partition("::")
    suite = Path(path).stem.removeprefix("test_")
    name = name.removeprefix("test_")
    # testinfra adds the host to every test's id; one report is one host anyway.
    base, _, params = name.partition("[")
    params = params.removesuffix("]")
    for host_id in _HOST_IDS:
        params = params.replace(f"-{host_id}", "").replace(f"{host_id}-", "")
        if params == host_id:
            params = ""
    return suite, f"{base}[{params}]" if params else base


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or (report.when == "setup" and not report.passed):
        props = dict(report.user_properties).get("gate", {})
        if report.skipped:
            status = "skip"
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
            message = str(reason).removeprefix("Skipped: ")
        elif report.passed:
            status, message = "pass", props.get("message", "")
        elif props:  # measured and found wanting
            status, message = "fail", props["message"]
        else:  # the check itself broke: it could not measure
            status, message = "error", str(report.longrepr)[-400:]
        suite, name = _check_id(report.nodeid)
        _RESULTS.append({
            "id": f"{suite}.{name}", "suite": suite, "status": status,
            "value": props.get("value"), "expected": props.get("expected"),
            "duration_s": round(report.duration, 3), "message": message,
            "action": props.get("action") if status == "fail" else None})



def verdict(checks: list[dict[str, Any]], exitstatus: int) -> str:
    if any(c["status"] == "fail" for c in checks):
        return FAIL
    if exitstatus not in (0, 1) or any(c["status"] == "error" for c in checks) or not checks:
        return COULD_NOT_RUN
    return PASS


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    path = config.getoption("--gate-report")
    if not path:
        return
    checks = list(_RESULTS)
    failed = [c for c in checks if c["status"] == "fail"]
    advised = worst([Action(c["action"]) for c in failed])
    report = {
        "node": config.getoption("--gate-node"),
        "tier": config.getoption("--gate-tier"),
        "verdict": verdict(checks, int(exitstatus)),
        "started_at": config._gate_started,  # type: ignore[attr-defined]
        "duration_s": round(time.time() - config._gate_started, 3),  # type: ignore[attr-defined]
        "counts": {s: sum(c["status"] == s for c in checks)
                   for s in ("pass", "fail", "skip", "error")},
        "failed": [c["id"] for c in failed],
        "excluded": config.getoption("--gate-exclude"),
        "action": advised.value if advised else None,
        "checks": checks,
    }
    Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n")
