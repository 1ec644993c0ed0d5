"""The lab's burst image without the lab: it is built by running the Image Builder
component the Pulumi program declares (gpupool.render.image), step by step, with only the
lab's named differences (the artifact from the working tree, the lab's NVIDIA mirror in
the variables); its recipe names everything the image is made of. The build itself, on a
bare lab host, is proven by tests/integration/test_slurm_lab.py (aws_lab)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from gpupool.lab import burst_image, hosts, mirror
from gpupool.render import image, inventory
from gpupool.spec import loader
from tests.conftest import ROOT

DESC = loader.load_stack("lab", ROOT)
ADDED = hosts.mirror_vars("-----BEGIN PGP PUBLIC KEY BLOCK-----\nfixture\n")


DIGEST = "0123456789abcdef" * 4


def _document() -> str:
    return image.component_document(DESC, burst_image.region(DESC), DIGEST)


def test_every_step_of_the_document_runs_and_the_lab_adds_only_its_mirror(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, str]] = []
    monkeypatch.setattr(burst_image, "_in_builder",
                        lambda _b, script, what: ran.append((what, script)))
    for phase in yaml.safe_load(_document())["phases"]:
        burst_image.run_phase("builder", phase, tmp_path, ADDED)
    steps = [what for what, _ in ran]
    assert steps == ["InstallAnsible", "FetchPlaybooks", "VerifyArtifact",
                     f"writing {image.VARS_FILE}",
                     "RunPlaybook", "CleanUp", "BurstBootNeeds"]
    written = json.loads((tmp_path / "file0").read_text())
    assert written == {**inventory.burst_image_vars(DESC, burst_image.region(DESC)), **ADDED}
    assert written["nvidia_repo_source"] == "mirror"
    fetch = dict(ran)["FetchPlaybooks"]
    assert f"{burst_image.STAGE}/{burst_image.ARTIFACT} /opt/gpupool-image/" in fetch


def test_a_step_the_lab_cannot_run_is_refused_by_name(tmp_path: Path) -> None:
    phase = {"steps": [{"name": "Reboot", "action": "Reboot", "inputs": {}}]}
    with pytest.raises(burst_image.BurstImageError, match="Reboot: the lab does not run"):
        burst_image.run_phase("builder", phase, tmp_path, ADDED)


def test_a_destination_is_quoted_for_the_builders_shell(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    ran: list[str] = []
    monkeypatch.setattr(burst_image, "_in_builder", lambda _b, script, _w: ran.append(script))
    phase = {"steps": [{"name": "F", "action": "S3Download",
                        "inputs": [{"source": "s3://b/k", "destination": "/x; rm -rf /"}]}]}
    burst_image.run_phase("builder", phase, tmp_path, ADDED)
    assert ran[0].endswith("'/x; rm -rf /'")


def test_the_artifact_is_the_working_trees_files_and_the_gate(tmp_path: Path) -> None:
    bundle = tmp_path / "gate-bundle.tar.gz"
    bundle.write_bytes(b"gate")
    files = dict(burst_image.artifact_files(bundle))
    assert files[image.GATE_BUNDLE] == bundle
    assert "playbooks/burst_image.yml" in files and "ansible.cfg" in files
    assert "roles/acceptance_gate/defaults/main.yml" in files
    assert "gpupool/onhost/spot_watch.py" in files
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in files)
    assert {n.split("/")[0] for n in files} == {"ansible.cfg", "playbooks", "roles", "gpupool",
                                                ".cache"}


def test_the_recipe_changes_with_every_input(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("one")
    b.write_text("one")
    first = burst_image.pack_artifact([("x", a)], tmp_path / "1.tar.gz")
    assert burst_image.pack_artifact([("x", b)], tmp_path / "2.tar.gz") == first
    b.write_text("two")
    changed = burst_image.pack_artifact([("x", b)], tmp_path / "3.tar.gz")
    assert changed != first
    doc = _document()
    ref = burst_image.image_ref(DESC, doc, ADDED, first, "base:1")
    assert ref.startswith(f"localhost/gpupool-burst-{DESC.pool.name}:")
    assert len({ref,
                burst_image.image_ref(DESC, doc + " ", ADDED, first, "base:1"),
                burst_image.image_ref(DESC, doc, hosts.mirror_vars("other"), first, "base:1"),
                burst_image.image_ref(DESC, doc, ADDED, changed, "base:1"),
                burst_image.image_ref(DESC, doc, ADDED, first, "base:2")}) == 5


def test_the_artifacts_digest_is_its_sha256_and_the_build_step_accepts_it(
        tmp_path: Path) -> None:
    """pack_artifact's digest is the archive's own SHA-256, stable for the same files (no
    times in the tar nor the gzip header), and the rendered VerifyArtifact commands pass
    that archive and refuse another."""
    src = tmp_path / "x"
    src.write_text("one")
    archive = tmp_path / "1.tar.gz"
    digest = burst_image.pack_artifact([("x", src)], archive)
    assert digest == hashlib.sha256(archive.read_bytes()).hexdigest()
    os.utime(src, (1, 1))
    assert burst_image.pack_artifact([("x", src)], tmp_path / "2.tar.gz") == digest
    with tarfile.open(archive) as tar:
        assert [(m.name, m.mtime, m.uid, m.uname) for m in tar] == [("x", 0, 0, "")]
    for pinned, ok in ((digest, True), (DIGEST, False)):
        script = "\n".join(image.verify_commands(pinned, str(archive)))
        proc = subprocess.run(["bash", "-c", script], capture_output=True, check=False)
        assert (proc.returncode == 0) is ok, proc.stderr


def test_the_lab_hands_the_packed_artifacts_digest_to_the_document(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "gate-bundle.tar.gz"
    bundle.write_bytes(b"gate")
    monkeypatch.setattr(burst_image, "lab_vars", lambda _d: ADDED)
    monkeypatch.setattr(burst_image, "gate_bundle", lambda _d: bundle)
    monkeypatch.setattr(hosts, "build_image", lambda _r, _recipe=None: "base:1")
    monkeypatch.setattr(hosts, "podman", lambda *_a, **_k: subprocess.CompletedProcess(
        _a, 0, "", ""))  # the image exists: build() returns its ref
    rendered: list[str | None] = []
    real = image.component_document
    monkeypatch.setattr(image, "component_document",
                        lambda d, r, digest: rendered.append(digest) or real(d, r, digest))
    ref = burst_image.build(DESC)
    expected = burst_image.pack_artifact(burst_image.artifact_files(bundle),
                                         tmp_path / "again.tar.gz")
    assert rendered == [expected]
    document = real(DESC, burst_image.region(DESC), expected)
    assert ref == burst_image.image_ref(DESC, document, ADDED, expected, "base:1")


def test_no_mirror_no_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts, "mirror_dir", lambda _d: tmp_path)
    with pytest.raises(burst_image.BurstImageError, match="bring the lab up first"):
        burst_image.lab_vars(DESC)
    (tmp_path / mirror.KEY_NAME).write_text("key")
    assert burst_image.lab_vars(DESC)["nvidia_repo_mirror_key"] == "key"


def test_the_fixture_layer_touches_no_burst_software() -> None:
    """Only what a lab host lacks: the metadata service, the aws wrapper, cloud-init's
    seed folder and slurmd's fresh-boot flag; everything else is the playbook's."""
    layer = burst_image.fixture_layer()
    written = {line.split(">")[-1].strip() for line in layer.splitlines()
               if ">" in line and "/etc/" in line.split(">")[-1]}
    assert written == {"/etc/systemd/system/slurmd.service.d/gpupool-lab-boot.conf",
                       "/etc/cloud/cloud.cfg.d/90-gpupool-lab.cfg",
                       "/etc/systemd/system/gpupool-fixture-imds.service <<'EOF'"}
    for never in ("apt-get", "munge", "nftables", "sshd", "slurm.conf"):
        assert never not in layer, never


def test_the_fixture_layer_uses_the_paths_the_lab_hosts_are_given() -> None:
    """The layer's folders and files are the module's constants, which burst_hosts writes
    into each host: a path changed in one place cannot leave the other behind."""
    layer = burst_image.fixture_layer()
    assert "@" not in layer.replace('"$@"', "")
    assert f"mkdir -p /etc/cloud/cloud.cfg.d {burst_image.SEED_DIR}\n" in layer
    assert f"--state {burst_image.IMDS_STATE}\n" in layer
    assert f'"$(cat {burst_image.ENDPOINT_FILE})"' in layer
    assert f"install -m 0755 {burst_image.STAGE}/fixture_imds.py " in layer
    assert burst_image.IMDS_STATE.startswith(burst_image.IMDS_DIR + "/")


def test_the_fixture_paths_are_plain_so_the_layer_needs_no_quoting() -> None:
    """The layer puts them unquoted into shell lines and here-documents: only plain absolute
    paths may be, and every mark the layer holds is one of them."""
    paths = burst_image.fixture_paths()
    for mark, path in paths.items():
        assert re.fullmatch(r"(/[\w.-]+)+", path) and ".." not in path, (mark, path)
    assert set(re.findall(r"@([A-Z_]+)@", burst_image._FIXTURE_LAYER)) == set(paths)
