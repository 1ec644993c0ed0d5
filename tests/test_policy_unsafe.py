"""A deliberately unsafe stack: SSH open to the world, unversioned checkpoints, spot
without checkpoints. Two layers stop it, and this test says which catches what:

- the description validator (gpupool validate) refuses an unsafe *description* first:
  admin CIDR 0.0.0.0/0 (admin-cidr-not-open) and spot without a checkpoints tier
  (spot-needs-checkpoints); it has no rule on versioning, so an unversioned checkpoints
  tier passes it;
- the policy pack judges *program inputs*, whatever produced them: here the lab stack's
  recorded resources (mocks fixture, tests/_pulumi.py) edited to be unsafe, and it
  reports all three.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool import cli
from gpupool.spec import loader
from policies.core import Level, Stack
from tests._policy import LAB_POLICY, drop, edit, recorded, violations
from tests.conftest import ROOT, mutate, raw_stack

SSH_RULE = "lab-eu-west-1-training-in-10-231-30-0_24-tcp-22"
UNSAFE_DESCRIPTION = [
    {"set": "network.admin_cidrs", "value": ["0.0.0.0/0"]},
    {"delete": "storage_tiers.checkpoints"},
]


def _unsafe_program_inputs() -> Stack:
    def no_checkpoint_writes(p: dict[str, Any]) -> None:
        doc = json.loads(p["policy"])
        doc["Statement"] = [s for s in doc["Statement"] if "Checkpoints" not in s["Sid"]]
        p["policy"] = json.dumps(doc)

    s = edit(recorded("lab"), ":SecurityGroupIngressRule", SSH_RULE,
             lambda p: p.update(cidrIpv4="0.0.0.0/0"))
    s = drop(s, ":BucketVersioning", "lab-checkpoints")
    return edit(s, "iam/policy:Policy", "lab-l4-burst-node", no_checkpoint_writes)


def test_validator_rejects_the_unsafe_description_first() -> None:
    with pytest.raises(loader.DescriptionError) as exc:
        loader.parse(mutate(raw_stack("lab"), UNSAFE_DESCRIPTION))
    # Without the checkpoints tier the lab's controller backups have no bucket, and its
    # two controllers no shared state, either.
    assert {p.rule for p in exc.value.problems} == {"admin-cidr-not-open",
                                                    "spot-needs-checkpoints",
                                                    "backup-tier-bucket",
                                                    "failover-state-shared"}


def test_validator_lets_unversioned_checkpoints_through() -> None:
    loader.parse(mutate(raw_stack("lab"), [
        {"set": "storage_tiers.checkpoints.versioning", "value": False}]))


def test_cli_policy_shows_the_validators_errors(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "unsafe.yaml"
    path.write_text(yaml.safe_dump(mutate(raw_stack("lab"), UNSAFE_DESCRIPTION)))
    assert cli.main(["policy", "--file", str(path)]) == 1
    err = capsys.readouterr().err
    assert "admin-cidr-not-open" in err
    assert "spot-needs-checkpoints" in err


def test_policy_pack_rejects_unsafe_program_inputs_with_all_three() -> None:
    found = violations(_unsafe_program_inputs(), "lab")
    mandatory = {(v.policy, v.message) for v in found if v.level == Level.MANDATORY}
    assert ("network-no-open-ingress",
            "ingress from 0.0.0.0/0 (the whole internet) to port 22") in mandatory
    assert ("storage-checkpoints-versioned",
            "checkpoints bucket lab-checkpoints-eu-west-1 is not versioned: an overwritten "
            "or deleted checkpoint cannot be recovered") in mandatory
    assert ("compute-spot-needs-checkpoints",
            "spot group l4-burst runs without checkpoints: its nodes may not write to the "
            "checkpoints bucket") in mandatory


def test_spot_without_any_checkpoints_bucket() -> None:
    s = recorded("lab")
    for type_ in (":Bucket", ":BucketVersioning", ":BucketLifecycleConfiguration",
                  ":BucketPublicAccessBlock", ":BucketOwnershipControls",
                  ":BucketServerSideEncryptionConfiguration"):
        s = drop(s, type_, "lab-checkpoints")
    found = [v.message for v in violations(s, "lab")
             if v.policy == "compute-spot-needs-checkpoints"]
    assert found == ["spot group l4-burst runs without checkpoints: no checkpoints bucket is "
                     "declared, so preempted work restarts from zero"]


def test_cli_policy_passes_shipped_stacks(capsys: pytest.CaptureFixture[str]) -> None:
    for stack in ("lab", "example"):
        assert cli.main(["policy", "--stack", stack, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        # A lab stack is told what the lab weakens (advisory, tests/test_lab_controls.py).
        assert data["passed"] is True and [v for v in data["violations"]
                                           if v["policy"] != LAB_POLICY] == []
        assert bool(data["violations"]) == (stack == "lab")
    assert (ROOT / "policies" / "PulumiPolicy.yaml").is_file()


def test_cli_report_groups_violations_by_resource(capsys: pytest.CaptureFixture[str]) -> None:
    from gpupool.cli.commands.policy import report  # noqa: PLC0415 - registers the command

    found = violations(_unsafe_program_inputs(), "lab")
    report(found)
    lines = capsys.readouterr().out.splitlines()
    headers = [line for line in lines if not line.startswith("  ")]
    assert headers == sorted(set(headers), key=lambda h: (h != "stack", h))
    assert len(headers) == len({v.resource for v in found})
    ssh = next(i for i, line in enumerate(lines) if line.endswith(SSH_RULE))
    below = lines[ssh + 1:ssh + 4]
    assert any("mandatory network-no-open-ingress: ingress from 0.0.0.0/0" in line
               for line in below), below
