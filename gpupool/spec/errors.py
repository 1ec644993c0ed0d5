"""Problems found in a pool description, reported all at once."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

MAX_VALUE_CHARS = 120  # offending values are echoed, but a hostile one is not echoed whole
MAX_PATH_CHARS = 200  # a path as people read it (a hostile key makes one of any length)

# C0 and C1 control characters (newline and tab included), and the Unicode line separators
# and bidirectional overrides that make text read differently from what it is. No value in
# a description needs them, and each could break out of a file it is written into, or
# rewrite the terminal a problem is printed on (an ANSI escape).
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

# A word a suggestion is looked for: difflib compares every pair of characters, and no
# name a description may use is longer.
MAX_SUGGESTED_CHARS = 64


def clip(value: Any) -> Any:
    """value as echoed in a problem: long strings and large collections cut short."""
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        return value[:MAX_VALUE_CHARS - 3] + "..."
    if isinstance(value, dict | list | tuple | set) and len(text := repr(value)) > MAX_VALUE_CHARS:
        return text[:MAX_VALUE_CHARS - 3] + "..."
    return value


def printable(text: str, limit: int = MAX_PATH_CHARS) -> str:
    """text as it may be shown to people: cut short, and every control character (an ANSI
    escape, a newline, a bidirectional override) written as its escape, as repr writes it."""
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def quoted(value: Any) -> str:
    """A value named in a message: a string in single quotes, cut short and with its
    control characters escaped; anything else as YAML writes it."""
    if isinstance(value, str):
        return f"'{printable(value, MAX_VALUE_CHARS)}'"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return printable(str(value), MAX_VALUE_CHARS)


def nearest(word: Any, choices: Iterable[str]) -> str | None:
    """The choice closest to word (difflib, ignoring case), if one is close enough; never
    for a word no choice could be mistyped from (too long, or with control characters)."""
    if (not isinstance(word, str) or not word or len(word) > MAX_SUGGESTED_CHARS
            or CONTROL.search(word)):
        return None
    by_folded = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(word.lower(), by_folded, n=1, cutoff=0.6)
    return by_folded[found[0]] if found else None


def did_you_mean(word: Any, choices: Iterable[str]) -> str:
    """"did you mean `x`?" for the choice nearest word, or "" when none is near."""
    found = nearest(word, choices)
    return f"did you mean `{found}`?" if found else ""


def unknown(what: str, word: Any, known: Iterable[str]) -> str:
    """The message for a name not in a catalog: the nearest known one, and all of them,
    sorted: "unknown GPU model; did you mean `l4`? known: a100, a10g, ..."."""
    names = sorted(known)
    hint = did_you_mean(word, names)
    return f"unknown {what}; {hint + ' ' if hint else ''}known: {', '.join(names)}"


@dataclass(frozen=True)
class Problem:
    path: str  # e.g. "nodes.gpu-a1.addresses.training"
    rule: str  # stable identifier, e.g. "address-in-segment"
    message: str
    value: Any = None  # the offending value; None where there is none to show

    def __str__(self) -> str:
        return f"{printable(self.path)}: [{self.rule}] {printable(self.message, 10_000)}" + (
            "" if self.value is None else f" (got {self.value!r})")

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
