"""Role monitoring's web configuration: the password and its hash made on the host
(gpupool/onhost/web_password.py under Debian's own python3 and python3-bcrypt, as on the
controller), web.yml accepted by promtool with a real certificate and hash, Prometheus'
own clients log in over TLS, and idle reclaim logs in to a loopback HTTPS server that
requires basic auth, refusing to send a password over plain http."""

from __future__ import annotations

import base64
import grp
import http.server
import json
import os
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpupool.onhost import idle_reclaim as ir
from tests.conftest import ROOT, render_role_template
from tests.test_idle_reclaim import _Prometheus

PROGRAM = ROOT / "gpupool" / "onhost" / "web_password.py"
SYSTEM_PYTHON = "/usr/bin/python3"
DEFAULTS = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
GROUP = grp.getgrgid(os.getgid()).gr_name


def _has_bcrypt() -> bool:
    return Path(SYSTEM_PYTHON).exists() and subprocess.run(
        [SYSTEM_PYTHON, "-c", "import bcrypt"], capture_output=True, check=False,
        timeout=30).returncode == 0


needs_bcrypt = pytest.mark.skipif(not _has_bcrypt(), reason="Debian's python3-bcrypt "
                                  "missing: run scripts/bootstrap.sh")


def web_password(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SYSTEM_PYTHON, str(PROGRAM), str(tmp / "password"),
                           str(tmp / "password.bcrypt"), *extra], capture_output=True,
                          text=True, timeout=60, check=False)


def bcrypt_ok(password: bytes, hashed: bytes) -> bool:
    code = "import bcrypt, sys; sys.exit(0 if bcrypt.checkpw(sys.argv[1].encode(), " \
           "sys.argv[2].encode()) else 1)"
    return subprocess.run([SYSTEM_PYTHON, "-c", code, password.decode(), hashed.decode()],
                          check=False, timeout=60).returncode == 0


@needs_bcrypt
def test_the_password_is_made_once_and_its_hash_follows_it(tmp_path: Path) -> None:
    first = web_password(tmp_path, GROUP, "--check")
    assert first.stdout.strip() == "changed" and not list(tmp_path.iterdir())
    assert web_password(tmp_path, GROUP).stdout.strip() == "changed"
    password = (tmp_path / "password").read_bytes().strip()
    hashed = (tmp_path / "password.bcrypt").read_bytes().strip()
    assert len(password) >= 40 and hashed.startswith(b"$2")
    assert bcrypt_ok(password, hashed)
    for name in ("password", "password.bcrypt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o640
    # Converged: nothing to do, in check mode or not.
    assert web_password(tmp_path, GROUP, "--check").stdout.strip() == "ok"
    assert web_password(tmp_path, GROUP).stdout.strip() == "ok"
    assert (tmp_path / "password.bcrypt").read_bytes().strip() == hashed
    # Rotated by deleting the password: a new one, and a hash that matches it.
    (tmp_path / "password").unlink()
    assert web_password(tmp_path, GROUP).stdout.strip() == "changed"
    assert (tmp_path / "password").read_bytes().strip() != password
    assert bcrypt_ok((tmp_path / "password").read_bytes().strip(),
                     (tmp_path / "password.bcrypt").read_bytes().strip())


@needs_bcrypt
def test_a_wrong_hash_or_a_planted_link_is_replaced_not_followed(tmp_path: Path) -> None:
    web_password(tmp_path, GROUP)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "password.bcrypt").unlink()
    (tmp_path / "password.bcrypt").symlink_to(victim)
    assert web_password(tmp_path, GROUP).stdout.strip() == "changed"
    assert victim.read_text() == "keep\n"
    assert not (tmp_path / "password.bcrypt").is_symlink()
    (tmp_path / "password.bcrypt").write_text("not a hash\n")
    assert web_password(tmp_path, GROUP).stdout.strip() == "changed"


@needs_bcrypt
def test_an_unknown_group_is_a_message(tmp_path: Path) -> None:
    proc = web_password(tmp_path, "no-such-group-gpupool")
    assert proc.returncode == 2 and "web_password:" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made as the role makes it."""
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "825", "-subj",
                    "/CN=gpupool-monitoring", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@needs_bcrypt
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: run "
                    "scripts/bootstrap.sh (Debian package prometheus)")
def test_promtool_accepts_the_web_configuration(tmp_path: Path,
                                                certificate: tuple[Path, Path]) -> None:
    web_password(tmp_path, GROUP)
    cert, key = certificate
    text = render_role_template(
        "monitoring", "web.yml.j2", monitoring_tls_cert=str(cert), monitoring_tls_key=str(key),
        monitoring_web_user=DEFAULTS["monitoring_web_user"],
        monitoring_web_user_hash=(tmp_path / "password.bcrypt").read_text().strip())
    config = yaml.safe_load(text)
    assert set(config["basic_auth_users"]) == {DEFAULTS["monitoring_web_user"]}
    (tmp_path / "web.yml").write_text(text)
    proc = subprocess.run(["promtool", "check", "web-config", str(tmp_path / "web.yml")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_prometheus_logs_in_to_itself_and_alertmanager_over_tls() -> None:
    text = render_role_template(
        "monitoring", "prometheus.yml.j2", **{k: v for k, v in DEFAULTS.items()
                                              if "{{" not in str(v)},
        monitoring_config_dir="/etc/prometheus", monitoring_address="10.0.0.1")
    config = yaml.safe_load(text)
    client = {"scheme": "https",
              "tls_config": {"ca_file": DEFAULTS["monitoring_tls_cert"]},
              "basic_auth": {"username": DEFAULTS["monitoring_web_user"],
                             "password_file": DEFAULTS["monitoring_web_password_file"]}}
    alertmanager = config["alerting"]["alertmanagers"][0]
    assert {k: alertmanager[k] for k in client} == client
    own = next(j for j in config["scrape_configs"] if j["job_name"] == "prometheus")
    assert {k: own[k] for k in client} == client


def test_idle_reclaim_logs_in_where_role_monitoring_says() -> None:
    """The idle_reclaim role's defaults name the monitoring role's user, password file and
    certificate, and an https URL."""
    ours = yaml.safe_load((ROOT / "roles/idle_reclaim/defaults/main.yml").read_text())
    assert ours["idle_reclaim_prometheus_url"].startswith("https://")
    assert [ours[f"idle_reclaim_prometheus_{k}"] for k in ("user", "password_file",
                                                           "ca_file")] == [
        DEFAULTS[k] for k in ("monitoring_web_user", "monitoring_web_password_file",
                              "monitoring_tls_cert")]


class _Guarded(_Prometheus):
    """FIXTURE Prometheus over TLS that requires one user's basic auth."""

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != self.server.expected:  # type: ignore[attr-defined]
            self.send_response(401)
            self.end_headers()
            return
        super().do_GET()


@pytest.fixture
def guarded(certificate: tuple[Path, Path], tmp_path: Path
            ) -> Iterator[tuple[str, Path]]:
    password = tmp_path / "password"
    password.write_text("s3cret-for-the-fixture\n")
    server = http.server.HTTPServer(("127.0.0.1", 0), _Guarded)
    server.expected = "Basic " + base64.b64encode(  # type: ignore[attr-defined]
        b"gpupool:s3cret-for-the-fixture").decode()
    server.answer = json.dumps({"status": "success", "data": {  # type: ignore[attr-defined]
        "resultType": "vector", "result": [{"metric": {"hpc_job": "41"}, "value": [1, "0"]}]}
    }).encode()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}", password
    server.shutdown()
    server.server_close()


def test_idle_reclaim_queries_over_tls_with_basic_auth(
        guarded: tuple[str, Path], certificate: tuple[Path, Path], tmp_path: Path) -> None:
    url, password = guarded
    cert = str(certificate[0])
    endpoint = ir.load_endpoint(url, {"user": "gpupool", "password_file": str(password),
                                      "ca_file": cert})
    assert ir.prometheus_query(endpoint)("up") == {"41": 0.0}
    wrong = tmp_path / "wrong"
    wrong.write_text("guess\n")
    for bad in (ir.Endpoint(url, "gpupool", str(wrong), cert),  # 401
                ir.Endpoint(url, ca_file=cert),  # no password
                ir.Endpoint(url, "gpupool", str(password))):  # the system's CAs only
        with pytest.raises(ir.Unavailable):
            ir.prometheus_query(bad)("up")
    with pytest.raises(ir.Unavailable, match="password"):
        ir.prometheus_query(ir.Endpoint(url, "gpupool", str(tmp_path / "absent"), cert))


@pytest.mark.parametrize("auth", [
    {"user": "gpupool", "password_file": "/p"},  # over http: the password in clear
    {"user": "gpupool"}, {"password_file": "/p"}, {"user": "x y", "password_file": "/p"},
    {"user": "gpupool", "password_file": "relative"}, {"ca_file": "/a\n"}, {"other": 1}, [],
])
def test_a_malformed_login_is_refused(auth: object) -> None:
    with pytest.raises(ValueError):
        ir.load_endpoint("http://10.0.0.1:9090", auth)
