"""The verbs of `gpupool`: which module implements each, and the decorator that registers it.

The map is explicit so the entry point imports only the verb it runs: a GPU node running
`gpupool gate --local` has only the gate's packages, and `validate` should not pay for
Pulumi or matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from gpupool.spec.model import Description

# verb -> module under gpupool.cli.commands
VERBS = {
    "validate": "validate", "show": "show", "inventory": "inventory",
    "plan": "plan", "policy": "policy", "slurm": "slurm", "audit": "audit",
    "lab": "lab", "gate": "gate", "drill": "drill", "replay": "replay", "init": "init",
}
# Verbs that read the description and files, compute, write and exit within seconds (the
# others wait on hosts for minutes). Their objects live until they end and hold few
# cycles, so they run without the cyclic collector (cli.main.run): its passes over a
# 3,000-node pool's objects freed nothing and made `inventory` grow faster than the pool
# (2.8 CPU-s at 1,000 nodes, 10.2 at 3,000; without them 1.7 and 4.8).
BATCH = frozenset({"validate", "show", "inventory", "plan", "policy", "slurm", "audit"})

Handler = Callable[[argparse.Namespace, Description], int]
PlainHandler = Callable[[argparse.Namespace], int]
Setup = Callable[[argparse.ArgumentParser], None]
COMMANDS: dict[str, tuple[str, Handler, Setup]] = {}
# Verbs that work without a description (creating a project).
PLAIN: dict[str, tuple[str, PlainHandler, Setup]] = {}


def _no_arguments(p: argparse.ArgumentParser) -> None:
    """The verb takes only the common --stack/--file/--json arguments."""


def _known(name: str) -> None:
    if name not in VERBS:
        raise ValueError(f"verb {name!r} is missing from gpupool.cli.registry.VERBS")


def command(name: str, help_: str, setup: Setup = _no_arguments) -> Callable[[Handler], Handler]:
    """Register a subcommand that works on a validated description."""
    _known(name)

    def wrap(fn: Handler) -> Handler:
        COMMANDS[name] = (help_, fn, setup)
        return fn

    return wrap


def plain_command(name: str, help_: str, setup: Setup) -> Callable[[PlainHandler], PlainHandler]:
    """Register a subcommand that needs no description."""
    _known(name)

    def wrap(fn: PlainHandler) -> PlainHandler:
        PLAIN[name] = (help_, fn, setup)
        return fn

    return wrap


def load(wanted: str | None) -> None:
    """Import the wanted verb's module, or every verb's when it is not a known verb (help,
    a typo: argparse then lists them all)."""
    for verb in [wanted] if wanted in VERBS else list(VERBS):
        importlib.import_module(f"gpupool.cli.commands.{VERBS[verb]}")
