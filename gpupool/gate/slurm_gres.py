"""Parsers for what Slurm says a node's GPUs are: `slurmd -G` (the GRES slurmd detects and
would register, gres.conf and NVML merged) and `scontrol show node NAME` (what slurmctld
holds for the node); pure functions, tested on recorded outputs without Slurm or a GPU.

`slurmd -G` logs one record per GRES line, `Gres Name=gpu Type=h100 Count=1 Index=0
ID=7696487 File=/dev/nvidia0 ...` (Slurm's _log_gres_slurmd_conf; at a lower log level only
`Gres Name=gpu Type=h100 Count=8`), to stderr, each after a `slurmd: ` prefix or none.
A type is matched as Slurm matches slurm.conf's Type against NVML's name: case-insensitive,
as a substring (h100 in nvidia_h100_80gb_hbm3, 1g.10gb in nvidia_h100_80gb_hbm3_1g.10gb).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_GRES_LINE = re.compile(r"(?:^|\s)Gres Name=(?P<rest>.*)$")
_GRES_SPEC = re.compile(r"^(?P<name>[^:()]+)(?::(?P<type>[^:()]+))?:(?P<count>[0-9]+)"
                        r"(?:\([^)]*\))?$")
# slurmctld's reason when a node registers fewer GRES than slurm.conf gives it.
GRES_REASON = re.compile(r"gres/\S+ count (reported lower|too low)", re.IGNORECASE)


@dataclass(frozen=True)
class GresRecord:
    name: str
    type: str  # "(null)" where none
    count: int
    index: int | None
    file: str | None
    flags: tuple[str, ...]


def _pairs(text: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in text.split() if "=" in p)


def parse_slurmd_gres(text: str) -> list[GresRecord]:
    """Every `Gres Name=...` record slurmd -G printed, in order."""
    out = []
    for line in text.splitlines():
        m = _GRES_LINE.search(line.strip())
        if not m:
            continue
        f = _pairs("Name=" + m["rest"])
        try:
            count = int(f.get("Count", "0"))
        except ValueError:
            continue
        index = f.get("Index")
        out.append(GresRecord(f.get("Name", ""), f.get("Type", "(null)"), count,
                              int(index) if index and index.lstrip("-").isdigit() else None,
                              f.get("File"), tuple(x for x in f.get("Flags", "").split(",")
                                                   if x)))
    return out


def gpu_counts(records: list[GresRecord]) -> dict[str, int]:
    """GPU GRES counted by type as slurmd reported it."""
    counts: Counter[str] = Counter()
    for r in records:
        if r.name == "gpu":
            counts[r.type] += r.count
    return dict(counts)


def parse_gres_spec(spec: str) -> dict[str, int]:
    """scontrol's `Gres=gpu:h100:8(S:0-1),gpu:1g.10gb:28` as {type: count} for gpu
    (an untyped gpu:8 counts under "")."""
    out: Counter[str] = Counter()
    if spec in ("", "(null)"):
        return {}
    for part in re.split(r",(?![^(]*\))", spec):
        m = _GRES_SPEC.match(part.strip())
        if m and m["name"] == "gpu":
            out[m["type"] or ""] += int(m["count"])
    return dict(out)


def parse_scontrol_node(text: str) -> dict[str, str]:
    """`scontrol show node NAME` as {key: value}; Reason (which holds spaces) runs to the
    end of its line."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Reason="):
            out["Reason"] = line.removeprefix("Reason=")
            continue
        out |= _pairs(line)
    return out


def _matches(want: str, got: str) -> bool:
    return want.lower() == got.lower() or want.lower() in got.lower()


def compare(want: dict[str, int], got: dict[str, int]) -> list[str]:
    """What differs between the description's GPU GRES ({type: count}) and a report's,
    each reported type counted toward the first wanted type it matches; empty when equal."""
    found: Counter[str] = Counter()
    extra: dict[str, int] = {}
    for gtype, n in got.items():
        match = next((w for w in want if _matches(w, gtype)), None)
        if match is None:
            extra[gtype] = n
        else:
            found[match] += n
    wrong = [f"{w}: {found.get(w, 0)} instead of {n}" for w, n in want.items()
             if found.get(w, 0) != n]
    wrong += [f"{t}: {n} not in the description" for t, n in extra.items()]
    return wrong
