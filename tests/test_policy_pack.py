"""The CrossGuard pack runs the same policy functions as the offline runner."""

from __future__ import annotations

import pytest
import yaml
from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
)

from policies import pack
from policies.catalog import POLICIES
from policies.core import STACK, Level, Stack
from tests._policy import recorded, violations
from tests.conftest import ROOT
from tests.test_policy_unsafe import _unsafe_program_inputs


@pytest.fixture
def lab_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pack finds the description as under `pulumi preview` on stack lab."""
    monkeypatch.setenv("PULUMI_STACK", "lab")
    monkeypatch.delenv("PULUMI_CONFIG", raising=False)
    pack.description.cache_clear()
    pack.config.cache_clear()


def test_pack_project_file() -> None:
    data = yaml.safe_load((ROOT / "policies" / "PulumiPolicy.yaml").read_text())
    assert data["runtime"]["name"] == "python"
    assert (ROOT / "policies" / data["runtime"]["options"]["virtualenv"]).resolve() == (
        ROOT / ".venv").resolve()


def test_pack_levels_match() -> None:
    policies = pack.crossguard_policies()
    assert [p.name for p in policies] == list(POLICIES)
    for p in policies:
        want = (EnforcementLevel.MANDATORY if POLICIES[p.name].level is Level.MANDATORY
                else EnforcementLevel.ADVISORY)
        assert p.enforcement_level == want


def crossguard_run(stack: Stack) -> set[tuple[str, str, str]]:
    """(resource, policy, message) as the CrossGuard policies report them."""
    reported: set[tuple[str, str, str]] = set()
    for policy in pack.crossguard_policies():
        if isinstance(policy, ResourceValidationPolicy):
            for r in stack.resources:
                args = ResourceValidationArgs(r.type, r.props, r.urn, r.name, None, None)
                policy.validate(args, lambda m, _urn=None, u=r.urn, n=policy.name:
                                reported.add((u, n, m)))
        else:
            resources = [PolicyResource(r.type, r.props, r.urn, r.name, None, None, None,
                                        [], {}) for r in stack.resources]
            policy.validate(StackValidationArgs(resources),
                            lambda m, urn=None, n=policy.name: reported.add((urn or STACK, n, m)))
    return reported


def test_crossguard_reports_what_the_offline_runner_reports(lab_env: None) -> None:
    stack = _unsafe_program_inputs()
    reported = crossguard_run(stack)
    assert reported == {(v.resource, v.policy, v.message) for v in violations(stack, "lab")}
    assert {p for _, p, _ in reported} >= {"network-no-open-ingress",
                                          "storage-checkpoints-versioned",
                                          "compute-spot-needs-checkpoints"}


def test_pack_reads_the_description_from_stack_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_CONFIG", '{"gpupool:description": "pools/example.yaml"}')
    pack.description.cache_clear()
    assert pack.description().pool.name == "prod"
    pack.description.cache_clear()


def test_shipped_stack_passes_through_crossguard(lab_env: None) -> None:
    # The lab is told what it weakens (advisory, tests/test_lab_controls.py), nothing else.
    stack = recorded("lab")
    reported = crossguard_run(stack)
    assert reported == {(v.resource, v.policy, v.message) for v in violations(stack, "lab")}
    assert {p for _, p, _ in reported} == {"hygiene-lab-weakened-controls"}
