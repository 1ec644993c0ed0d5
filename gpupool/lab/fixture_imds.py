#!/usr/bin/python3
"""The lab's FIXTURE instance metadata service (IMDSv2) inside each burst host: the lab's
stand-in for EC2's 169.254.169.254, so whatever a real instance asks of its metadata at boot
(its tags, life cycle, zone, the instance role's credentials) and while it runs (a spot
interruption notice) is answered inside the lab host. Nothing here is EC2; no cloud
behaviour follows from it beyond what the state file says.

gpupool/lab/burst_hosts.py copies it into a burst host with a state file it writes from
the instance moto reports (STATE, JSON: {"meta-data": {path: text}}) and starts it on
169.254.169.254:80. As EC2 does, it answers only with a session token (PUT
/latest/api/token with a TTL header of 1 to 21600 seconds; any GET without a token it
issued is 401). Two answers come from files a test writes while the host runs, in the
state file's folder: `spot-instance-action` (meta-data/spot/instance-action) and
`rebalance` (meta-data/events/recommendations/rebalance); absent, they are 404 as on EC2.

Standard library only (lab hosts have python3).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.server
import json
import secrets
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

# Paths and header names of EC2's protocol, not credentials.
TOKEN_PATH = "/latest/api/token"  # noqa: S105
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"  # noqa: S105
TOKEN_HEADER = "X-aws-ec2-metadata-token"  # noqa: S105
MAX_TTL_S = 21600
META = "/latest/meta-data/"
# Notices a test injects while the host runs: meta-data path -> file beside the state.
NOTICE_FILES = {"spot/instance-action": "spot-instance-action",
                "events/recommendations/rebalance": "rebalance"}


@dataclasses.dataclass
class Seen:
    """What the fixture saw, and the tokens it issued (tests read these and may revoke the
    tokens, as a restarted metadata service forgets them). `broken`, when set, answers
    every GET with that status: a test's knob, never set in a lab host."""

    tokens: set[str] = dataclasses.field(default_factory=set)
    puts: int = 0
    refused: int = 0
    paths: list[str] = dataclasses.field(default_factory=list)
    broken: int = 0


def handler(state: Path, seen: Seen | None = None
            ) -> type[http.server.BaseHTTPRequestHandler]:
    seen = seen or Seen()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, status: int, body: str = "") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            ttl = self.headers.get(TOKEN_TTL_HEADER, "")
            if self.path != TOKEN_PATH or not ttl.isdigit() or not 1 <= int(ttl) <= MAX_TTL_S:
                self._answer(400)
                return
            seen.puts += 1
            token = secrets.token_urlsafe(24)
            seen.tokens.add(token)
            self._answer(200, token)

        def do_GET(self) -> None:
            seen.paths.append(self.path)
            if self.headers.get(TOKEN_HEADER) not in seen.tokens:
                seen.refused += 1
                self._answer(401)
                return
            if seen.broken:
                # Somewhere else: a client must not follow (its token would go along).
                self.send_response(seen.broken)
                self.send_header("Location", "http://192.0.2.1/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if not self.path.startswith(META):
                self._answer(404)
                return
            path = self.path[len(META):]
            notice = NOTICE_FILES.get(path)
            if notice is not None:
                file = state.with_name(notice)
                self._answer(200, file.read_text()) if file.exists() else self._answer(404)
                return
            # Read per request: a test may change what the instance says while it runs.
            body = json.loads(state.read_text())["meta-data"].get(path)
            self._answer(404) if body is None else self._answer(200, body)

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write(f"fixture-imds: {format % args}\n")

    return Handler


@contextlib.contextmanager
def serving(state: Path, seen: Seen | None = None) -> Iterator[str]:
    """The fixture on 127.0.0.1 in this process, for tests: yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler(state, seen))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="FIXTURE IMDSv2 for a lab burst host")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--address", default="169.254.169.254")
    parser.add_argument("--port", type=int, default=80)
    args = parser.parse_args(argv)
    server = http.server.ThreadingHTTPServer((args.address, args.port), handler(args.state))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
