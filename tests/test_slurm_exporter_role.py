"""Issue 50, PrivateData=jobs: role slurm_exporter splits the scheduler exporter in two. Its
units as Ansible renders them for the lab stack (tests/test_template_escaping.py's renderer,
the benign description): root's snapshot oneshot without capabilities, its file system
read-only but the snapshot directory, its network the controllers' addresses only; the
unprivileged exporter serving from the snapshot; the directory only root writes and only the
exporter's group reads. gpupool/onhost/slurm_exporter.py's halves: tests/test_slurm_exporter.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpupool.onhost import slurm_exporter as ex
from gpupool.render import slurm
from gpupool.spec import loader
from gpupool.spec.facts import controller

pytest.importorskip("ansible")

from tests.test_template_escaping import renders  # needs Ansible (importorskip above)

ROLE = Path(__file__).resolve().parents[1] / "roles" / "slurm_exporter"
VARS = yaml.safe_load((ROLE / "vars" / "Debian.yml").read_text())


def unit(name: str) -> list[tuple[str, str]]:
    """(key, value) of each directive of the unit as rendered for the lab's controller."""
    desc = loader.load_stack("lab")
    (text,) = [r.text for t, rs in renders(None).items() if t == ROLE / "templates" / name
               for r in rs if r.host == controller(desc) and r.text is not None]
    return [tuple(ln.split("=", 1)) for ln in text.splitlines()  # type: ignore[misc]
            if "=" in ln and not ln.startswith("#")]


def test_the_snapshot_is_root_without_capabilities_and_writes_one_directory() -> None:
    got = unit("gpupool-slurm-snapshot.service.j2")
    d = dict(got)
    assert "User" not in d and "DynamicUser" not in d  # root: Slurm shows it every job
    assert d["Type"] == "oneshot"
    assert d["ExecStart"].split() == [
        VARS["slurm_exporter_python"], f"{VARS['slurm_exporter_lib_dir']}/slurm_exporter.py",
        "--write-snapshot", VARS["slurm_exporter_snapshot_dir"]]
    assert d["CapabilityBoundingSet"] == "" and d["AmbientCapabilities"] == ""
    assert d["NoNewPrivileges"] == "true" and d["ProtectSystem"] == "strict"
    assert d["ReadWritePaths"] == VARS["slurm_exporter_snapshot_dir"]
    for key in ("ProtectHome", "PrivateTmp", "PrivateDevices", "ProtectKernelTunables",
                "ProtectKernelModules", "ProtectControlGroups", "RestrictSUIDSGID"):
        assert d[key] == "true", key


def test_the_snapshot_reaches_the_controllers_only() -> None:
    d = dict(unit("gpupool-slurm-snapshot.service.j2"))
    desc = loader.load_stack("lab")
    assert d["IPAddressDeny"] == "any"
    assert d["IPAddressAllow"].split() == [
        "localhost", *(addr for _, addr in slurm.controller_addresses(desc))]
    assert len(d["IPAddressAllow"].split()) >= 3  # the lab has a backup controller
    assert d["RestrictAddressFamilies"].split() == ["AF_UNIX", "AF_INET", "AF_INET6"]


def test_snapshots_are_taken_at_once_and_every_interval() -> None:
    d = dict(unit("gpupool-slurm-snapshot.timer.j2"))
    assert d["OnActiveSec"] == "0" and d["OnUnitActiveSec"] == "10s"


def test_the_exporter_serves_from_the_snapshot_unprivileged() -> None:
    d = dict(unit("gpupool-slurm-exporter.service.j2"))
    assert d["User"] == "gpupool-exporter" and d["NoNewPrivileges"] == "true"
    argv = d["ExecStart"].split()
    snapshot = argv[argv.index("--snapshot") + 1]
    assert snapshot == f"{VARS['slurm_exporter_snapshot_dir']}/{ex.SNAPSHOT_NAME}"
    assert argv[argv.index("--max-age") + 1] == "40"  # four timer intervals


def test_only_root_writes_the_snapshot_and_only_the_exporters_group_reads_it() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    (directory,) = [t["ansible.builtin.file"] for t in tasks
                    if "ansible.builtin.file" in t and "snapshot" in t["name"]]
    assert directory == {"path": "{{ slurm_exporter_snapshot_dir }}", "state": "directory",
                         "owner": "root", "group": "{{ slurm_exporter_user }}", "mode": "0750"}
    (copy,) = [t for t in tasks if "ansible.builtin.copy" in t]
    assert "prom_textfile.py" in str(copy["loop"])  # the no-follow writer beside it
