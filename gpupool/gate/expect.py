"""What a node must look like, derived from the pool description (never typed twice)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpupool.render.flows import allowed, probe_ports
from gpupool.spec import os_release
from gpupool.spec.catalog import GPU_MODELS, INSTANCE_TYPES
from gpupool.spec.facts import node_class, rack_places
from gpupool.spec.mig import is_partitioned
from gpupool.spec.model import NAME_RE, Description, Interconnect, Mount, NodeRole, OsRelease


@dataclass(frozen=True)
class GpuExpect:
    model: str
    product: str
    count: int
    memory_gib: int
    nvswitch: bool
    min_bf16_tflops: float
    min_mem_bw_gbps: float
    # The class's MIG layout, instances per profile on every GPU; () where MIG is off.
    mig: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class MountExpect:
    tier: str
    path: str
    fstype: str
    options: tuple[str, ...]
    writable: bool


@dataclass(frozen=True)
class Probe:
    """A connection from a peer to this node's address on a segment they share."""

    peer: str
    segment: str
    address: str  # this node's address on the segment
    port: int
    allowed: bool

    @property
    def id(self) -> str:
        return f"{self.peer}/{self.segment}:{self.port}"


@dataclass(frozen=True)
class NodeExpect:
    node: str
    environment: str
    node_class: str
    roles: tuple[str, ...]
    leaf: str
    addresses: dict[str, str]
    mtu: dict[str, int]
    gpu: GpuExpect | None
    software: dict[str, str]
    mounts: tuple[MountExpect, ...]
    teams: tuple[str, ...]
    probes: tuple[Probe, ...] = field(default=())
    # The description's fixed ids: {"users": member -> uid, "teams": team -> gid}.
    ids: dict[str, dict[str, int]] = field(default_factory=dict)
    # The Debian release the node runs: its class's (`os`, "debian-13"), or for a burst
    # node the one its image was built on (its facts' `os`); "" where none is known (facts
    # of an older user-data name none: the supported releases alone apply).
    os: str = ""
    # The environment images a compute node must pull from the pool's registry, NAME:VERSION
    # as declared; empty where no registry is declared (or not a compute node).
    images: tuple[str, ...] = ()

    @property
    def lab(self) -> bool:
        return self.environment == "lab"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> NodeExpect:
        """The inverse of to_json (how `gpupool gate` hands a burst node's expectation to
        the suites, which have no description to derive it from)."""
        d = json.loads(text)
        gpu = d["gpu"] and GpuExpect(**{**d["gpu"], "mig": tuple(map(tuple, d["gpu"]["mig"]))})
        return cls(**{**d, "roles": tuple(d["roles"]), "gpu": gpu,
                      "mounts": tuple(MountExpect(**{**m, "options": tuple(m["options"])})
                                      for m in d["mounts"]),
                      "teams": tuple(d["teams"]), "images": tuple(d.get("images", ())),
                      "probes": tuple(Probe(**p) for p in d["probes"])})


def _gpu(desc: Description, node: str) -> GpuExpect | None:
    gpu = node_class(desc, node).gpu
    if gpu is None or NodeRole.COMPUTE not in desc.nodes[node].roles:
        return None
    model = GPU_MODELS[gpu.model]
    layout = tuple(sorted(gpu.mig_profiles.items())) if is_partitioned(gpu) else ()
    return GpuExpect(gpu.model, model.product, gpu.count, gpu.memory_gib,
                     gpu.interconnect is Interconnect.NVSWITCH, model.min_bf16_tflops,
                     model.min_mem_bw_gbps, layout)


def _mount(tier: str, mount: Mount) -> MountExpect:
    return MountExpect(tier, mount.path, mount.fstype.value, tuple(mount.options),
                       "ro" not in mount.options)


def node_expect(desc: Description, node: str) -> NodeExpect:
    n = desc.nodes[node]
    compute = NodeRole.COMPUTE in n.roles
    mounts = tuple(_mount(name, t.mount) for name, t in desc.storage_tiers.items()
                   if t.mount is not None and compute)
    # Inbound: what this node's own firewall lets in, probed from one peer per segment.
    probes = tuple(
        Probe(peer, seg, addr, port, allowed(desc, peer, node, seg, port))
        for seg, addr in n.addresses.items()
        for peer in [next((p for p, pn in desc.nodes.items()
                           if p != node and seg in pn.addresses), None)] if peer
        for port in probe_ports(desc))
    return NodeExpect(
        node=node,
        environment=desc.pool.environment,
        node_class=n.class_,
        roles=tuple(r.value for r in n.roles),
        leaf=rack_places(desc)[n.rack].leaf,
        addresses=dict(n.addresses),
        mtu={s: desc.network.segments[s].mtu for s in n.addresses},
        gpu=_gpu(desc, node),
        software=os_release.versions(desc, desc.node_classes[n.class_].os),
        mounts=mounts,
        teams=tuple(desc.teams),
        probes=probes,
        ids=desc.ids.model_dump(mode="json"),
        os=desc.node_classes[n.class_].os.value,
        images=tuple(f"{name}:{image.version}"
                     for name, image in sorted(desc.environment_images.items()))
        if compute and desc.image_registry is not None else (),
    )


def with_locks(expect: NodeExpect, locks: tuple[str, ...] | list[str]) -> NodeExpect:
    """The expectation with the COMPONENT=VERSION overrides of `gpupool gate --lock` (checked
    there) in place of the description's software lock."""
    over = dict(pair.split("=", 1) for pair in locks)
    return dataclasses.replace(expect, software={**expect.software, **over}) if over else expect


class FactsError(ValueError):
    """A burst node's facts file is not what the user-data writes."""


def _fact(facts: Mapping[str, Any], key: str, kind: type) -> Any:
    value = facts.get(key)
    if not isinstance(value, kind):
        raise FactsError(f"burst facts: {key} must be a {kind.__name__}, got {value!r}")
    return value


def _release(facts: Mapping[str, Any]) -> str:
    """The facts' `os`, the release the burst image was built on, as NodeExpect.os. Facts
    written by an older user-data, without the key (a launch template not yet updated,
    booting an image of a newer checkout), keep the check they had, the supported releases
    alone (""): such a node is no less proven than before, and refusing it would stop burst
    capacity until `pulumi up`. A value that is there must be a release gpupool knows (it
    reaches the gate's messages and report, so nothing else is taken)."""
    if "os" not in facts:
        return ""
    value = _fact(facts, "os", str)
    if value not in {r.value for r in OsRelease}:
        raise FactsError(f"burst facts: os must be one of "
                         f"{', '.join(r.value for r in OsRelease)}, got {value[:40]!r}")
    return value


def burst_expect(facts: Mapping[str, Any], node: str) -> NodeExpect:
    """What a burst node must look like, from the facts its user-data writes
    (gpupool.render.cloud.launch.burst_facts): the group's instance type's GPUs, the release
    its image was built on, the software lock, the teams and the storage tiers' mounts. No
    probes (nothing declares its peers' addresses) and no leaf switch; its host firewall is
    checked as on-prem. Mount values reach the suites' commands, so they pass the
    description's own rules again (model.Mount) or the facts are refused."""
    itype = _fact(facts, "instance_type", str)
    if itype not in INSTANCE_TYPES:
        raise FactsError(f"burst facts: unknown instance type {itype!r}")
    t = INSTANCE_TYPES[itype]
    model = GPU_MODELS[t.gpu_model]
    software = _fact(facts, "software", dict)
    teams = _fact(facts, "teams", list)
    if not all(isinstance(v, str) for v in [*software.values(), *teams]):
        raise FactsError("burst facts: software versions and teams must be strings")
    ids = facts.get("ids", {})
    if not (isinstance(ids, dict) and set(ids) <= {"users", "teams"} and all(
            isinstance(table, dict) and all(isinstance(k, str) and type(v) is int
                                            for k, v in table.items())
            for table in ids.values())):
        raise FactsError("burst facts: ids must map users and teams to whole numbers")
    mounts = facts.get("mounts", {})
    if not (isinstance(mounts, dict) and all(isinstance(k, str) and re.fullmatch(NAME_RE, k)
                                             for k in mounts)):
        raise FactsError("burst facts: mounts must map storage tier names to mounts")
    try:
        expected = tuple(_mount(k, Mount.model_validate(v)) for k, v in mounts.items())
    except ValidationError as exc:
        raise FactsError(f"burst facts: mounts: {exc.errors()[0]['msg']}") from None
    return NodeExpect(
        node=node, environment=_fact(facts, "environment", str),
        node_class=_fact(facts, "burst_group", str), roles=(NodeRole.COMPUTE.value,),
        leaf="", addresses={}, mtu={},
        gpu=GpuExpect(t.gpu_model, model.product, t.gpus, t.gpu_memory_gib, False,
                      model.min_bf16_tflops, model.min_mem_bw_gbps),
        software=dict(software), mounts=expected, teams=tuple(teams), ids=ids,
        os=_release(facts))
