"""The pool description's reference, generated from its model (gpupool/spec/model.py): a JSON
Schema (draft 2020-12) that editors with a YAML language server check and complete
descriptions against, and a Markdown page of every section and field.

Both are written from the model alone, so they cannot drift from what the loader accepts:
the schema's keys are the YAML keys (`class`, `from`: the fields' aliases), its required
fields and bounds are the model's, and every section refuses a key it does not know. A
field's description is the comment the model gives it (above it or after it), a section's
its class's docstring.

The schema types each value; the loader's relational rules (gpupool/spec/rules.py: a node's
class exists, addresses lie in their segments, ...) are `gpupool validate`'s alone.

    python -m gpupool.spec.reference    # in a checkout: rewrite SCHEMA_FILE and REFERENCE_PAGE
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import sys
import tokenize
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from gpupool.paths import DATA, PROJECT_ROOT
from gpupool.spec import loader, model
from gpupool.spec.model import Description

SCHEMA_FILE = DATA / "description-schema" / "description.schema.json"
REFERENCE_PAGE = PROJECT_ROOT / "docs" / "description-reference.md"
REGENERATE = "python -m gpupool.spec.reference"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
# The mark of a file gpupool wrote (gpupool schema -o replaces one without --force): JSON
# has no comments, so the schema carries it as its "$comment".
MARK = "Written by gpupool"
COMMENT = (f"{MARK} from its description model (gpupool/spec/model.py); do not edit: "
           f"`gpupool schema` prints it, `{REGENERATE}` regenerates gpupool's copy.")

# The loader's named value formats (pattern -> (rule id, meaning)): the page names a value
# by its format and explains each once.
FORMATS: dict[str, tuple[str, str]] = loader._PATTERN_RULES


class _Generator(GenerateJsonSchema):
    """pydantic's generator without a title per field: it only repeats the key ("Memory
    Gib"), and an editor would show that instead of the field's description."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _notes() -> dict[tuple[str, str], str]:
    """(class, field or enum member) -> the comment the model writes above or after it."""
    source = inspect.getsource(model)
    lines = source.splitlines()
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    notes: dict[tuple[str, str], str] = {}
    for cls in (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                name = stmt.target.id
            elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                  and isinstance(stmt.targets[0], ast.Name)):
                name = stmt.targets[0].id
            else:
                continue
            above: list[str] = []
            line = stmt.lineno - 1
            while line in comments and lines[line - 1].lstrip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            after = [comments[n] for n in range(stmt.lineno, (stmt.end_lineno or 0) + 1)
                     if n in comments and not lines[n - 1].lstrip().startswith("#")]
            if text := " ".join(above + after):
                notes[cls.name, name] = text
    return notes


def _prose(text: str) -> str:
    """A docstring's paragraphs, each on one line: hard-wrapped lines read badly in an
    editor's hover."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n") if p.strip())


def _key_patterns(node: Any) -> None:
    """pydantic writes a map with constrained keys as patternProperties, which checks only
    the keys that match and lets any other key through unchecked; the loader refuses such a
    key. As propertyNames plus additionalProperties, every key and value is checked."""
    if isinstance(node, dict):
        pattern = node.get("patternProperties")
        if isinstance(pattern, dict) and len(pattern) == 1 and "additionalProperties" not in node:
            ((key, values),) = pattern.items()
            del node["patternProperties"]
            node["propertyNames"] = {"pattern": key}
            node["additionalProperties"] = values
        for value in node.values():
            _key_patterns(value)
    elif isinstance(node, list):
        for value in node:
            _key_patterns(value)


def schema() -> dict[str, Any]:
    """The JSON Schema of a pool description file."""
    raw = Description.model_json_schema(by_alias=True, schema_generator=_Generator)
    _key_patterns(raw)
    notes = _notes()
    defs: dict[str, Any] = raw.pop("$defs")
    classes = {name: getattr(model, name) for name in [*defs, Description.__name__]}
    for name, node in [*defs.items(), (Description.__name__, raw)]:
        cls = classes[name]
        if "description" in node:
            node["description"] = _prose(node["description"])
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            for field_name, field in cls.model_fields.items():
                note = notes.get((name, field_name))
                if note:
                    node["properties"][field.alias or field_name]["description"] = note
        else:  # an enum: what each value means, where the model says
            values = [f"`{m.value}`: {notes[name, m.name]}" for m in cls
                      if (name, m.name) in notes]
            if values:
                node["description"] = "\n\n".join([*filter(None, [node.get("description")]),
                                                   "; ".join(values)])
    raw.pop("title", None)
    return {"$schema": DRAFT, "$comment": COMMENT, "title": "gpupool pool description",
            **raw, "$defs": defs}


def schema_text() -> str:
    """The schema as SCHEMA_FILE holds it and `gpupool schema` prints it."""
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


# The page.


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _code(value: Any) -> str:
    # A string bare (`pcie`), unless it is empty: an empty code span is no text at all.
    text = value if isinstance(value, str) and value else json.dumps(value, ensure_ascii=False)
    return f"`{text}`"


def _bounds(node: dict[str, Any]) -> str:
    parts = []
    for key, word in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"),
                      ("minLength", "length ≥"), ("maxLength", "length ≤"),
                      ("minItems", "at least"), ("minProperties", "at least")):
        if key in node:
            parts.append(f"{word} {node[key]}")
    return f" ({', '.join(parts)})" if parts else ""


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """A schema node as the page says its type."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        values = defs[name].get("enum")
        return ("one of " + ", ".join(_code(v) for v in values) if values
                else f"[{name}](#{name.lower()})")
    if "anyOf" in node:
        return " or ".join(_type(n, defs) for n in node["anyOf"])
    kind, bounds = node.get("type", "any"), _bounds(node)
    if kind == "array":
        text = f"list{bounds} of {_type(node['items'], defs)}"
    elif kind == "object":
        keys = _type({"type": "string", **node.get("propertyNames", {})}, defs)
        text = f"map{bounds}: {keys} → {_type(node.get('additionalProperties', {}), defs)}"
    elif "pattern" in node:
        pattern = node["pattern"]
        text = (f"[{FORMATS[pattern][0]}](#value-formats)" if pattern in FORMATS
                else f"string matching {_code(pattern)}") + bounds
    else:
        text = kind + bounds
    return text


def _walk(defs: dict[str, Any], node: Any, path: str, seen: dict[str, list[str]]) -> None:
    """Each section's YAML paths, sections in the order a description reads (depth first)."""
    if isinstance(node, dict) and "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        if "properties" not in defs[name]:
            return
        first = name not in seen
        seen.setdefault(name, []).append(path)
        if first:
            for key, sub in defs[name]["properties"].items():
                _walk(defs, sub, f"{path}.{key}".lstrip("."), seen)
    elif isinstance(node, dict):
        for sub in node.get("anyOf", []):
            _walk(defs, sub, path, seen)
        if "items" in node:
            _walk(defs, node["items"], f"{path}[]", seen)
        if isinstance(node.get("additionalProperties"), dict):
            _walk(defs, node["additionalProperties"], f"{path}.<key>", seen)


def reference() -> str:
    """The Markdown page: every section and field of a description."""
    full = schema()
    defs = dict(full["$defs"])
    defs[Description.__name__] = {k: v for k, v in full.items() if k != "$defs"}
    seen: dict[str, list[str]] = {}
    _walk(defs, {"$ref": f"#/$defs/{Description.__name__}"}, "", seen)
    out = [
        "# Pool description reference", "",
        f"{MARK} from its description model (gpupool/spec/model.py); do not edit it: "
        f"`{REGENERATE}` regenerates this page and the JSON Schema, which "
        "`gpupool schema` prints (`gpupool schema --reference` prints this page).", "",
        "A pool description is one YAML file (`pools/<stack>.yaml`). This page gives each "
        "section's keys: their type, whether a description must give them, their default "
        "and what they mean. Every section refuses a key it does not list. A value's type "
        "is exact: a count is a YAML integer (`8`, never `8.0` or `\"8\"`), a flag `true` or "
        "`false`. `<key>` in a path is a name the description chooses (a node's, a "
        "team's). `gpupool validate` checks more than the schema says: that addresses and "
        "networks parse (a network without host bits set), that a duration is at most "
        f"{model.MAX_DURATION_S // 86400} days, that no value holds control characters "
        "or `{{`, and how fields relate (a node's class exists, an address lies in its "
        "segment).", "",
        "To have an editor check and complete a description, save the schema "
        "(`gpupool schema -o gpupool-description.schema.json`) and name it on the "
        "file's first line, for the YAML language server:", "",
        "```yaml",
        "# yaml-language-server: $schema=gpupool-description.schema.json",
        "```", "",
    ]
    for name, paths in seen.items():
        node = defs[name]
        where = ", ".join(_code(p) for p in paths) if paths != [""] else "the file itself"
        out += [f"## {name}", "", f"At {where}.", ""]
        if "description" in node:
            out += [node["description"], ""]
        out += ["| Key | Type | Required | Default | Description |",
                "| --- | --- | --- | --- | --- |"]
        required = set(node.get("required", []))
        for key, prop in node["properties"].items():
            text = prop.get("description", "")
            if "$ref" in prop and "enum" in defs[prop["$ref"].rsplit("/", 1)[1]]:
                text = " ".join(filter(None, [text, defs[prop["$ref"].rsplit("/", 1)[1]].get(
                    "description", "")]))
            default = _code(prop["default"]) if "default" in prop else ""
            out.append(f"| `{key}` | {_cell(_type(prop, defs))} | "
                       f"{'yes' if key in required else 'no'} | {_cell(default)} | "
                       f"{_cell(text)} |")
        out.append("")
    out += ["## Value formats", "",
            "| Format | Pattern | Meaning |", "| --- | --- | --- |"]
    out += [f"| {rule} | {_cell(_code(pattern))} | {_cell(meaning)} |"
            for pattern, (rule, meaning) in FORMATS.items()]
    return "\n".join(out) + "\n"


def main() -> int:
    """Rewrite the committed schema and page from the model (in a checkout)."""
    if not (PROJECT_ROOT / "pyproject.toml").is_file():
        print(f"{REGENERATE} rewrites a gpupool checkout's files; this gpupool is installed "
              "(use `gpupool schema`)", file=sys.stderr)
        return 2
    SCHEMA_FILE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE_PAGE.parent.mkdir(parents=True, exist_ok=True)
    SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
    REFERENCE_PAGE.write_text(reference(), encoding="utf-8")
    print(f"wrote {SCHEMA_FILE.relative_to(PROJECT_ROOT)} and "
          f"{REFERENCE_PAGE.relative_to(PROJECT_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
