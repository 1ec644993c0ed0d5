"""MIG from the description: layouts against NVIDIA's profile tables, and the one layout
rendered for Slurm, nvidia-mig-parted, the GPU Operator and Kueue."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpupool.render import inventory, mig_config, slurm
from gpupool.spec import loader, mig
from gpupool.spec.catalog import MIG_GEOMETRIES
from gpupool.spec.errors import DescriptionError
from gpupool.spec.model import Gpu
from tests.conftest import mutate, raw_stack

# The lab's whole-GPU quotas moved onto its burst L4s, so its GPU class may become MIG.
L4_QUOTAS = [{"set": f"teams.{t}.{k}.l4", "value": 4}
             for t in ("vision", "nlp") for k in ("quota", "borrowing_limit")]


def mig_lab(model: str, memory: int, strategy: str, layout: dict[str, int], count: int = 4,
            ops: list[dict[str, Any]] | None = None) -> Any:
    gpu = {"model": model, "count": count, "memory_gib": memory, "mig_strategy": strategy,
           "mig_profiles": layout}
    return mutate(raw_stack("lab"), [{"set": "node_classes.lab-l4.gpu", "value": gpu},
                                     *L4_QUOTAS, *(ops or [])])


def problems(data: Any) -> list[tuple[str, str]]:
    with pytest.raises(DescriptionError) as info:
        loader.parse(data)
    return [(p.path, p.rule) for p in info.value.problems]


# -- layouts against the profile tables ---------------------------------------------------

@pytest.mark.parametrize(("model", "memory", "layout"), [
    ("a100", 80, {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}),
    ("a100", 80, {"1g.10gb": 7}),
    ("a100", 80, {"3g.40gb": 2}),
    ("a100", 80, {"4g.40gb": 1, "3g.40gb": 1}),
    ("a100", 80, {"2g.20gb": 2, "3g.40gb": 1}),  # 2g at 0 and 2, 3g at 4
    ("a100", 80, {"2g.20gb": 3, "1g.10gb": 1}),
    ("a100", 80, {"1g.20gb": 4}),
    ("a100", 40, {"1g.5gb": 7}),
    ("h100", 80, {"7g.80gb": 1}),
    ("h100", 94, {"3g.47gb": 2}),
    ("h200", 141, {"1g.18gb": 7}),
    ("h200", 141, {"4g.71gb": 1, "2g.35gb": 1, "1g.18gb": 1}),
])
def test_valid_layouts_place(model: str, memory: int, layout: dict[str, int]) -> None:
    geo = MIG_GEOMETRIES[(model, memory)]
    starts = mig.placement(geo, layout)
    assert starts is not None
    taken = [s for p, ss in starts.items() for st in ss
             for s in range(st, st + geo.profiles[p].size)]
    assert len(taken) == len(set(taken)) and max(taken) < geo.memory_slices
    strategy = "single" if len(layout) == 1 else "mixed"
    desc = loader.parse(mig_lab(model, memory, strategy, layout))
    assert desc.node_classes["lab-l4"].gpu is not None


@pytest.mark.parametrize(("model", "memory", "layout", "where", "rule"), [
    ("a100", 80, {"1g.18gb": 1}, "mig_profiles.1g.18gb", "mig-profile-known"),
    ("a100", 40, {"3g.40gb": 1}, "mig_profiles.3g.40gb", "mig-profile-known"),
    ("h200", 141, {"1g.10gb": 7}, "mig_profiles.1g.10gb", "mig-profile-known"),
    ("a100", 80, {"3g.40gb": 3}, "mig_profiles.3g.40gb", "mig-profile-max-instances"),
    ("a100", 80, {"1g.20gb": 5}, "mig_profiles.1g.20gb", "mig-profile-max-instances"),
    ("a100", 80, {"1g.10gb": 7, "1g.20gb": 1}, "mig_profiles", "mig-slices-within-gpu"),
    ("h100", 80, {"4g.40gb": 1, "2g.20gb": 2}, "mig_profiles", "mig-slices-within-gpu"),
    # Seven slices or fewer, yet no arrangement: memory slices overlap.
    ("a100", 80, {"3g.40gb": 1, "2g.20gb": 1, "1g.20gb": 2}, "mig_profiles", "mig-placement"),
    ("h100", 80, {"1g.20gb": 4, "3g.40gb": 1}, "mig_profiles", "mig-placement"),
])
def test_invalid_layouts_name_the_field(model: str, memory: int, layout: dict[str, int],
                                        where: str, rule: str) -> None:
    strategy = "single" if len(layout) == 1 else "mixed"
    assert problems(mig_lab(model, memory, strategy, layout)) == [
        (f"node_classes.lab-l4.gpu.{where}", rule)]


def test_mig_on_a_model_without_mig() -> None:
    data = mutate(raw_stack("lab"), [
        {"set": "node_classes.lab-l4.gpu.mig_strategy", "value": "mixed"},
        {"set": "node_classes.lab-l4.gpu.mig_profiles", "value": {"1g.10gb": 7}}])
    assert problems(data) == [("node_classes.lab-l4.gpu.mig_strategy", "mig-capable")]


def test_every_table_is_consistent() -> None:
    for (model, memory), geo in MIG_GEOMETRIES.items():
        for name, p in geo.profiles.items():
            assert name == f"{p.compute_slices}g.{p.memory_gb}gb", (model, name)
            assert p.memory_gb <= memory
            # Alone, max_instances of a profile place; one more does not.
            assert mig.placement(geo, {name: p.max_instances}) is not None, (model, name)
            assert mig.placement(geo, {name: p.max_instances + 1}) is None, (model, name)


def test_per_profile_quota_must_be_offered() -> None:
    data = mig_lab("a100", 80, "single", {"1g.10gb": 7},
                   ops=[{"set": "teams.vision.mig_quota", "value": {"3g.40gb": 1}}])
    assert problems(data) == [("teams.vision.mig_quota.3g.40gb", "mig-quota-profile-in-pool")]


# -- rendering ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mixed() -> Any:
    return loader.parse(mig_lab("a100", 80, "mixed", {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1},
                                ops=[{"set": "teams.vision.mig_quota",
                                      "value": {"1g.10gb": 4, "3g.40gb": 2}}]))


def test_slurm_gres_are_mig_types(mixed: Any) -> None:
    conf = slurm.slurm_conf(mixed)
    nodes = slurm.records(conf, "NodeName")
    assert nodes["lab-gpu1"]["Gres"] == "gpu:1g.10gb:4,gpu:2g.20gb:4,gpu:3g.40gb:4"
    assert nodes["l4-burst-0"]["Gres"] == "gpu:l4:4"  # cloud GPUs come whole
    tres = next(line for line in conf if line.startswith("AccountingStorageTRES="))
    assert tres.endswith("gres/gpu:1g.10gb,gres/gpu:2g.20gb,gres/gpu:3g.40gb")


def test_slurm_gres_conf_lab_fixture_devices(mixed: Any) -> None:
    lines = slurm.gres_conf(mixed)
    assert lines == [
        "NodeName=lab-gpu[1-3] Name=gpu Type=1g.10gb File=/dev/nvidia-caps/nvidia-cap[0-3]",
        "NodeName=lab-gpu[1-3] Name=gpu Type=2g.20gb File=/dev/nvidia-caps/nvidia-cap[4-7]",
        "NodeName=lab-gpu[1-3] Name=gpu Type=3g.40gb File=/dev/nvidia-caps/nvidia-cap[8-11]",
        "NodeName=l4-burst-[0-1] Name=gpu Type=l4 File=/dev/nvidia[0-3]"]
    devices = slurm.fixture_mig_devices(mixed)
    assert devices["lab-gpu1"] == ["1g.10gb"] * 4 + ["2g.20gb"] * 4 + ["3g.40gb"] * 4
    # The file the slurm role writes: the GPUs' devices, then MIG devices 0-11 in their
    # folder, as gres.conf names them.
    rows = [r.split() for r in slurm.plan(mixed)["fixture_devices"]["lab-gpu1"].splitlines()
            if not r.startswith("#")]
    caps = rows.index(["d", "/dev/nvidia-caps", "0755", "root", "root", "-"])
    assert all(r[1].startswith("/dev/nvidia") and r[-1].startswith("195:") for r in rows[:caps])
    assert [r[1] for r in rows[caps + 1:]] == [f"/dev/nvidia-caps/nvidia-cap{i}"
                                               for i in range(12)]
    assert [r[-1] for r in rows[caps + 1:]] == [f"{slurm.MIG_FIXTURE_MAJOR}:{i}"
                                                for i in range(12)]


def test_slurm_gres_conf_production_autodetects_mig() -> None:
    data = mig_lab("h100", 80, "single", {"1g.10gb": 7}, count=8)
    data["pool"]["environment"] = "production"
    # Debian 13's NVML plugin (24.11.5-2) fits its Slurm: NVML finds the instances. Its
    # Slurm is Debian 13's, so the nodes run Debian 13 (rule release-slurm-suite).
    data["software"]["slurm"] = "24.11.5"
    for node_class in data["node_classes"].values():
        node_class["os"] = "debian-13"
    desc = loader.parse(data)
    lines = slurm.gres_conf(desc)
    assert lines[0] == "AutoDetect=nvml"
    assert not any("lab-gpu" in line for line in lines)  # NVML finds the instances
    assert slurm.records(slurm.slurm_conf(desc), "NodeName")["lab-gpu2"]["Gres"] == \
        "gpu:1g.10gb:56"
    assert slurm.fixture_mig_devices(desc) == {}


def test_production_mig_is_refused_where_the_nvml_plugin_cannot_be_installed() -> None:
    """Debian 12's plugin pins 22.05.8-4+deb12u2, below the floor production holds Slurm
    to: a MIG layout could not reach Slurm, so validation refuses it (and so does the
    renderer, handed the model unchecked)."""
    data = mig_lab("h100", 80, "single", {"1g.10gb": 7}, count=8)
    data["pool"]["environment"] = "production"
    data["software"]["slurm"] = "22.05.8-4+deb12u3"
    with pytest.raises(DescriptionError) as err:
        loader.parse(data)
    (problem,) = err.value.problems
    assert problem.rule == "mig-needs-nvml"
    assert problem.path.endswith(".gpu.mig_profiles")
    assert "on Debian 12 (bookworm) NVML autodetection cannot be installed with a fixed " \
        "Slurm" in problem.message
    data["pool"]["environment"] = "lab"
    desc = loader.parse(data)  # the lab names fixture devices: no plugin needed
    prod = desc.model_copy(update={"pool": desc.pool.model_copy(
        update={"environment": "production"})})
    with pytest.raises(slurm.SlurmPolicyError, match="MIG instances can only be found"):
        slurm.gres_conf(prod)


def test_slurm_team_limits_carry_the_mig_quota(mixed: Any) -> None:
    limits = {lim["account"]: lim["GrpTRES"] for lim in slurm.accounting(mixed)["limits"]}
    assert limits["vision"] == "gres/gpu=14,gres/gpu:l4=8,gres/gpu:1g.10gb=4,gres/gpu:3g.40gb=2"
    assert limits["nlp"] == "gres/gpu=8,gres/gpu:l4=8"


def test_mig_parted_config(mixed: Any) -> None:
    config = yaml.safe_load(mig_config.mig_parted_yaml(mixed))
    assert config == {"version": "v1", "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "gpupool-lab-l4": [{"devices": "all", "mig-enabled": True, "mig-devices": {
            "1g.10gb": 1, "2g.20gb": 1, "3g.40gb": 1}}]}}
    plan = mig_config.plan(mixed)
    assert plan["classes"] == {"lab-l4": {
        "config": "gpupool-lab-l4", "mig_enabled": True,
        "layout": {"1g.10gb": 1, "2g.20gb": 1, "3g.40gb": 1}, "instances_per_gpu": 3,
        "gpus": 4, "reset_needed": True}}
    assert inventory.pool_vars(mixed)["gpupool_mig"] == plan


def test_no_mig_capable_class_renders_only_all_disabled() -> None:
    desc = loader.load_stack("lab")
    assert mig_config.plan(desc)["classes"] == {}
    assert mig_config.plan(desc)["strategy"] == "none"
    assert yaml.safe_load(mig_config.plan(desc)["config"])["mig-configs"] == {
        "all-disabled": [{"devices": "all", "mig-enabled": False}]}


def test_operator_values_and_configmap(mixed: Any) -> None:
    op = mig_config.operator(mixed, "gpupool-mig-parted")
    assert op["values"] == {"mig": {"strategy": "mixed"}, "migManager": {
        "enabled": True, "config": {"name": "gpupool-mig-parted", "default": "all-disabled"}}}
    assert yaml.safe_load(op["configmap_data"]["config.yaml"]) == \
        mig_config.mig_parted_config(mixed)
    assert op["node_configs"] == dict.fromkeys(
        ("lab-gpu1", "lab-gpu2", "lab-gpu3"), "gpupool-lab-l4")


def test_operator_values_fit_the_chart(mixed: Any) -> None:
    from gpupool.paths import PROJECT_ROOT  # noqa: PLC0415

    schemas = PROJECT_ROOT / "gpupool" / "data" / "schemas" / "gpu-operator-v26.7.0"
    chart = yaml.safe_load((schemas / "values.yaml").read_text())
    crd = yaml.safe_load((schemas / "nvidia.com_clusterpolicies.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    values = mig_config.operator(mixed, "gpupool-mig-parted")["values"]
    for section, keys in values.items():
        assert section in chart
        props = spec["properties"][section]["properties"]
        assert set(keys) <= set(props)
    assert values["mig"]["strategy"] in props_enum(spec, "mig", "strategy")
    assert values["migManager"]["config"]["default"] in spec["properties"]["migManager"][
        "properties"]["config"]["properties"]["default"]["enum"]


def props_enum(spec: dict[str, Any], section: str, key: str) -> list[str]:
    return spec["properties"][section]["properties"][key]["enum"]


def test_kueue_resources_per_class(mixed: Any) -> None:
    assert mig.kueue_resources(mixed) == {"lab-l4": {
        "nvidia.com/mig-1g.10gb": 4, "nvidia.com/mig-2g.20gb": 4, "nvidia.com/mig-3g.40gb": 4}}
    single = Gpu(model="h200", count=8, memory_gib=141, mig_strategy="single",
                 mig_profiles={"1g.18gb": 7})
    assert [(r.resource, r.profile, r.per_node) for r in mig.kubernetes_resources(single)] == [
        ("nvidia.com/gpu", "1g.18gb", 56)]
    whole = Gpu(model="l4", count=4, memory_gib=24)
    assert [(r.resource, r.per_node) for r in mig.kubernetes_resources(whole)] == [
        ("nvidia.com/gpu", 4)]
    assert mig.mig_capacity(mixed) == {"1g.10gb": 12, "2g.20gb": 12, "3g.40gb": 12}


def test_config_names_are_always_dns_labels() -> None:
    assert mig_config.config_name("hgx-a100") == "gpupool-hgx-a100"
    for hostile in ("a" * 63, "x\nExecStartPre=/bin/sh", "Upper"):
        name = mig_config.config_name(hostile)
        assert len(name) <= 63 and name.replace("-", "").isalnum() and name.islower()
