"""Run the policies without the Pulumi CLI: over what the program declares under mocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpupool.paths import PROJECT_ROOT
from gpupool.preview.pulumi_mock import Run
from gpupool.spec import loader
from gpupool.spec.model import Description
from policies.catalog import evaluate
from policies.core import Res, Stack, Violation


def stack_config(stack: str, root: Path = PROJECT_ROOT) -> dict[str, tuple[Any, bool]]:
    """A stack's config from Pulumi.<stack>.yaml: key -> (value, is a Pulumi secret)."""
    path = loader.stack_config_path(stack, root)
    if not path.is_file():
        return {}
    config = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    return {k: ((v["secure"], True) if isinstance(v, dict) and "secure" in v else (v, False))
            for k, v in config.items()}


def program_config(config: dict[str, tuple[Any, bool]]) -> dict[str, str]:
    """The plain values of a stack's config, as the program reads them (a secret's value
    here is ciphertext, which the program never reads)."""
    return {k: v for k, (v, secret) in config.items() if isinstance(v, str) and not secret}


def as_stack(run: Run, config: dict[str, tuple[Any, bool]] | None = None) -> Stack:
    return Stack([Res(r.type, r.name, r.urn, r.inputs) for r in run.resources], config or {})


def check(run: Run, desc: Description, config: dict[str, tuple[Any, bool]] | None = None
          ) -> list[Violation]:
    return evaluate(as_stack(run, config), desc)
