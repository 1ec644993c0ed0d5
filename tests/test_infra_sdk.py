"""infra.sdk: the program loads only the SDK modules it uses, and a partial package still
gives every other name. Each check runs in a fresh interpreter: this one may already have
loaded the packages whole."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_the_program_and_the_policy_pack_use_only_preloaded_modules() -> None:
    # A package completed during a plan or a policy run means MODULES lacks a module the
    # program uses: right answers still, but every plan pays for the whole package.
    out = _python(
        "import sys\n"
        "from gpupool.preview import plan\n"
        "from gpupool.spec import loader\n"
        "from infra import sdk\n"
        "from policies import offline\n"
        "desc = loader.load_stack('example')\n"
        "offline.check(plan.declare(desc, 'example'), desc)\n"
        "print(sorted(p for p in sdk.MODULES if '__getattr__' not in vars(sys.modules[p])))\n")
    assert out == "[]"


def test_a_partial_package_completes_on_any_other_name_keeping_its_classes() -> None:
    out = _python(
        "import sys\n"
        "from infra import sdk\n"
        "sdk.preload()\n"
        "import pulumi_aws as aws\n"
        "import pulumi_kubernetes as k8s\n"
        "vpc, ns = aws.ec2.Vpc, k8s.core.v1.Namespace\n"
        "assert '__getattr__' in vars(aws.ec2) and 'Instance' not in vars(aws.ec2)\n"
        "assert aws.ec2.Instance.__module__ == 'pulumi_aws.ec2.instance'\n"
        "assert '__getattr__' not in vars(aws.ec2) and aws.ec2.Vpc is vpc\n"
        "from pulumi_kubernetes.core.v1 import Pod\n"
        "assert k8s.core.v1.Namespace is ns and sys.modules['pulumi_aws.ec2'] is aws.ec2\n"
        "try:\n"
        "    aws.s3.NoSuchThing\n"
        "except AttributeError:\n"
        "    print('ok')\n")
    assert out == "ok"
