"""Find, parse and validate a pool description.

The one place a stack's description lives: `Pulumi.<stack>.yaml` holds the config key
`gpupool:description`, a path (relative to the project root) to the description file.
The Pulumi program, the CLI and the tests all resolve it through `description_path`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import TypeAdapter, ValidationError

from gpupool.paths import PROJECT_ROOT
from gpupool.spec import rules
from gpupool.spec.errors import DescriptionError, Problem
from gpupool.spec.model import (
    DURATION_RE,
    MIG_PROFILE_RE,
    MOUNT_OPTION_RE,
    MOUNT_PATH_RE,
    MOUNT_SOURCE_RE,
    NAME_RE,
    USER_RE,
    VERSION_RE,
    Description,
)

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
    MOUNT_PATH_RE: ("mount-path", "must be an absolute path of plain names (letters, digits, "
                                  "'-', '_', '.'), without '//' or a trailing '/'"),
    MOUNT_SOURCE_RE: ("mount-source", "must be server:/export (NFS) or nid@net:/fsname "
                                      "(Lustre)"),
    MOUNT_OPTION_RE: ("mount-option", "must be a mount option such as noatime or vers=4.2"),
    MIG_PROFILE_RE: ("mig-profile-name", "must be a MIG profile name such as 1g.10gb or "
                                         "3g.40gb"),
}


# Limits on what a description file may cost to read, far above any real pool (a
# 3,000-node description is about 1 MB and 200,000 YAML nodes): past them the file is
# refused with one problem instead of exhausting memory or time.
MAX_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 64  # nested collections
MAX_EXPANDED_NODES = 2_000_000  # after anchors and aliases are expanded ("billion laughs")
MAX_NUMBER_CHARS = 64  # an integer's digits, signs and separators
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _DescriptionLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last of two), unhashable
    keys and nesting deeper than MAX_DEPTH, and accepts merge keys (`<<: *anchor`)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        # The composer recurses once per level: bound it before Python's stack is.
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nesting deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _FastDescriptionLoader(yaml.CSafeLoader):
    """The same loader on libyaml (PyYAML's C extension): ten times faster on a large pool.
    Its composer is native code, so nesting is bounded before it runs (_too_deep)."""


def _too_deep(text: str) -> yaml.Mark | None:
    """Where the document nests deeper than MAX_DEPTH, from libyaml's event stream (its
    parser keeps its own stack, so no depth overflows it); None when it does not."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.CSafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                return event.start_mark
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return None


def _construct_mapping(loader: yaml.SafeLoader | yaml.CSafeLoader, node: yaml.MappingNode
                       ) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:  # merged keys may be overridden; explicit ones not
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"a mapping key must be a plain value, not {type(key).__name__}",
                key_node.start_mark) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


def _construct_int(loader: yaml.SafeLoader | yaml.CSafeLoader, node: yaml.ScalarNode) -> int:
    # Python refuses to convert a decimal of more than 4,300 digits (a ValueError out of
    # PyYAML); no number in a description comes near MAX_NUMBER_CHARS.
    if len(str(node.value)) > MAX_NUMBER_CHARS:
        raise yaml.constructor.ConstructorError(
            None, None, f"a number of more than {MAX_NUMBER_CHARS} characters",
            node.start_mark)
    return int(yaml.SafeLoader.construct_yaml_int(loader, node))  # type: ignore[arg-type]


for _loader in (_DescriptionLoader, _FastDescriptionLoader):
    _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    _loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes the document has once aliases are expanded, without expanding them:
    each distinct node's size is computed once (aliases share node objects)."""
    sizes: dict[int, int] = {}
    order: list[yaml.Node] = []
    stack = [root]
    while stack:  # post-order without recursion
        node = stack.pop()
        if id(node) in sizes:
            continue
        sizes[id(node)] = 0
        order.append(node)
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(n for pair in node.value for n in pair)
    for node in reversed(order):
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
        if sizes[id(node)] > MAX_EXPANDED_NODES:
            return sizes[id(node)]
    return sizes[id(root)]


def read_yaml(path: Path) -> Any:
    """The YAML document in path, read within the limits above. Every way a file can be
    unreadable or hostile is a DescriptionError with one problem, never another exception."""
    def refuse(where: str, rule: str, message: str, value: Any = None) -> DescriptionError:
        return DescriptionError(str(path), [Problem(where, rule, message, value)])

    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise refuse("(file)", "readable", exc.strerror or str(exc), str(path)) from None
    if len(raw) > MAX_BYTES:
        raise refuse("(file)", "file-size", f"larger than {MAX_BYTES // (1024 * 1024)} MiB; "
                     "a pool description is far smaller")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise refuse("(file)", "encoding", f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at "
                     f"offset {exc.start} cannot be decoded") from None
    loader: _DescriptionLoader | _FastDescriptionLoader | None = None
    try:
        if yaml.__with_libyaml__:
            if (mark := _too_deep(text)) is not None:
                raise yaml.composer.ComposerError(
                    None, None, f"nesting deeper than {MAX_DEPTH} levels", mark)
            loader = _FastDescriptionLoader(text)
        else:
            loader = _DescriptionLoader(text)  # its reader already refuses some characters
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node)
        if size > MAX_EXPANDED_NODES:
            raise refuse("(file)", "yaml-aliases", "anchors and aliases expand to more than "
                         f"{MAX_EXPANDED_NODES:,} values", None)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}" if mark else "(file)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise refuse(where, "yaml", problem) from None
    finally:
        if loader is not None:
            loader.dispose()


def stack_config_path(stack: str, root: Path = PROJECT_ROOT) -> Path:
    return root / f"Pulumi.{stack}.yaml"


# Pulumi's stack names: no path separators, so a stack name never leaves the project.
STACK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def stacks(root: Path = PROJECT_ROOT) -> list[str]:
    """The stacks of the project: one Pulumi.<stack>.yaml each."""
    return sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml")
                  for p in root.glob("Pulumi.*.yaml"))


def description_path(stack: str, root: Path = PROJECT_ROOT) -> Path:
    if not STACK_RE.fullmatch(stack) or ".." in stack:
        raise DescriptionError(stack, [Problem(
            "stack", "stack-name", "a stack name is letters, digits, '.', '_' and '-'",
            stack)])
    cfg_path = stack_config_path(stack, root)
    if not cfg_path.is_file():
        known = ", ".join(stacks(root)) or "none"
        raise DescriptionError(str(cfg_path), [Problem(
            "stack", "stack-exists", f"no stack config {cfg_path.name} (stacks: {known})",
            stack)])
    cfg = read_yaml(cfg_path)
    config = cfg.get("config") if isinstance(cfg, dict) else None
    rel = config.get(CONFIG_KEY) if isinstance(config, dict) else None
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise DescriptionError(str(cfg_path), [Problem(
            f"config.{CONFIG_KEY}", "description-path",
            "the stack config must name the pool description file", rel)])
    # A stack config comes with a project, perhaps someone else's: it may name only a file
    # of that project, never one elsewhere on the machine (/etc/shadow's lines would come
    # back as problems). --file names any file, on its user's own word.
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise DescriptionError(str(cfg_path), [Problem(
            f"config.{CONFIG_KEY}", "description-path",
            "the description must be a file inside the project folder", rel)])
    return path


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
    value = None if kind == "missing" else err.get("input")  # the parent is no offender
    return Problem(_path(loc) or "(top)", kind.replace("_", "-"), message, value)


# C0 and C1 control characters (newline and tab included), and the Unicode line separators
# and bidirectional overrides that make text read differently from what it is. No value in
# a description needs them, and each could break out of a file it is written into.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


# Jinja's delimiters: every value reaches Ansible, which would evaluate them (a lookup
# runs commands on the control host). No value needs them; the files gpupool writes for
# Ansible also mark every string !unsafe (gpupool.render.ansible_yaml).
_TEMPLATE = re.compile(r"\{\{|\{%|\{#")


def control_characters(data: Any) -> list[Problem]:
    """A problem for every key or string value holding a control character or template
    syntax."""
    found: list[Problem] = []
    stack: list[tuple[tuple[int | str, ...], Any]] = [((), data)]
    while stack:
        loc, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and _CONTROL.search(k):
                    found.append(Problem(_path(loc) or "(top)", "control-character",
                                         "keys may not contain control characters", k))
                stack.append(((*loc, str(k)), v))
        elif isinstance(value, list):
            stack.extend(((*loc, i), v) for i, v in enumerate(value))
        elif isinstance(value, str) and (m := _CONTROL.search(value)):
            found.append(Problem(_path(loc) or "(top)", "control-character",
                                 f"contains control character U+{ord(m.group()):04X}; values "
                                 "are single-line text", value))
        if isinstance(value, str) and _TEMPLATE.search(value):
            found.append(Problem(_path(loc) or "(top)", "template-syntax",
                                 "may not contain {{, {% or {# (Ansible would evaluate it)",
                                 value))
        if isinstance(value, dict):
            found += [Problem(_path(loc) or "(top)", "template-syntax",
                              "keys may not contain {{, {% or {#", k)
                      for k in value if isinstance(k, str) and _TEMPLATE.search(k)]
    return found


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
    controls = control_characters(data)
    try:
        desc = Description.model_validate(data)
    except ValidationError as exc:
        problems = controls + [_problem(e) for e in exc.errors()]
        if isinstance(data, dict):
            partial, valid = _valid_sections(data)
            problems += rules.check(partial, valid)
        raise DescriptionError(source, problems) from None
    problems = controls + rules.check(desc)
    if problems:
        raise DescriptionError(source, problems)
    return desc


def load_file(path: Path) -> Description:
    desc = parse(read_yaml(path), str(path))
    desc._source = path.resolve()
    return desc


def load_stack(stack: str, root: Path = PROJECT_ROOT) -> Description:
    return load_file(description_path(stack, root))
