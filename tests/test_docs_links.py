"""The README and the docs/ pages link only to what exists: every relative link names a file
or folder of the repository, and every `#anchor` into a Markdown file names one of its
headings, as GitHub makes their ids. Every docs/ page is linked from the README."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) or ![alt](target), with an optional title; the text may hold one level of
# brackets. Reference definitions: [label]: target.
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+[^)]*)?\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
EXTERNAL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:|//)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")


def prose(text: str) -> str:
    """The Markdown without its code: fenced and indented blocks, and code spans."""
    kept: list[str] = []
    fenced = False
    previous_blank_or_code = True
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            kept.append("")
            continue
        indented = line.startswith(("    ", "\t")) and line.strip() != ""
        if fenced or (indented and previous_blank_or_code):
            kept.append("")
            previous_blank_or_code = True
            continue
        previous_blank_or_code = line.strip() == ""
        kept.append(line)
    return CODE_SPAN.sub("", "\n".join(kept))


def links(text: str) -> list[str]:
    body = prose(text)
    found = [m.group(1) for m in INLINE.finditer(body)]
    found += [m.group(1) for m in REFERENCE.finditer(body)]
    return [target.strip("<>") for target in found]


def slug(heading: str) -> str:
    """GitHub's id for a heading: its text without markup, lower case, punctuation dropped
    (letters, digits, `-` and `_` kept), each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading id of a Markdown file; a repeated heading gets -1, -2... as on GitHub."""
    seen: dict[str, int] = {}
    ids: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            ids.add(base if count == 0 else f"{base}-{count}")
    return ids


def broken(page: Path) -> list[str]:
    problems: list[str] = []
    for target in links(page.read_text()):
        if EXTERNAL.match(target):
            continue
        where, _, anchor = target.partition("#")
        where = unquote(where)
        if where.startswith("/"):
            resolved = ROOT / where.lstrip("/")
        else:
            resolved = (page.parent / where) if where else page
        if not resolved.exists():
            problems.append(f"{target}: no such file or folder")
        elif anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
            problems.append(f"{target}: {resolved.name} has no heading with id #{anchor}")
        elif not resolved.resolve().is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = ROOT / "README.md"
    linked = {(readme.parent / unquote(t.partition("#")[0])).resolve()
              for t in links(readme.read_text()) if not EXTERNAL.match(t)}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


def test_the_checker_sees_what_github_sees(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# The `gpupool` command\n\n## Exit codes and `--json`\n\n## Tour\n\n"
                    "## Tour\n\nSee [a](other.md#x) and ![b](<img dir/p.png> \"t\").\n\n"
                    "    [not](a link in code)\n\n```\n[nor](this)\n```\n"
                    "`[nor](this)` and [ref]: on no line of its own\n")
    assert anchors(page) == {"the-gpupool-command", "exit-codes-and---json", "tour", "tour-1"}
    assert links(page.read_text()) == ["other.md#x", "img dir/p.png"]
    assert slug("The Pulumi program (`infra/`) and its guardrails (`policies/`)") == (
        "the-pulumi-program-infra-and-its-guardrails-policies")
