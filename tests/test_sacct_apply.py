"""gpupool/onhost/sacct_apply.py against a stand-in sacctmgr on PATH (a FIXTURE:
it answers the queries the script makes from canned accounting and logs what it is asked to
change): team limits converge to the plan, including limits the plan no longer holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

SCRIPT = ROOT / "gpupool" / "onhost" / "sacct_apply.py"
FAKE = """#!{python}
import sys
args = sys.argv[1:]
if args[:2] == ["-i", "modify"] or args[:1] == ["modify"]:
    open({log!r}, "a").write(" ".join(args) + "\\n")
elif "tres" in args:
    print("gres|gpu\\ngres|gpu:l4\\ngres|gpu:1g.10gb")
elif "assoc" in args:
    print({assoc!r})
"""


def apply(tmp_path: Path, grptres_now: str, limits: dict[str, str], *flags: str
          ) -> tuple[dict, list[str]]:
    log = tmp_path / "changes.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "sacctmgr"
    fake.write_text(FAKE.format(python=sys.executable, log=str(log),
                                assoc=f"vision||{grptres_now}"))
    fake.chmod(0o755)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"cluster": "lab", "tres": ["gres/gpu", "gres/gpu:l4"],
                                "limits": [{"account": "vision", "GrpTRES": v}
                                           for v in limits.values()]}))
    proc = subprocess.run([sys.executable, str(SCRIPT), str(plan), "--phase", "limits",
                           *flags], capture_output=True, text=True, timeout=60, check=True,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    changes = log.read_text().splitlines() if log.exists() else []
    return json.loads(proc.stdout), changes


def test_a_limit_no_longer_planned_is_cleared(tmp_path: Path) -> None:
    result, changes = apply(tmp_path, "gres/gpu:1g.10gb=2,gres/gpu:l4=16,gres/gpu=16",
                            {"vision": "gres/gpu=16,gres/gpu:l4=16"})
    assert result["changed"]
    assert changes == ["-i modify account where name=vision cluster=lab set "
                       "GrpTRES=gres/gpu=16,gres/gpu:l4=16,gres/gpu:1g.10gb=-1"]


def test_limits_as_planned_change_nothing(tmp_path: Path) -> None:
    result, changes = apply(tmp_path, "gres/gpu:l4=16,gres/gpu=16",
                            {"vision": "gres/gpu=16,gres/gpu:l4=16"})
    assert result == {"changed": False, "actions": []} and changes == []


def test_check_mode_reports_without_changing(tmp_path: Path) -> None:
    result, changes = apply(tmp_path, "gres/gpu=4", {"vision": "gres/gpu=16"}, "--check")
    assert result["changed"] and changes == []
