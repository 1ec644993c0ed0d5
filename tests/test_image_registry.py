"""The pool's image registry (issue 54): the description's `image_registry` is refused with
its field named where a registry could not work (an unknown host, one without an IPv4
management address, a port another daemon takes, a tier that is unknown, too small,
read-only, in the cloud or no file system, hostile values); the render names the images
by the host's address and keeps them under the tier; the firewall opens the port on that
host only, to the nodes that pull; the inventory puts the host in its group; and the
nodes' pull program (gpupool/onhost/image_pull.py) pulls only declared images, swaps a
bundle in whole and keeps a version once it is there, with stand-in skopeo and umoci on
PATH (FIXTURES: the real ones run in the Debian 13 lane)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.gate.expect import NodeExpect, node_expect
from gpupool.onhost import image_pull
from gpupool.render import environment_image, flows, inventory
from gpupool.spec import catalog, loader
from gpupool.spec.errors import DescriptionError
from gpupool.spec.model import Description
from tests.conftest import raw_stack

FIXTURE = Path(__file__).parent / "fixtures" / "environment-images.yaml"
REGISTRY = {"host": "mgmt1", "tier": "checkpoints", "size_gib": 500}


def _raw(**registry: Any) -> dict[str, Any]:
    data = raw_stack("example")
    data["environment_images"] = yaml.safe_load(FIXTURE.read_text())["environment_images"]
    data["image_registry"] = {**REGISTRY, **registry}
    return data


def _codes(data: dict[str, Any]) -> dict[str, set[str]]:
    with pytest.raises(DescriptionError) as info:
        loader.parse(data, "test")
    out: dict[str, set[str]] = {}
    for p in info.value.problems:
        out.setdefault(p.path, set()).add(p.rule)
    return out


@pytest.fixture(scope="module")
def desc() -> Description:
    return loader.parse(_raw(), "test")


def test_a_declared_registry_parses_and_names_the_images_by_its_address(
        desc: Description) -> None:
    plan = environment_image.registry_plan(desc)
    assert plan is not None
    assert plan["registry"] == "10.40.9.10:5000" == environment_image.default_registry(desc)
    assert plan["path"] == "/checkpoints/gpupool-registry"
    assert {i["name"] for i in plan["images"]} == set(desc.environment_images)
    for image in plan["images"]:
        assert image["reference"] == (f"10.40.9.10:5000/{desc.pool.name}/{image['name']}:"
                                      f"{image['version']}")


def test_absent_means_no_registry() -> None:
    data = _raw()
    del data["image_registry"]
    desc = loader.parse(data, "test")
    assert environment_image.registry_plan(desc) is None
    assert environment_image.default_registry(desc) == f"registry.{desc.pool.domain}"
    assert inventory.pool_vars(desc)["gpupool_image_registry"] is None
    assert flows.REGISTRY_CLIENTS not in flows.segment_sources(desc)


@pytest.mark.parametrize(("change", "path", "code"), [
    ({"host": "nope"}, "image_registry.host", "image-registry-host"),
    ({"port": 22}, "image_registry.port", "greater-than-equal"),  # below 1024
    ({"port": 6817}, "image_registry.port", "image-registry-port"),
    ({"port": 9090}, "image_registry.port", "image-registry-port"),
    ({"port": 61000}, "image_registry.port", "image-registry-port"),
    ({"tier": "nope"}, "image_registry.tier", "image-registry-tier"),
    ({"tier": "archive"}, "image_registry.tier", "image-registry-tier"),  # a bucket only
    ({"tier": "scratch"}, "image_registry.tier", "image-registry-tier"),  # in the cloud
    ({"tier": "datasets"}, "image_registry.tier", "image-registry-tier"),  # mounted ro
    ({"size_gib": 200 * 1024 + 1}, "image_registry.size_gib", "image-registry-size"),
])
def test_a_registry_that_could_not_work_is_refused_with_its_field(
        change: dict[str, Any], path: str, code: str) -> None:
    assert code in _codes(_raw(**change)).get(path, set())


def test_a_tier_that_holds_exactly_the_size_passes() -> None:
    loader.parse(_raw(size_gib=200 * 1024), "test")


def test_a_host_with_an_ipv6_management_address_is_refused() -> None:
    data = _raw()
    data["nodes"]["mgmt1"]["addresses"]["management"] = "fd00::10"
    assert "image-registry-host" in _codes(data).get("image_registry.host", set())


@pytest.mark.parametrize(("field", "value"), [
    ("host", "mgmt1; rm -rf /"), ("host", "../etc"), ("host", "a\x00b"), ("host", ""),
    ("host", "x" * 10_000), ("host", 7), ("port", "5000; id"), ("port", 0), ("port", 80),
    ("port", 65536), ("port", True), ("port", 5000.5), ("tier", "$(id)"), ("tier", None),
    ("size_gib", 0), ("size_gib", -1), ("size_gib", "20"), ("size_gib", 10**12),
    ("size_gib", float("nan")), ("extra", "x"),
])
def test_hostile_values_are_refused_with_their_field(field: str, value: Any) -> None:
    codes = _codes(_raw(**{field: value}))
    assert any(p.startswith(f"image_registry.{field}") or p == "image_registry"
               for p in codes), codes


def test_the_firewall_opens_the_port_on_the_host_only_to_the_nodes_that_pull(
        desc: Description) -> None:
    assert flows.allowed(desc, "h100-a1", "mgmt1", "management", 5000)
    assert flows.allowed(desc, "l40s-c6", "mgmt1", "management", 5000)
    # Nobody reaches it on another host, nor from its own segment at large.
    assert not flows.allowed(desc, "mgmt1", "h100-a1", "management", 5000)
    sources = flows.segment_sources(desc)[flows.REGISTRY_CLIENTS]
    assert "10.40.9.10" in sources  # the controller is a login node: it pulls too
    assert all(a.ports != (5000,) for n in desc.nodes if n != "mgmt1"
               for a in flows.inbound(desc, n))


def test_the_inventory_groups_the_registry_host(desc: Description) -> None:
    inv = inventory.build(desc)
    assert list(inv["all"]["children"]["image_registry"]["hosts"]) == ["mgmt1"]
    plan = inventory.pool_vars(desc)["gpupool_image_registry"]
    assert plan == environment_image.registry_plan(desc)


# The pull program, with stand-in tools: skopeo writes the layout directory it is given,
# umoci a bundle (config.json and rootfs) from it; each logs its argv.
SKOPEO = """#!/bin/sh
echo "skopeo $*" >> "$TOOL_LOG"
[ -n "$SKOPEO_FAIL" ] && { echo "$SKOPEO_FAIL" >&2; exit 1; }
dest=${5#oci:}; mkdir -p "${dest%:*}"
"""
UMOCI = """#!/bin/sh
echo "umoci $*" >> "$TOOL_LOG"
out=$5; mkdir -p "$out/rootfs"; echo '{}' > "$out/config.json"
chmod 700 "$out" "$out/rootfs"; chmod 600 "$out/config.json"
"""


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("skopeo", SKOPEO), ("umoci", UMOCI)):
        tool = bin_dir / name
        tool.write_text(text)
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("TOOL_LOG", str(tmp_path / "tools.log"))
    monkeypatch.delenv("SKOPEO_FAIL", raising=False)
    (tmp_path / "tools.log").write_text("")
    images = {"registry": "10.40.9.10:5000", "auth_file": f"{tmp_path}/auth.json",
              "layout_dir": f"{tmp_path}/layouts", "bundle_dir": f"{tmp_path}/bundles",
              "images": [{"name": "pytorch", "version": "1.4.0", "digest": "sha256:x",
                          "reference": "10.40.9.10:5000/pool/pytorch:1.4.0",
                          "repository": "pool/pytorch"}]}
    (tmp_path / "images.json").write_text(json.dumps(images))
    return tmp_path


def _pull(node: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[Any]]:
    rc = image_pull.main(["--images-file", str(node / "images.json"), "--json", *args])
    out = capsys.readouterr().out
    return rc, [json.loads(line) for line in out.splitlines()]


def test_a_declared_image_is_pulled_once_then_kept(
        node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, [first] = _pull(node, "pytorch", capsys=capsys)
    assert rc == 0 and first["state"] == "pulled", first
    bundle = node / "bundles" / "pytorch-1.4.0"
    assert first["detail"] == str(bundle) and (bundle / "config.json").is_file()
    # A job's user opens the bundle: umoci left it to root alone.
    assert {p.name: p.stat().st_mode & 0o777 for p in (bundle, bundle / "rootfs",
                                                        bundle / "config.json")} == {
        "pytorch-1.4.0": 0o755, "rootfs": 0o755, "config.json": 0o644}
    log = (node / "tools.log").read_text().splitlines()
    assert log[0] == (f"skopeo copy --quiet --authfile {node}/auth.json "
                      f"docker://10.40.9.10:5000/pool/pytorch:1.4.0 "
                      f"oci:{node}/layouts/pytorch:1.4.0")
    rc, [again] = _pull(node, "pytorch:1.4.0", capsys=capsys)
    assert rc == 0 and again["state"] == "cached"
    assert len((node / "tools.log").read_text().splitlines()) == 2  # nothing ran again
    rc, [refreshed] = _pull(node, "--refresh", "pytorch", capsys=capsys)
    assert rc == 0 and refreshed["state"] == "pulled"
    assert sorted(p.name for p in (node / "bundles").iterdir()) == ["pytorch-1.4.0"]


def test_a_failed_pull_leaves_the_bundle_as_it_was(
        node: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _pull(node, "pytorch", capsys=capsys)
    marker = (node / "bundles" / "pytorch-1.4.0" / image_pull.MARKER).read_text()
    monkeypatch.setenv("SKOPEO_FAIL", "unauthorized: authentication required")
    rc, [failed] = _pull(node, "--refresh", "pytorch", capsys=capsys)
    assert rc == 1 and failed["state"] == "failed"
    assert "skopeo copy exited 1: unauthorized" in failed["detail"]
    assert (node / "bundles" / "pytorch-1.4.0" / image_pull.MARKER).read_text() == marker


@pytest.mark.parametrize("wanted", [
    "other", "pytorch:9.9.9", "../pytorch", "pytorch:1.4.0/../../x", "$(id)", "",
])
def test_only_declared_images_are_pulled(
        node: Path, wanted: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = image_pull.main(["--images-file", str(node / "images.json"), wanted])
    assert rc == image_pull.EXIT_USAGE
    assert "not a declared image" in capsys.readouterr().err
    assert (node / "tools.log").read_text() == ""


@pytest.mark.parametrize(("key", "value"), [
    ("bundle_dir", "relative/dir"), ("bundle_dir", "/a b"), ("layout_dir", "/x/../etc"),
    ("auth_file", None), ("images", "pytorch"),
])
def test_a_malformed_images_file_is_refused(
        node: Path, key: str, value: Any, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads((node / "images.json").read_text())
    data[key] = value
    (node / "images.json").write_text(json.dumps(data))
    assert image_pull.main(["--images-file", str(node / "images.json"), "--all"]) == 2
    assert capsys.readouterr().err.startswith("gpupool-image-pull: ")


@pytest.mark.parametrize(("field", "value"), [
    ("name", "../etc"), ("name", "Py Torch"), ("version", "1.4"), ("version", "1.4.0/x"),
    ("reference", "evil.example.com/x:1"), ("reference", "10.0.0.1:5000/a:1 --x"),
    ("digest", 5),
])
def test_a_hostile_image_entry_is_refused(
        node: Path, field: str, value: Any, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads((node / "images.json").read_text())
    data["images"][0][field] = value
    (node / "images.json").write_text(json.dumps(data))
    assert image_pull.main(["--images-file", str(node / "images.json"), "--all"]) == 2
    assert (node / "tools.log").read_text() == ""


def test_an_unreadable_images_file_is_a_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert image_pull.main(["--images-file", str(tmp_path / "none.json"), "--all"]) == 2
    assert "cannot read the images file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert image_pull.main(["--images-file", str(tmp_path / "bad.json"), "--all"]) == 2


def test_asking_for_nothing_is_a_usage_error(
        node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert image_pull.main(["--images-file", str(node / "images.json")]) == 2
    assert image_pull.main(["--images-file", str(node / "images.json"), "--all",
                            "pytorch"]) == 2


def test_the_gate_expects_the_declared_images_on_compute_nodes_only(desc: Description) -> None:
    compute = node_expect(desc, "h100-a1")
    assert compute.images == tuple(sorted(f"{n}:{i.version}"
                                          for n, i in desc.environment_images.items()))
    assert node_expect(desc, "mgmt1").images == ()  # a controller and login node
    assert NodeExpect.from_json(compute.to_json()) == compute
    # Facts of an older user-data carry no images: none are expected.
    older = json.loads(compute.to_json())
    del older["images"]
    assert NodeExpect.from_json(json.dumps(older)).images == ()
    data = _raw()
    del data["image_registry"]
    assert node_expect(loader.parse(data, "test"), "h100-a1").images == ()


def test_an_image_the_registry_has_not_got_is_absent_not_failed(
        node: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKOPEO_FAIL", 'reading manifest 1.4.0 in 10.40.9.10:5000/pool/pytorch: '
                                      'manifest unknown')
    rc, [absent] = _pull(node, "pytorch", capsys=capsys)
    assert rc == 1 and absent["state"] == "absent", absent
    monkeypatch.setenv("SKOPEO_FAIL", "x509: certificate signed by unknown authority")
    rc, [failed] = _pull(node, "pytorch", capsys=capsys)
    assert rc == 1 and failed["state"] == "failed", failed


def test_the_monitoring_ports_validation_keeps_free_are_the_roles() -> None:
    defaults = yaml.safe_load((Path(__file__).parents[1] / "roles" / "monitoring" / "defaults"
                               / "main.yml").read_text())
    assert (defaults["monitoring_prometheus_port"], defaults["monitoring_alertmanager_port"]) \
        == (catalog.PROMETHEUS_PORT, catalog.ALERTMANAGER_PORT)
