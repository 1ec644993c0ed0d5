"""Prometheus rules pass promtool's unit tests; the dashboard only uses valid PromQL over
metrics that the rules record or the exporters provide."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

MON = ROOT / "monitoring"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: run "
                                "scripts/bootstrap.sh (Debian package prometheus)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL or "promtool", *args], capture_output=True, text=True,
                          timeout=120, check=False)


# The raw series a query can read: gpupool's own, DCGM's fields, node_exporter's.
RAW_SERIES = re.compile(r"\b(gpupool_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+|node_[a-z0-9_]+)\b")


def series_read() -> set[str]:
    """Every raw series the rules and the dashboard read (recorded ones excluded): what a
    Prometheus must have scraped for no panel and no alert to stay empty."""
    rules = yaml.safe_load((MON / "rules" / "gpupool.rules.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dash = json.loads((MON / "dashboards" / "gpupool-pool.json").read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    return {name for e in exprs for name in RAW_SERIES.findall(e)}


def test_rules_are_valid() -> None:
    proc = _promtool("check", "rules", str(MON / "rules" / "gpupool.rules.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rules_unit_tests_pass() -> None:
    proc = _promtool("test", "rules", str(MON / "tests" / "gpupool.rules.test.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_tested_and_links_a_runbook() -> None:
    rules = yaml.safe_load((MON / "rules" / "gpupool.rules.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    tests = (MON / "tests" / "gpupool.rules.test.yml").read_text()
    for alert in alerts:
        assert f"alertname: {alert['alert']}" in tests, alert["alert"]
        assert alert["annotations"]["runbook"].startswith("runbooks/")


def test_dashboard_queries_parse_and_use_known_series(tmp_path: Path) -> None:
    dash = json.loads((MON / "dashboards" / "gpupool-pool.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    # promtool parses PromQL when it checks rules: wrap each query as a recording rule.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:panel{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = _promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recorded = {r["record"] for g in yaml.safe_load(
        (MON / "rules" / "gpupool.rules.yml").read_text())["groups"]
        for r in g["rules"] if "record" in r}
    for expr in exprs:
        for name in re.findall(r"gpupool:[a-z0-9_:]+", expr):
            assert name in recorded, f"{name} is not recorded by the rules"
