"""A local AWS endpoint (moto) on 127.0.0.1, for the lab and the tests: the only AWS this
machine can reach. Nothing here is used against a real account."""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.request
from collections.abc import Iterator

FIXTURE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "fixture", "AWS_SECRET_ACCESS_KEY": "fixture",
                       "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


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
