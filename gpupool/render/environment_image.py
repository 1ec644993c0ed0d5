"""Environment images as plain data: for each image the description declares, the
Containerfile that builds it, the digest of its declaration and the reference it is pushed
as (`<registry>/<pool>/<image>:<version>`).

Pure: nothing is built or pushed here. The digest is the SHA-256 of the declaration in
canonical JSON (sorted keys, no spacing, set-like lists sorted), so it changes exactly when
the declaration does and never with YAML formatting or key order; the Containerfile
carries it as the `gpupool.declaration-digest` label, which is how a builder decides that
an image in the registry is current. Every value is constrained by the model (no
whitespace, quote, `$` or shell metacharacter passes), and is still written so that it
cannot break out: RUN instructions in exec (JSON array) form, which no shell reads, and
label values as JSON strings.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from gpupool.spec.catalog import MANAGEMENT_SEGMENT
from gpupool.spec.model import REGISTRY_HOST, Description, EnvironmentImage

DIGEST_LABEL = "gpupool.declaration-digest"
# Lists whose order means nothing: sorted before hashing and rendering, so reordering
# them neither changes the digest nor the image.
_SETS = ("python_packages", "teams", "task_classes")
# The registry an image is pushed to: a host name or IPv4 address with an optional port.
REGISTRY_RE = re.compile(REGISTRY_HOST)


@dataclass(frozen=True)
class Rendered:
    name: str
    version: str
    digest: str  # "sha256:<64 hex digits>"
    reference: str
    containerfile: str


def declaration(name: str, image: EnvironmentImage) -> dict[str, Any]:
    """The image's declaration as hashed: its name and every field, defaults included."""
    data = image.model_dump(mode="json")
    for key in _SETS:
        data[key] = sorted(data[key])
    return {"name": name, **data}


def digest(name: str, image: EnvironmentImage) -> str:
    canonical = json.dumps(declaration(name, image), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def check_registry(registry: str) -> None:
    """ValueError for a registry that is not a host[:port]."""
    if not REGISTRY_RE.fullmatch(registry):
        raise ValueError(f"not a registry host[:port]: {registry!r}")


def reference(registry: str, pool: str, name: str, image: EnvironmentImage) -> str:
    """Where the image is pushed."""
    check_registry(registry)
    return f"{registry}/{pool}/{name}:{image.version}"


def _run(*argv: str) -> str:
    # Exec form: the builder runs argv as it is, with no shell to read any of it.
    return "RUN " + json.dumps(list(argv))


def containerfile(name: str, image: EnvironmentImage) -> str:
    labels = {"org.opencontainers.image.title": name,
              "org.opencontainers.image.version": image.version,
              "gpupool.cuda": image.cuda,
              DIGEST_LABEL: digest(name, image)}
    lines = [f"# Written by gpupool from environment_images.{name}; do not edit.",
             f"FROM {image.base}",
             # Build arguments, not ENV: they reach the RUN steps and stay out of the image.
             "ARG DEBIAN_FRONTEND=noninteractive",
             "LABEL " + " ".join(f"{k}={json.dumps(v)}" for k, v in labels.items())]
    if image.packages:
        # One step each (exec form has no `&&`): the update's lists are removed in a later
        # layer, so they cost the image's size, not its reproducibility.
        lines += [_run("apt-get", "update"),
                  _run("apt-get", "install", "-y", "--no-install-recommends",
                       *(f"{p}={v}" for p, v in sorted(image.packages.items()))),
                  _run("rm", "-rf", "/var/lib/apt/lists")]
    if image.python_packages:
        # PEP 668: Debian's Python refuses pip outside a virtual environment unless told;
        # the variable (unlike --break-system-packages) is ignored by older pips.
        lines += ["ARG PIP_BREAK_SYSTEM_PACKAGES=1", "ARG PIP_NO_CACHE_DIR=1",
                  _run("python3", "-m", "pip", "install", *sorted(image.python_packages))]
    return "\n".join(lines) + "\n"


def render(desc: Description, registry: str) -> list[Rendered]:
    """Every declared image, by name; ValueError for a bad registry even where no image is
    declared (a typo is named the first time, not once an image is added)."""
    check_registry(registry)
    return [Rendered(name, image.version, digest(name, image),
                     reference(registry, desc.pool.name, name, image),
                     containerfile(name, image))
            for name, image in sorted(desc.environment_images.items())]


def default_registry(desc: Description) -> str:
    """The declared registry's host:port (its host's management address), else
    registry.<pool domain>."""
    reg = desc.image_registry
    if reg is None:
        return f"registry.{desc.pool.domain}"
    return f"{desc.nodes[reg.host].addresses[MANAGEMENT_SEGMENT]}:{reg.port}"


# Where the registry keeps its images under its tier's mount.
REGISTRY_DIR = "gpupool-registry"


def registry_plan(desc: Description) -> dict[str, Any] | None:
    """Role image_registry's plan: the host, where it listens and keeps its images, and
    every declared image's reference (what nodes pull and the gate starts); None where no
    registry is declared."""
    reg = desc.image_registry
    if reg is None:
        return None
    tier = desc.storage_tiers[reg.tier]
    if tier.mount is None:  # refused by rule image-registry-tier
        raise ValueError(f"image_registry.tier {reg.tier} has no mount")
    address = desc.nodes[reg.host].addresses[MANAGEMENT_SEGMENT]
    registry = default_registry(desc)
    return {"host": reg.host, "address": address, "port": reg.port, "registry": registry,
            "tier": reg.tier, "path": f"{tier.mount.path.rstrip('/')}/{REGISTRY_DIR}",
            "size_gib": reg.size_gib,
            "images": [{"name": i.name, "version": i.version, "digest": i.digest,
                        "reference": i.reference,
                        "repository": f"{desc.pool.name}/{i.name}"}
                       for i in render(desc, registry)]}
