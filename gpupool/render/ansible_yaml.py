"""YAML that Ansible reads (inventories, variable files), with every string value that
holds a `{` marked `!unsafe`: Ansible then never evaluates template syntax that came from a
description, whatever validation let through. A string without `{` holds none (Jinja's
delimiters all start with it) and is written as it is. Keys stay plain (Ansible does not
evaluate host, group or variable names), and so do templates gpupool writes itself
(Template: never one that holds a description's text), and Ansible's connection variables
(`ansible_*`): tools that read the inventory through `ansible-inventory --list`, testinfra
among them, take those as plain strings; gpupool.spec.connection constrains them."""

from __future__ import annotations

from typing import Any

import yaml


class _Unsafe(str):
    __slots__ = ()


class Template(str):
    """A template gpupool wrote (no description text in it): Ansible evaluates it."""

    __slots__ = ()


class _Dumper(yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper):  # type: ignore[misc]
    pass


_Dumper.add_representer(
    _Unsafe, lambda dumper, value: dumper.represent_scalar("!unsafe", str(value)))


def _mark(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v if isinstance(k, str) and k.startswith("ansible_") else _mark(v)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_mark(v) for v in value]
    if isinstance(value, Template):
        return str(value)
    return _Unsafe(value) if isinstance(value, str) and "{" in value else value


def dump(data: Any) -> str:
    """data as YAML in its own key order, string values with a `{` tagged !unsafe."""
    return yaml.dump(_mark(data), Dumper=_Dumper, sort_keys=False)


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def load(text: str) -> Any:
    """What dump wrote, read back with plain strings (for gpupool's own readers)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader that knows !unsafe
