"""What the Pulumi CLI checks when it loads a project and its stacks, for the tests.

Pulumi's own project schema (gpupool/data/pulumi/project.json, vendored from pulumi/pulumi;
its SOURCE.md names the commit) is checked with jsonschema; the rules the schema cannot
say are re-implemented here from Pulumi's Go code at that commit, each citing it:

- project_problems: `ValidateProject` (the schema, sdk/go/common/workspace/project.go),
  then `Project.Validate` (same file: config keys not namespaced by the project), and
  `tokens.ValidateProjectName` (sdk/go/common/tokens/project.go).
- stack_problems: `config.ParseKey` (sdk/go/common/resource/config/key.go) for each key
  of a Pulumi.<stack>.yaml, and `mergeConfig` (pkg/workspace/config.go) for a project key
  the stack must set.

Each returns Pulumi's message for every problem found ([] when Pulumi loads the file).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import jsonschema

from tests.conftest import ROOT

SCHEMA_PATH = ROOT / "gpupool" / "data" / "pulumi" / "project.json"
# tokens.NameRegexpPattern (sdk/go/common/tokens/names.go) and the 100-character limit
# of tokens.ValidateProjectName.
PROJECT_NAME_RE = re.compile(r"[A-Za-z0-9_.-][A-Za-z0-9_.-]*")
PROJECT_NAME_MAX = 100


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def project_name_problems(name: str) -> list[str]:
    """tokens.ValidateProjectName, its messages (`pulumi new` refuses such a name)."""
    if name == "":
        return ["project names may not be empty"]
    if len(name.encode()) > PROJECT_NAME_MAX:  # Go's len counts UTF-8 bytes
        return ["project names are limited to 100 characters"]
    if not PROJECT_NAME_RE.fullmatch(name):
        return ["project names may only contain alphanumerics, hyphens, underscores, and "
                "periods"]
    return []


def namespaced_by_project(project: str, key: str) -> bool:
    """configKeyIsNamespacedByProject (sdk/go/common/workspace/project.go)."""
    return ":" not in key or key.startswith(project + ":")


def project_problems(project: Any) -> list[str]:
    """What loading this Pulumi.yaml (parsed) would refuse."""
    if not isinstance(project, dict):
        return [f"expected project to be an object, was {type(project).__name__}"]
    name = project.get("name")
    if not isinstance(name, str) or not name:
        return ["project is missing a non-empty string 'name' attribute"]
    problems = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in _validator().iter_errors(project)]
    problems += project_name_problems(name)
    config = project.get("config")
    if not isinstance(config, dict):
        return problems
    for key, given in config.items():
        if key == "secret" and isinstance(given, bool):
            continue
        own = namespaced_by_project(name, key)
        # RewriteShorthandConfigValues: a bare value is the project's default or a value.
        decl = given if isinstance(given, dict) else (
            {"default": given} if own else {"value": given})
        if "default" in decl and "value" in decl:
            problems.append(f"project config '{key}' cannot have both a 'default' and "
                            "'value' attribute")
        elif own:
            if decl.get("type") == "array" and "items" not in decl:
                problems.append(f"The configuration key '{key}' declares an array but does "
                                "not specify the underlying type via the 'items' attribute")
        elif "type" in decl:
            problems.append(f"Configuration key '{key}' is not namespaced by the project "
                            "and should not define a type")
        elif "default" in decl:
            problems.append(f"Configuration key '{key}' is not namespaced by the project "
                            "and should not define a default value. Did you mean to use "
                            "the 'value' attribute instead of 'default'?")
        elif "value" not in decl:
            problems.append(f"Configuration key '{key}' is namespaced and must provide an "
                            "attribute 'value'")
    return problems


def _parse_key(key: str) -> tuple[str, str] | None:
    """config.ParseKey: `<namespace>:<name>`, or the old `<namespace>:config:<name>`."""
    parts = key.split(":")
    if len(parts) == 2:
        return parts[0], parts[1]
    if len(parts) == 3 and parts[1] == "config":
        return parts[0], parts[2]
    return None


def stack_problems(stack: Any, project: dict[str, Any]) -> list[str]:
    """What loading this Pulumi.<stack>.yaml (parsed) under the project would refuse."""
    if stack is None:
        stack = {}
    if not isinstance(stack, dict):
        return [f"a stack file is a mapping, not {type(stack).__name__}"]
    config = stack.get("config") or {}
    if not isinstance(config, dict):
        return ["the stack's config is a mapping"]
    problems, keys = [], set()
    for key in config:
        parsed = _parse_key(str(key))
        if parsed is None:
            problems.append(f"could not parse {key} as a configuration key (configuration "
                            "keys should be of the form `<namespace>:<name>`)")
        else:
            keys.add(parsed)
    name = project["name"]
    declared = project.get("config")
    declared = declared if isinstance(declared, dict) else {}
    for key, decl in declared.items():
        # parseConfigKey: an unqualified project key is in the project's namespace.
        namespace, _, short = key.rpartition(":")
        namespace = namespace or name
        required = isinstance(decl, dict) and "default" not in decl and "value" not in decl
        if required and namespace == name and (namespace, short) not in keys:
            problems.append(f"Stack is missing configuration value '{namespace}:{short}'")
    return problems
