"""The CrossGuard policy pack: `pulumi preview --policy-pack policies`.

Only builds the pack (which serves it to the Pulumi CLI); the policies themselves live in
the importable modules beside this file and run offline too (`gpupool policy`).
"""

import sys
from pathlib import Path

# The CLI runs this file by path; make the project root importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack

from policies.pack import crossguard_policies

PolicyPack(name="gpupool", enforcement_level=EnforcementLevel.MANDATORY,
           policies=crossguard_policies())
