"""Benchmarks: each module here has main() -> dict, prints its figures and writes them to
bench/results/<module>.json. `python -m bench` (make bench) runs them all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write(name: str, figures: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return path
