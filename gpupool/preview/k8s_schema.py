"""Validate manifests against the API a pool's cluster serves.

Kubernetes objects: kubernetes-validate's bundled schemas for one pinned version, strict
(unknown fields are errors). Kueue objects: the v0.19.2 CRDs' openAPIV3Schema, made
strict the same way, because the API server prunes unknown fields silently.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from gpupool.paths import DATA
from gpupool.render.k8s_objects import KUBERNETES_VERSION

KUEUE_VERSION = "v0.19.2"
SCHEMAS = DATA / "schemas"
KUEUE_GROUP = "kueue.x-k8s.io"


def kueue_crd_dir(root: Path = SCHEMAS) -> Path:
    return root / f"kueue-{KUEUE_VERSION}"


def _strict(schema: Any) -> Any:
    """Forbid fields a schema does not declare, except where it preserves unknown ones."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def _kueue_validator(kind: str, version: str) -> jsonschema.Draft7Validator:
    for path in sorted(kueue_crd_dir().glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] != kind:
            continue
        for v in crd["spec"]["versions"]:
            if v["name"] == version:
                return jsonschema.Draft7Validator(_strict(v["schema"]["openAPIV3Schema"]))
    raise LookupError(f"no Kueue CRD for {kind} {version} in {kueue_crd_dir()}")


def problems(manifest: dict[str, Any]) -> list[str]:
    """Every schema violation of one manifest, as 'kind/name: path: message' lines."""
    where = f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"
    group, _, version = manifest["apiVersion"].rpartition("/")
    if group == KUEUE_GROUP:
        validator = _kueue_validator(manifest["kind"], version)
        return [f"{where}: {'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in sorted(validator.iter_errors(manifest), key=str)]
    try:
        # A JSON round trip turns tuples into lists as the API server would see them.
        kubernetes_validate.validate(json.loads(json.dumps(manifest)), KUBERNETES_VERSION,
                                     strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{where}: {'.'.join(map(str, exc.path)) or '(top)'}: {exc.message}"]
    return []
