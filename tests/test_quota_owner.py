"""Issue 55: gpupool/render/scheduling.py owns teams' quotas. It is the one renderer that
reads a team's quota, borrowing limit or MIG quota from the description and the one place
the fair-share formula is written; Kueue's ClusterQueues and namespace ceilings, Slurm's
accounts and limits, the summary and the policies take their values from it. That the
two schedulers then agree on each team's share is tests/test_scheduler_agreement.py's
test_each_teams_share_agrees."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

# The description's quota fields (gpupool/spec/model.py, Team).
QUOTA_FIELDS = {"quota", "borrowing_limit", "mig_quota"}
SCANNED = ("gpupool/render", "gpupool/cli", "gpupool/workload", "gpupool/exercise", "gpupool/lab",
           "gpupool/preview", "infra", "policies")
# The one module allowed to read them.
OWNERS = {"gpupool/render/scheduling.py"}


def quota_reads(source: str) -> list[tuple[int, str]]:
    """(line, field) for every `x.quota`-style attribute and getattr(x, "quota")."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in QUOTA_FIELDS:
            out.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in QUOTA_FIELDS):
            out.append((node.lineno, str(node.args[1].value)))
    return sorted(out)


def scanned_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py")
                  if "__pycache__" not in p.parts)


def test_the_scan_sees_the_owner_and_catches_a_reader() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert files >= OWNERS
    assert {"gpupool/render/k8s_objects.py", "gpupool/render/slurm.py",
            "policies/cluster.py"} <= files
    owner = (ROOT / "gpupool/render/scheduling.py").read_text()
    assert {f for _, f in quota_reads(owner)} == QUOTA_FIELDS
    assert quota_reads("ceiling = sum(t.quota.values()) + getattr(t, 'borrowing_limit')\n"
                       "x = desc.teams[a].mig_quota\n") == [
        (1, "borrowing_limit"), (1, "quota"), (2, "mig_quota")]


def test_only_scheduling_reads_quotas_from_the_description() -> None:
    offenders = [f"{p.relative_to(ROOT).as_posix()}:{line}: .{field}"
                 for p in scanned_files() if p.relative_to(ROOT).as_posix() not in OWNERS
                 for line, field in quota_reads(p.read_text())]
    assert not offenders, ("read teams' quotas through gpupool.render.scheduling "
                           "(team_share / team_quotas), not the description:\n"
                           + "\n".join(offenders))
