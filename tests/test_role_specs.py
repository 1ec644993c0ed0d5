"""Each role's public API is its defaults/main.yml, and meta/argument_specs.yml documents
it as `ansible-doc -t role` shows it: every default variable is an option there, with the
same default (unless it is required) and a description of its own (not the variable's name
spelled out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p.parent.parent for p in (ROOT / "roles").glob("*/defaults/main.yml"))


def options(role: Path) -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    found: dict[str, dict[str, Any]] = {}
    for entry in spec["argument_specs"].values():
        found |= entry.get("options") or {}
    return found


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_default_is_documented_with_its_value(role: Path) -> None:
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    spec = options(role)
    assert sorted(set(defaults) - set(spec)) == [], "defaults without an argument spec"
    for name, value in defaults.items():
        opt = spec[name]
        # Ansible refuses a default beside required: true (the caller must set it).
        if not opt.get("required"):
            assert opt.get("default") == value, (name, opt.get("default"), value)
        text = opt.get("description")
        text = " ".join(text) if isinstance(text, list) else (text or "")
        assert text.strip() and text.strip().lower() != name.replace("_", " "), name
