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

from tests.conftest import ROOT, render_role_template

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


# The web client settings prometheus.yml reads: role monitoring's public defaults.
WEB = {k: v for k, v in yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml")
                                       .read_text()).items()
       if k in ("monitoring_tls_cert", "monitoring_web_user", "monitoring_web_password_file")}


def test_burst_nodes_node_and_dcgm_exporters_are_discovered_through_slurm(tmp_path: Path) -> None:
    """Role monitoring's prometheus.yml: the node
    and dcgm jobs each also ask the scheduler exporter for Slurm's cloud nodes, on their own
    exporter's port, and promtool accepts the file."""
    text = render_role_template(
        "monitoring", "prometheus.yml.j2", monitoring_scrape_interval="15s",
        monitoring_config_dir="/etc/gpupool/monitoring", monitoring_address="10.0.0.1",
        monitoring_alertmanager_port=9093, monitoring_prometheus_port=9090,
        monitoring_slurm_exporter_port=9815, monitoring_node_exporter_port=9100,
        monitoring_dcgm_exporter_port=9400, **WEB)
    jobs = {j["job_name"]: j for j in yaml.safe_load(text)["scrape_configs"]}
    assert {name: [c["url"] for c in job.get("http_sd_configs", [])]
            for name, job in jobs.items()} == {
        "prometheus": [], "gpupool-slurm": [],
        "node": ["http://10.0.0.1:9815/sd/cloud-nodes?port=9100"],
        "dcgm": ["http://10.0.0.1:9815/sd/cloud-nodes?port=9400"]}
    (tmp_path / "prometheus.yml").write_text(text)
    proc = _promtool("check", "config", "--syntax-only", str(tmp_path / "prometheus.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
