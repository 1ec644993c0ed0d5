"""Find, parse and validate a pool description.

The one place a stack's description lives: `Pulumi.<stack>.yaml` holds the config key
`gpupool:description`, a path (relative to the project root) to the description file.
The Pulumi program, the CLI and the tests all resolve it through `description_path`.
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from gpupool.paths import PROJECT_ROOT
from gpupool.spec import rules
from gpupool.spec.errors import CONTROL, DescriptionError, Problem, did_you_mean, printable, quoted
from gpupool.spec.model import (
    CUDA_RELEASE_RE,
    DEB_NAME_RE,
    DEB_VERSION_RE,
    DURATION_RE,
    IMAGE_NAME_RE,
    IMAGE_REF_RE,
    IMAGE_VERSION_RE,
    MIG_PROFILE_RE,
    MOUNT_OPTION_RE,
    MOUNT_PATH_RE,
    MOUNT_SOURCE_RE,
    NAME_RE,
    PYTHON_PIN_RE,
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
    IMAGE_NAME_RE: ("image-name", "must be a name an OCI registry takes: lowercase letters "
                                  "and digits, with single '.', '_' or '-' between them"),
    IMAGE_VERSION_RE: ("image-version", "must be MAJOR.MINOR.PATCH with an optional "
                                        "-pre-release, such as 1.4.0 or 2.0.0-rc.1"),
    IMAGE_REF_RE: ("image-reference", "must be an image reference [host[:port]/]repository "
                                      "with a :tag, an @sha256: digest or both, such as "
                                      "debian:trixie"),
    CUDA_RELEASE_RE: ("cuda-release", "must be a CUDA release major.minor[.patch], such as "
                                      "12.8 or 12.8.1"),
    DEB_NAME_RE: ("debian-package", "must be a Debian package name (lowercase letters, "
                                    "digits, '+', '-', '.')"),
    DEB_VERSION_RE: ("debian-version", "must be one exact Debian version "
                                       "[epoch:]upstream[-revision], such as 1:2.47.3-0+deb13u1"),
    PYTHON_PIN_RE: ("python-pin", "must be a Python package pinned to one exact version, "
                                  "name==version (no ranges, extras, markers or local "
                                  "versions)"),
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


def _at(mark: yaml.Mark) -> str:
    """Where a mark is, as people count: "line 3, column 1"."""
    return f"line {mark.line + 1}, column {mark.column + 1}"


# What a key that is not a plain value is, in YAML's words (PyYAML builds a list or dict).
_KINDS = {"list": "a list", "dict": "a mapping"}


def _construct_mapping(loader: yaml.SafeLoader | yaml.CSafeLoader, node: yaml.MappingNode
                       ) -> dict[Any, Any]:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:  # merged keys may be overridden; explicit ones not
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:
            kind = _KINDS.get(type(key).__name__, "a collection")
            raise yaml.constructor.ConstructorError(
                None, None, f"a mapping key must be a plain value, not {kind}",
                key_node.start_mark) from None
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {quoted(key)} (first at {_at(first)}); a key may "
                "appear only once in a mapping", key_node.start_mark)
        seen[key] = key_node.start_mark
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


TAB_MESSAGE = "tabs are not allowed for indentation in YAML; use spaces"
# PyYAML's names of tokens, which its pure-Python parser quotes: "but got '<stream end>'".
_TOKEN = re.compile(r"'?<([a-z ]+)>'?")


def _position(text: str, position: int, character: int) -> str:
    """Where a reader error is: PyYAML counts characters, libyaml may count bytes."""
    if 0 <= position < len(text) and text[position] == chr(character):
        before = text[:position]
    else:
        before = text.encode("utf-8")[:position].decode("utf-8", "ignore")
    newline = "\n"
    column = len(before) - (before.rfind(newline) + 1) + 1
    return f"line {before.count(newline) + 1}, column {column}"


def _yaml_problem(exc: yaml.YAMLError, text: str) -> tuple[str, str]:
    """Where a YAML error is ("line 3, column 1") and what it is, in one plain message:
    no Python repr, none of PyYAML's quoting of the source, and a tab named as a tab."""
    if isinstance(exc, yaml.reader.ReaderError):
        return (_position(text, exc.position, exc.character),
                f"character U+{exc.character:04X} is not allowed in YAML")
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if mark is None or not problem:
        return "(file)", printable(str(exc).splitlines()[0] if str(exc) else "not YAML", 500)
    line = text.split("\n", mark.line + 1)[mark.line] if text.count("\n") >= mark.line else ""
    if line[mark.column:mark.column + 1] == "\t" or ("tab" in problem and "\t" in line):
        column = mark.column if line[mark.column:mark.column + 1] == "\t" else line.index("\t")
        return f"line {mark.line + 1}, column {column + 1}", TAB_MESSAGE
    message = _TOKEN.sub(lambda m: "the end of the file" if m.group(1) == "stream end"
                         else m.group(1), problem)
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and context_mark is not mark and (
            context_mark.line, context_mark.column) != (mark.line, mark.column):
        message += f" ({context} at {_at(context_mark)})"
    return _at(mark), printable(message, 500)


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
        where, message = _yaml_problem(exc, text)
        raise refuse(where, "yaml", message) from None
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


def _unwrap(annotation: Any) -> Any:
    """The type under Annotated[...] and an optional's `| None`."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        else:
            return annotation


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model whose mapping sits at loc (an error's place) below model, if one does:
    fields by name or alias, a mapping's values by any key, a list's items by index."""
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = next((f for n, f in annotation.model_fields.items()
                          if part in (n, f.alias)), None)
            if field is None:
                return None
            annotation = field.annotation
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        elif typing.get_origin(annotation) is list and isinstance(part, int):
            annotation = typing.get_args(annotation)[0]
        else:
            return None
    annotation = _unwrap(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) \
        else None


def _keys_of(model: type[BaseModel]) -> list[str]:
    """The keys a description writes for model's fields (an alias where there is one:
    `class`, not `class_`), in the model's order."""
    return [f.alias or n for n, f in model.model_fields.items()]


def _what(value: Any) -> str:
    """What a value is, in YAML's words."""
    if value is None:
        return "empty"
    if isinstance(value, list | tuple):
        return "a list"
    return "a mapping" if isinstance(value, dict) else "a single value"


def _place(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """An error's place without pydantic's own parts (a validator's "function-after[...]")."""
    return tuple(p for p in loc if not (isinstance(p, str) and "[" in p and p != "[key]"))


def _problem(err: Any, model: type[BaseModel] | None = None) -> Problem:
    """A pydantic error as a problem. With the model validated (Description), a mistyped
    key names the key meant and a misshapen section the keys it takes."""
    loc = _place(err["loc"])
    kind = err["type"]
    message = err["msg"]
    if kind == "string_pattern_mismatch":
        kind, message = _PATTERN_RULES.get(err["ctx"]["pattern"], (kind, message))
    elif kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif kind == "missing":
        message = "a required field is missing"
    elif kind == "extra_forbidden":
        # The unknown key is the last part, whatever it holds ("[" included).
        loc = (*_place(err["loc"][:-1]), err["loc"][-1])
        parent = _model_at(model, loc[:-1]) if model is not None else None
        allowed = _keys_of(parent) if parent is not None else []
        hint = did_you_mean(loc[-1], allowed)
        message = ("unknown field; " + (hint or f"expected one of: {', '.join(allowed)}")
                   if allowed else "unknown field")
    elif kind == "model_type":
        here = _model_at(model, loc) if model is not None else None
        keys = ", ".join(_keys_of(here)) if here is not None else ""
        if not loc and keys:
            # The whole file: empty, or a list or a single value where the pool belongs.
            what = {"empty": "the file is empty (or holds only comments)",
                    "a list": "the top level is a list"}.get(
                _what(err.get("input")), "the top level is a single value")
            message = f"{what}; expected a pool description: a mapping with the keys {keys}"
        else:
            message = (f"expected a mapping{' with the keys ' + keys if keys else ''}; "
                       f"it is {_what(err.get('input'))}")
    elif kind == "dict_type":
        message = f"expected a mapping; it is {_what(err.get('input'))}"
    elif kind == "list_type":
        message = f"expected a list; it is {_what(err.get('input'))}"
    elif kind == "bool_type":
        message = "expected true or false (unquoted)"
    value = None if kind == "missing" else err.get("input")  # the parent is no offender
    return Problem(_path(loc) or "(top)", kind.replace("_", "-"), message, value)


# Control characters (errors.CONTROL): no value in a description needs them, and each could
# break out of a file it is written into.
_CONTROL = CONTROL


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
        problems = controls + [_problem(e, Description) for e in exc.errors()]
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
