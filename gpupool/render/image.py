"""The burst image as plain data: the EC2 Image Builder component document that turns a
Debian 12 instance into a burst node (playbooks/burst_image.yml at the software lock), the
semantic version that names it, the artifact it fetches, and the stack config that names
a pre-built image instead.

infra/image.py declares the pipeline from these and the policy pack reads the same stack
config, so both follow one derivation.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from typing import Any

import yaml

from gpupool.render import cloud, inventory
from gpupool.spec.catalog import INSTANCE_TYPES
from gpupool.spec.model import Description, Purpose

PLAYBOOK = "playbooks/burst_image.yml"
# What the artifact holds: the paths of this checkout the playbook reads (the slurm role
# copies gpupool/onhost/spot_watch.py from next to the roles). `make burst-image-artifact`
# packs them; an operator uploads the archive to artifact_uri().
ARTIFACT_PATHS = ("ansible.cfg", "playbooks", "roles", "gpupool/onhost")
# Packed beside them by `make burst-image-artifact` (gpupool.gate.bundle, not tracked):
# the acceptance gate the image's boot runs, where roles/acceptance_gate looks for it.
GATE_BUNDLE = ".cache/gate-bundle.tar.gz"
ARTIFACT_KEY = "gpupool/burst-image/gpupool-image.tar.gz"
WORK_DIR = "/opt/gpupool-image"
VARS_FILE = f"{WORK_DIR}/vars.json"  # the image's variables (inventory.burst_image_vars)
# Stack config: an AMI id for every burst region, or a JSON map region -> AMI id.
CONFIG_KEY = "burstImageId"
AMI_ID_RE = re.compile(r"^ami-[0-9a-f]{8,17}$")
# The major version of the scheme below: raised if the derivation itself changes.
VERSION_MAJOR = 1


def artifact_bucket(desc: Description) -> str:
    """The pool's datasets bucket: private, SSE-KMS with the pool key, read by burst nodes
    already; the image's archive sits under its own prefix there."""
    tier = next((t for t, v in cloud.bucket_tiers(desc).items()
                 if v.purpose is Purpose.DATASETS), None)
    if tier is None:
        raise ValueError("the burst image's artifact lives in the datasets bucket, and the "
                         "description declares no datasets tier")
    return cloud.bucket_name(desc, tier)


def artifact_uri(desc: Description) -> str:
    return f"s3://{artifact_bucket(desc)}/{ARTIFACT_KEY}"


def artifact_policy(desc: Description, key_arn: str) -> dict[str, Any]:
    """The build instance may read the image's artifact and decrypt it through S3 (the
    datasets bucket is encrypted with the pool key), nothing more."""
    bucket = artifact_bucket(desc)
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadImageArtifact", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"arn:aws:s3:::{bucket}/{ARTIFACT_KEY}"]},
        {"Sid": "DecryptImageArtifact", "Effect": "Allow", "Action": ["kms:Decrypt"],
         "Resource": [key_arn], "Condition": {"StringEquals": {
             "kms:ViaService": f"s3.{desc.pool.cloud_region}.amazonaws.com"}}}]}


def _bash(name: str, *commands: str) -> dict[str, Any]:
    return {"name": name, "action": "ExecuteBash", "inputs": {"commands": list(commands)}}


def _build_steps(desc: Description, region: str) -> list[dict[str, Any]]:
    archive = f"{WORK_DIR}/gpupool-image.tar.gz"
    # The lock is in here, in plain sight: a lock change is a new document, so a new version.
    image_vars = json.dumps(inventory.burst_image_vars(desc, region), sort_keys=True)
    q = shlex.quote
    return [
        _bash("InstallAnsible", "set -eu", "export DEBIAN_FRONTEND=noninteractive",
              "apt-get update -q", "apt-get install -y -q --no-install-recommends ansible"),
        {"name": "FetchPlaybooks", "action": "S3Download",
         "inputs": [{"source": artifact_uri(desc), "destination": archive}]},
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
    slurm = shlex.quote(desc.software.slurm)
    return [_bash(
        "BurstBootNeeds", "set -eu",
        "for tool in cloud-init curl aws munged slurmd nvidia-smi; do command -v \"$tool\"; done",
        f"test -x {cloud.SPOT_WATCH_PROGRAM}",
        f"test -f /etc/systemd/system/{cloud.SPOT_WATCH_UNIT.format('')}",
        f"test ! -e {cloud.MUNGE_KEY_PATH}",
        # The tiers' mount units the boot starts (role storage), enabled.
        *(f"systemctl is-enabled {shlex.quote(unit)}" for unit in cloud.mount_units(desc)),
        "installed=$(dpkg-query -W -f='${Version}' slurmd)",
        f'case "${{installed#*:}}" in {slurm}|{slurm}-*) ;; '
        f'*) echo "slurmd $installed is not the lock\'s {desc.software.slurm}" >&2; exit 1;; esac')]


def component_document(desc: Description, region: str) -> str:
    """The Image Builder component (document schema 1.0) of a burst region's image."""
    doc = {
        "name": cloud.burst_image_name(desc, region),
        "description": f"gpupool pool {desc.pool.name}: a burst node at the software lock",
        "schemaVersion": 1.0,
        "phases": [{"name": "build", "steps": _build_steps(desc, region)},
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
