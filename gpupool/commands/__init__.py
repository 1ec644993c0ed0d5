"""Subcommands of `gpupool`, one module each; importing a module registers its commands
with `gpupool.cli.command`."""
