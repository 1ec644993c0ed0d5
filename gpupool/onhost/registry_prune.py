#!/usr/bin/python3
"""The registry host's garbage collection (role image_registry, installed as
/usr/local/sbin/gpupool-registry-prune): deletes the versions of the pool's images that
no declaration names, then, with --collect, frees their blobs.

The declared file the role writes (/etc/gpupool/registry/declared.json: the writable
instance's loopback endpoint, its CA, the push account and its password file, the
instance's configuration, the pool and the `<pool>/<name>:<version>` to keep) is the
allow-list of what stays. The program asks the writable instance (Registry HTTP API v2,
TLS with the pool's CA, basic auth) for its repositories and their tags; in each
repository under `<pool>/` a tag not declared has its manifest deleted by digest, unless a
declared tag in that repository points at the same manifest. Repositories outside
`<pool>/` are left alone. Names the registry returns are checked against distribution's
grammar before they become part of a request, and every request stays under /v2/.

  gpupool-registry-prune [--declared-file F] [--json] [--dry-run | --collect]

--dry-run prints what would be deleted; --collect, after deleting, stops the writable
instance, runs `docker-registry garbage-collect --delete-untagged` and starts it again
whatever the collection did (nodes pull from the read-only instance meanwhile). No timer
runs it: a person does (runbooks/registry-full.md).

Exit 0: done; 1: an API call, a refused name or the collection failed (the message names
it); 2: a usage error or a malformed declared file. Standard library only: it runs under
the host's python3.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A tool that hangs fails the collection, with what it said last (see there).
try:  # in the package: the tests, the lab's control host
    from gpupool.onhost import tool_run
except ImportError:  # on the registry's host, where its role copies it beside this file
    import tool_run  # type: ignore[no-redef]

DECLARED_FILE = Path("/etc/gpupool/registry/declared.json")
SERVICE = "gpupool-registry-push.service"
# The pool's name (gpupool/spec/model.py NAME_RE), an image's name and version
# (IMAGE_NAME_RE, IMAGE_VERSION_RE) and the account's user (USER_RE).
POOL_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
NAME_RE = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*")
VERSION_RE = re.compile(r"[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}(-[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?")
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
PATH_RE = re.compile(r"(/[A-Za-z0-9_][-A-Za-z0-9_.]*)+")
ENDPOINT_RE = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}:[0-9]{1,5}")
# What distribution itself accepts (reference/regexp.go): a repository's path components,
# at most 255 characters in all; a tag; a manifest digest. Anything else the registry
# returns is refused before it reaches a URL.
_COMPONENT = r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*"
REPOSITORY_RE = re.compile(rf"{_COMPONENT}(/{_COMPONENT})*")
REPOSITORY_MAX = 255
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}")
# The manifest types a pushed image has: asked for by HEAD, so the registry answers with
# the stored manifest's digest rather than converting it to an older schema.
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
))
# Bounds: a registry that stops answering, or pages forever, fails the run, not the host.
HTTP_TIMEOUT_S = 30
PAGE_SIZE = 100
MAX_BODY = 8 << 20  # bytes of one answer: a page of names is far smaller
MAX_PAGES = 1000
SYSTEMCTL_TIMEOUT_S = 120
COLLECT_TIMEOUT_S = 3600
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Usage(Exception):
    """A request or a declared file this program refuses."""


class Failed(Exception):
    """An API call, a name or the collection that failed; the message names it."""


@dataclass(frozen=True)
class Declared:
    endpoint: str
    ca_file: Path
    user: str
    password_file: Path
    config_file: Path
    pool: str
    keep: frozenset[str]  # "<pool>/<name>:<version>"


@dataclass
class Outcome:
    """What a run did (or, in a dry run, would do), for the lines and the summary."""

    lines: list[dict[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    repositories: int = 0
    kept: int = 0


def _field(data: dict[str, Any], key: str, pattern: re.Pattern[str], what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise Usage(f"declared file: {key} is not {what}")
    return value


def _keep(value: object, pool: str) -> frozenset[str]:
    if not isinstance(value, list):
        raise Usage("declared file: keep is not a list")
    for i, entry in enumerate(value):
        repository, _, version = entry.rpartition(":") if isinstance(entry, str) else ("", "", "")
        owner, _, name = repository.partition("/")
        if owner != pool or not NAME_RE.fullmatch(name) or not VERSION_RE.fullmatch(version):
            raise Usage(f"declared file: keep[{i}] is not {pool}/<name>:<version>: {entry!r}")
    return frozenset(value)


def load(path: Path) -> Declared:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Usage(f"cannot read the declared file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise Usage(f"declared file {path}: not an object")
    if unknown := sorted(set(data) - {"endpoint", "ca_file", "user", "password_file",
                                      "config_file", "pool", "keep"}):
        raise Usage(f"declared file {path}: unknown keys {unknown}")
    endpoint = _field(data, "endpoint", ENDPOINT_RE, "IPv4:port")
    if not 1 <= int(endpoint.rpartition(":")[2]) <= 65535:
        raise Usage("declared file: endpoint's port is not 1-65535")
    paths = {k: Path(_field(data, k, PATH_RE, "an absolute path of plain names"))
             for k in ("ca_file", "password_file", "config_file")}
    pool = _field(data, "pool", POOL_RE, "a pool's name")
    return Declared(endpoint=endpoint, user=_field(data, "user", USER_RE, "a user name"),
                    pool=pool, keep=_keep(data.get("keep"), pool), **paths)


def _password(path: Path) -> str:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise Usage(f"cannot read the password file {path}: {exc}") from None
    if not value or not value.isprintable():
        raise Usage(f"the password file {path} is empty or not one line")
    return value


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect could lead a request (with the push credential) outside /v2/: refused.
    def redirect_request(  # noqa: PLR0917 - urllib's signature
            self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
            newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl!r} refused",
                                     headers, fp)


class Registry:
    """The writable instance's API: every path is built here, from checked names."""

    def __init__(self, declared: Declared, password: str) -> None:
        try:
            context = ssl.create_default_context(cafile=str(declared.ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise Usage(f"cannot load the CA {declared.ca_file}: {exc}") from None
        self.base = f"https://{declared.endpoint}"
        token = base64.b64encode(f"{declared.user}:{password}".encode()).decode()
        self.auth = f"Basic {token}"
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=context), _NoRedirect())

    def request(self, method: str, path: str,
                headers: dict[str, str] | None = None) -> tuple[bytes, Any]:
        """(body, headers) of a 2xx answer; Failed naming the call otherwise."""
        if not path.startswith("/v2/"):  # every caller builds paths under /v2/
            raise Failed(f"refused to {method} {path!r}: not under /v2/")
        req = urllib.request.Request(  # noqa: S310 - https:// and a path under /v2/
            self.base + path, method=method,
            headers={"Authorization": self.auth, **(headers or {})})
        what = f"{method} {path}"
        try:
            with self.opener.open(req, timeout=HTTP_TIMEOUT_S) as resp:
                body, answer = resp.read(MAX_BODY + 1), resp.headers
        except urllib.error.HTTPError as exc:
            hint = " (the push account's credential was refused)" if exc.code == 401 else ""
            raise Failed(f"{what}: the registry answered HTTP {exc.code}{hint}") from None
        except TimeoutError:
            raise Failed(f"{what}: no answer within {HTTP_TIMEOUT_S} s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):  # while connecting
                raise Failed(f"{what}: no answer within {HTTP_TIMEOUT_S} s") from None
            raise Failed(f"{what}: cannot reach {self.base}: {exc.reason}") from None
        except (OSError, ValueError) as exc:  # a reset connection, a malformed answer
            raise Failed(f"{what}: {exc}") from None
        if len(body) > MAX_BODY:
            raise Failed(f"{what}: the answer is larger than {MAX_BODY} bytes")
        return body, answer

    def _paged(self, path: str, key: str) -> Iterator[object]:
        """The items of a paginated list (the catalog, a repository's tags): `n` per page,
        the next page's `last` taken from the Link header, which is never followed as
        given (it could name another host or path)."""
        last = None
        for _ in range(MAX_PAGES):
            query = {"n": str(PAGE_SIZE), **({"last": last} if last is not None else {})}
            body, headers = self.request("GET", f"{path}?{urllib.parse.urlencode(query)}")
            try:
                items = json.loads(body).get(key)
            except (ValueError, AttributeError):
                raise Failed(f"GET {path}: the answer is not a JSON object") from None
            if items is not None and not isinstance(items, list):
                raise Failed(f"GET {path}: {key} is not a list")
            yield from items or []
            last = _next_last(headers.get("Link", ""))
            if last is None:
                return
        raise Failed(f"GET {path}: more than {MAX_PAGES} pages")

    def repositories(self) -> Iterator[object]:
        return self._paged("/v2/_catalog", "repositories")

    def tags(self, repository: str) -> Iterator[object]:
        return self._paged(f"/v2/{_quote_repository(repository)}/tags/list", "tags")

    def digest(self, repository: str, tag: str) -> str:
        _, headers = self.request(
            "HEAD", f"/v2/{_quote_repository(repository)}/manifests/{_quote(tag)}",
            {"Accept": MANIFEST_TYPES})
        value = headers.get("Docker-Content-Digest", "")
        if not DIGEST_RE.fullmatch(value):
            raise Failed(f"HEAD {repository}:{tag}: no valid Docker-Content-Digest "
                         f"({value[:80]!r})")
        return value

    def delete(self, repository: str, digest: str) -> None:
        self.request("DELETE", f"/v2/{_quote_repository(repository)}/manifests/{digest}")


def _next_last(link: str) -> str | None:
    """The `last` of a Link header's rel="next" target, or None where there is none."""
    match = re.match(r'\s*<([^>]*)>\s*;\s*rel="?next"?', link)
    if not match:
        return None
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(match.group(1)).query).get("last")
    return values[0] if values else None


def _quote(part: str) -> str:
    # Names are checked against distribution's grammar first; quoting is the second line.
    return urllib.parse.quote(part, safe="")


def _quote_repository(repository: str) -> str:
    return "/".join(_quote(p) for p in repository.split("/"))


def _checked(value: object, pattern: re.Pattern[str], limit: int) -> str | None:
    if isinstance(value, str) and len(value) <= limit and pattern.fullmatch(value):
        return value
    return None


def _prune_repository(registry: Registry, declared: Declared, repository: str,
                      dry_run: bool, out: Outcome) -> None:
    tags: list[str] = []
    for value in registry.tags(repository):
        if (tag := _checked(value, TAG_RE, 128)) is None:
            out.errors.append(f"{repository}: refused a tag that is no tag: {value!r:.120}")
        else:
            tags.append(tag)
    declared_tags = [t for t in tags if f"{repository}:{t}" in declared.keep]
    out.kept += len(declared_tags)
    # Deleting a manifest removes every tag on it: one a declared tag shares stays.
    protected = {registry.digest(repository, t) for t in declared_tags}
    deleted: set[str] = set()
    for tag in sorted(set(tags) - set(declared_tags)):
        digest = registry.digest(repository, tag)
        line = {"repository": repository, "tag": tag, "digest": digest}
        if digest in protected:
            out.kept += 1
            out.lines.append({**line, "state": "kept: a declared tag shares its manifest"})
            continue
        if not dry_run and digest not in deleted:
            registry.delete(repository, digest)
            deleted.add(digest)
        out.lines.append({**line, "state": "would delete" if dry_run else "deleted"})


def prune(registry: Registry, declared: Declared, dry_run: bool) -> Outcome:
    """Delete (or list) every undeclared tag of the pool's repositories; a repository
    whose calls fail is reported and the others still pruned."""
    out = Outcome()
    try:
        for value in registry.repositories():
            repository = _checked(value, REPOSITORY_RE, REPOSITORY_MAX)
            if repository is None:
                out.errors.append(f"refused a repository name that is no name: {value!r:.120}")
                continue
            if not repository.startswith(f"{declared.pool}/"):
                continue  # another pool's, or something pushed by hand: not ours to judge
            out.repositories += 1
            try:
                _prune_repository(registry, declared, repository, dry_run, out)
            except Failed as exc:
                out.errors.append(str(exc))
    except Failed as exc:  # the catalog itself
        out.errors.append(str(exc))
    return out


def _run(argv: list[str], timeout: int) -> None:
    try:
        tool_run.run(argv, timeout)
    except tool_run.ToolFailed as exc:
        raise Failed(str(exc)) from None


def collect(config_file: Path) -> None:
    """Free the deleted manifests' blobs. The writable instance is stopped meanwhile (a
    collection beside a push can delete a blob the push still needs) and started again
    whatever the collection did; a failure of both is reported as both."""
    _run(["systemctl", "stop", SERVICE], SYSTEMCTL_TIMEOUT_S)
    failure: Failed | None = None
    try:
        _run(["docker-registry", "garbage-collect", "--delete-untagged", str(config_file)],
             COLLECT_TIMEOUT_S)
    except Failed as exc:
        failure = exc
    finally:
        try:
            _run(["systemctl", "start", SERVICE], SYSTEMCTL_TIMEOUT_S)
        except Failed as exc:
            raise Failed(f"{failure}; then {exc}" if failure else str(exc)) from None
    if failure is not None:
        raise failure


def _report(out: Outcome, dry_run: bool, as_json: bool, collected: bool | None) -> None:
    verb = "would delete" if dry_run else "deleted"
    deleted = sum(line["state"] == verb for line in out.lines)
    for line in out.lines:
        if as_json:
            print(json.dumps(line))
        else:
            print(f"{line['repository']}:{line['tag']}: {line['state']} ({line['digest']})")
    summary = {"repositories": out.repositories, "deleted": deleted, "kept": out.kept,
               "errors": len(out.errors), "collected": collected}
    if as_json:
        print(json.dumps({"summary": summary}))
    else:
        note = {None: "", True: ", blobs collected", False: ", blobs not collected"}[collected]
        print(f"{out.repositories} repositories of the pool: {verb} {deleted} tags, kept "
              f"{out.kept}, {len(out.errors)} errors{note}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpupool-registry-prune",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--declared-file", type=Path, default=DECLARED_FILE)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print what would be deleted")
    mode.add_argument("--collect", action="store_true",
                      help="after deleting, collect the blobs (stops the writable instance)")
    p.add_argument("--json", action="store_true", help="one JSON object per tag, then a summary")
    args = p.parse_args(argv)
    try:
        declared = load(args.declared_file)
        registry = Registry(declared, _password(declared.password_file))
    except Usage as exc:
        print(f"gpupool-registry-prune: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = prune(registry, declared, args.dry_run)
    collected: bool | None = None
    if args.collect:
        collected = False
        if out.errors:
            out.errors.append("not collected: the deletions above failed in part")
        else:
            try:
                collect(declared.config_file)
                collected = True
            except Failed as exc:
                out.errors.append(f"collection failed: {exc}")
    for error in out.errors:
        print(f"gpupool-registry-prune: {error}", file=sys.stderr)
    _report(out, args.dry_run, args.json, collected)
    return EXIT_FAILED if out.errors else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
