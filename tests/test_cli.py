"""The command line's entry point loads only the verb it runs."""

from __future__ import annotations

import pytest

from bench.cli_startup import VERBS, heavy_modules
from gpupool.cli import registry


@pytest.mark.parametrize("verb", VERBS)
def test_light_verbs_load_no_heavy_library(verb: str) -> None:
    # Pulumi and matplotlib cost about a second; these verbs need neither.
    assert heavy_modules(verb) == []


def test_every_verb_module_registers_its_verb() -> None:
    registry.load(None)
    assert set(registry.COMMANDS) == set(registry.VERBS)


def test_a_verb_missing_from_the_map_is_refused() -> None:
    with pytest.raises(ValueError, match="VERBS"):
        registry.command("frobnicate", "not a verb")
