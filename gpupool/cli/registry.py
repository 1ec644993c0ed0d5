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

# verb -> (its module under gpupool.cli.commands, its one line in `gpupool --help`). The
# lines are here, not in the modules, so `gpupool --help`, `--version` and a mistyped verb
# import no verb's module (nor the extra it needs).
VERBS = {
    "validate": ("validate", "check the description; report every problem at once"),
    "show": ("show", "a readable summary: capacity, segments, quotas and classes"),
    "images": ("images", "the environment images: digests, references, Containerfiles"),
    "inventory": ("inventory", "the Ansible inventory derived from the description"),
    "plan": ("plan", "run the Pulumi program under mocks; show what it declares"),
    "policy": ("policy", "run the policy pack offline over what the program declares"),
    "slurm": ("slurm", "the Slurm policy rendered from the description"),
    "audit": ("audit", "workload audit from job history: durations, demand, GPUs needed"),
    "lab": ("lab", "bring the local podman lab pool up or down, or show its state"),
    "gate": ("gate", "run the acceptance gate on nodes and decide pass / fail"),
    "drill": ("drill", "run failure drills on the lab's Slurm and record their figures"),
    "replay": ("replay", "replay a job trace on the lab's Slurm: gpupool policy vs baseline"),
    "init": ("init", "create a new pool project in DIR"),
    "schema": ("schema", "the description's JSON Schema (for editors), or its field reference"),
    "playbook": ("playbook", "run one of gpupool's playbooks in the project, or list them"),
}
# The extra (pyproject.toml) that brings each optional top-level module.
EXTRAS = {"pulumi": "cloud", "pulumi_aws": "cloud", "pulumi_kubernetes": "cloud",
          "pulumi_policy": "cloud", "jsonschema": "cloud", "kubernetes_validate": "cloud",
          "ansible": "lab", "ansible_collections": "lab", "matplotlib": "report",
          "pytest": "gate", "testinfra": "gate"}
# Verbs that read the description and files, compute, write and exit within seconds (the
# others wait on hosts for minutes). Their objects live until they end and hold few
# cycles, so they run without the cyclic collector (cli.main.run): its passes over a
# 3,000-node pool's objects freed nothing and made `inventory` grow faster than the pool
# (2.8 CPU-s at 1,000 nodes, 10.2 at 3,000; without them 1.7 and 4.8).
BATCH = frozenset({"validate", "show", "images", "inventory", "plan", "policy", "slurm", "audit"})

Handler = Callable[[argparse.Namespace, Description], int]
PlainHandler = Callable[[argparse.Namespace], int]
Setup = Callable[[argparse.ArgumentParser], None]
COMMANDS: dict[str, tuple[str, Handler, Setup]] = {}
# Verbs that work without a description (creating a project).
PLAIN: dict[str, tuple[str, PlainHandler, Setup]] = {}
# Verbs whose module could not be imported for want of an extra: verb -> (extra, module).
MISSING: dict[str, tuple[str, str]] = {}


def _no_arguments(p: argparse.ArgumentParser) -> None:
    """The verb takes only the common --stack/--file/--json arguments."""


def _known(name: str) -> None:
    if name not in VERBS:
        raise ValueError(f"verb {name!r} is missing from gpupool.cli.registry.VERBS")


def command(name: str, setup: Setup = _no_arguments) -> Callable[[Handler], Handler]:
    """Register a subcommand that works on a validated description."""
    _known(name)

    def wrap(fn: Handler) -> Handler:
        COMMANDS[name] = (VERBS[name][1], fn, setup)
        return fn

    return wrap


def plain_command(name: str, setup: Setup) -> Callable[[PlainHandler], PlainHandler]:
    """Register a subcommand that needs no description."""
    _known(name)

    def wrap(fn: PlainHandler) -> PlainHandler:
        PLAIN[name] = (VERBS[name][1], fn, setup)
        return fn

    return wrap


def extra_of(exc: BaseException) -> str | None:
    """The extra whose absence the exception is, if it is a missing optional module."""
    if not isinstance(exc, ModuleNotFoundError):
        return None
    return EXTRAS.get((exc.name or "").split(".")[0])


def load(wanted: str | None) -> None:
    """Import the wanted verb's module, or every verb's when wanted is None (tests, the
    runbooks' check). A module that needs a missing extra is not registered: MISSING says
    which extra (the parser then gives the verb a help that names it)."""
    for verb in [wanted] if wanted is not None else list(VERBS):
        if verb in COMMANDS or verb in PLAIN:
            continue
        module = VERBS[verb][0]
        try:
            importlib.import_module(f"gpupool.cli.commands.{module}")
        except ModuleNotFoundError as exc:
            extra = extra_of(exc)
            if extra is None:
                raise
            MISSING[verb] = (extra, exc.name or "")
