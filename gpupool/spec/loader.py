"""Find, parse and validate a pool description.

The one place a stack's description lives: `Pulumi.<stack>.yaml` holds the config key
`gpupool:description`, a path (relative to the project root) to the description file.
The Pulumi program, the CLI and the tests all resolve it through `description_path`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import TypeAdapter, ValidationError

from gpupool.paths import PROJECT_ROOT
from gpupool.spec import rules
from gpupool.spec.errors import DescriptionError, Problem
from gpupool.spec.model import DURATION_RE, NAME_RE, USER_RE, VERSION_RE, Description

CONFIG_KEY = "gpupool:description"

# Pattern -> (rule id, what the pattern means), so errors explain rather than quote regexes.
_PATTERN_RULES = {
    NAME_RE: ("name", "must be a DNS-1123 label (lowercase letters, digits and '-', starting "
                      "with a letter, at most 63 characters) to serve as hostname, Slurm "
                      "and Kubernetes name"),
    VERSION_RE: ("pinned-version", "must be one exact version such as 535.309.01 (no ranges, "
                                   "wildcards or 'latest')"),
    DURATION_RE: ("duration", "must be a whole number with unit s, m, h or d, such as 4h"),
    USER_RE: ("user-name", "must be a Unix user name"),
}


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; a pool description must not."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def stack_config_path(stack: str, root: Path = PROJECT_ROOT) -> Path:
    return root / f"Pulumi.{stack}.yaml"


def description_path(stack: str, root: Path = PROJECT_ROOT) -> Path:
    cfg_path = stack_config_path(stack, root)
    if not cfg_path.is_file():
        raise DescriptionError(str(cfg_path), [Problem(
            "stack", "stack-exists", f"no stack config {cfg_path.name}", stack)])
    cfg = yaml.safe_load(cfg_path.read_text()) or {}
    rel = (cfg.get("config") or {}).get(CONFIG_KEY)
    if not isinstance(rel, str):
        raise DescriptionError(str(cfg_path), [Problem(
            f"config.{CONFIG_KEY}", "description-path",
            "the stack config must name the pool description file", rel)])
    return (root / rel).resolve()


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += "(key)"
        else:
            out += f".{part}" if out else str(part)
    return out


def _problem(err: Any) -> Problem:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p and p != "[key]"))
    kind = err["type"]
    message = err["msg"]
    if kind == "string_pattern_mismatch":
        kind, message = _PATTERN_RULES.get(err["ctx"]["pattern"], (kind, message))
    elif kind == "value_error":
        message = message.removeprefix("Value error, ")
    return Problem(_path(loc) or "(top)", kind.replace("_", "-"), message, err.get("input"))


def _valid_sections(data: dict[str, Any]) -> tuple[Description, frozenset[str]]:
    """The well-typed top-level sections of an invalid description, as a partial model."""
    sections: dict[str, Any] = {}
    for name, field in Description.model_fields.items():
        if name not in data and field.is_required():
            continue
        try:
            annotation = (Annotated[field.annotation, *field.metadata] if field.metadata
                          else field.annotation)
            adapter: TypeAdapter[Any] = TypeAdapter(annotation)
            sections[name] = adapter.validate_python(data.get(name, field.default))
        except ValidationError:
            continue
    return Description.model_construct(**sections), frozenset(sections)


def parse(data: Any, source: str = "<description>") -> Description:
    """Validate data; raise DescriptionError listing every problem.

    Relational rules still run over the sections that are well-typed when others are not,
    so a single run reports everything that can be known.
    """
    try:
        desc = Description.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(e) for e in exc.errors()]
        if isinstance(data, dict):
            partial, valid = _valid_sections(data)
            problems += rules.check(partial, valid)
        raise DescriptionError(source, problems) from None
    problems = rules.check(desc)
    if problems:
        raise DescriptionError(source, problems)
    return desc


def load_file(path: Path) -> Description:
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except OSError as exc:
        raise DescriptionError(str(path), [Problem("(file)", "readable", exc.strerror or "",
                                                   str(path))]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(file)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise DescriptionError(str(path), [Problem(where, "yaml", problem, None)]) from None
    desc = parse(data, str(path))
    desc._source = path.resolve()
    return desc


def load_stack(stack: str, root: Path = PROJECT_ROOT) -> Description:
    return load_file(description_path(stack, root))
