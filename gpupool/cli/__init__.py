"""The command line, top layer: `main` (the `gpupool` entry point), the verb registry, the
console helpers, and one module per verb in `commands/`."""

from gpupool.cli.main import build_parser, main
from gpupool.cli.output import EXIT_INTERNAL, EXIT_INVALID, EXIT_OK, EXIT_USAGE
from gpupool.cli.registry import COMMANDS

__all__ = ["COMMANDS", "EXIT_INTERNAL", "EXIT_INVALID", "EXIT_OK", "EXIT_USAGE", "build_parser",
           "main"]
