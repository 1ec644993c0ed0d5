"""Parsers for what NVIDIA's tools print; pure functions so they are tested on recorded
outputs without a GPU."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# Queried in this order with --format=csv,noheader,nounits.
QUERY_FIELDS = (
    "index", "name", "uuid", "memory.total", "driver_version", "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
    "remapped_rows.pending", "remapped_rows.failure", "persistence_mode",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
    "pcie.link.width.max", "clocks_event_reasons.active", "temperature.gpu",
)
QUERY_COMMAND = ("nvidia-smi --query-gpu=" + ",".join(QUERY_FIELDS)
                 + " --format=csv,noheader,nounits")

# Throttle reasons that mean trouble (bitmask from nvml.h); idle and power-cap reasons are
# normal on a healthy card.
BAD_THROTTLE = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


@dataclass(frozen=True)
class GpuState:
    index: int
    name: str
    uuid: str
    memory_mib: int
    driver: str
    ecc_enabled: bool | None
    uncorrected_ecc: int | None
    retired_pending: bool | None
    remap_pending: bool | None
    remap_failed: bool | None
    persistence: bool
    pcie_gen: int | None
    pcie_gen_max: int | None
    pcie_width: int | None
    pcie_width_max: int | None
    throttle_mask: int
    temperature_c: int | None

    @property
    def bad_throttle(self) -> list[str]:
        return [name for bit, name in BAD_THROTTLE.items() if self.throttle_mask & bit]


def _num(value: str) -> int | None:
    value = value.strip()
    return None if value in ("[N/A]", "N/A", "[Not Supported]", "") else int(value, 0)


def _flag(value: str, yes: str = "Yes") -> bool | None:
    value = value.strip()
    return None if value in ("[N/A]", "N/A", "[Not Supported]") else value in (yes, "Enabled")


def parse_query(text: str) -> list[GpuState]:
    gpus = []
    for line in text.strip().splitlines():
        f = [c.strip() for c in line.split(",")]
        if len(f) != len(QUERY_FIELDS):
            raise ValueError(f"expected {len(QUERY_FIELDS)} fields, got {len(f)}: {line!r}")
        gpus.append(GpuState(
            index=int(f[0]), name=f[1], uuid=f[2], memory_mib=int(f[3]), driver=f[4],
            ecc_enabled=_flag(f[5], "Enabled"), uncorrected_ecc=_num(f[6]),
            retired_pending=_flag(f[7]), remap_pending=_flag(f[8]),
            remap_failed=_flag(f[9]), persistence=f[10] == "Enabled",
            pcie_gen=_num(f[11]), pcie_gen_max=_num(f[12]), pcie_width=_num(f[13]),
            pcie_width_max=_num(f[14]), throttle_mask=_num(f[15]) or 0,
            temperature_c=_num(f[16])))
    return gpus


_LINK = re.compile(r"^\s*Link (\d+): (.+)$")


def parse_nvlink_status(text: str) -> dict[int, dict[int, bool]]:
    """`nvidia-smi nvlink --status` -> {gpu index: {link: active}}."""
    out: dict[int, dict[int, bool]] = {}
    gpu = -1
    for line in text.splitlines():
        if line.startswith("GPU "):
            gpu = int(line.split()[1].rstrip(":"))
            out[gpu] = {}
        elif (m := _LINK.match(line)) and gpu >= 0:
            out[gpu][int(m.group(1))] = "inactive" not in m.group(2).lower()
    return out


# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., ...": the driver's line for an XID event
# (NVIDIA's "Xid Errors" guide); older drivers print the address without "PCI:".
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F:.]+)\): (\d{1,6})")


def parse_xids(kernel_log: str) -> list[tuple[str, int]]:
    """(PCI address, XID code) for each XID line in a kernel log."""
    return [(m.group(1), int(m.group(2))) for m in XID_LINE.finditer(kernel_log)]


def parse_dcgm_diag(text: str) -> dict[str, str]:
    """`dcgmi diag -r N -j` -> {test name: result} with results Pass/Fail/Warn/Skip."""
    data: dict[str, Any] = json.loads(text)
    results: dict[str, str] = {}
    for category in data.get("DCGM GPU Diagnostic", {}).get("test_categories", []):
        for test in category.get("tests", []):
            verdicts = {r.get("status", "") for r in test.get("results", [])}
            worst = next((v for v in ("Fail", "Warn", "Pass", "Skip") if v in verdicts), "Skip")
            results[test["name"]] = worst
    return results


# `nvidia-smi -L`: a "GPU i: name (UUID: ...)" line per GPU, then, on a GPU in MIG mode,
# one indented "MIG <profile> Device j: (UUID: MIG-...)" line per MIG device.
_GPU_LINE = re.compile(r"^GPU (\d+): ")
_MIG_LINE = re.compile(r"^\s+MIG (\d+g\.\d+gb)\s+Device\s+(\d+): \(UUID: (MIG-[^)]+)\)")


def parse_mig_list(text: str) -> dict[int, list[tuple[str, str]]]:
    """`nvidia-smi -L` -> {gpu index: [(MIG profile, MIG device UUID), ...]}; a GPU not in
    MIG mode maps to []."""
    out: dict[int, list[tuple[str, str]]] = {}
    gpu = -1
    for line in text.splitlines():
        if m := _GPU_LINE.match(line):
            gpu = int(m.group(1))
            out[gpu] = []
        elif (m := _MIG_LINE.match(line)) and gpu >= 0:
            out[gpu].append((m.group(1), m.group(3)))
    return out


# `nvidia-smi mig -lgi` table rows: | GPU  Name  Profile-ID  Instance-ID  Start:Size |
_LGI_ROW = re.compile(r"^\|\s+(\d+)\s+MIG (\d+g\.\d+gb)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|$")


def parse_gpu_instances(text: str) -> dict[int, list[tuple[str, int]]]:
    """`nvidia-smi mig -lgi` -> {gpu index: [(profile, placement start), ...]}."""
    out: dict[int, list[tuple[str, int]]] = {}
    for line in text.splitlines():
        if m := _LGI_ROW.match(line.strip()):
            out.setdefault(int(m.group(1)), []).append((m.group(2), int(m.group(5))))
    return out


def mig_counts(devices: list[tuple[str, str]] | list[tuple[str, int]]) -> dict[str, int]:
    """Instances per profile of one GPU, from either parser."""
    counts: dict[str, int] = {}
    for profile, _ in devices:
        counts[profile] = counts.get(profile, 0) + 1
    return dict(sorted(counts.items()))


@dataclass(frozen=True)
class DcgmHealth:
    """The last DCGM health check (`dcgmi health --check`) that roles/dcgm's timer recorded:
    what the GPUs' background watches saw between gates."""

    status: str  # pass | fail | error (dcgmi could not reach a host engine)
    checked_at: datetime
    detail: str


def parse_dcgm_health(text: str) -> DcgmHealth:
    """The record gpupool-dcgm-health writes (roles/dcgm/templates/gpupool-dcgm-health.sh.j2)."""
    try:
        raw = json.loads(text)
        status, when = raw["status"], raw["checked_at"]
        checked = datetime.strptime(when, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a DCGM health record: {exc}") from None
    if status not in ("pass", "fail", "error"):
        raise ValueError(f"not a DCGM health record: status {status!r}")
    return DcgmHealth(status, checked, str(raw.get("detail", ""))[-300:])
