"""Version floors: the Slurm and NVIDIA driver releases known to be vulnerable, per release
line, and the Debian version comparison that decides whether a lock is below them.

The table is vendored data (gpupool/data/version-floors/floors.yaml, its sources in
SOURCE.md), one entry per advisory. A lock is compared as Debian compares package versions
(dpkg's algorithm, below): a lock that names a Debian revision (22.05.8-4+deb12u3) is fixed
by a backport Debian published for that upstream version, even where upstream fixed the
line only in a later release; a lock of the bare upstream version is compared with the
upstream fixes alone (apt's pin `22.05.8*` would take the unfixed 22.05.8-4 as readily).

Nothing here raises on a bad version: `VersionError` carries a message, and the rule
turns it into a problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, cmp_to_key
from typing import Any

import yaml

from gpupool.paths import DATA

FLOORS_FILE = DATA / "version-floors" / "floors.yaml"
# No real package version is longer; a longer one is refused before any digit is read
# (Python refuses to read a decimal of over 4,300 digits).
MAX_VERSION_CHARS = 128
LINES = {"major": 1, "major.minor": 2}

_EPOCH = re.compile(r"^[0-9]{1,9}$")
_UPSTREAM = re.compile(r"^[0-9][A-Za-z0-9.+~-]*$")
_REVISION = re.compile(r"^[A-Za-z0-9.+~]+$")
_DIGITS = "0123456789"


class VersionError(ValueError):
    """A string that is not a version Debian (and so this comparison) understands."""


@dataclass(frozen=True)
class DebianVersion:
    epoch: int
    upstream: str
    revision: str  # "" when the version names none

    def __str__(self) -> str:
        epoch = f"{self.epoch}:" if self.epoch else ""
        return f"{epoch}{self.upstream}" + (f"-{self.revision}" if self.revision else "")


def parse(version: object) -> DebianVersion:
    """A version as dpkg reads it ([epoch:]upstream[-revision]), or VersionError."""
    if not isinstance(version, str) or not version:
        raise VersionError(f"not a version: {version!r}")
    if len(version) > MAX_VERSION_CHARS:
        raise VersionError(f"longer than {MAX_VERSION_CHARS} characters")
    if not version.isascii() or not version.isprintable() or " " in version:
        raise VersionError(f"not a version: {version!r} (only ASCII letters, digits and "
                           ". + ~ - : are allowed)")
    epoch, rest = "0", version
    if ":" in version:
        epoch, rest = version.split(":", 1)
        if not _EPOCH.match(epoch):
            raise VersionError(f"not a version: {version!r} (the epoch before ':' must be "
                               "a number)")
    upstream, revision = rest.rsplit("-", 1) if "-" in rest else (rest, "")
    if not _UPSTREAM.match(upstream):
        raise VersionError(f"not a version: {version!r} (it must start with a digit)")
    if "-" in rest and not _REVISION.match(revision):
        raise VersionError(f"not a version: {version!r} (empty or bad Debian revision "
                           "after the last '-')")
    return DebianVersion(int(epoch), upstream, revision)


def _order(c: str) -> int:
    """dpkg's weight of one character of a non-digit run: '~' sorts before everything,
    even the end of the string; letters before other characters."""
    if c == "~":
        return -1
    if not c or c in _DIGITS:
        return 0
    return ord(c) if c.isalpha() else ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit runs (by _order) and digit runs (as numbers)."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and a[i] not in _DIGITS) or (j < len(b) and b[j] not in _DIGITS):
            ac = _order(a[i] if i < len(a) and a[i] not in _DIGITS else "")
            bc = _order(b[j] if j < len(b) and b[j] not in _DIGITS else "")
            if ac != bc:
                return -1 if ac < bc else 1
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        first_diff = 0
        while i < len(a) and a[i] in _DIGITS and j < len(b) and b[j] in _DIGITS:
            if not first_diff and a[i] != b[j]:
                first_diff = -1 if a[i] < b[j] else 1
            i, j = i + 1, j + 1
        if i < len(a) and a[i] in _DIGITS:
            return 1
        if j < len(b) and b[j] in _DIGITS:
            return -1
        if first_diff:
            return first_diff
    return 0


def compare(a: str | DebianVersion, b: str | DebianVersion) -> int:
    """-1, 0 or 1 as `dpkg --compare-versions a lt|eq|gt b`; VersionError for a bad one."""
    va = a if isinstance(a, DebianVersion) else parse(a)
    vb = b if isinstance(b, DebianVersion) else parse(b)
    if va.epoch != vb.epoch:
        return -1 if va.epoch < vb.epoch else 1
    return _compare_part(va.upstream, vb.upstream) or _compare_part(va.revision, vb.revision)


def release_line(version: str | DebianVersion, how: str) -> str:
    """The release line a version belongs to: "580" (how "major") or "24.11"
    ("major.minor"), read from the upstream version's leading numbers."""
    v = version if isinstance(version, DebianVersion) else parse(version)
    numbers = re.split(r"[^0-9]", v.upstream.split("~")[0])
    parts = [n for n in numbers[:LINES[how]] if n]
    if len(parts) < LINES[how]:
        raise VersionError(f"{v}: no release line ({how}) can be read from it")
    return ".".join(str(int(p)) if how == "major" else p for p in parts)


@dataclass(frozen=True)
class Advisory:
    id: str
    component: str
    line: str  # "major" or "major.minor"
    cves: tuple[str, ...]
    summary: str
    fixed: dict[str, str | None]  # line -> first fixed upstream release (None: none)
    debian: dict[str, str]  # line -> Debian version carrying the fix as a backport
    sources: tuple[str, ...]

    def affects(self, line: str) -> bool:
        return line in self.fixed or line in self.debian

    def fixes(self, version: DebianVersion, line: str) -> bool:
        """Whether `version` (of `line`) carries this advisory's fix."""
        if not self.affects(line):
            return True
        upstream = self.fixed.get(line)
        if upstream is not None and compare(version.upstream, upstream) >= 0:
            return True
        backport = self.debian.get(line)
        if backport is None or not version.revision:
            return False
        fix = parse(backport)
        return version.upstream == fix.upstream and compare(version, fix) >= 0

    def fixed_in(self, line: str) -> str:
        parts = [f"{line}: {self.fixed[line]}" if self.fixed.get(line)
                 else f"no {line} release upstream"]
        if line in self.debian:
            parts.append(f"Debian {self.debian[line]}")
        return ", ".join(parts)


def _advisory(raw: dict[str, Any]) -> Advisory:
    return Advisory(raw["id"], raw["component"], raw["line"], tuple(raw["cves"]),
                    raw["summary"], dict(raw["fixed"]), dict(raw.get("debian") or {}),
                    tuple(raw["sources"]))


@cache
def advisories() -> tuple[Advisory, ...]:
    data = yaml.safe_load(FLOORS_FILE.read_text())
    return tuple(_advisory(a) for a in data["advisories"])


@dataclass(frozen=True)
class Verdict:
    """A lock below the floor of its release line: the advisories it misses and the
    smallest fix (`pin`), or the lines that carry every fix when its own line has none."""

    component: str
    version: str
    line: str
    missed: tuple[Advisory, ...]
    pin: str | None  # the smallest release of the same line that carries every fix
    other_lines: tuple[str, ...]  # else: the smallest fixed release of each later line

    @property
    def cves(self) -> list[str]:
        return [c for a in self.missed for c in a.cves]

    @property
    def fix(self) -> str:
        if self.pin:
            return f"pin {self.pin} or later"
        later = ", ".join(self.other_lines) or "none known"
        return (f"no {self.line} release carries every fix: move to a fixed line "
                f"({later})")

    @property
    def message(self) -> str:
        found = "; ".join(f"{', '.join(a.cves)} ({a.summary}; fixed in {a.fixed_in(self.line)})"
                          for a in self.missed)
        return f"known vulnerable, refused in production: {found}; {self.fix}"


def _passes(component: str, version: DebianVersion, how: str) -> bool:
    line = release_line(version, how)
    return all(a.fixes(version, line) for a in advisories() if a.component == component)


def components() -> list[str]:
    """The locked components the table holds floors for."""
    return sorted({a.component for a in advisories()})


def check(component: str, version: object) -> Verdict | None:
    """None when `version` of `component` carries every fix the table knows for its line;
    else the Verdict. VersionError when `version` cannot be read."""
    mine = [a for a in advisories() if a.component == component]
    if not mine:
        return None
    v = parse(version)
    how = mine[0].line
    line = release_line(v, how)
    missed = tuple(a for a in mine if not a.fixes(v, line))
    if not missed:
        return None
    candidates: dict[str, list[DebianVersion]] = {}
    for a in mine:
        for text in [*(f for f in a.fixed.values() if f), *a.debian.values()]:
            cand = parse(text)
            candidates.setdefault(release_line(cand, how), []).append(cand)
    best: dict[str, DebianVersion] = {}
    for ln, cands in candidates.items():
        ok = [c for c in cands if _passes(component, c, how)]
        for c in ok:
            if ln not in best or compare(c, best[ln]) < 0:
                best[ln] = c
    pin = best.get(line)
    by_line = cmp_to_key(lambda x, y: compare(x + ".0", y + ".0"))
    later = tuple(str(best[ln]) for ln in sorted(best, key=by_line)
                  if compare(ln + ".0", line + ".0") > 0)
    return Verdict(component, str(version), line, missed, str(pin) if pin else None, later)
