"""Problems found in a pool description, reported all at once."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MAX_VALUE_CHARS = 120  # offending values are echoed, but a hostile one is not echoed whole


def clip(value: Any) -> Any:
    """value as echoed in a problem: long strings and large collections cut short."""
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        return value[:MAX_VALUE_CHARS - 3] + "..."
    if isinstance(value, dict | list | tuple | set) and len(text := repr(value)) > MAX_VALUE_CHARS:
        return text[:MAX_VALUE_CHARS - 3] + "..."
    return value


@dataclass(frozen=True)
class Problem:
    path: str  # e.g. "nodes.gpu-a1.addresses.training"
    rule: str  # stable identifier, e.g. "address-in-segment"
    message: str
    value: Any = None

    def __str__(self) -> str:
        return f"{self.path}: [{self.rule}] {self.message} (got {self.value!r})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class DescriptionError(Exception):
    """The description is invalid; nothing may be changed from it."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        # Sorted by where and what; values of different types never get compared.
        self.problems = sorted(
            (Problem(p.path, p.rule, p.message, clip(p.value)) for p in problems),
            key=lambda p: (p.path, p.rule, p.message, repr(p.value)))
        super().__init__(f"{source}: {len(self.problems)} problem(s)\n" + "\n".join(
            f"  {p}" for p in self.problems))
