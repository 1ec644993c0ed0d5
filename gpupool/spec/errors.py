"""Problems found in a pool description, reported all at once."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, order=True)
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
        self.problems = sorted(problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s)\n" + "\n".join(
            f"  {p}" for p in self.problems))
