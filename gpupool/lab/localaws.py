"""A local AWS endpoint (moto) on this machine, for the lab and the tests: the only AWS this
machine can reach, and a FIXTURE in front of it that runs out of capacity on demand
(CapacityProxy). Nothing here is used against a real account."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FIXTURE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "fixture", "AWS_SECRET_ACCESS_KEY": "fixture",
                       "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


FLEET_ERROR = ("<?xml version='1.0' encoding='UTF-8'?><CreateFleetResponse "
               "xmlns='http://ec2.amazonaws.com/doc/2016-11-15/'><requestId>fixture"
               "</requestId><fleetId>fleet-fixture</fleetId><errorSet><item><lifecycle>"
               "{market}</lifecycle><errorCode>{code}</errorCode><errorMessage>We currently "
               "do not have sufficient {itype} capacity in the Availability Zone you "
               "requested.</errorMessage></item></errorSet><fleetInstanceSet/>"
               "</CreateFleetResponse>")
ICE = "InsufficientInstanceCapacity"


def overrides(form: dict[str, str]) -> list[dict[str, str]]:
    """A CreateFleet request's overrides, in order, as flat {field: value} dicts."""
    out: dict[int, dict[str, str]] = {}
    prefix = "LaunchTemplateConfigs.1.Overrides."
    for key, value in form.items():
        if key.startswith(prefix):
            index, _, field = key[len(prefix):].partition(".")
            out.setdefault(int(index), {})[field] = value
    return [out[i] for i in sorted(out)]


class CapacityProxy:
    """FIXTURE in front of moto, which can never run out of capacity: EC2 out of capacity
    for the instance types in `short` (type -> the error code its fleets report), answered
    as EC2 does (a 200 whose errorSet carries the code, no instance); moto for the rest.
    Every CreateFleet form lands in `fleets`. Listens on `address` (loopback unless lab
    hosts must reach it); stop() shuts it down."""

    def __init__(self, upstream: str, address: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self.short: dict[str, str] = {}
        self.refused: list[tuple[str, str]] = []
        self.fleets: list[dict[str, str]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()}
                if form.get("Action") == "CreateFleet":
                    proxy.fleets.append(form)
                    market = form["TargetCapacitySpecification.DefaultTargetCapacityType"]
                    itype = overrides(form)[0]["InstanceType"]
                    if itype in proxy.short:
                        proxy.refused.append((market, itype))
                        self._reply(200, FLEET_ERROR.format(
                            market=market, code=proxy.short[itype], itype=itype).encode())
                        return
                req = urllib.request.Request(  # noqa: S310 - loopback moto
                    proxy.upstream + self.path, data=body,
                                             headers=dict(self.headers), method="POST")
                try:
                    with urllib.request.urlopen(req) as resp:  # noqa: S310 - loopback moto
                        self._reply(resp.status, resp.read())
                except urllib.error.HTTPError as exc:  # moto's own errors pass through
                    self._reply(exc.code, exc.read())

            def _reply(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def endpoint(address: str = "127.0.0.1") -> Iterator[str]:
    """A moto server on a free port of `address` (loopback, or this machine's address on a
    lab network, gpupool.lab.burst_hosts.aws_address, for lab hosts to reach), stopped on
    exit; fixture credentials so a real profile is never picked up. Every moto server in
    one process shares one backend, so each starts from a reset: no bucket or template
    left by an earlier user."""
    from moto.server import ThreadedMotoServer  # noqa: PLC0415 - a development dependency

    saved = {k: os.environ.get(k) for k in FIXTURE_CREDENTIALS}
    os.environ.update(FIXTURE_CREDENTIALS)
    port = free_port(address)
    server = ThreadedMotoServer(ip_address=address, port=port)
    server.start()
    url = f"http://{address}:{port}"
    try:
        reset = urllib.request.Request(f"{url}/moto-api/reset", method="POST")  # noqa: S310
        with urllib.request.urlopen(reset, timeout=30):  # noqa: S310 - loopback moto
            pass
        yield url
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
