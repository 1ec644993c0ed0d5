"""Shell scripts rendered from template files, every value shell-quoted where it is written.

A template is the script itself with four additions, each starting with `@@` (text a
shell script never holds, unlike `$`):

- `@@name` or `@@{name}`: a value, written as one shell word (shlex.quote; a sequence as
  words, each quoted). A description's value can then never end its word, whatever it holds.
- a line that is only `@@name` of a block: lines the caller made safe itself (a ruleset, a
  here-document's one JSON line, a line per item of a list, each value in it quoted).
- `@@if name` and `@@end` lines: what lies between them is kept only where the flag is set.
- `@@#` lines: the template's own comments, never in the script.

Verbatim values, written as they are, are gpupool's own text, never a description's.
Rendering is strict: a placeholder without a value, or a value or block the kept text never
uses, is an error, so a template and its renderer cannot drift apart unnoticed.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping, Sequence
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"


class _Template(string.Template):
    delimiter = "@@"


Value = str | int | Sequence[str]


def _quote(value: Value) -> str:
    if isinstance(value, str | int):
        return shlex.quote(str(value))
    return " ".join(shlex.quote(v) for v in value)


def render(template: str, values: Mapping[str, Value], *,
           verbatim: Mapping[str, str] | None = None,
           blocks: Mapping[str, Sequence[str]] | None = None,
           flags: Mapping[str, bool] | None = None) -> str:
    """The script: template's text with values quoted, verbatim text, blocks and the
    sections whose flag is set."""
    verbatim, blocks, flags = verbatim or {}, blocks or {}, flags or {}
    clash = (set(values) & set(verbatim)) | ((set(values) | set(verbatim)) & set(blocks))
    if clash:
        raise ValueError(f"given twice: {sorted(clash)}")
    words = {**{k: _quote(v) for k, v in values.items()}, **verbatim}
    out: list[str] = []
    used: set[str] = set()
    kept: list[bool] = []  # one per open @@if: whether its flag is set
    for line in template.splitlines():
        if line.startswith("@@#"):
            continue
        if line.startswith("@@if "):
            kept.append(flags[line[5:].strip()])
            continue
        if line == "@@end":
            if not kept:
                raise ValueError("an @@end without its @@if")
            kept.pop()
            continue
        if not all(kept):
            continue
        if line.startswith("@@") and line[2:] in blocks:
            used.add(line[2:])
            out += blocks[line[2:]]
            continue
        piece = _Template(line)
        used.update(piece.get_identifiers())
        out.append(piece.substitute(words))
    if kept:
        raise ValueError("an @@if without its @@end")
    unused = (set(words) | set(blocks)) - used
    if unused:
        raise ValueError(f"given but never used: {sorted(unused)}")
    return "\n".join(out) + "\n"


def render_file(name: str, values: Mapping[str, Value], *,
                verbatim: Mapping[str, str] | None = None,
                blocks: Mapping[str, Sequence[str]] | None = None,
                flags: Mapping[str, bool] | None = None) -> str:
    """render() of a template in gpupool/render/templates."""
    return render((TEMPLATES / name).read_text(encoding="utf-8"), values,
                  verbatim=verbatim, blocks=blocks, flags=flags)
