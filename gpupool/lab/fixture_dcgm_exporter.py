#!/usr/bin/python3
# @FIXTURE_MARK@
"""The lab's FIXTURE /usr/bin/dcgm-exporter (package datacenter-gpu-manager-exporter of the
lab mirror, gpupool/lab/mirror.py). It is not NVIDIA software and reads no GPU: it exists
so that the dcgm role's unit, its flags, Prometheus' scrape and the Slurm job map are
exercised in the lab.

It takes the real exporter's flags (--collectors, --address, --hpc-job-mapping-dir,
--remote-hostengine-info; others are ignored) and serves on GET /metrics every counter of
the collectors file for each fixture GPU (/dev/nvidia<N> device files, which the slurm
role creates in the lab), value 0, with the real exporter's labels (gpu, UUID, device,
modelName, Hostname) plus fixture="1" and FIXTURE in the help text, so that nobody takes
its numbers for GPU data. As the real exporter does, a GPU whose index names a file in the
job-mapping directory (content: job ids, one per line) gets one sample per job, labelled
hpc_job="<id>".

Standard library only (lab hosts have python3). GPUPOOL_FIXTURE_DEV_DIR (tests only)
replaces /dev.
"""

from __future__ import annotations

import argparse
import glob
import http.server
import os
import re
import socket
import sys

FIELD = re.compile(r"DCGM_FI_[A-Z0-9_]+")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dcgm-exporter", description="FIXTURE dcgm-exporter")
    p.add_argument("-f", "--collectors", default="/etc/dcgm-exporter/default-counters.csv")
    p.add_argument("-a", "--address", default=":9400")
    p.add_argument("--hpc-job-mapping-dir", default="")
    p.add_argument("-r", "--remote-hostengine-info", default="")
    args, _unknown = p.parse_known_args(argv)  # the real exporter's other flags
    return args


def counters(path: str) -> list[tuple[str, str, str]]:
    """(field, Prometheus type, help) of each counter line of a dcgm-exporter CSV."""
    out = []
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            field, kind, help_ = (x.strip() for x in [*line.split(",", 2), "", ""][:3])
            if FIELD.fullmatch(field) and kind in ("gauge", "counter"):
                out.append((field, kind, help_))
    return out


def gpus(dev_dir: str) -> list[int]:
    """Indexes of the /dev/nvidia<N> device files present."""
    names = (os.path.basename(d) for d in glob.glob(os.path.join(dev_dir, "nvidia[0-9]*")))
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"nvidia(\d+)", n)))


def jobs(mapping_dir: str, index: int) -> list[str]:
    """Job ids the mapping directory lists for a GPU (a file named after its index)."""
    if not mapping_dir:
        return []
    try:
        with open(os.path.join(mapping_dir, str(index)), encoding="utf-8") as f:
            return [x.strip() for x in f if x.strip()]
    except OSError:
        return []


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics(args: argparse.Namespace, dev_dir: str, hostname: str) -> str:
    samples: list[dict[str, str]] = []
    for i in gpus(dev_dir):
        base = {"gpu": str(i), "UUID": f"FIXTURE-{hostname}-{i}", "device": f"nvidia{i}",
                "modelName": "FIXTURE", "Hostname": hostname, "fixture": "1"}
        samples += [{**base, "hpc_job": j} for j in jobs(args.hpc_job_mapping_dir, i)] or [base]
    lines = []
    for field, kind, help_ in counters(args.collectors):
        lines += [f"# HELP {field} FIXTURE, not GPU data: {escape(help_)}",
                  f"# TYPE {field} {kind}"]
        for labels in samples:
            text = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
            lines.append(f"{field}{{{text}}} 0")
    return "\n".join(lines) + "\n"


def serve(args: argparse.Namespace) -> None:
    dev_dir = os.environ.get("GPUPOOL_FIXTURE_DEV_DIR", "/dev")
    hostname = socket.gethostname()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                # The collectors file is read per scrape: a bad one answers 500, not a crash.
                try:
                    body = metrics(args, dev_dir, hostname).encode()
                except (OSError, ValueError) as e:
                    self.send_error(500, str(e))
                    return
                kind = "text/plain; version=0.0.4; charset=utf-8"
            elif path == "/health":
                body, kind = b"OK (FIXTURE)\n", "text/plain"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *a: object) -> None:
            pass  # one line per scrape would flood the journal

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

    host, _, port = args.address.rpartition(":")
    host = host.strip("[]")
    if ":" in host:
        Server.address_family = socket.AF_INET6
    server = Server((host, int(port)), Handler)
    print(f"dcgm-exporter FIXTURE (no GPU data) serving on {args.address}", file=sys.stderr,
          flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(parse_args(sys.argv[1:]))
