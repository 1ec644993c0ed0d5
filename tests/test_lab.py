"""The lab's names and plan derive from the description (no podman needed)."""

from __future__ import annotations

import json

import pytest

from gpupool.lab import hosts, mirror
from gpupool.spec import loader
from gpupool.spec.model import DEFAULT_RELEASE, Description, OsRelease


def _desc() -> Description:
    return loader.load_stack("lab")


def test_resource_names_derive_from_pool_and_description() -> None:
    desc = _desc()
    assert hosts.container_name(desc, "lab-gpu1") == "gpupool-lab-lab-gpu1"
    assert {hosts.network_name(desc, s) for s in desc.network.segments} == {
        f"gpupool-lab-{s}" for s in ("training", "storage", "management")}
    assert hosts.inventory_path(desc).parts[-3:] == (".lab", "lab", "inventory.yml")


def test_image_is_keyed_by_its_recipe(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    before = hosts.image_hash(hosts.base_recipe(DEFAULT_RELEASE))
    monkeypatch.setattr(hosts, "IMAGE_PACKAGES", (*hosts.IMAGE_PACKAGES, "vim"))
    recipe = hosts.base_recipe(DEFAULT_RELEASE)
    assert hosts.image_hash(recipe) != before
    assert hosts.image_ref(recipe).endswith(hosts.image_hash(recipe))


def test_driver_packages_come_from_the_role() -> None:
    pkgs = mirror.driver_packages()
    assert "nvidia-smi" in pkgs and "nvidia-persistenced" in pkgs


def test_bench_pool_widens_lab_to_five_gpu_nodes() -> None:
    from bench.onboard import bench_description  # noqa: PLC0415

    desc = bench_description(5)
    assert desc.source is not None
    desc.source.unlink()  # the bench removes it after its run
    assert desc.pool.name == "bench"
    gpu = [n for n, node in desc.nodes.items() if desc.node_classes[node.class_].gpu]
    assert len(gpu) == 5
    mgmt = [node.addresses["management"] for node in desc.nodes.values()]
    assert len(set(mgmt)) == len(mgmt) and all(a.startswith("10.251.") for a in mgmt)


def test_mirror_carries_every_other_driver_build_debian_serves() -> None:
    """Each package's build of each other nvidia-smi version; packages with a version
    stream of their own (no build of that version) keep their one build."""
    served = {
        "nvidia-smi": ["535.309.01-0+deb12u1", "535.261.03-1"],
        "libnvidia-ml1": ["535.309.01-0+deb12u1", "535.261.03-1"],
        "nvidia-modprobe": ["535.309.01-0+deb12u1", "535.161.07-1~deb12u1"],
        "nvidia-persistenced": ["535.171.04-1~deb12u1"],
        "pciutils": ["1:3.9.0-4"],
    }
    assert mirror.other_builds(served, "535.309.01") == [
        "libnvidia-ml1=535.261.03-1", "nvidia-smi=535.261.03-1"]
    assert mirror.other_builds(served, "535.261.03") == [
        "libnvidia-ml1=535.309.01-0+deb12u1", "nvidia-modprobe=535.309.01-0+deb12u1",
        "nvidia-smi=535.309.01-0+deb12u1"]
    assert mirror.other_builds({"nvidia-smi": ["535.309.01-0+deb12u1"]}, "535.309.01") == []


def test_mirror_reads_the_driver_builds_it_carries(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pool = tmp_path / "pool"
    pool.mkdir()
    for name in ("nvidia-smi_535.309.01-0+deb12u1_amd64.deb",
                 "nvidia-smi_535.261.03-1_amd64.deb", "libnvidia-ml1_535.216.03-1_amd64.deb",
                 "datacenter-gpu-manager_1%3a3.3.9_amd64.deb"):
        (pool / name).touch()
    assert mirror.driver_versions(tmp_path) == ["535.261.03", "535.309.01"]


class _FakePodman:
    """Just enough of podman's container life cycle for ensure_host: create, inspect, start
    and rm, by name, recording each call."""

    def __init__(self) -> None:
        self.containers: dict[str, dict[str, object]] = {}
        self.calls: list[str] = []

    def __call__(self, *args: str, check: bool = True, timeout: float = 300):  # type: ignore[no-untyped-def]
        import subprocess  # noqa: PLC0415

        self.calls.append(args[0])
        out, rc = "", 0
        if args[:2] == ("container", "inspect"):
            info = self.containers.get(args[2])
            out, rc = (json.dumps([info]), 0) if info else ("", 125)
        elif args[0] == "create":
            name = args[args.index("--name") + 1]
            made = [a.split("=", 1)[1] for a in args if a.startswith("gpupool.create=")]
            self.containers[name] = {"State": {"Status": "created"},
                                     "Config": {"Labels": {"gpupool.create": made[0]}}}
        elif args[0] == "start":
            self.containers[args[1]]["State"] = {"Status": "running"}
        elif args[0] == "rm":
            self.containers.pop(args[-1])
        return subprocess.CompletedProcess(["podman", *args], rc, out, "")


def test_a_host_made_by_another_checkout_is_replaced_not_reused(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    desc = _desc()
    fake = _FakePodman()
    monkeypatch.setattr(hosts, "podman", fake)
    monkeypatch.setattr(hosts, "lab_dir", lambda _d: tmp_path / "one")
    assert hosts.ensure_host(desc, "lab-ctl", "img") is True
    fake.calls.clear()
    assert hosts.ensure_host(desc, "lab-ctl", "img") is False  # same arguments: kept
    assert fake.calls == ["container"]
    # Another clone's lab left on this machine: its host mounts that clone's key and mirror.
    monkeypatch.setattr(hosts, "lab_dir", lambda _d: tmp_path / "two")
    assert hosts.ensure_host(desc, "lab-ctl", "img") is True
    assert fake.calls[-3:] == ["rm", "create", "start"]
    # So is one built from another image, and one asked to be replaced.
    assert hosts.ensure_host(desc, "lab-ctl", "img2") is True
    assert hosts.ensure_host(desc, "lab-ctl", "img2", replace=True) is True
    assert hosts.ensure_host(desc, "lab-ctl", "img2") is False


def test_host_keys_are_recorded_per_host_and_verified_by_every_ssh(monkeypatch, tmp_path  # type: ignore[no-untyped-def]
                                                                   ) -> None:
    """Issue 50: the lab records each host's key through podman (its trusted channel) and
    every SSH client it configures (Ansible's, the gate's, its own) verifies it: a host made
    anew replaces its line; what is not one ed25519 public key is refused."""
    import subprocess  # noqa: PLC0415

    import pytest  # noqa: PLC0415

    desc = _desc()
    monkeypatch.setattr(hosts, "lab_dir", lambda _d: tmp_path)
    keys = {"lab-ctl": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOne root@lab-ctl\n",
            "lab-gpu1": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITwo root@lab-gpu1\n"}

    def exec_(_d: Description, node: str, argv: list[str], timeout: float = 120
              ) -> subprocess.CompletedProcess[str]:
        assert argv == ["cat", hosts.HOST_KEY_FILE]
        return subprocess.CompletedProcess(argv, 0, keys[node], "")

    monkeypatch.setattr(hosts, "exec_", exec_)
    hosts.record_host_key(desc, "lab-ctl")
    hosts.record_host_key(desc, "lab-gpu1")
    keys["lab-ctl"] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINew root@lab-ctl\n"
    hosts.record_host_key(desc, "lab-ctl")
    lines = hosts.known_hosts_path(desc).read_text().splitlines()
    ctl = ",".join(["lab-ctl", *desc.nodes["lab-ctl"].addresses.values()])
    assert lines == [
        f"{','.join(['lab-gpu1', *desc.nodes['lab-gpu1'].addresses.values()])} "
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITwo",
        f"{ctl} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINew"]
    for bad in ("ssh-rsa AAAAB3Nza root@x", "ssh-ed25519", "ssh-ed25519 AAAA;id",
                "ssh-ed25519 AAAA\nlab-ctl ssh-ed25519 EVIL"):
        keys["lab-ctl"] = bad
        with pytest.raises(hosts.LabError, match="no ssh-ed25519 public key"):
            hosts.record_host_key(desc, "lab-ctl")
    args = " ".join(hosts.ssh_args(desc))
    assert "StrictHostKeyChecking=yes" in args and "/dev/null" not in args
    assert f"UserKnownHostsFile={hosts.known_hosts_path(desc)}" in args


def test_a_lab_boots_its_classes_release() -> None:
    """Each lab boots the image of its node classes' release, one release per lab (Slurm
    22.05 and 24.11 cannot share one), from that release's suite and mirror."""
    from tests.conftest import debian13_lab_raw  # noqa: PLC0415

    assert hosts.lab_recipe(_desc()).suite == "bookworm"
    trixie = loader.parse(debian13_lab_raw())
    recipe = hosts.lab_recipe(trixie)
    assert (recipe.suite, recipe.name) == ("trixie", "gpupool-base-trixie")
    assert hosts.image_ref(recipe) != hosts.image_ref(hosts.lab_recipe(_desc()))
    assert "deb http://deb.debian.org/debian trixie main contrib non-free" in \
        mirror.debian_sources(OsRelease.DEBIAN_13)


def test_a_lab_of_two_releases_is_refused_with_a_message() -> None:
    # Built past validation, which refuses the mix too (rule slurm-release-window).
    desc = Description.model_construct(**{**_desc().__dict__, "node_classes": {
        **_desc().node_classes,
        "ctl": _desc().node_classes["ctl"].model_copy(update={"os": OsRelease.DEBIAN_13})}})
    with pytest.raises(hosts.LabError, match="the lab runs one Debian release, the "
                       "description declares nodes on debian-12, debian-13"):
        hosts.lab_release(desc)
