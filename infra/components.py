"""Shared pieces of the components: the component base and resource option helpers."""

from __future__ import annotations

from typing import Any

import pulumi

from gpupool.spec.model import Description
from infra import sdk

# Before any component touches pulumi_aws or pulumi_kubernetes: load only what they use.
sdk.preload()

TYPE_PREFIX = "gpupool:infra"


class Component(pulumi.ComponentResource):
    """A ComponentResource whose children default to it as parent (and its provider)."""

    def __init__(self, kind: str, name: str, opts: pulumi.ResourceOptions | None) -> None:
        super().__init__(f"{TYPE_PREFIX}:{kind}", name, None, opts)

    def child(self, **extra: Any) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, **extra)


def pool_prefix(desc: Description) -> str:
    return desc.pool.name
