"""Entry point for the Pulumi CLI (`main: infra/` in Pulumi.yaml).

The stack config `gpupool:description` names the pool description; it is the only setting
the program reads (`gpupool:connection` is Ansible's), so every resource follows from
that file.
"""

import sys
from pathlib import Path

# The CLI runs this file by path; make the project root importable as for the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.program import main

main()
