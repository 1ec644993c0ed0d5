"""Hygiene: who pays for what (tags), and no secrets in plain config."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpupool.preview.aws_types import aws_taggable
from gpupool.render.cloud import names
from gpupool.render.lab_controls import weakened
from gpupool.spec.model import Description
from policies.core import Level, Res, Stack, resource_policy, stack_policy, tags_of

SECRET_KEY = re.compile(r"(pass(word|wd)?|secret|token|api[-_]?key|private[-_]?key|"
                        r"credential)", re.IGNORECASE)
# Values that are secrets whatever their key is called.
SECRET_VALUE = re.compile(r"(AKIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY-----|"
                          r"gh[pousr]_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9-]{10,})")


def taggable(r: Res) -> bool:
    if r.type.startswith("kubernetes:"):
        return "metadata" in r.props
    return aws_taggable(r.type)


@resource_policy("hygiene-cost-tags", "hygiene", Level.MANDATORY,
                 "Every taggable resource carries pool, team and cost-centre tags (labels "
                 "in Kubernetes) naming a declared team and its cost centre.")
def cost_tags(r: Res, desc: Description) -> Iterator[str]:
    if not taggable(r):
        return
    tags = tags_of(r)
    missing = [k for k in (names.TAG_POOL, names.TAG_TEAM, names.TAG_COST_CENTRE)
               if not tags.get(k)]
    if missing:
        yield f"missing tags: {', '.join(missing)}"
        return
    team = tags[names.TAG_TEAM]
    if tags[names.TAG_POOL] != desc.pool.name:
        yield f"pool tag {tags[names.TAG_POOL]} is not this pool ({desc.pool.name})"
    if team != names.SHARED and team not in desc.teams:
        yield f"team tag {team} names no declared team"
        return
    expected = desc.teams[team].cost_centre if team in desc.teams else desc.pool.cost_centre
    if tags[names.TAG_COST_CENTRE] != expected:
        yield (f"cost-centre tag {tags[names.TAG_COST_CENTRE]} is not {team}'s cost centre "
               f"{expected}")


@stack_policy("hygiene-no-plain-secrets", "hygiene", Level.MANDATORY,
              "Tokens, passwords and keys in stack config are Pulumi secrets, never plain.")
def plain_secrets(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    for key, (value, secret) in sorted(stack.config.items()):
        if secret or not isinstance(value, str) or not value:
            continue
        if SECRET_KEY.search(key.rsplit(":", 1)[-1]):
            yield None, (f"config {key} looks like a secret but is plain text; set it with "
                         "`pulumi config set --secret`")
        elif SECRET_VALUE.search(value):
            yield None, f"config {key} holds a credential in plain text; make it a secret"


@stack_policy("hygiene-lab-weakened-controls", "hygiene", Level.ADVISORY,
              "A lab description's stack is told, control by control, what the lab weakens "
              "against production (the list `gpupool validate` prints).")
def lab_weakened(stack: Stack, desc: Description) -> Iterator[tuple[str | None, str]]:
    for w in weakened(desc):
        yield None, f"lab weakens {w}"
