"""The lab's burst image (its stand-in for the pool's pre-built AMI), built the way EC2
Image Builder builds the real one: the component document the Pulumi program declares
(gpupool.render.image.component_document) is run step by step in a bare lab host.

The bare host is the lab's base image (Debian 12, as the build's official AMI), with
systemd, on podman's default network (it fetches Debian's packages as a build instance
does). Its build phase installs Debian's Ansible, fetches the artifact, writes the image's
variables and runs playbooks/burst_image.yml with them; its validate phase checks what the
user-data needs. So a role or playbook change that would break the real image build, or
an image the boot cannot use, fails here first. What the lab does differently, and why:

- **The artifact** is packed from this checkout's working tree (the paths of
  image.ARTIFACT_PATHS and the gate's archive, as `make burst-image-artifact` packs them
  from HEAD): the lab tests what is checked out. The S3Download step is a copy, and the
  document pins the packed archive's SHA-256 as the stack config pins the uploaded one's.
- **The variables** add the lab's NVIDIA mirror (hosts.mirror_vars), as the lab's
  inventory does for its on-prem hosts: NVIDIA's repositories are unreachable here.
- **A FIXTURE layer** after the build gives the image what a real instance has and a lab
  host lacks: the metadata service (fixture_imds.py), an `aws` wrapper that sends the CLI
  to the lab's moto, the NoCloud seed folder, and slurmd's fresh-boot flag (a container
  shares this machine's boot time).

Built once per lab and recipe (the document, the lab's variables, the artifact's files,
the fixture layer and the base image: any change is a new image), reused by every test.
Nothing here is EC2 or Image Builder; no cloud behaviour follows from it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gpupool.lab import hosts, mirror
from gpupool.paths import PROJECT_ROOT, files_under
from gpupool.render import image
from gpupool.render.cloud import names
from gpupool.spec import os_release
from gpupool.spec.model import Description


class BurstImageError(hosts.LabError):
    """The lab's burst image could not be built; the message says which step failed."""


FIXTURE_IMDS = Path(__file__).with_name("fixture_imds.py")
# In the host: the lab's fixture folder, the metadata's state and injected notices, the
# lab's AWS endpoint, and cloud-init's NoCloud seed (the host's user-data and meta-data).
LAB_DIR = "/etc/gpupool-lab"
IMDS_DIR = f"{LAB_DIR}/imds"
IMDS_STATE = f"{IMDS_DIR}/state.json"
ENDPOINT_FILE = f"{LAB_DIR}/aws-endpoint"
SEED_DIR = "/var/lib/cloud/seed/nocloud"
STEP_TIMEOUT_S = 900
BOOT_WAIT_S = 60
STAGE = "/srv/gpupool-build"  # in the builder: what this machine hands it, read-only
ARTIFACT = "gpupool-image.tar.gz"
# Where the artifact carries the gate's archive (roles/acceptance_gate looks beside the
# playbooks: acceptance_gate_bundle).
GATE_BUNDLE = image.GATE_BUNDLE

# FIXTURE (lab only), run in the built image: what a real instance has and a lab host
# lacks. Nothing of the burst node's own software is touched. The @NAME@ marks are this
# module's paths (fixture_layer fills them), so the host and the layer cannot disagree.
_FIXTURE_LAYER = r"""set -eu
# A container shares this machine's boot time, and slurmctld takes a resuming node whose
# boot predates the resume for one that never rebooted (it waits out ResumeTimeout). -b
# reports the fresh boot a real instance's uptime shows.
mkdir -p /etc/systemd/system/slurmd.service.d
printf '%s\n' '[Service]' 'ExecStart=' 'ExecStart=/usr/sbin/slurmd -D -s -b $SLURMD_OPTIONS' \
  > /etc/systemd/system/slurmd.service.d/gpupool-lab-boot.conf
# cloud-init: the seed folder only; the host's network, name and locale are podman's.
mkdir -p /etc/cloud/cloud.cfg.d @SEED_DIR@
printf '%s\n' 'datasource_list: [NoCloud, None]' 'network: {config: disabled}' \
  'preserve_hostname: true' 'locale: C.UTF-8' > /etc/cloud/cloud.cfg.d/90-gpupool-lab.cfg
# The metadata service on 169.254.169.254, before cloud-init runs user scripts.
install -d -m 0755 @LAB_DIR@ @IMDS_DIR@
install -m 0755 @STAGE@/fixture_imds.py /usr/local/sbin/gpupool-fixture-imds
cat > /etc/systemd/system/gpupool-fixture-imds.service <<'EOF'
[Unit]
Description=FIXTURE instance metadata service (lab only; not EC2)
Before=cloud-init-local.service cloud-init.service cloud-final.service
DefaultDependencies=no
After=local-fs.target
[Service]
ExecStartPre=-/usr/sbin/ip addr add 169.254.169.254/32 dev lo
ExecStart=/usr/local/sbin/gpupool-fixture-imds --state @IMDS_STATE@
Restart=on-failure
[Install]
WantedBy=sysinit.target
EOF
systemctl enable gpupool-fixture-imds.service >/dev/null 2>&1
# The lab's AWS is moto on this machine; the CLI is the image's (Debian's).
cat > /usr/local/bin/aws <<'EOF'
#!/bin/sh
# FIXTURE (lab only): the real AWS CLI, sent to the lab's moto endpoint.
exec /usr/bin/aws --endpoint-url "$(cat @ENDPOINT_FILE@)" "$@"
EOF
chmod 0755 /usr/local/bin/aws
"""


def fixture_paths() -> dict[str, str]:
    """The @NAME@ marks of the fixture layer and the paths they stand for: this module's
    own literals, plain absolute paths (a unit test keeps them so), which therefore need no
    quoting in the layer's shell lines and here-documents."""
    return {"LAB_DIR": LAB_DIR, "IMDS_DIR": IMDS_DIR, "IMDS_STATE": IMDS_STATE,
            "ENDPOINT_FILE": ENDPOINT_FILE, "SEED_DIR": SEED_DIR, "STAGE": STAGE}


def fixture_layer() -> str:
    """The fixture layer's script with this module's paths in it."""
    script = _FIXTURE_LAYER
    for mark, path in fixture_paths().items():
        script = script.replace(f"@{mark}@", path)
    return script


def region(desc: Description) -> str:
    """The lab bursts in one region: the first the pool bursts in."""
    found = names.regions(desc)
    if not found:
        raise BurstImageError("the pool declares no burst group: there is no burst image")
    return found[0]


def lab_vars(desc: Description) -> dict[str, str]:
    """What the lab adds to the image's variables: its NVIDIA mirror, signed by its key."""
    key = hosts.mirror_dir(desc) / mirror.KEY_NAME
    if not key.is_file():
        raise BurstImageError(f"{key} is missing: bring the lab up first (gpupool lab up)")
    return hosts.mirror_vars(key.read_text())


def gate_bundle(desc: Description) -> Path:
    """The gate's archive for the image's release's Python, packed where the lab's own
    roles pack it (the stamp beside it skips the packing while this checkout's gate is
    unchanged)."""
    python = os_release.burst_release(desc).python
    out = hosts.cache_dir() / f"gate-bundle-py{python}.tar.gz"
    proc = subprocess.run([sys.executable, "-m", "gpupool.gate.bundle", str(out),
                           "--python", python],
                          cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise BurstImageError(f"packing the gate for the image: {proc.stderr.strip()}")
    return out


def artifact_files(bundle: Path) -> list[tuple[str, Path]]:
    """(name in the archive, file here): image.ARTIFACT_PATHS from the working tree, and
    the gate's archive where the playbook looks for it, sorted by name."""
    files = [(str(p.relative_to(PROJECT_ROOT)), p) for top in image.ARTIFACT_PATHS
             for p in files_under(PROJECT_ROOT / top)]
    return sorted([*files, (GATE_BUNDLE, bundle)])


def pack_artifact(files: list[tuple[str, Path]], out: Path) -> str:
    """Write the artifact and return its SHA-256, the digest the component pins (as an
    operator pins the uploaded archive's). The archive holds names, modes and bytes only
    (no times, owners, nor gzip's time stamp), so the same files give the same digest."""
    with out.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(out.read_bytes()).hexdigest()


def image_ref(desc: Description, document: str, added: dict[str, str], artifact: str,
              base: str) -> str:
    recipe = json.dumps([document, added, artifact, fixture_layer(), FIXTURE_IMDS.read_text(),
                         base], sort_keys=True)
    return f"localhost/gpupool-burst-{desc.pool.name}:" \
           f"{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"


def _in_builder(builder: str, script: str, what: str) -> None:
    proc = hosts.podman("exec", builder, "bash", "-c", script, check=False,
                        timeout=STEP_TIMEOUT_S)
    if proc.returncode != 0:
        raise BurstImageError(f"the burst image's step {what} failed ({proc.returncode}): "
                              f"{(proc.stdout + proc.stderr).strip()[-3000:]}")


def _stage_file(builder: str, stage: Path, name: str, text: str, dest: str) -> None:
    """Write text to dest in the builder (a new folder mode 0700, the file 0600)."""
    (stage / name).write_text(text)
    _in_builder(builder, f"install -D -m 0600 {shlex.quote(f'{STAGE}/{name}')} "
                f"{shlex.quote(dest)}", f"writing {dest}")


def run_phase(builder: str, phase: dict[str, Any], stage: Path, added: dict[str, str]) -> None:
    """One phase of the component document, step by step, as Image Builder runs it:
    ExecuteBash's commands as one bash script, S3Download as a copy of the artifact,
    CreateFile as written (the image's variables with the lab's added)."""
    for step in phase["steps"]:
        action, name, inputs = step["action"], step["name"], step["inputs"]
        if action == "ExecuteBash":
            _in_builder(builder, "\n".join(inputs["commands"]), name)
        elif action == "S3Download":
            for given in inputs:
                _in_builder(builder, f"install -D -m 0600 {STAGE}/{ARTIFACT} "
                            f"{shlex.quote(given['destination'])}", name)
        elif action == "CreateFile":
            for i, given in enumerate(inputs):
                text = given["content"]
                if given["path"] == image.VARS_FILE:
                    text = json.dumps({**json.loads(text), **added}, sort_keys=True)
                _stage_file(builder, stage, f"file{i}", text, given["path"])
        else:
            raise BurstImageError(f"step {name}: the lab does not run {action} steps")


def _booted(builder: str) -> bool:
    state = hosts.podman("exec", builder, "systemctl", "is-system-running", check=False,
                         timeout=30).stdout.strip()
    return state in ("running", "degraded")


def build(desc: Description, report: hosts.Report = lambda _m: None) -> str:
    """The lab's burst image, built from the component document unless it exists. The lab
    packs the artifact and hands its SHA-256 to the document, as an operator pins the
    uploaded archive's in the stack config: the build's VerifyArtifact step checks it."""
    added = lab_vars(desc)
    # The image builds on the controllers' release, as in the cloud (launch.ami_name).
    base = hosts.build_image(report, hosts.base_recipe(os_release.burst_release(desc)))
    files = artifact_files(gate_bundle(desc))
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        digest = pack_artifact(files, stage / ARTIFACT)
        document = image.component_document(desc, region(desc), digest)
        ref = image_ref(desc, document, added, digest, base)
        if hosts.podman("image", "exists", ref, check=False).returncode == 0:
            return ref
        _prune_images(desc)
        report(f"building burst image {ref} from {base} by its Image Builder component")
        start = time.monotonic()
        (stage / "fixture_imds.py").write_text(FIXTURE_IMDS.read_text())
        builder = f"gpupool-burst-build-{desc.pool.name}"
        hosts.podman("rm", "-f", builder, check=False)
        try:
            # Labelled with the pool, so `gpupool lab down` removes one left behind.
            hosts.podman("run", "-d", *hosts.labels(desc), "--name", builder,
                         "--systemd=always", "--cap-add", "NET_ADMIN",
                         "--security-opt", "unmask=/proc/sys",
                         "-v", f"{hosts.mirror_dir(desc)}:{hosts.MIRROR_MOUNT}:ro",
                         "-v", f"{stage}:{STAGE}:ro", base)
            hosts.wait_for(f"systemd in {builder}", lambda: _booted(builder), BOOT_WAIT_S)
            for phase in yaml.safe_load(document)["phases"]:
                run_phase(builder, phase, stage, added)
            _in_builder(builder, fixture_layer(), "the lab's fixture layer")
            hosts.podman("stop", "-t", "30", builder, timeout=120)
            hosts.podman("commit", "--change", 'CMD ["/sbin/init"]', "--change",
                         "ENTRYPOINT []", "--change", f"LABEL gpupool.pool={desc.pool.name}",
                         builder, ref, timeout=STEP_TIMEOUT_S)
        finally:
            hosts.podman("rm", "-f", "-t", "0", builder, check=False)
    report(f"burst image {ref} built in {time.monotonic() - start:.0f}s")
    return ref


def _prune_images(desc: Description) -> None:
    """Burst images of this lab from an earlier recipe: one is kept at most."""
    out = hosts.podman("images", "--filter",
                       f"reference=localhost/gpupool-burst-{desc.pool.name}",
                       "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    if out:
        hosts.podman("rmi", "-f", *out, timeout=STEP_TIMEOUT_S)
