"""Monitoring on the lab's real Slurm (roles slurm_exporter and monitoring, played by
slurm.yml): the scheduler exporter runs as its own unprivileged user and what it serves
agrees with Slurm's own view while jobs of two teams and three classes run, wait and
finish and a node is drained; Prometheus (Debian's package) scrapes it with the project's
rules loaded and agrees too; a drained node's alert reaches a webhook receiver through
Alertmanager and resolves when the node is back; every GPU node's (FIXTURE) dcgm-exporter is
scraped and labels the GPUs a job holds with the job; a job of a class with idle-GPU reclaim
is warned and cancelled from that evidence, and one of a class without is not; by the end,
every series the rules and the dashboard read has been scraped. What is
asserted is agreement and
delivery, never a duration (the delivery time is a figure: bench/monitoring_lab.py)."""

from __future__ import annotations

import json
import re
import secrets
import shlex
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import bench
import bench.monitoring_lab
from gpupool.lab import hosts, slurm_cluster
from gpupool.onhost import slurm_exporter
from gpupool.render import slurm
from gpupool.spec.facts import controller
from gpupool.spec.model import Description, Role
from tests.integration.conftest import ansible_playbook
from tests.test_monitoring import series_read
from tests.test_pool_defaults import resolve

pytestmark = pytest.mark.integration
wait_for = slurm_cluster.wait_for
SERVICE = "gpupool-slurm-exporter"
PORT = 9815
PROMETHEUS, ALERTMANAGER = 9090, 9093


@pytest.fixture(scope="module")
def pool(site: Any, lab_desc: Description) -> slurm_cluster.SlurmLab:
    """The session's lab, every role converged (fixture `site`, which plays slurm.yml)."""
    s = slurm_cluster.ready(lab_desc)
    s.cancel_all()
    return s


def promql(s: slurm_cluster.SlurmLab, query: str) -> list[dict[str, Any]]:
    """Prometheus' answer to an instant query: its result vector."""
    answer = json.loads(s.http_get(PROMETHEUS, "/api/v1/query?query="
                                   + urllib.parse.quote(query, safe=""), monitoring=True))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def scrape(s: slurm_cluster.SlurmLab) -> list[tuple[str, dict[str, str], float]]:
    """One scrape, from the controller, at the address the role serves on."""
    text = s.http_get(PORT, "/metrics")
    return [(x.name, dict(x.labels), x.value) for f in text_string_to_metric_families(text)
            for x in f.samples]


def series(got: list[tuple[str, dict[str, str], float]], name: str
           ) -> list[tuple[dict[str, str], float]]:
    return [(labels, v) for n, labels, v in got if n == name]


# Root's snapshot the exporter serves from (PrivateData=jobs): role slurm_exporter's vars.
SNAPSHOT = (yaml.safe_load((Path(__file__).resolve().parents[2] / "roles/slurm_exporter/vars/"
                            "Debian.yml").read_text())["slurm_exporter_snapshot_dir"]
            + "/" + slurm_exporter.SNAPSHOT_NAME)


def caught_up(s: slurm_cluster.SlurmLab) -> None:
    """Return once the exporter serves what Slurm says now: it answers from root's
    snapshot, up to one timer interval old, and reuses its last collection for
    MIN_INTERVAL_S. So: a snapshot taken after now, then that reuse past."""
    now = float(s.sh("date +%s.%N"))
    wait_for("a snapshot taken after now", lambda: float(
        json.loads(s.sh(f"cat {SNAPSHOT}"))["taken"]) > now, 60)
    time.sleep(slurm_exporter.MIN_INTERVAL_S + 1)


def finished_counts(s: slurm_cluster.SlurmLab) -> Counter[tuple[str, ...]]:
    return Counter({(x["team"], x["class"], x["state"]): int(v)
                    for x, v in series(scrape(s), "gpupool_jobs_finished_total")})


def test_runs_as_its_own_user_and_slurm_answers_it(pool: slurm_cluster.SlurmLab) -> None:
    assert pool.sh(f"systemctl is-active {SERVICE}").strip() == "active"
    user = pool.sh(f"systemctl show -p User --value {SERVICE}").strip()
    assert user == "gpupool-exporter"
    assert user in pool.sh("ps -o user= -C python3").split()
    assert ("gpupool_slurm_up", {}, 1.0) in scrape(pool)


def test_what_it_serves_agrees_with_slurm(pool: slurm_cluster.SlurmLab) -> None:
    desc = pool.desc
    teams = list(desc.teams)
    classes = list(desc.task_classes)
    per_node = max(n.gpus for n in slurm.nodes(desc) if not n.cloud)
    script = "#!/bin/bash\nsleep ${WORK:-60}\n"
    # Two whole nodes of deferred work for one team; one GPU each of training and
    # interactive work for the other, beside free GPUs (so nothing is preempted).
    running = [pool.sbatch(f"-p {classes[-1]}", f"-A {teams[0]}", f"--gpus={per_node}",
                           "-C onprem", script=script, env={"WORK": "600"}) for _ in range(2)]
    running += [pool.sbatch(f"-p {cls}", f"-A {teams[1]}", "--gpus=1", "-C onprem",
                            script=script, env={"WORK": "600"}) for cls in classes[:2]]
    wait_for("four jobs running", lambda: all(
        pool.state(j) == "RUNNING" for j in running), 60)
    # More than the pool holds: deferred work (which preempts nothing) waits, with a reason.
    waiting = [pool.sbatch(f"-p {classes[-1]}", f"-A {teams[1]}", f"--gpus={per_node}",
                           "-C onprem", script=script) for _ in range(2)]
    wait_for("the queue evaluated", lambda: all(
        pool.job(j)["Reason"] != "None" for j in waiting), 30)
    onprem = [n.name for n in slurm.nodes(desc) if not n.cloud]
    drained = onprem[-1]
    caught_up(pool)  # jobs that finished before this test are in `before`, not in what it adds
    before = finished_counts(pool)
    pool.sh(f"scontrol update nodename={drained} state=drain reason=monitoring-proof")
    try:
        want_gpus = {j: int(next(p for p in pool.job(j)["TRES"].split(",")
                                 if p.startswith("gres/gpu=")).split("=")[1])
                     for j in running}

        def agrees() -> list[tuple[str, dict[str, str], float]] | None:
            got = scrape(pool)
            held: dict[str, int] = {}
            for labels, _ in series(got, "gpupool_job_gpu_allocated"):
                held[labels["job_id"]] = held.get(labels["job_id"], 0) + 1
            pending = sum(v for _, v in series(got, "gpupool_jobs_pending"))
            squeue_pending = len(pool.sh("squeue -h -t PD -o %i").split())
            node = {x["node"]: x["state"] for x, _ in series(got, "gpupool_node_state")}
            # The exporter serves root's snapshot (PrivateData=jobs), up to one interval
            # old: a waiting job's reason may still be the one Slurm gave it before its
            # last evaluation, so the reasons are waited for too, not asserted after.
            reasons = {x["reason"] for x, _ in series(got, "gpupool_jobs_pending")}
            ok = (held == want_gpus and pending == squeue_pending
                  and node.get(drained) in ("drained", "draining")
                  and reasons <= {pool.job(j)["Reason"] for j in waiting})
            return got if ok else None

        got = wait_for("the exporter agreeing with Slurm", agrees, 30)
        # Prometheus sees the same within a few scrape intervals.
        total = sum(want_gpus.values())
        wait_for("Prometheus agreeing with Slurm", lambda: [
            r for r in promql(pool, 'sum(gpupool_node_gpus{state="allocated"})')
            if float(r["value"][1]) == total], 90)
        allocated = {(x["job_id"], x["team"], x["class"]) for x, _ in
                     series(got, "gpupool_job_gpu_allocated")}
        assert allocated == {(j, pool.job(j)["Account"], pool.job(j)["Partition"])
                             for j in running}
        gpus = [(x["state"], v) for x, v in series(got, "gpupool_node_gpus")
                if x["node"] in onprem]
        allocated_n = sum(v for state, v in gpus if state == "allocated")
        assert allocated_n == sum(want_gpus.values())
        assert sum(v for _, v in gpus) == sum(n.gpus for n in slurm.nodes(desc) if not n.cloud)
    finally:
        pool.cancel_all()
        pool.sh(f"scontrol update nodename={drained} state=resume")

    # Every job ended (cancelled): each run counted once, by team, class and state.
    ours = [*running, *waiting]
    runs = pool.sh(f"sacct -n -X -D -P -o Account,Partition,State -j {','.join(ours)}")
    want: Counter[tuple[str, ...]] = Counter()
    for line in runs.splitlines():
        team, klass, state = line.split("|")
        want[(team, klass, state.split()[0])] += 1

    def counted() -> Counter[tuple[str, ...]] | None:
        added = finished_counts(pool) - before
        return added if sum(added.values()) >= sum(want.values()) else None

    assert wait_for("the finished jobs counted", counted, 90) == want


def test_prometheus_scrapes_the_pool_with_the_rules_loaded(pool: slurm_cluster.SlurmLab
                                                          ) -> None:
    up = wait_for("the scheduler exporter scraped", lambda: [
        r for r in promql(pool, 'up{job="gpupool-slurm"}') if r["value"][1] == "1"], 120)
    assert len(up) == 1
    wait_for("every node_exporter scraped", lambda: len([
        r for r in promql(pool, 'up{job="node"}') if r["value"][1] == "1"]) == len(
        pool.desc.nodes), 120)
    rules = json.loads(pool.http_get(PROMETHEUS, "/api/v1/rules", monitoring=True))
    groups = {g["name"] for g in rules["data"]["groups"]}
    assert {"gpupool.recording", "gpupool.alerts"} <= groups
    names = set(json.loads(pool.http_get(PROMETHEUS, "/api/v1/label/__name__/values",
                                         monitoring=True))["data"])
    assert {"gpupool_slurm_up", "gpupool_node_state", "gpupool_node_gpus"} <= names
    pool.http_get(ALERTMANAGER, "/-/ready", monitoring=True)  # not 200: raises


# What a client gets from a URL: the HTTP status, or the reason it got none.
STATUS = """import base64, ssl, sys, urllib.error, urllib.request
url, ca, user, password = sys.argv[1:5]
request = urllib.request.Request(url)
if user:
    secret = base64.b64encode((user + ":" + password).encode()).decode()
    request.add_header("Authorization", "Basic " + secret)
try:
    context = ssl.create_default_context(cafile=ca) if ca else None
    print(urllib.request.urlopen(request, timeout=20, context=context).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception as e:
    print(type(e).__name__)
"""


def test_monitoring_requires_tls_and_basic_auth(pool: slurm_cluster.SlurmLab) -> None:
    """Prometheus and Alertmanager answer only over TLS and only to their user with its
    password (role monitoring's web configuration). A researcher logged in on the
    controller (the lab's controller is a login host) cannot read the password or the key,
    gets 401 without the password or with a wrong one, and nothing over plain http; the
    role's own clients (Prometheus' scrape of itself, its Alertmanager, idle reclaim,
    on-call's http_get) get in."""
    web = slurm_cluster.monitoring_web()
    researcher = next(u for t in pool.desc.teams.values()
                      for u in t.members.get(Role.RESEARCHER, []))
    address = pool.desc.nodes[pool.ctl].addresses["management"]
    cert, user = web["monitoring_tls_cert"], web["monitoring_web_user"]
    for secret in (web["monitoring_web_password_file"], web["monitoring_tls_key"]):
        assert pool.sh(f"stat -c '%a %U %G' {secret}").split() == [
            "640", "root", MONITORING["monitoring_user"]]
        assert pool.sh(f"runuser -u {researcher} -- cat {secret} >/dev/null 2>&1"
                       " && echo read || echo refused").strip() == "refused"

    def status(port: int, path: str, *, scheme: str = "https", password: str = "") -> str:
        args = [f"{scheme}://{address}:{port}{path}", cert if scheme == "https" else "",
                user if password else "", password]
        return pool.sh(f"runuser -u {researcher} -- python3 -c {shlex.quote(STATUS)} "
                       + " ".join(shlex.quote(a) for a in args)).strip()

    for port, path in ((PROMETHEUS, "/api/v1/query?query=up"),
                       (ALERTMANAGER, "/api/v2/silences")):
        assert status(port, path) == "401", (port, "no password")
        assert status(port, path, password=secrets.token_hex(8)) == "401", (port, "wrong")
        assert status(port, path, scheme="http") != "200", (port, "plain http")
        assert isinstance(json.loads(pool.http_get(port, path, monitoring=True)), dict | list)
    # Prometheus logs in to itself and to its Alertmanager.
    assert wait_for("Prometheus scraping itself over TLS", lambda: [
        r for r in promql(pool, 'up{job="prometheus"}') if r["value"][1] == "1"], 120)
    alertmanagers = json.loads(pool.http_get(PROMETHEUS, "/api/v1/alertmanagers",
                                             monitoring=True))["data"]["activeAlertmanagers"]
    assert [a["url"].split("://")[0] for a in alertmanagers] == ["https"]


# A webhook receiver on the controller: every POST body one line in a file.
SINK_PORT = 9099
SINK_LOG = "/run/gpupool-test-webhook.jsonl"
SINK_SCRIPT = "/run/gpupool-test-webhook.py"
SINK = f"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers['Content-Length']))
        with open({SINK_LOG!r}, 'ab') as f:
            f.write(body.replace(b'\\n', b' ') + b'\\n')
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(('127.0.0.1', {SINK_PORT}), H).serve_forever()
"""
ALERT_FOR = "30s"


def monitoring_role(s: slurm_cluster.SlurmLab, extra: dict[str, Any] | None = None,
                    tag: str = "monitoring") -> None:
    """The monitoring role (or another of slurm.yml's controller roles, by its tag) on the
    controller again, with extra variables (or none)."""
    args = ["--tags", tag, "--limit", controller(s.desc)]
    if extra:
        args += ["-e", json.dumps(extra)]
    run = ansible_playbook(hosts.inventory_path(s.desc), "playbooks/slurm.yml", *args,
                           timeout=600)
    assert run.rc == 0, run.output[-4000:]


def answer(s: slurm_cluster.SlurmLab, port: int, path: str) -> Any:
    """A monitoring server's JSON answer, or None while the service restarts."""
    try:
        return json.loads(s.http_get(port, path, monitoring=True))
    except (slurm_cluster.SlurmLabError, ValueError):
        return None


def webhook_alerts(s: slurm_cluster.SlurmLab) -> list[dict[str, Any]]:
    text = s.sh(f"cat {SINK_LOG} 2>/dev/null || true")
    return [a for line in text.splitlines() if line.strip()
            for a in json.loads(line).get("alerts", [])]


def test_a_drained_node_alerts_the_webhook_and_resolves(pool: slurm_cluster.SlurmLab) -> None:
    """The role's Alertmanager route delivers NodeDrained to a webhook receiver (its `for:`
    shortened to the lab's pace through monitoring_alert_for), and the alert resolves in
    Alertmanager once the node is back. The role is played again as it was afterwards."""
    onprem = [n.name for n in slurm.nodes(pool.desc) if not n.cloud]
    node = onprem[0]
    # A file, not `python3 -c "..."`: a shell's double quotes keep \n as two characters.
    pool.write(SINK_SCRIPT, SINK)
    pool.sh(f"rm -f {SINK_LOG}; systemd-run --unit gpupool-test-webhook --collect "
            f"python3 {SINK_SCRIPT}")
    try:
        monitoring_role(pool, {"monitoring_webhook_warning":
                               f"http://127.0.0.1:{SINK_PORT}/alerts",
                               "monitoring_alert_for": {"NodeDrained": ALERT_FOR}})
        wait_for("Prometheus back with the shortened rule", lambda: any(
            r.get("name") == "NodeDrained" and r.get("duration") == 30
            for g in ((answer(pool, PROMETHEUS, "/api/v1/rules") or {}).get("data") or {}
                      ).get("groups", [])
            for r in g["rules"]), 90)
        t0 = time.monotonic()
        pool.sh(f"scontrol update nodename={node} state=drain reason=alert-proof")
        try:
            firing = wait_for("NodeDrained at the webhook", lambda: [
                a for a in webhook_alerts(pool) if a["labels"].get("alertname") == "NodeDrained"
                and a["labels"].get("node") == node and a["status"] == "firing"], 300)
            drain_to_webhook = round(time.monotonic() - t0, 1)
            assert firing[0]["labels"]["severity"] == "warning"
            assert firing[0]["annotations"]["runbook"] == "runbooks/node-failure.md"
            # The webhook's URL is the service's to read, not a researcher's who logs in
            # here (a chat or paging URL often carries its token).
            config = f"{MONITORING['monitoring_config_dir']}/alertmanager.yml"
            assert pool.sh(f"stat -c '%a %U %G' {config}").split() == [
                "640", "root", MONITORING["monitoring_user"]]
            researcher = next(u for t in pool.desc.teams.values()
                              for u in t.members.get(Role.RESEARCHER, []))
            assert pool.sh(f"runuser -u {researcher} -- cat {config} >/dev/null 2>&1"
                           " && echo read || echo refused").strip() == "refused"
        finally:
            pool.sh(f"scontrol update nodename={node} state=resume")
        t1 = time.monotonic()

        def resolved() -> bool:
            alerts = answer(pool, ALERTMANAGER, "/api/v2/alerts?active=true")
            return alerts is not None and not [
                a for a in alerts if a["labels"].get("alertname") == "NodeDrained"
                and a["labels"].get("node") == node]

        wait_for("NodeDrained resolved in Alertmanager", resolved, 300)
        bench.write("monitoring_lab", {
            "alert": "NodeDrained", "alert_for": ALERT_FOR, "scrape_interval": "15s",
            "group_wait": "30s", "drain_to_webhook_s": drain_to_webhook,
            "resume_to_resolved_s": round(time.monotonic() - t1, 1)},
            f"pytest -m integration {bench.monitoring_lab.TEST}")
    finally:
        pool.sh(f"systemctl stop gpupool-test-webhook; rm -f {SINK_SCRIPT}", check=False)
        monitoring_role(pool)


def test_gpu_series_carry_the_job_that_holds_them(pool: slurm_cluster.SlurmLab) -> None:
    """Per-job GPU attribution (issue 16): while a job holds GPUs on a lab GPU node, the
    Slurm prolog's job-map part (roles dcgm and slurm) has dcgm-exporter label exactly that
    many of the node's GPU series hpc_job="<job id>" in Prometheus; after the job ends the
    epilog removes it and no series carries it. Every GPU node's exporter is scraped (up 1).

    The lab's dcgm-exporter is a FIXTURE package (gpupool/lab/mirror.py): it serves each
    counter as 0 for character devices standing in for GPUs. What is proven is the wiring
    (package, unit, flags, prolog/epilog, job map, scrape, labels); nothing about GPU
    metrics is claimed."""
    desc = pool.desc
    gpu_nodes = [n for n in slurm.nodes(desc) if not n.cloud and n.gpus > 0]

    def all_up() -> bool:
        up = promql(pool, 'up{job="dcgm"}')
        return len(up) == len(gpu_nodes) and all(r["value"][1] == "1" for r in up)

    wait_for("every GPU node's dcgm-exporter scraped", all_up, 120)

    want = min(2, max(n.gpus for n in gpu_nodes))
    job = pool.sbatch(f"-p {next(iter(desc.task_classes))}", f"-A {next(iter(desc.teams))}",
                      f"--gpus={want}", "-C onprem", script="#!/bin/bash\nsleep 600\n")
    query = f'DCGM_FI_DEV_GPU_UTIL{{hpc_job="{job}"}}'
    node = None
    try:
        wait_for("the job running", lambda: pool.state(job) == "RUNNING", 60)
        node = pool.job(job)["NodeList"]
        held = int(next(p for p in pool.job(job)["TRES"].split(",")
                        if p.startswith("gres/gpu=")).split("=")[1])
        assert held == want

        def labelled() -> list[dict[str, Any]] | None:
            found = promql(pool, query)
            return found if len(found) == held else None

        series = wait_for("the job's GPUs labelled in Prometheus", labelled, 120)
        assert {r["metric"]["Hostname"] for r in series} == {node}
        assert len({r["metric"]["gpu"] for r in series}) == held
        assert all(r["metric"].get("fixture") == "1" for r in series)
    finally:
        pool.cancel_all()
    wait_for("the job's label gone from Prometheus", lambda: not promql(pool, query), 120)
    assert not pool.sh(f"grep -rlx {job} /run/gpupool/dcgm-job-map || true", node).strip()


def test_a_job_that_stops_checkpointing_alerts_until_it_checkpoints(
        pool: slurm_cluster.SlurmLab) -> None:
    """The checkpoint-age series (issue 16, role storage): a job whose newest checkpoint is
    three hours old is reported by the node running its batch script, with its team, and
    CheckpointStale fires for it in Prometheus; a fresh checkpoint brings the age down, and
    once the job ends its series is gone. The collector runs as its timer would
    (`systemctl start` of the same oneshot) so the test waits for a scrape, not a timer.

    The node also holds a step socket nothing answers, as a step killed outright leaves it
    behind: `scontrol listpids` then exits 1 though it lists every other step. CI's lab
    had three such sockets from earlier proofs (stop 48), and the collector, reading the
    exit status alone, served no job at all; it must measure the job and count the
    socket."""
    desc = pool.desc
    team, klass = next(iter(desc.teams)), next(iter(desc.task_classes))
    name = "ckpt-age"
    directory = f"/checkpoints/{team}/{name}"
    job = pool.sbatch(f"-p {klass}", f"-A {team}", f"-J {name}", "-C onprem", script=(
        "#!/bin/bash\n"
        'd="/checkpoints/$SLURM_JOB_ACCOUNT/$SLURM_JOB_NAME"\n'
        'rm -rf "$d" && mkdir -p "$d" && touch "$d/ckpt-00000001.json"\n'
        'touch -d "@$(( $(date +%s) - 3 * 3600 ))" "$d/ckpt-00000001.json" "$d"\n'
        "exec sleep 600\n"))
    query = f'gpupool_checkpoint_age_seconds{{job_id="{job}"}}'
    node, stray = None, None
    try:
        wait_for("the job running", lambda: pool.state(job) == "RUNNING", 60)
        node = pool.job(job)["BatchHost"]
        assert pool.sh("systemctl is-active gpupool-checkpoint-age.timer", node).strip() == "active"
        stray = stray_step_socket(pool, node)
        # RUNNING is the scheduler's word: the batch script may not have aged its
        # checkpoint yet, and a collector run before it would report a fresh one.
        wait_for("the job's checkpoint aged on its node", lambda: len(pool.sh(
            f"find {directory} {directory}/ckpt-00000001.json -maxdepth 0 -mmin +120",
            node, check=False).split()) == 2, 60)

        def measure() -> None:
            pool.sh("systemctl start gpupool-checkpoint-age.service", node)

        def scraped(stale: bool) -> list[dict[str, Any]] | None:
            found = promql(pool, query)
            return found if found and (float(found[0]["value"][1]) > 7200) == stale else None

        measure()
        old = explained("the stale checkpoint's age in Prometheus", lambda: scraped(True),
                        lambda: checkpoint_age_evidence(pool, node, directory))
        assert len(old) == 1
        assert old[0]["metric"]["team"] == team
        assert old[0]["metric"]["instance"].startswith(desc.nodes[node].addresses["management"])
        measured = pool.sh(f"cat {TEXTFILE}", node)
        assert "gpupool_checkpoint_age_up 1.0" in measured
        unanswered = re.search(r"^gpupool_checkpoint_age_unanswered_steps (\S+)$", measured, re.M)
        assert unanswered and float(unanswered[1]) >= 1, measured
        alert = f'ALERTS{{alertname="CheckpointStale",job_id="{job}",alertstate="firing"}}'
        wait_for("CheckpointStale firing for the job", lambda: promql(pool, alert) or None, 120)

        pool.sh(f"touch {directory}/ckpt-00000002.json", node)
        measure()
        explained("the fresh checkpoint's age in Prometheus", lambda: scraped(False),
                  lambda: checkpoint_age_evidence(pool, node, directory))
        wait_for("CheckpointStale resolved", lambda: not promql(pool, alert), 120)
    finally:
        pool.cancel_all()
        if node is not None:
            pool.sh(f"rm -rf {directory} {stray or ''}", node, check=False)
    assert node is not None

    pool.sh("systemctl start gpupool-checkpoint-age.service", node)
    wait_for("the ended job's series gone from Prometheus", lambda: not promql(pool, query), 120)


T = TypeVar("T")


def explained(what: str, probe: Callable[[], T | None], evidence: Callable[[], str],
              timeout: float = 120) -> T:
    """wait_for, and when the wait is in vain, the evidence that says where the chain
    broke, in the failure's message."""
    try:
        return wait_for(what, probe, timeout)
    except hosts.LabError as exc:
        raise hosts.LabError(f"{exc}\n{evidence()}") from None


# The monitoring role's paths and service user on Debian.
MONITORING = yaml.safe_load((Path(__file__).resolve().parents[2]
                             / "roles/monitoring/vars/Debian.yml").read_text())
# Where role storage has the collector write: its public default as Ansible resolves it
# (through role pool_defaults, the textfile directory's one owner), not a second copy.
TEXTFILE = (str(resolve("storage", "storage_checkpoint_age_textfile_dir"))
            + "/gpupool_checkpoint_age.prom")
STRAY_JOB = 999_999_999  # a job id the lab never reaches


def stray_step_socket(pool: slurm_cluster.SlurmLab, node: str) -> str:
    """A step socket in the node's slurmd spool directory that nothing listens on (bound,
    then its process gone: connecting to it is refused, as to a killed slurmstepd's), named
    as slurmd names its steps' sockets. Slurm removes a refused socket only when it is ten
    minutes old, so this one stays for the test."""
    spool = pool.sh("scontrol show config | awk '$1 == \"SlurmdSpoolDir\" {print $3}'",
                    node).strip()
    assert re.fullmatch(r"(/[A-Za-z0-9_.-]+)+", spool), spool
    path = f"{spool}/{node}_{STRAY_JOB}.0"
    pool.sh(f"python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "
            f"{path} && test -S {path}", node)
    return path


def checkpoint_age_evidence(pool: slurm_cluster.SlurmLab, node: str, directory: str) -> str:
    """Each link from the job's directory to Prometheus: the directory's times, what slurmd
    lists, the collector's last runs and file, and the node's scrape."""
    on_node = [f"ls -la --time-style=+%s {directory}; date +%s", "scontrol listpids",
               "journalctl -u gpupool-checkpoint-age.service -n 12 --no-pager -o short-monotonic",
               "systemctl list-timers gpupool-checkpoint-age.timer --no-pager",
               f"cat {TEXTFILE}"]
    lines = [f"## {node}: {cmd}\n{pool.sh(cmd + ' 2>&1', node, check=False)}" for cmd in on_node]
    address = pool.desc.nodes[node].addresses["management"]
    for query in (f'up{{instance=~"{address}:.*"}}',
                  f'node_textfile_scrape_error{{instance=~"{address}:.*"}}'):
        lines.append(f"## prometheus: {query}\n{json.dumps(promql(pool, query))}")
    return "\n".join(lines)


def test_an_idle_job_is_warned_then_cancelled_and_recorded(pool: slurm_cluster.SlurmLab
                                                           ) -> None:
    """Idle-GPU reclaim (issue 16, role idle_reclaim): a running job of a class that
    declares idle_reclaim, whose GPUs report idle in Prometheus for the class's window, is
    warned in its AdminComment, then cancelled after the warning, each step recorded
    (accounting, journal, gpupool_idle_reclaim_total, and the idle GPU-hours the cancel
    ended in gpupool_idle_reclaim_gpu_hours_total); an equally idle job of a class
    without the rule runs on, and so does a BUSY job of the ruled class, beside it all
    along, which is never warned.

    The lab's interactive class reclaims after 30 minutes; the role runs here with a
    60 s window and a 30 s warning in its policy (the variable the description fills), and
    the test starts the service itself instead of waiting for the timer, which is stopped
    meanwhile and put back after. The FIXTURE dcgm-exporter reports, for a GPU mapped to a
    job, the CPU activity of the job's processes (gpupool/lab/fixture_dcgm_exporter.py),
    not GPU data: the busy job's script burns CPU (bounded by its loop and its time limit)
    and its GPU reads above 0 in Prometheus, the idle one's (sleep) reads 0. What is
    proven is that reclaim tells the two apart from that evidence, and the wiring from
    Prometheus and squeue to Slurm's actions; nothing about GPU behaviour."""
    desc = pool.desc
    team = next(iter(desc.teams))
    ruled = next(n for n, c in desc.task_classes.items() if c.idle_reclaim)
    other = next(n for n, c in desc.task_classes.items() if not c.idle_reclaim)
    policy = {ruled: {"after_s": 60, "warn_s": 30, "action": "cancel",
                      "threshold_percent": 0}}
    service = "gpupool-idle-reclaim"
    monitoring_role(pool, {"idle_reclaim_policy": policy}, tag="idle_reclaim")
    pool.sh(f"systemctl stop {service}.timer")
    script = "#!/bin/bash\nsleep 600\n"
    idle = pool.sbatch(f"-p {ruled}", f"-A {team}", "--gpus=1", "-C onprem", script=script)
    spared = pool.sbatch(f"-p {other}", f"-A {team}", "--gpus=1", "-C onprem", script=script)
    # About a fifth of a CPU, in bursts, for at most 10 minutes (and its time limit).
    burn = ("#!/bin/bash\nend=$((SECONDS + 600))\n"
            "while (( SECONDS < end )); do\n"
            "  for ((i = 0; i < 20000; i++)); do :; done\n  sleep 1\ndone\n")
    busy = pool.sbatch(f"-p {ruled}", f"-A {team}", "--gpus=1", "-C onprem", "--time=10",
                       script=burn)
    try:
        wait_for("the three jobs running", lambda: {
            pool.state(idle), pool.state(spared), pool.state(busy)} == {"RUNNING"}, 120)

        def peak(job: str) -> float | None:
            found = promql(pool, f'max_over_time(DCGM_FI_DEV_GPU_UTIL{{hpc_job="{job}"}}[5m])')
            return float(found[0]["value"][1]) if found else None

        wait_for("the busy job's GPU reported in use", lambda: (peak(busy) or 0) > 0, 120)

        def comment(job: str) -> str:
            # Raw: the comment holds spaces, which pool.job's parsing splits on.
            out = pool.sh(f"scontrol -o show job {job}")
            return out.split("AdminComment=", 1)[1] if "AdminComment=" in out else ""

        def judged(step: str) -> bool:
            pool.sh(f"systemctl start {service}.service")  # a oneshot: returns when done
            if comment(idle).startswith(f"gpupool idle-reclaim {step}"):
                return True
            time.sleep(5)  # a few scrapes between two judgements, as the timer would
            return False

        wait_for("the idle job warned", lambda: judged("warned"), 240)
        assert pool.state(idle) == "RUNNING"
        wait_for("the idle job cancelled", lambda: judged("cancelled")
                 and pool.state(idle) == "CANCELLED", 180)
        assert pool.state(spared) == "RUNNING"
        assert not comment(spared).startswith("gpupool")
        # Judged in every pass that warned and cancelled the idle one, never warned.
        assert pool.state(busy) == "RUNNING"
        assert not comment(busy).startswith("gpupool")
        assert (peak(busy) or 0) > 0
        (record,) = pool.sacct(idle, "State,AdminComment")
        assert record["State"].startswith("CANCELLED")
        assert "gpupool idle-reclaim cancelled" in record["AdminComment"]
        journal = pool.sh(f"journalctl -u {service} --no-pager -o cat")
        assert f"job {idle} (class {ruled}, team {team}): warned" in journal
        assert f"job {idle} (class {ruled}, team {team}): cancelled" in journal
        assert f"job {busy} " not in journal
        assert "1 GPU(s) idle" in journal
        prom = pool.sh("cat /var/lib/prometheus/node-exporter/gpupool_idle_reclaim.prom")
        assert (f'gpupool_idle_reclaim_total{{class="{ruled}",step="cancelled",'
                f'team="{team}"}}') in prom
        # One GPU idle at least the 60 s window before the warning and 30 s after it.
        key = (f'gpupool_idle_reclaim_gpu_hours_total{{class="{ruled}",step="cancelled",'
               f'team="{team}"}}')
        hours = [float(line.split()[-1]) for line in prom.splitlines()
                 if line.startswith(key + " ")]
        assert len(hours) == 1 and hours[0] >= 90 / 3600, prom
    finally:
        pool.cancel_all()
        monitoring_role(pool, tag="idle_reclaim")  # the description's policy, timer on


def test_every_series_the_rules_and_dashboard_read_was_scraped(pool: slurm_cluster.SlurmLab
                                                               ) -> None:
    """No panel and no alert reads a series nothing produces (issue 16): every raw series
    the rules and the dashboard read is in the lab Prometheus' store by the end of this
    module, whose tests made the conditional ones appear (pending and finished jobs, a
    batch job's checkpoint age). The health loop's series come from one run of a GPU
    node's health service, started here as its timer would, and the controller backup's
    from one run of its service. DCGM_FI_* come from the
    FIXTURE dcgm-exporter: they prove the counter list and the scrape, not GPU data."""
    wanted = series_read()
    assert {"gpupool_slurm_up", "DCGM_FI_DEV_GPU_UTIL"} <= wanted
    node = next(n.name for n in slurm.nodes(pool.desc) if not n.cloud and n.gpus > 0)
    pool.sh("systemctl start gpupool-health.service", node, timeout=600)
    # And the controller's backup, as its timer would (the lab keeps it on the host's disk).
    pool.sh("systemctl start gpupool-controller-backup.service", timeout=600)

    def missing() -> set[str]:
        names = json.loads(pool.http_get(PROMETHEUS, "/api/v1/label/__name__/values",
                                         monitoring=True))["data"]
        return wanted - set(names)

    try:
        wait_for("every series the rules and dashboard read", lambda: not missing(), 120)
    except hosts.LabError:
        pytest.fail(f"never scraped: {sorted(missing())}")
