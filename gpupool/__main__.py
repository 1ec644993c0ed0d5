"""`python -m gpupool`: the command line without an installed entry point (a GPU host
running the gate from a checkout)."""

import sys

from gpupool.cli import main

sys.exit(main())
