"""Every Kubernetes object validates strictly against the pinned Kubernetes version and
every Kueue object against the Kueue v0.19.2 CRDs vendored in gpupool/data/schemas."""

from __future__ import annotations

import copy

import pytest

from gpupool.preview import k8s_schema
from gpupool.render.k8s_objects import KUEUE_API, manifests
from gpupool.spec import loader
from tests.conftest import ROOT

SCHEMAS = ROOT / "gpupool" / "data" / "schemas"


def test_schemas_are_where_ci_finds_them() -> None:
    assert k8s_schema.SCHEMAS == SCHEMAS
    assert sorted(p.name for p in k8s_schema.kueue_crd_dir().glob("*.yaml"))


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_every_manifest_is_valid(stack: str) -> None:
    objs = manifests(loader.load_stack(stack, ROOT))
    kinds = {m["kind"] for m in objs}
    assert {"Namespace", "ResourceQuota", "LimitRange", "NetworkPolicy", "Role",
            "RoleBinding", "PriorityClass", "ResourceFlavor", "ClusterQueue", "LocalQueue",
            "WorkloadPriorityClass"} <= kinds
    assert [p for m in objs for p in k8s_schema.problems(m)] == []


def _first(kind: str) -> dict:
    return copy.deepcopy(next(m for m in manifests(loader.load_stack("lab", ROOT))
                              if m["kind"] == kind))


@pytest.mark.parametrize("kind", ["ResourceQuota", "ClusterQueue", "WorkloadPriorityClass"])
def test_unknown_fields_are_rejected(kind: str) -> None:
    m = _first(kind)
    (m.setdefault("spec", {}) if "spec" in m else m)["nominalQuotaTypo"] = 1
    assert any("nominalQuotaTypo" in p for p in k8s_schema.problems(m))


def test_wrong_types_are_rejected() -> None:
    cq = _first("ClusterQueue")
    cq["spec"]["resourceGroups"][0]["flavors"][0]["name"] = "Not_A_Name"
    assert k8s_schema.problems(cq)
    pc = _first("PriorityClass")
    pc["value"] = "high"
    assert k8s_schema.problems(pc)
    assert cq["apiVersion"] == KUEUE_API
