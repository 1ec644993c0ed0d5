"""A dotted path into nested JSON-like data (`a.b.0.c`): the plan's key inputs and the
bench report's figures use it. Stdlib only, so a light reader imports it without Pulumi."""

from __future__ import annotations

from typing import Any


def walk(value: Any, path: str) -> Any:
    """The value at path (list items by index), or None where the path leads nowhere."""
    for part in path.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return None
    return value
