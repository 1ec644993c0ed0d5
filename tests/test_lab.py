"""The lab's names and plan derive from the description (no podman needed)."""

from __future__ import annotations

from gpupool import lab, labmirror, loader
from gpupool.model import Description


def _desc() -> Description:
    return loader.load_stack("lab")


def test_resource_names_derive_from_pool_and_description() -> None:
    desc = _desc()
    assert lab.container_name(desc, "lab-gpu1") == "gpupool-lab-lab-gpu1"
    assert {lab.network_name(desc, s) for s in desc.network.segments} == {
        f"gpupool-lab-{s}" for s in ("training", "storage", "management")}
    assert lab.inventory_path(desc).parts[-3:] == (".lab", "lab", "inventory.yml")


def test_image_is_keyed_by_its_recipe(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    before = lab.image_hash()
    monkeypatch.setattr(lab, "IMAGE_PACKAGES", (*lab.IMAGE_PACKAGES, "vim"))
    assert lab.image_hash() != before
    assert lab.image_ref().endswith(lab.image_hash())


def test_driver_packages_come_from_the_role() -> None:
    pkgs = labmirror.driver_packages()
    assert "nvidia-smi" in pkgs and "nvidia-persistenced" in pkgs


def test_bench_pool_widens_lab_to_five_gpu_nodes() -> None:
    from bench.onboard import bench_description  # noqa: PLC0415

    desc = bench_description(5)
    assert desc.pool.name == "bench"
    gpu = [n for n, node in desc.nodes.items() if desc.node_classes[node.class_].gpu]
    assert len(gpu) == 5
    mgmt = [node.addresses["management"] for node in desc.nodes.values()]
    assert len(set(mgmt)) == len(mgmt) and all(a.startswith("10.251.") for a in mgmt)
