"""GPU detection in Slurm: the Slurm lock and the NVML plugin it needs, resolved together
from the vendored archive facts (gpupool/data/slurm-gpu-detection)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpupool import cli
from gpupool.paths import DATA
from gpupool.render import inventory, slurm
from gpupool.spec import floors, gpu_detection, loader, rules
from gpupool.spec.gpu_detection import resolve
from tests.conftest import ROOT, mutate, raw_stack


def _with_slurm(stack: str, version: str):  # type: ignore[no-untyped-def]
    desc = loader.load_stack(stack, ROOT)
    return desc.model_copy(update={"software": desc.software.model_copy(
        update={"slurm": version})})


def test_the_facts_are_vendored_with_their_source() -> None:
    folder = DATA / "slurm-gpu-detection"
    assert (folder / "SOURCE.md").is_file()
    source = (folder / "SOURCE.md").read_text()
    suites = {s.codename: s for s in gpu_detection.suites()}
    assert set(suites) == {"bookworm", "trixie"}
    for s in suites.values():  # every version in the data is cited in SOURCE.md
        assert s.slurm in source and s.plugin in source
        floors.parse(s.slurm)
        for op, version in s.requires:
            assert op in {"=", ">=", "<=", "<<", ">>"}
            floors.parse(version)


def test_bookworm_plugin_pins_a_build_below_the_floor() -> None:
    for lock in ("22.05.8", "22.05.8-4+deb12u3"):
        d = resolve(lock)
        assert not d.available and d.plugin_version is None
        assert d.suite is not None and d.suite.codename == "bookworm"
        assert d.installed == "22.05.8-4+deb12u3"  # what apt's `22.05.8*` takes
        assert "on Debian 12 (bookworm) NVML autodetection cannot be installed with a " \
            "fixed Slurm" in d.reason
        assert "(= 22.05.8-4+deb12u2)" in d.reason
    # The plugin's own build fits it, and is refused by the floor (rule version-floor).
    assert resolve("22.05.8-4+deb12u2").available
    assert floors.check("slurm", "22.05.8-4+deb12u2") is not None


def test_trixie_plugin_fits_its_slurm() -> None:
    for lock in ("24.11.5", "24.11.5-4+deb13u1"):
        d = resolve(lock)
        assert d.available and d.plugin_version == "24.11.5-2"
        assert d.plan() == {"autodetect": "nvml", "plugin_package": "slurm-wlm-nvml-plugin",
                            "plugin_version": "24.11.5-2", "suite": "trixie",
                            "installed_slurm": "24.11.5-4+deb13u1", "reason": d.reason}


@pytest.mark.parametrize("lock", ["24.11.6", "23.11.1", "25.05.9"])
def test_a_slurm_no_known_suite_carries_has_no_plugin(lock: str) -> None:
    d = resolve(lock)
    assert not d.available and d.suite is None and d.plugin_version is None
    assert "no Debian suite gpupool knows carries Slurm" in d.reason


def test_dependency_operators_as_dpkg_reads_them() -> None:
    trixie = next(s for s in gpu_detection.suites() if s.codename == "trixie")
    assert trixie.admits("24.11.5-1") and trixie.admits("24.11.5-4+deb13u1")
    assert not trixie.admits("24.11.4-1") and not trixie.admits("24.11.6-1")
    assert not trixie.admits("24.11.5~rc1-1")  # ~ sorts before the release


def test_production_whole_gpus_fall_back_to_device_files_on_debian_12() -> None:
    desc = _with_slurm("example", "22.05.8-4+deb12u3")
    assert not list(rules.mig_needs_nvml(desc))  # whole GPUs need no plugin
    lines = slurm.gres_conf(desc)
    comments = [line for line in lines if line.startswith("#")]
    assert comments and "cannot be installed with a fixed Slurm" in comments[0]
    body = [line for line in lines if not line.startswith("#")]
    assert body[0] == "AutoDetect=off"
    assert "AutoDetect=nvml" not in lines
    gres = slurm.records(body, "NodeName")
    assert gres["h100-a[1-8],h100-b[1-8],h100-burst-[0-5]"] == {
        "NodeName": "h100-a[1-8],h100-b[1-8],h100-burst-[0-5]", "Name": "gpu",
        "Type": "h100", "File": "/dev/nvidia[0-7]"}
    # Every GPU node of slurm.conf is named with as many devices as its Gres count.
    nodes = slurm.records(slurm.slurm_conf(desc), "NodeName")
    named = " ".join(body)
    assert all(name.split("-")[0] in named for name in nodes)
    plan = slurm.plan(desc)["gpu_detection"]
    assert plan["autodetect"] == "off" and plan["plugin_version"] is None


def test_production_on_debian_13_autodetects_and_names_the_plugin() -> None:
    desc = loader.load_stack("example", ROOT)
    assert slurm.gres_conf(desc)[0] == "AutoDetect=nvml"
    plan = slurm.plan(desc)["gpu_detection"]
    assert (plan["plugin_package"], plan["plugin_version"]) == ("slurm-wlm-nvml-plugin",
                                                               "24.11.5-2")


def test_the_lab_keeps_its_fixture_files_and_installs_no_plugin_on_bookworm() -> None:
    lab = loader.load_stack("lab", ROOT)
    assert not any(line.startswith("AutoDetect") for line in slurm.gres_conf(lab))
    plan = slurm.plan(lab)["gpu_detection"]
    assert plan["autodetect"] is None and plan["plugin_version"] is None
    assert plan["suite"] == "bookworm"


def test_a_debian_13_lab_installs_no_plugin_either() -> None:
    """The trixie Slurm fits the plugin, but a lab host's sources carry no contrib and its
    gres.conf names fixture devices: the role installs none there (the Debian 13 lane once
    failed on `No package matching 'slurm-wlm-nvml-plugin'`)."""
    from tests.conftest import debian13_lab_raw  # noqa: PLC0415

    lab = loader.parse(debian13_lab_raw())
    plan = slurm.plan(lab)["gpu_detection"]
    assert plan["suite"] == "trixie" and plan["plugin_version"] is None
    assert not any(line.startswith("AutoDetect") for line in slurm.gres_conf(lab))
    region = next(iter(lab.burst_groups.values())).region
    assert inventory.burst_image_vars(lab, region)["slurm_nvml_plugin_version"] == ""


def test_the_role_installs_the_resolved_plugin_and_the_image_gets_it_too() -> None:
    """The slurm role's default reads the plan's plugin version; a burst image, which has
    no plan, is handed it among its variables."""
    defaults = yaml.safe_load((ROOT / "roles/slurm/defaults/main.yml").read_text())
    assert "slurm_policy.gpu_detection.plugin_version" in defaults["slurm_nvml_plugin_version"]
    tasks = yaml.safe_load((ROOT / "roles/slurm/tasks/packages.yml").read_text())
    install = next(t for t in tasks if "NVML plugin" in t["name"])
    assert install["ansible.builtin.apt"]["name"] == [
        "{{ slurm_nvml_plugin_package }}={{ slurm_nvml_plugin_version }}",
        "{{ slurm_nvidia_ml_package }}={{ slurm_nvidia_driver_version }}*"]
    desc = loader.load_stack("example", ROOT)
    region = next(iter(desc.burst_groups.values())).region
    assert inventory.burst_image_vars(desc, region)["slurm_nvml_plugin_version"] == "24.11.5-2"
    bookworm = _with_slurm("example", "22.05.8-4+deb12u3")
    assert inventory.burst_image_vars(bookworm, region)["slurm_nvml_plugin_version"] == ""


def test_validate_can_say_plainly_why_there_is_no_autodetection() -> None:
    bookworm = _with_slurm("example", "22.05.8-4+deb12u3")
    text = gpu_detection.notice(bookworm)
    assert text is not None
    assert "on Debian 12 (bookworm) NVML autodetection cannot be installed with a fixed " \
        "Slurm" in text and "AutoDetect=off" in text
    assert gpu_detection.notice(loader.load_stack("example", ROOT)) is None  # trixie: NVML
    assert gpu_detection.notice(loader.load_stack("lab", ROOT)) is None  # fixture devices


def test_validate_prints_the_notice_and_lists_it_in_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pool.yaml"
    raw = raw_stack("example")
    # Debian 12's Slurm, on Debian 12 nodes (rule release-slurm-suite).
    path.write_text(yaml.safe_dump(mutate(raw, [
        {"set": "software.slurm", "value": "22.05.8-4+deb12u3"},
        *({"set": f"node_classes.{c}.os", "value": "debian-12"} for c in raw["node_classes"])])))
    assert cli.main(["validate", "--file", str(path), "--json"]) == cli.EXIT_OK
    notices = json.loads(capsys.readouterr().out)["notices"]
    assert notices == [gpu_detection.notice(loader.load_file(path))]
    assert cli.main(["validate", "--file", str(path)]) == cli.EXIT_OK
    assert "note: GPU detection: " in capsys.readouterr().out
    assert cli.main(["validate", "--stack", "example", "--json"]) == cli.EXIT_OK
    # The example's Debian 13 nodes have NVML, on a release the lab proves: no notice.
    assert json.loads(capsys.readouterr().out)["notices"] == []


def test_detection_follows_the_release_s_own_slurm_lock() -> None:
    """A pool whose `software.slurm` is Debian 12's while every node runs Debian 13 with its
    own Slurm (software.per_release): gres.conf, the plugin and validate's notice follow
    the Slurm the nodes install, not the pool-wide lock nobody runs (before: AutoDetect=off
    and no plugin on Debian 13 nodes that could have NVML)."""
    raw = raw_stack("example")
    raw["software"]["slurm"] = "22.05.8-4+deb12u3"
    raw["software"]["per_release"] = {"debian-13": {"slurm": "24.11.5-4+deb13u1"}}
    desc = loader.parse(raw)
    assert slurm.gres_conf(desc)[0] == "AutoDetect=nvml"
    assert slurm.plan(desc)["gpu_detection"]["plugin_version"] == "24.11.5-2"
    assert gpu_detection.notice(desc) is None
    region = next(iter(desc.burst_groups.values())).region
    assert inventory.burst_image_vars(desc, region)["slurm_nvml_plugin_version"] == "24.11.5-2"
