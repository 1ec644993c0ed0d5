"""The gate's MIG check: parsers on fixture outputs and the layout it expects; on this
GPU-less machine the check skips with the rest of the GPU suite.

The nvidia-smi outputs under fixtures/ are hand-written in NVIDIA's documented formats
(MIG user guide: `nvidia-smi -L` and `nvidia-smi mig -lgi` on an A100-SXM4-80GB split
3g.40gb + 2g.20gb + 1g.10gb), not recorded: fixtures for the parsers only, nothing about
real MIG behaviour is concluded from them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from gpupool.gate.expect import node_expect
from gpupool.gate.nvidia import mig_counts, parse_gpu_instances, parse_mig_list
from gpupool.spec import loader
from tests.conftest import GPUPOOL, ROOT, mutate, raw_stack

FIXTURES = Path(__file__).parent / "fixtures"
LAYOUT = {"1g.10gb": 1, "2g.20gb": 1, "3g.40gb": 1}
MIG_LAB = [{"set": "node_classes.lab-l4.gpu",
            "value": {"model": "a100", "count": 4, "memory_gib": 80, "mig_strategy": "mixed",
                      "mig_profiles": LAYOUT}},
           *({"set": f"teams.{t}.{k}.l4", "value": 4}
             for t in ("vision", "nlp") for k in ("quota", "borrowing_limit"))]


def test_parse_mig_device_list_fixture() -> None:
    devices = parse_mig_list((FIXTURES / "nvidia-smi-L-mig-a100.txt").read_text())
    assert sorted(devices) == [0, 1]
    assert all(mig_counts(d) == LAYOUT for d in devices.values())
    assert devices[0][0] == ("3g.40gb", "MIG-0a1b2c3d-0000-5000-8000-000000000001")


def test_parse_gpu_instances_fixture() -> None:
    gis = parse_gpu_instances((FIXTURES / "nvidia-smi-mig-lgi-a100.txt").read_text())
    assert gis[0] == [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]
    assert all(mig_counts(d) == LAYOUT for d in gis.values())


def test_a_gpu_without_mig_lists_no_devices() -> None:
    text = (FIXTURES / "nvidia-smi-L-mig-a100.txt").read_text()
    plain = "\n".join(line for line in text.splitlines() if not line.startswith("  MIG"))
    assert parse_mig_list(plain) == {0: [], 1: []}


def test_expected_layout_comes_from_the_class() -> None:
    desc = loader.parse(mutate(raw_stack("lab"), MIG_LAB))
    gpu = node_expect(desc, "lab-gpu1").gpu
    assert gpu is not None and dict(gpu.mig) == LAYOUT
    plain = node_expect(loader.load_stack("lab", ROOT), "lab-gpu1").gpu
    assert plain is not None and plain.mig == ()


def test_mig_check_skips_without_a_gpu(tmp_path: Path) -> None:
    src = tmp_path / "mig-lab.yaml"
    src.write_text(yaml.safe_dump(mutate(raw_stack("lab"), MIG_LAB)))
    proc = subprocess.run([*GPUPOOL, "gate", "lab-gpu1", "--local", "--file", str(src),
                           "--suite", "gpu", "--out", str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    report = json.loads(proc.stdout)["reports"][0]
    check = next(c for c in report["checks"] if c["id"] == "gpu.mig_instances_match_the_layout")
    assert check["status"] == "skip" and check["message"].startswith("no NVIDIA GPU")
