"""Issue 50, roles mean what they say: who administers the pool, and where researchers get
a shell, are said in the description and checked there."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.spec import loader
from gpupool.spec.errors import DescriptionError
from tests.conftest import mutate, raw_stack


def _problems(stack: str, ops: list[dict[str, Any]]) -> set[tuple[str, str]]:
    try:
        loader.parse(mutate(raw_stack(stack), ops))
    except DescriptionError as e:
        return {(p.path, p.rule) for p in e.problems}
    return set()


def test_the_shipped_stacks_name_their_operators_and_their_controller_logins() -> None:
    assert loader.parse(raw_stack("example")).pool.operators == ["kim", "lee"]
    lab = loader.parse(raw_stack("lab"))
    assert lab.pool.operators == [] and lab.pool.controller_login


@pytest.mark.parametrize(("operators", "expected"), [
    # A researcher, an on-call engineer and a name no team lists are no operators.
    (["alice"], {("pool.operators[0]", "operator-is-admin")}),
    (["kim", "olga"], {("pool.operators[1]", "operator-is-admin")}),
    (["nobody"], {("pool.operators[0]", "operator-is-admin")}),
    (["kim", "kim"], {("pool.operators", "operator-unique")}),
    (["root; ALL"], {("pool.operators[0]", "user-name")}),
    (["kim", "lee"], set()),
])
def test_a_pool_operator_is_a_teams_admin(operators: list[str],
                                          expected: set[tuple[str, str]]) -> None:
    assert _problems("example", [{"set": "pool.operators", "value": operators}]) == expected


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_a_controller_is_a_login_host_only_where_the_pool_says_so(stack: str) -> None:
    name = next(n for n, node in raw_stack(stack)["nodes"].items()
                if {"controller", "login"} <= set(node.get("roles", [])))
    assert _problems(stack, [{"delete": "pool.controller_login"}]) == {
        (f"nodes.{name}.roles", "controller-login-declared")}
    split = [{"delete": "pool.controller_login"},
             {"set": f"nodes.{name}.roles", "value": ["controller"]}]
    assert not any(rule == "controller-login-declared" for _, rule in _problems(stack, split))
