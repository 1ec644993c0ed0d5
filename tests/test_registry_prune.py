"""The registry host's garbage collection (issue 54, gpupool/onhost/registry_prune.py)
against a FIXTURE registry: a small Registry HTTP API v2 in a thread on 127.0.0.1, served
over TLS with a throwaway self-signed certificate (made here with `cryptography`) that the
program trusts as the pool's CA, with basic auth, a paginated catalog and tag lists, HEAD
and DELETE of manifests. It checks that undeclared tags go and declared ones stay, that a
manifest a declared tag shares stays, that other pools' repositories are not touched, that
pages are followed, that errors (401, 500, no answer) become messages and exit 1, that
hostile names from the registry never leave /v2/, that a malformed declared file is
refused (exit 2), that a dry run deletes nothing, and that --collect starts the writable
instance again even when the collection fails (FIXTURE systemctl and docker-registry on
PATH; the real ones run on the registry's host)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import posixpath
import ssl
import stat
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpupool.onhost import registry_prune

POOL = "lab"
PASSWORD = "0123456789abcdef"  # noqa: S105 - the FIXTURE's push account
PAGE = 2  # the FIXTURE answers at most this many per page, whatever `n` asks


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Store:
    """The FIXTURE registry's state and what it was asked."""

    repos: dict[str, dict[str, str]] = field(default_factory=dict)  # repo -> tag -> digest
    catalog: list[str] | None = None  # names the catalog lists, where not repos' keys
    tags: dict[str, list[str]] = field(default_factory=dict)  # tag lists given as they are
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)  # path prefix -> HTTP status
    hang: str | None = None  # a path prefix never answered
    release: threading.Event = field(default_factory=threading.Event)


class Handler(BaseHTTPRequestHandler):
    store: Store  # set on the subclass each FIXTURE server makes

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: object = None, headers: dict[str, str] | None = None,
              ) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _page(self, items: list[str], query: dict[str, list[str]], path: str, key: str,
              ) -> None:
        items = sorted(items, key=str)  # a hostile catalog may list a number
        last = query.get("last", [None])[0]
        start = 0 if last is None else next(
            (i for i, item in enumerate(items) if str(item) > last), len(items))
        size = min(int(query.get("n", ["100"])[0]), PAGE)
        page = items[start:start + size]
        headers = {}
        if start + size < len(items):
            next_query = urllib.parse.urlencode({"n": size, "last": page[-1]})
            headers["Link"] = f'<{path}?{next_query}>; rel="next"'
        self._send(200, {key: page}, headers)

    def _refused(self, path: str) -> bool:
        """Answered already: a path that hangs or fails, or a request without the
        credential."""
        store = self.store
        if store.hang and path.startswith(store.hang):
            store.release.wait(30)
            return True
        status = next((s for prefix, s in store.fail.items() if path.startswith(prefix)), 0)
        expected = "Basic " + base64.b64encode(f"push:{PASSWORD}".encode()).decode()
        if not status and self.headers.get("Authorization") != expected:
            status = 401
        if status:
            self._send(status, {"errors": [{"code": "FIXTURE"}]})
        return bool(status)

    def _manifest(self, repo: str, ref: str) -> None:
        tags = self.store.repos.get(repo, {})
        if self.command == "HEAD" and ref in tags:
            self._send(200, None, {"Docker-Content-Digest": tags[ref]})
        elif self.command == "DELETE" and ref in tags.values():
            self.store.repos[repo] = {t: d for t, d in tags.items() if d != ref}
            self._send(202)
        else:
            self._send(404, {"errors": [{"code": "MANIFEST_UNKNOWN"}]})

    def _handle(self) -> None:
        store = self.store
        store.requests.append((self.command, self.path, dict(self.headers)))
        url = urllib.parse.urlsplit(self.path)
        path, query = urllib.parse.unquote(url.path), urllib.parse.parse_qs(url.query)
        if self._refused(path):
            return
        rest = path.removeprefix("/v2/")
        tags_repo, tags_sep, tags_end = rest.rpartition("/tags/")
        manifest_repo, manifest_sep, ref = rest.rpartition("/manifests/")
        if path == "/v2/_catalog" and self.command == "GET":
            names = store.catalog if store.catalog is not None else list(store.repos)
            self._page(names, query, "/v2/_catalog", "repositories")
        elif tags_sep and tags_end == "list" and tags_repo in store.tags:
            self._send(200, {"name": tags_repo, "tags": store.tags[tags_repo]})
        elif tags_sep and tags_end == "list":
            self._page(list(store.repos.get(tags_repo, {})), query, url.path, "tags")
        elif manifest_sep:
            self._manifest(manifest_repo, ref)
        else:
            self._send(404, {"errors": [{"code": "NAME_UNKNOWN"}]})

    do_GET = do_HEAD = do_DELETE = _handle


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A throwaway self-signed certificate for 127.0.0.1 (the FIXTURE's CA and its
    server's certificate at once) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpupool FIXTURE registry")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "ca.crt", directory / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def store() -> Store:
    return Store(repos={
        f"{POOL}/pytorch": {"1.4.0": _digest("a"), "1.3.0": _digest("b"),
                            "1.2.0": _digest("c"), "latest": _digest("a")},
        f"{POOL}/jax": {"0.4.0": _digest("d"), "0.3.0": _digest("e")},
        f"{POOL}/old": {"1.0.0": _digest("f")},
        "other/pytorch": {"1.0.0": _digest("g")},
    })


@pytest.fixture
def registry(store: Store, tls: tuple[Path, Path]) -> Iterator[str]:
    """The FIXTURE registry, serving TLS on a free loopback port: its endpoint."""
    handler = type("StoreHandler", (Handler,), {"store": store})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.block_on_close = False
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*tls)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    store.release.set()
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def declared(tmp_path: Path, registry: str, tls: tuple[Path, Path]) -> dict[str, Any]:
    (tmp_path / "push.password").write_text(PASSWORD + "\n")
    return {"endpoint": registry, "ca_file": str(tls[0]), "user": "push",
            "password_file": str(tmp_path / "push.password"),
            "config_file": "/etc/gpupool/registry/push.yml", "pool": POOL,
            "keep": [f"{POOL}/pytorch:1.4.0", f"{POOL}/jax:0.4.0", f"{POOL}/gone:2.0.0"]}


def _run(tmp_path: Path, declared: dict[str, Any], *args: str) -> int:
    path = tmp_path / "declared.json"
    path.write_text(json.dumps(declared))
    return registry_prune.main(["--declared-file", str(path), *args])


def _paths(store: Store) -> list[str]:
    return [path for _, path, _ in store.requests]


def test_undeclared_tags_go_declared_and_shared_ones_stay(
        tmp_path: Path, store: Store, declared: dict[str, Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(tmp_path, declared, "--json") == 0
    assert store.repos == {
        f"{POOL}/pytorch": {"1.4.0": _digest("a"), "latest": _digest("a")},
        f"{POOL}/jax": {"0.4.0": _digest("d")},
        f"{POOL}/old": {},
        "other/pytorch": {"1.0.0": _digest("g")},
    }
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert lines[-1] == {"summary": {"repositories": 3, "deleted": 4, "kept": 3,
                                     "errors": 0, "collected": None}}
    states = {f"{ln['repository']}:{ln['tag']}": ln["state"] for ln in lines[:-1]}
    assert states[f"{POOL}/pytorch:latest"].startswith("kept")
    assert states[f"{POOL}/old:1.0.0"] == "deleted"
    # The other pool's repository: not even its tags were asked for.
    assert not [p for p in _paths(store) if "other" in p]
    # The HEADs asked for the manifest types a push stores.
    heads = [h for m, _, h in store.requests if m == "HEAD"]
    assert heads and all("application/vnd.oci.image.manifest.v1+json" in h["Accept"]
                         and "application/vnd.docker.distribution.manifest.v2+json"
                         in h["Accept"] for h in heads)


def test_every_request_carries_the_push_credential_and_pages_are_followed(
        tmp_path: Path, store: Store, declared: dict[str, Any]) -> None:
    assert _run(tmp_path, declared, "--dry-run") == 0
    expected = "Basic " + base64.b64encode(f"push:{PASSWORD}".encode()).decode()
    assert {h.get("Authorization") for _, _, h in store.requests} == {expected}
    catalog = [p for p in _paths(store) if p.startswith("/v2/_catalog")]
    assert len(catalog) == 2  # four repositories, two a page
    assert "last=lab%2Fold" in catalog[1]
    tag_pages = [p for p in _paths(store) if p.startswith(f"/v2/{POOL}/pytorch/tags/list")]
    assert len(tag_pages) == 2  # four tags, two a page


def test_a_dry_run_deletes_nothing(tmp_path: Path, store: Store, declared: dict[str, Any],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    before = json.dumps(store.repos, sort_keys=True)
    assert _run(tmp_path, declared, "--dry-run") == 0
    assert json.dumps(store.repos, sort_keys=True) == before
    assert not [m for m, _, _ in store.requests if m == "DELETE"]
    out = capsys.readouterr().out
    assert f"{POOL}/pytorch:1.3.0: would delete" in out
    assert "would delete 4 tags" in out


@pytest.mark.parametrize(("fail", "words"), [
    ({"/v2/_catalog": 401}, "HTTP 401 (the push account's credential was refused)"),
    ({"/v2/_catalog": 500}, "GET /v2/_catalog?n=100: the registry answered HTTP 500"),
    ({f"/v2/{POOL}/jax/manifests": 500}, "HEAD /v2/lab/jax/manifests/"),
])
def test_errors_are_messages_and_exit_1(
        tmp_path: Path, store: Store, declared: dict[str, Any], fail: dict[str, int],
        words: str, capsys: pytest.CaptureFixture[str]) -> None:
    store.fail = fail
    assert _run(tmp_path, declared) == 1
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert err.startswith("gpupool-registry-prune: ")


def test_a_failing_repository_leaves_the_others_pruned(
        tmp_path: Path, store: Store, declared: dict[str, Any]) -> None:
    store.fail = {f"/v2/{POOL}/jax/": 500}
    assert _run(tmp_path, declared) == 1
    assert store.repos[f"{POOL}/old"] == {}
    assert len(store.repos[f"{POOL}/jax"]) == 2


def test_a_wrong_password_is_refused(tmp_path: Path, declared: dict[str, Any],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    Path(declared["password_file"]).write_text("wrong\n")
    assert _run(tmp_path, declared) == 1
    assert "HTTP 401" in capsys.readouterr().err


def test_a_registry_that_does_not_answer_is_a_message(
        tmp_path: Path, store: Store, declared: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(registry_prune, "HTTP_TIMEOUT_S", 0.5)
    store.hang = "/v2/_catalog"
    assert _run(tmp_path, declared) == 1
    err = capsys.readouterr().err
    assert "GET /v2/_catalog?n=100: no answer within 0.5 s" in err
    assert "Traceback" not in err


def test_an_oversized_answer_is_a_message(
        tmp_path: Path, declared: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(registry_prune, "MAX_BODY", 16)
    assert _run(tmp_path, declared) == 1
    assert "the answer is larger than 16 bytes" in capsys.readouterr().err


def test_a_certificate_not_the_pools_is_refused(
        tmp_path: Path, declared: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    other, _ = _certificate(tmp_path)
    declared["ca_file"] = str(other)
    assert _run(tmp_path, declared) == 1
    assert "cannot reach https://127.0.0.1:" in capsys.readouterr().err


HOSTILE = ["../x", f"{POOL}/../../x", f"{POOL}/a%2f..%2f..", f"{POOL}/a?b=c", f"{POOL}/a b",
           f"{POOL}/a#b", f"{POOL}/" + "a" * 300, f"{POOL}/A", f"/{POOL}/a", f"{POOL}//a", 7]


def _outside_v2(paths: list[str]) -> list[str]:
    """Requests a server would resolve outside /v2/ (after unquoting and `..`)."""
    out = []
    for path in paths:
        plain = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
        if not posixpath.normpath(plain).startswith("/v2/") or ".." in plain:
            out.append(path)
    return out


def test_hostile_repository_names_are_refused(
        tmp_path: Path, store: Store, declared: dict[str, Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    store.catalog = [*HOSTILE, f"{POOL}/old"]
    assert _run(tmp_path, declared) == 1
    assert store.repos[f"{POOL}/old"] == {}  # the good name is still pruned
    err = capsys.readouterr().err
    assert err.count("refused a repository name") == len(HOSTILE)
    assert _outside_v2(_paths(store)) == []
    # No request names any of them: only the catalog's pages and lab/old's calls.
    assert {p.split("?")[0] for p in _paths(store)} == {
        "/v2/_catalog", f"/v2/{POOL}/old/tags/list",
        f"/v2/{POOL}/old/manifests/1.0.0", f"/v2/{POOL}/old/manifests/{_digest('f')}"}


def test_hostile_tags_are_refused(tmp_path: Path, store: Store, declared: dict[str, Any],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    hostile = ["../../../x", "a/../b", "a%2f", "a?b", "a b", "-a", ".a", "a" * 129, None]
    store.tags[f"{POOL}/old"] = [*hostile, "1.0.0"]
    assert _run(tmp_path, declared) == 1
    assert capsys.readouterr().err.count("refused a tag") == len(hostile)
    assert _outside_v2(_paths(store)) == []
    assert store.repos[f"{POOL}/old"] == {}  # its one good tag went


def test_a_hostile_next_link_only_gives_the_next_name(
        tmp_path: Path, store: Store, declared: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The Link's host and path are not followed: only its `last`, quoted into our own.
    link = '<https://evil.example/../../x?last=lab%2F..%2F..&n=1>; rel="next"'
    assert registry_prune._next_last(link) == "lab/../.."
    assert registry_prune._next_last('<x>; rel="prev"') is None
    assert _run(tmp_path, declared, "--dry-run") == 0
    assert _outside_v2(_paths(store)) == []


def test_names_are_quoted_into_the_path() -> None:
    assert registry_prune._quote_repository("lab/a b?c") == "lab/a%20b%3Fc"
    assert registry_prune._quote("../x") == "..%2Fx"


@pytest.mark.parametrize(("key", "value"), [
    ("endpoint", "localhost:5000"), ("endpoint", "127.0.0.1:99999"), ("endpoint", 5000),
    ("ca_file", "relative/ca.crt"), ("ca_file", "/etc/../ca.crt"), ("password_file", None),
    ("config_file", "/etc/gpupool/push yml"), ("user", "Push"), ("user", "push\n"),
    ("pool", "../lab"), ("pool", ""), ("keep", "lab/pytorch:1.4.0"),
    ("keep", ["other/pytorch:1.0.0"]), ("keep", ["lab/pytorch"]), ("keep", ["lab/../x:1.0.0"]),
    ("keep", ["lab/pytorch:latest"]), ("keep", [7]), ("surprise", 1),
])
def test_a_malformed_declared_file_is_refused(
        tmp_path: Path, store: Store, declared: dict[str, Any], key: str, value: object,
        capsys: pytest.CaptureFixture[str]) -> None:
    if value is None:
        del declared[key]
    else:
        declared[key] = value
    assert _run(tmp_path, declared) == 2
    assert capsys.readouterr().err.startswith("gpupool-registry-prune: declared file")
    assert store.requests == []


@pytest.mark.parametrize("text", ["", "not json", "[]", "{}"])
def test_an_unreadable_declared_file_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "declared.json").write_text(text)
    assert registry_prune.main(["--declared-file", str(tmp_path / "declared.json")]) == 2
    assert registry_prune.main(["--declared-file", str(tmp_path / "none.json")]) == 2


def test_an_empty_password_file_is_refused(tmp_path: Path, declared: dict[str, Any]) -> None:
    Path(declared["password_file"]).write_text("\n")
    assert _run(tmp_path, declared) == 2


def test_dry_run_and_collect_exclude_each_other(tmp_path: Path,
                                                declared: dict[str, Any]) -> None:
    with pytest.raises(SystemExit) as info:
        _run(tmp_path, declared, "--dry-run", "--collect")
    assert info.value.code == 2


def _tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collect_rc: int) -> Path:
    """FIXTURE systemctl and docker-registry on PATH that log their arguments."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name, rc in (("systemctl", 0), ("docker-registry", collect_rc)):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n'
                        f'[ {rc} -eq 0 ] || echo "FIXTURE failure" >&2\nexit {rc}\n')
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_collect_stops_collects_and_starts(
        tmp_path: Path, store: Store, declared: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    log = _tools(tmp_path, monkeypatch, 0)
    assert _run(tmp_path, declared, "--collect") == 0
    assert log.read_text().splitlines() == [
        "systemctl stop gpupool-registry-push.service",
        "docker-registry garbage-collect --delete-untagged /etc/gpupool/registry/push.yml",
        "systemctl start gpupool-registry-push.service"]
    assert store.repos[f"{POOL}/old"] == {}
    assert "blobs collected" in capsys.readouterr().out


def test_a_failed_collection_still_starts_the_instance(
        tmp_path: Path, declared: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    log = _tools(tmp_path, monkeypatch, 3)
    assert _run(tmp_path, declared, "--collect") == 1
    assert log.read_text().splitlines()[-1] == "systemctl start gpupool-registry-push.service"
    err = capsys.readouterr().err
    assert "collection failed: docker-registry garbage-collect exited 3: FIXTURE failure" in err


def test_no_collection_after_failed_deletions(
        tmp_path: Path, store: Store, declared: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    log = _tools(tmp_path, monkeypatch, 0)
    store.fail = {f"/v2/{POOL}/jax/": 500}
    assert _run(tmp_path, declared, "--collect") == 1
    assert not log.exists()
    assert "not collected" in capsys.readouterr().err
