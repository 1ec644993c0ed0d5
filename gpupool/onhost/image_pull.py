#!/usr/bin/python3
"""A node's pull program (role image_registry, installed as /usr/local/sbin/gpupool-image-pull):
turns a declared environment image in the pool's registry into a bundle for
`srun --container=<bundle dir>/<name>-<version>`.

Only what the description declares can be pulled: the images file the role writes
(/etc/gpupool/images.json: the registry, the credential file, the directories and each
image's name, version and reference) is the allow-list, so no argument becomes a reference
or a path by itself. A pull copies the image from the registry into an OCI layout kept on
the node (skopeo, with the registry's CA from containers-certs.d and the read-only
credential) and unpacks it (umoci) beside its final place, then renames it there, so a job
never sees half a bundle. A bundle already there for that version is kept: a version is
immutable once declared, so the second start costs nothing; --refresh pulls again.

  gpupool-image-pull [--images-file F] [--refresh] [--json] NAME[:VERSION]... | --all

Exit 0: every image is there; 1: a pull or unpack failed (the message names the image;
state `absent` where the registry answered that it has no such image: declared, not pushed
yet), 2: an image not declared, or a malformed images file. Standard library only: it runs under
the node's python3.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A tool that hangs fails the pull, with what it said last (see there).
try:  # in the package: the tests, the lab's control host
    from gpupool.onhost import tool_run
except ImportError:  # on the node, where role image_registry copies it beside this file
    import tool_run  # type: ignore[no-redef]

IMAGES_FILE = Path("/etc/gpupool/images.json")
MARKER = ".gpupool-image.json"  # in a bundle: what it was unpacked from
# The image names and versions the description allows (gpupool/spec/model.py IMAGE_NAME_RE
# and IMAGE_VERSION_RE): checked again here, since they become paths.
NAME_RE = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*")
VERSION_RE = re.compile(r"[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}(-[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?")
REFERENCE_RE = re.compile(r"[0-9.]{7,15}:[0-9]{1,5}/[a-z0-9._/-]{1,255}:[0-9A-Za-z.-]{1,128}")
PATH_RE = re.compile(r"(/[A-Za-z0-9_][-A-Za-z0-9_.]*)+")
# Each tool's run is bounded: a registry that stops answering fails the pull, not the node.
PULL_TIMEOUT_S = 900
UNPACK_TIMEOUT_S = 900
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Usage(Exception):
    """A request or an images file this program refuses."""


class Absent(RuntimeError):
    """The registry answers, and has no such image: it is declared but not pushed yet."""


# What skopeo says when the registry answers that a repository or tag does not exist (the
# distribution spec's NAME_UNKNOWN and MANIFEST_UNKNOWN errors).
ABSENT_RE = re.compile(r"manifest unknown|name unknown", re.IGNORECASE)


@dataclass(frozen=True)
class Image:
    name: str
    version: str
    reference: str
    digest: str  # the declaration's digest

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


@dataclass(frozen=True)
class Catalogue:
    auth_file: Path
    layout_dir: Path
    bundle_dir: Path
    images: tuple[Image, ...]


def _path(data: dict[str, Any], key: str) -> Path:
    value = data.get(key)
    if not isinstance(value, str) or not PATH_RE.fullmatch(value):
        raise Usage(f"images file: {key} is not an absolute path of plain names")
    return Path(value)


def _image(entry: object, i: int) -> Image:
    if not isinstance(entry, dict):
        raise Usage(f"images file: images[{i}] is not an object")
    values = {k: entry.get(k) for k in ("name", "version", "reference", "digest")}
    if not all(isinstance(v, str) for v in values.values()):
        raise Usage(f"images file: images[{i}] lacks a name, version, reference or digest")
    for key, pattern in (("name", NAME_RE), ("version", VERSION_RE),
                         ("reference", REFERENCE_RE)):
        if not pattern.fullmatch(values[key]):
            raise Usage(f"images file: images[{i}].{key} is malformed: {values[key]!r}")
    return Image(**values)  # type: ignore[arg-type]


def load(path: Path) -> Catalogue:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Usage(f"cannot read the images file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise Usage(f"images file {path}: not an object with a list of images")
    return Catalogue(_path(data, "auth_file"), _path(data, "layout_dir"),
                     _path(data, "bundle_dir"),
                     tuple(_image(e, i) for i, e in enumerate(data["images"])))


def select(catalogue: Catalogue, wanted: list[str], every: bool) -> list[Image]:
    """The declared images asked for: NAME (its declared version) or NAME:VERSION."""
    if every:
        return list(catalogue.images)
    out = []
    for item in wanted:
        name, _, version = item.partition(":")
        found = [i for i in catalogue.images
                 if i.name == name and (not version or i.version == version)]
        if not found:
            declared = ", ".join(f"{i.name}:{i.version}" for i in catalogue.images) or "none"
            raise Usage(f"{item!r} is not a declared image; declared: {declared}")
        out += found
    return out


def _run(argv: list[str], timeout: int) -> None:
    try:
        tool_run.run(argv, timeout)
    except tool_run.ToolFailed as exc:
        raise (Absent(str(exc)) if ABSENT_RE.search(exc.last) else exc) from None


def cached(catalogue: Catalogue, image: Image) -> bool:
    """Is this version's bundle there, unpacked from this reference?"""
    try:
        marker = json.loads((catalogue.bundle_dir / image.key / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("reference") == image.reference


def pull(catalogue: Catalogue, image: Image) -> None:
    """Copy the image into the node's layout, unpack it beside its place, then swap it in."""
    layout = catalogue.layout_dir / image.name
    _run(["skopeo", "copy", "--quiet", "--authfile", str(catalogue.auth_file),
          f"docker://{image.reference}", f"oci:{layout}:{image.version}"], PULL_TIMEOUT_S)
    final = catalogue.bundle_dir / image.key
    staging = catalogue.bundle_dir / f".{image.key}.new"
    shutil.rmtree(staging, ignore_errors=True)
    _run(["umoci", "unpack", "--rootless", "--image", f"{layout}:{image.version}",
          str(staging)], UNPACK_TIMEOUT_S)
    # umoci leaves the bundle, its rootfs and config.json to the unpacking user (root)
    # alone; a job runs it as its own user, who must open them. The image's own files keep
    # the modes the image gives them.
    for path, mode in ((staging, 0o755), (staging / "rootfs", 0o755),
                       (staging / "config.json", 0o644)):
        path.chmod(mode)
    (staging / MARKER).write_text(json.dumps(
        {"reference": image.reference, "declaration_digest": image.digest}) + "\n")
    old = catalogue.bundle_dir / f".{image.key}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpupool-image-pull", description=__doc__.split("\n\n")[0])
    p.add_argument("images", nargs="*", metavar="NAME[:VERSION]")
    p.add_argument("--all", action="store_true", help="every declared image")
    p.add_argument("--images-file", type=Path, default=IMAGES_FILE)
    p.add_argument("--refresh", action="store_true", help="pull even where a bundle is there")
    p.add_argument("--json", action="store_true", help="one JSON object per image")
    args = p.parse_args(argv)
    try:
        if bool(args.images) == args.all:
            raise Usage("name the images to pull, or --all")
        catalogue = load(args.images_file)
        images = select(catalogue, args.images, args.all)
    except Usage as exc:
        print(f"gpupool-image-pull: {exc}", file=sys.stderr)
        return EXIT_USAGE
    os.umask(0o022)  # bundles are read by every job's user
    failed = 0
    for image in images:
        start = time.monotonic()
        state = "cached"
        try:
            if args.refresh or not cached(catalogue, image):
                pull(catalogue, image)
                state = "pulled"
        except (RuntimeError, OSError) as exc:
            failed += 1
            state, detail = "absent" if isinstance(exc, Absent) else "failed", str(exc)
        else:
            detail = str(catalogue.bundle_dir / image.key)
        seconds = round(time.monotonic() - start, 2)
        if args.json:
            print(json.dumps({"image": f"{image.name}:{image.version}", "state": state,
                              "seconds": seconds, "detail": detail}))
        else:
            print(f"{image.name}:{image.version}: {state} ({seconds} s): {detail}",
                  file=sys.stdout if state in ("pulled", "cached") else sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
