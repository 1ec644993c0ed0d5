"""The gate's Slurm GRES checks: what `slurmd -G` and `scontrol show node` report, read
from hand-made samples (tests/gate/fixtures/README.md) and compared with the description."""

from __future__ import annotations

from pathlib import Path

from gpupool.gate import slurm_gres

FIXTURES = Path(__file__).parent / "fixtures"


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_whole_gpus_found_by_nvml() -> None:
    records = slurm_gres.parse_slurmd_gres(_read("slurmd-G-h100-nvml.txt"))
    assert len(records) == 8
    assert records[0] == slurm_gres.GresRecord(
        "gpu", "h100", 1, 0, "/dev/nvidia0", ("HAS_FILE", "HAS_TYPE", "ENV_NVML"))
    assert [r.index for r in records] == list(range(8))
    got = slurm_gres.gpu_counts(records)
    assert got == {"h100": 8}
    assert slurm_gres.compare({"h100": 8}, got) == []
    # One GPU more than the host has, or another model: both are named.
    assert slurm_gres.compare({"h100": 9}, got) == ["h100: 8 instead of 9"]
    assert slurm_gres.compare({"h200": 8}, got) == ["h200: 0 instead of 8",
                                                    "h100: 8 not in the description"]


def test_a_file_range_record_counts_all_its_devices() -> None:
    records = slurm_gres.parse_slurmd_gres(_read("slurmd-G-l40s-files.txt"))
    assert [(r.type, r.count, r.index, r.file) for r in records] == [
        ("l40s", 4, None, "/dev/nvidia[0-3]")]
    assert slurm_gres.compare({"l40s": 4}, slurm_gres.gpu_counts(records)) == []


def test_mig_instances_match_their_profiles_inside_nvml_names() -> None:
    records = slurm_gres.parse_slurmd_gres(_read("slurmd-G-a100-mig-nvml.txt"))
    got = slurm_gres.gpu_counts(records)
    assert got == {"nvidia_a100-sxm4-80gb_3g.40gb": 2, "nvidia_a100-sxm4-80gb_2g.20gb": 2,
                   "nvidia_a100-sxm4-80gb_1g.10gb": 2}
    want = {"1g.10gb": 2, "2g.20gb": 2, "3g.40gb": 2}  # one of each on each of two GPUs
    assert slurm_gres.compare(want, got) == []
    assert slurm_gres.compare({"1g.10gb": 4, "3g.40gb": 2}, got) == [
        "1g.10gb: 2 instead of 4", "nvidia_a100-sxm4-80gb_2g.20gb: 2 not in the description"]
    assert records[0].file is not None and "/dev/nvidia-caps/nvidia-cap21" in records[0].file


def test_a_missing_plugin_detects_nothing() -> None:
    records = slurm_gres.parse_slurmd_gres(_read("slurmd-G-mig-no-plugin.txt"))
    assert records == []
    assert slurm_gres.compare({"1g.10gb": 14}, slurm_gres.gpu_counts(records)) == [
        "1g.10gb: 0 instead of 14"]


def test_scontrol_node_whole_gpus() -> None:
    node = slurm_gres.parse_scontrol_node(_read("scontrol-show-node-h100.txt"))
    assert node["NodeName"] == "h100-a1" and node["State"] == "IDLE"
    assert slurm_gres.parse_gres_spec(node["Gres"]) == {"h100": 8}
    assert "Reason" not in node


def test_scontrol_node_drained_for_too_few_gres() -> None:
    node = slurm_gres.parse_scontrol_node(_read("scontrol-show-node-mig-drained.txt"))
    assert slurm_gres.parse_gres_spec(node["Gres"]) == {"1g.10gb": 2, "2g.20gb": 2,
                                                        "3g.40gb": 2}
    assert node["Reason"].startswith("gres/gpu count reported lower than configured (0 < 6)")
    assert slurm_gres.GRES_REASON.search(node["Reason"])
    assert "DRAIN" in node["State"]


def test_gres_specs() -> None:
    assert slurm_gres.parse_gres_spec("(null)") == {}
    assert slurm_gres.parse_gres_spec("gpu:8") == {"": 8}
    assert slurm_gres.parse_gres_spec("gpu:h100:8(S:0-1),gpu:l4:2(S:0)") == {"h100": 8,
                                                                             "l4": 2}
    assert slurm_gres.parse_gres_spec("gpu:1g.10gb:28,mps:400") == {"1g.10gb": 28}
