"""The burst image as plain data: the EC2 Image Builder component document that turns a
Debian 12 instance into a burst node (playbooks/burst_image.yml at the software lock), the
semantic version that names it, the artifact it fetches, and the stack config that names
a pre-built image instead; image_plan gathers what BurstImage declares in a region. (Here,
not in cloud/launch.py beside the burst pool's plan: this module reads launch.)

infra/image.py declares the pipeline from these and the policy pack reads the same stack
config, so both follow one derivation.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from gpupool.render import inventory
from gpupool.render.cloud import launch, names, storage
from gpupool.spec import os_release
from gpupool.spec.catalog import INSTANCE_TYPES
from gpupool.spec.model import Description, Purpose

PLAYBOOK = "playbooks/burst_image.yml"
# What the artifact holds: the paths of this checkout the playbook reads (the slurm role
# copies gpupool/onhost/spot_watch.py from next to the roles). `make burst-image-artifact`
# packs them; an operator uploads the archive to artifact_uri().
ARTIFACT_PATHS = ("ansible.cfg", "playbooks", "roles", "gpupool/onhost")
# Packed beside them by `make burst-image-artifact` (gpupool.gate.bundle, not tracked):
# the acceptance gate the image's boot runs, for the Python of the image's release (the
# controllers'), where playbooks/burst_image.yml hands it to roles/acceptance_gate.
GATE_BUNDLE = ".cache/gate-bundle.tar.gz"
ARTIFACT_KEY = "gpupool/burst-image/gpupool-image.tar.gz"
WORK_DIR = "/opt/gpupool-image"
VARS_FILE = f"{WORK_DIR}/vars.json"  # the image's variables (inventory.burst_image_vars)
ARCHIVE = f"{WORK_DIR}/gpupool-image.tar.gz"  # where the build downloads the artifact
# Stack config: an AMI id for every burst region, or a JSON map region -> AMI id.
CONFIG_KEY = "burstImageId"
AMI_ID_RE = re.compile(r"^ami-[0-9a-f]{8,17}$")
# Stack config: the SHA-256 of the artifact the operator uploaded (`make
# burst-image-artifact` prints it), 64 lowercase hex digits. The build verifies the
# download against it before using it; without one the build refuses.
DIGEST_KEY = "burstImageArtifactSha256"
DIGEST_RE = re.compile(r"[0-9a-f]{64}")
# The major version of the scheme below: raised if the derivation itself changes.
VERSION_MAJOR = 1


def artifact_bucket(desc: Description) -> str:
    """The pool's datasets bucket: private, SSE-KMS with the pool key, read by burst nodes
    already; the image's archive sits under its own prefix there."""
    tier = storage.purpose_tier(desc, Purpose.DATASETS)
    if tier is None:
        raise ValueError("the burst image's artifact lives in the datasets bucket, and the "
                         "description declares no datasets tier")
    return names.bucket_name(desc, tier)


def artifact_uri(desc: Description) -> str:
    return f"s3://{artifact_bucket(desc)}/{ARTIFACT_KEY}"


def artifact_policy(bucket: str, key_region: str, key_arn: str) -> dict[str, Any]:
    """The build instance may read the image's artifact in bucket (artifact_bucket) and
    decrypt it through S3 (the datasets bucket is encrypted with the pool key, which lives
    in key_region, the pool's cloud region), nothing more."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadImageArtifact", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"arn:aws:s3:::{bucket}/{ARTIFACT_KEY}"]},
        {"Sid": "DecryptImageArtifact", "Effect": "Allow", "Action": ["kms:Decrypt"],
         "Resource": [key_arn], "Condition": {"StringEquals": {
             "kms:ViaService": f"s3.{key_region}.amazonaws.com"}}}]}


def artifact_digest(raw: str | None) -> str | None:
    """The artifact's pinned SHA-256 from the stack config gpupool:burstImageArtifactSha256:
    exactly 64 lowercase hex digits, or None where the config gives none (the build then
    refuses every artifact). Anything else is refused with a message, never a traceback."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or not DIGEST_RE.fullmatch(raw):
        shown = raw if isinstance(raw, str) and len(raw) <= 80 else f"{str(raw)[:80]}..."
        raise ValueError(f"gpupool:{DIGEST_KEY} must be the artifact's SHA-256 as exactly 64 "
                         f"lowercase hex digits (sha256sum's output), not {shown!r}")
    return raw


def verify_commands(digest: str | None, archive: str = ARCHIVE) -> list[str]:
    """The build's check of the downloaded artifact against the pinned digest, before
    anything reads it: a changed (or unpinned) artifact fails the build."""
    q = shlex.quote
    if digest is None:
        unpinned = (f"the burst image artifact is not pinned: set the stack config "
                    f"gpupool:{DIGEST_KEY} to its SHA-256")
        return ["set -eu", f"echo {q(unpinned)} >&2", "exit 1"]
    if not DIGEST_RE.fullmatch(digest):  # only a validated digest reaches the document
        raise ValueError(f"not a SHA-256: {digest!r}")
    changed = (f"the burst image artifact {archive} is not the one pinned by "
               f"gpupool:{DIGEST_KEY} ({digest}): refusing to build")
    return ["set -eu",
            f"if ! printf '%s  %s\\n' {digest} {q(archive)} "
            "| sha256sum --check --strict --quiet -; then",
            f"  echo {q(changed)} >&2", f"  rm -f {q(archive)}", "  exit 1", "fi"]


def _bash(name: str, *commands: str) -> dict[str, Any]:
    return {"name": name, "action": "ExecuteBash", "inputs": {"commands": list(commands)}}


def _build_steps(desc: Description, region: str, digest: str | None
                 ) -> list[dict[str, Any]]:
    archive = ARCHIVE
    # The lock is in here, in plain sight: a lock change is a new document, so a new version.
    image_vars = json.dumps(inventory.burst_image_vars(desc, region), sort_keys=True)
    q = shlex.quote
    return [
        _bash("InstallAnsible", "set -eu", "export DEBIAN_FRONTEND=noninteractive",
              "apt-get update -q", "apt-get install -y -q --no-install-recommends ansible"),
        {"name": "FetchPlaybooks", "action": "S3Download",
         "inputs": [{"source": artifact_uri(desc), "destination": archive}]},
        _bash("VerifyArtifact", *verify_commands(digest, archive)),
        {"name": "WriteVars", "action": "CreateFile",
         "inputs": [{"path": VARS_FILE, "content": image_vars}]},
        _bash("RunPlaybook", "set -eu", f"install -d -m 0700 {q(WORK_DIR)}/src",
              f"tar -xzf {q(archive)} -C {q(WORK_DIR)}/src",
              # Debian's ansible has no Mitogen, ansible.cfg's strategy: its own, named.
              f"cd {q(WORK_DIR)}/src && ANSIBLE_CONFIG={q(WORK_DIR)}/src/ansible.cfg "
              "ANSIBLE_STRATEGY=linear "
              f"ansible-playbook -c local -i localhost, -e @{q(VARS_FILE)} {PLAYBOOK}"),
        # A booted node runs no Ansible (its user-data boots it): the build's own tools
        # leave the image, about 500 MB of collections among them.
        _bash("CleanUp", "set -eu", "export DEBIAN_FRONTEND=noninteractive",
              f"rm -rf {q(WORK_DIR)}", "apt-get purge -y -q ansible ansible-core",
              "apt-get autoremove -y -q --purge", "apt-get clean"),
    ]


def _validate_steps(desc: Description) -> list[dict[str, Any]]:
    """What the user-data needs from the image, checked on the built instance. The NVIDIA
    stack's versions are refused by the playbook itself (tasks/nvidia_versions.yml)."""
    locked = os_release.lock(desc, os_release.burst_release(desc))["slurm"]
    slurm = shlex.quote(locked)
    return [_bash(
        "BurstBootNeeds", "set -eu",
        "for tool in cloud-init curl aws munged slurmd nvidia-smi; do command -v \"$tool\"; done",
        f"test -x {launch.SPOT_WATCH_PROGRAM}",
        f"test -f /etc/systemd/system/{launch.SPOT_WATCH_UNIT.format('')}",
        f"test ! -e {launch.MUNGE_KEY_PATH}",
        # The tiers' mount units the boot starts (role storage), enabled.
        *(f"systemctl is-enabled {shlex.quote(unit)}" for unit in storage.mount_units(desc)),
        "installed=$(dpkg-query -W -f='${Version}' slurmd)",
        f'case "${{installed#*:}}" in {slurm}|{slurm}-*) ;; '
        f'*) echo "slurmd $installed is not the lock\'s {locked}" >&2; exit 1;; esac')]


def component_document(desc: Description, region: str, digest: str | None) -> str:
    """The Image Builder component (document schema 1.0) of a burst region's image, which
    builds only from the artifact whose SHA-256 is digest (artifact_digest; None: it builds
    from none). The digest is in the document, so a new artifact is a new version."""
    doc = {
        "name": names.burst_image_name(desc, region),
        "description": f"gpupool pool {desc.pool.name}: a burst node at the software lock",
        "schemaVersion": 1.0,
        "phases": [{"name": "build", "steps": _build_steps(desc, region, digest)},
                   {"name": "validate", "steps": _validate_steps(desc)}],
    }
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


def version(document: str) -> str:
    """The semantic version of a component and its recipe: VERSION_MAJOR, then the first
    two 24-bit groups of the document's SHA-256 (Image Builder allows up to 2^30 - 1 per
    field). The document holds the lock and everything else the build reads from the
    description, so any change to them is a new version (versions are immutable in Image
    Builder) and the same document always gets the same one."""
    digest = hashlib.sha256(document.encode()).hexdigest()
    return f"{VERSION_MAJOR}.{int(digest[:6], 16)}.{int(digest[6:12], 16)}"


def instance_types(desc: Description, region: str) -> list[str]:
    """The build instance's types: the region's burst instance types, smallest (vCPUs)
    first. Each has an NVIDIA GPU, so the build builds and loads the driver's kernel
    module as a burst node would (the role does so only where it finds a GPU)."""
    found = {t for g in desc.burst_groups.values() if g.region == region
             for t in g.instance_types}
    return sorted(found, key=lambda t: (INSTANCE_TYPES[t].vcpus, t))


@dataclass(frozen=True)
class ImagePlan:
    """What BurstImage declares in one burst region: the component document, the parent
    AMI's name pattern, where and on what the build runs, the artifact it may read, and
    the pre-built AMI the stack config names instead of a build."""

    region: str
    pool: str
    document: str  # component_document
    parent_ami_name: str  # launch.ami_name, Debian's AMIs owned by launch.AMI_OWNER
    instance_types: list[str]  # instance_types
    zone: str  # the region's first zone: its training subnet hosts the build
    artifact_bucket: str
    key_region: str  # the pool key's, for artifact_policy
    # The region's AMI from the stack config (gpupool:burstImageId): no image is built,
    # the pipeline stays declared for operators' rebuilds.
    prebuilt: str | None
    tags: dict[str, str]


def image_plan(desc: Description, region: str, prebuilt: str | None,
               digest: str | None) -> ImagePlan:
    """BurstImage's args for a burst region; digest: the artifact's SHA-256 the stack
    config pins (gpupool:burstImageArtifactSha256, validated by artifact_digest): the
    build verifies the download against it and refuses anything else; None, every
    artifact."""
    return ImagePlan(
        region=region, pool=desc.pool.name,
        document=component_document(desc, region, digest),
        parent_ami_name=launch.ami_name(desc), instance_types=instance_types(desc, region),
        zone=names.region_zones(desc, region)[0], artifact_bucket=artifact_bucket(desc),
        key_region=desc.pool.cloud_region, prebuilt=prebuilt,
        tags=names.tags(desc, None, **{names.TAG_BURST_REGION: region}))


def image_overrides(raw: str | None, regions: list[str]) -> dict[str, str]:
    """Region -> pre-built AMI id, from the stack config gpupool:burstImageId: one AMI id
    (only for a pool that bursts in one region: AMI ids are regional) or a JSON object
    region -> AMI id. A region without one gets its image from its pipeline."""
    if raw is None or not raw.strip():
        return {}
    text = raw.strip()
    if text.startswith("{"):
        try:
            given = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"gpupool:{CONFIG_KEY} is not a JSON object: {e.msg}") from None
    elif len(regions) == 1:
        given = {regions[0]: text}
    else:
        raise ValueError(f"gpupool:{CONFIG_KEY} names one AMI, but the pool bursts in "
                         f"{', '.join(regions)}: give a JSON object region -> AMI id")
    if not isinstance(given, dict):
        raise ValueError(f"gpupool:{CONFIG_KEY} must be an AMI id or a JSON object")
    for region, ami in given.items():
        if region not in regions:
            raise ValueError(f"gpupool:{CONFIG_KEY} names {region!r}, where the pool does "
                             f"not burst ({', '.join(regions) or 'no region'})")
        if not isinstance(ami, str) or not AMI_ID_RE.match(ami):
            raise ValueError(f"gpupool:{CONFIG_KEY} for {region}: {ami!r} is not an AMI id")
    return dict(given)
