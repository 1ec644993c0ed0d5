"""A monthly cost ceiling for what the Pulumi program declares, from vendored AWS prices.

The ceiling is what the declared capacity costs when all of it runs all month: every burst
group at its max_nodes on its dearest instance type for 730 hours, each FSx file system at
its storage capacity, each bucket holding its tier's size_tib in S3 Standard, and the NAT
gateways, interface endpoints and hybrid links for every hour. Usage (data processed and
transferred, requests) is not in it. Prices come from gpupool/data/prices/aws.yaml (its
sources in SOURCE.md); what the table has no price for is a line without a figure, never a
guess. `gpupool plan` prints it and the policy pack holds it to pool.monthly_budget_usd.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from gpupool.paths import DATA
from gpupool.render.cloud import names, storage
from gpupool.spec.model import Description

PRICES_FILE = DATA / "prices" / "aws.yaml"
GIB_PER_TIB = 1024

ASG = "aws:autoscaling/group:Group"
FSX_LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"
BUCKET = "aws:s3/bucket:Bucket"
NAT_GATEWAY = "aws:ec2/natGateway:NatGateway"
VPC_ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
VPN_CONNECTION = "aws:ec2/vpnConnection:VpnConnection"
TGW_ATTACHMENT = "aws:ec2transitgateway/vpcAttachment:VpcAttachment"
DX_ASSOCIATION = "aws:directconnect/gatewayAssociation:GatewayAssociation"

# The kinds of the ceiling, in the order they are shown.
INSTANCES, FILE_SYSTEMS, BUCKETS, NAT, ENDPOINTS, LINKS = (
    "instances", "file systems", "buckets", "nat", "endpoints", "links")
KINDS = (INSTANCES, FILE_SYSTEMS, BUCKETS, NAT, ENDPOINTS, LINKS)
# Kinds whose cost grows with what the description declares (nodes, TiB): one of them
# unpriced leaves the ceiling open, where the others are each a bounded hourly fee.
UNBOUNDED_KINDS = (INSTANCES, FILE_SYSTEMS, BUCKETS)


@dataclass(frozen=True)
class Prices:
    read: str
    hours: int
    instances: Mapping[str, Mapping[str, float]]
    fsx_lustre: Mapping[str, Mapping[str, float]]
    s3_standard: Mapping[str, float]
    nat_gateway_hour: Mapping[str, float]
    interface_endpoint_hour: Mapping[str, float]
    vpn_connection_hour: Mapping[str, float]
    transit_gateway_attachment_hour: Mapping[str, float]
    sources: Mapping[str, str]


def _prices(section: Any) -> dict[str, Any]:
    """A section's prices: {source, prices} where it has some, {} for a kind left out."""
    return dict(section.get("prices") or {}) if isinstance(section, dict) else {}


@cache
def prices() -> Prices:
    data = yaml.safe_load(PRICES_FILE.read_text())
    sections = ("instances", "fsx_lustre", "s3_standard", "nat_gateway_hour",
                "interface_endpoint_hour", "vpn_connection_hour",
                "transit_gateway_attachment_hour")
    return Prices(read=str(data["read"]), hours=int(data["hours_per_month"]),
                  sources={s: str(data[s]["source"]) for s in sections
                           if isinstance(data.get(s), dict) and "source" in data[s]},
                  **{s: _prices(data.get(s)) for s in sections})


@dataclass(frozen=True)
class Line:
    """One declared resource's share of the ceiling; usd None: the table has no price."""

    kind: str
    resource: str
    region: str
    what: str
    usd: float | None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "resource": self.resource, "region": self.region,
                "what": self.what,
                "usd_per_month": None if self.usd is None else round(self.usd, 2)}


@dataclass(frozen=True)
class Ceiling:
    lines: tuple[Line, ...]
    read: str

    @property
    def per_kind(self) -> dict[str, float | None]:
        """Each declared kind's priced lines summed; None where none of them is priced."""
        out: dict[str, float | None] = {}
        for k in KINDS:
            of_kind = [x.usd for x in self.lines if x.kind == k]
            if of_kind:
                priced = [u for u in of_kind if u is not None]
                out[k] = sum(priced) if priced else None
        return out

    @property
    def total(self) -> float:
        return sum(x.usd or 0.0 for x in self.lines)

    @property
    def unpriced(self) -> list[Line]:
        return [x for x in self.lines if x.usd is None]

    @property
    def open_ended(self) -> list[Line]:
        """Unpriced lines of a kind that grows with the description: with one, the total
        says nothing about what the pool may cost."""
        return [x for x in self.unpriced if x.kind in UNBOUNDED_KINDS]

    def as_json(self) -> dict[str, Any]:
        return {"currency": "USD", "period": "month", "prices_read": self.read,
                "prices_source": "gpupool/data/prices/SOURCE.md",
                "per_kind": {k: None if v is None else round(v, 2)
                             for k, v in self.per_kind.items()},
                "total": round(self.total, 2),
                "not_priced": [x.as_json() for x in self.unpriced],
                "lines": [x.as_json() for x in self.lines]}


def _tags(inputs: Mapping[str, Any]) -> dict[str, Any]:
    tags = inputs.get("tags") or {}
    if isinstance(tags, list):
        return {t.get("key"): t.get("value") for t in tags if isinstance(t, Mapping)}
    return dict(tags) if isinstance(tags, Mapping) else {}


def _region_of(name: str, desc: Description, inputs: Mapping[str, Any]) -> str:
    """A network resource's region: its service name's, else the one in its name (the
    program names them <pool>-<region>-...), else the pool's home region."""
    service = str(inputs.get("serviceName") or "")
    if service.startswith("com.amazonaws."):
        return service.split(".")[2]
    known = sorted({desc.pool.cloud_region, *names.regions(desc)}, key=len, reverse=True)
    return next((r for r in known if f"-{r}-" in name or name.endswith(f"-{r}")),
                desc.pool.cloud_region)


def _per_hour(rate: float | None, count: int, p: Prices) -> float | None:
    return None if rate is None else rate * count * p.hours


def _instances(name: str, i: Mapping[str, Any], desc: Description, p: Prices) -> Line:
    group = desc.burst_groups.get(str(_tags(i).get("burst-group")))
    region = group.region if group else desc.pool.cloud_region
    most = int(i.get("maxSize") or 0)
    overrides = (((i.get("mixedInstancesPolicy") or {}).get("launchTemplate") or {})
                 .get("overrides") or [])
    types = [str(o.get("instanceType")) for o in overrides if o.get("instanceType")]
    rates = [p.instances.get(region, {}).get(t) for t in types]
    what = f"{most} x {'|'.join(types)} x {p.hours} h"
    if not types or any(r is None for r in rates):
        return Line(INSTANCES, name, region, what, None)
    # The group may launch any of its types: the dearest is the ceiling.
    return Line(INSTANCES, name, region, what, _per_hour(max(r or 0.0 for r in rates), most, p))


def _file_system(name: str, i: Mapping[str, Any], desc: Description, p: Prices) -> Line:
    home = desc.pool.cloud_region
    deployment = str(i.get("deploymentType") or "")
    gib = float(i.get("storageCapacity") or 0)
    rate = p.fsx_lustre.get(home, {}).get(deployment)
    return Line(FILE_SYSTEMS, name, home, f"FSx for Lustre {deployment} {gib:g} GiB",
                None if rate is None else rate * gib)


def _bucket(name: str, i: Mapping[str, Any], desc: Description, p: Prices) -> Line:
    home = desc.pool.cloud_region
    tier = storage.tier_of_bucket(desc, str(i.get("bucket") or ""))
    if tier is None:
        return Line(BUCKETS, name, home, "a bucket of no tier", None)
    gb = desc.storage_tiers[tier].size_tib * GIB_PER_TIB
    rate = p.s3_standard.get(home)
    return Line(BUCKETS, name, home, f"tier {tier}: {gb:g} GB in S3 Standard",
                None if rate is None else rate * gb)


def _nat(name: str, i: Mapping[str, Any], desc: Description, p: Prices) -> Line:
    region = _region_of(name, desc, i)
    return Line(NAT, name, region, f"NAT gateway x {p.hours} h (GB processed not included)",
                _per_hour(p.nat_gateway_hour.get(region), 1, p))


def _endpoint(name: str, i: Mapping[str, Any], desc: Description, p: Prices) -> Line | None:
    if str(i.get("vpcEndpointType") or "Gateway") != "Interface":
        return None  # a gateway endpoint (S3) has no hourly charge
    region = _region_of(name, desc, i)
    zones = len(i.get("subnetIds") or []) or 1
    return Line(ENDPOINTS, name, region, f"interface endpoint x {zones} zones x {p.hours} h",
                _per_hour(p.interface_endpoint_hour.get(region), zones, p))


def _vpn(name: str, i: Mapping[str, Any], desc: Description, p: Prices) -> Line:
    region = _region_of(name, desc, i)
    return Line(LINKS, name, region, f"Site-to-Site VPN x {p.hours} h",
                _per_hour(p.vpn_connection_hour.get(region), 1, p))


def _attachment(name: str, i: Mapping[str, Any], desc: Description, p: Prices) -> Line:
    region = _region_of(name, desc, i)
    return Line(LINKS, name, region, f"Transit Gateway attachment x {p.hours} h",
                _per_hour(p.transit_gateway_attachment_hour.get(region), 1, p))


def _direct_connect(name: str, i: Mapping[str, Any], desc: Description, p: Prices) -> Line:
    return Line(LINKS, name, _region_of(name, desc, i), "Direct Connect gateway association "
                "(the connection's port hours are outside the stack)", None)


LINES = {ASG: _instances, FSX_LUSTRE: _file_system, BUCKET: _bucket, NAT_GATEWAY: _nat,
         VPC_ENDPOINT: _endpoint, VPN_CONNECTION: _vpn, TGW_ATTACHMENT: _attachment,
         DX_ASSOCIATION: _direct_connect}


def line(type_: str, name: str, inputs: Mapping[str, Any], desc: Description,
         p: Prices | None = None) -> Line | None:
    """The ceiling's line for one declared resource; None for a resource that is no line."""
    fn = LINES.get(type_)
    return fn(name, inputs, desc, p or prices()) if fn else None


def ceiling(resources: Iterable[tuple[str, str, Mapping[str, Any]]],
            desc: Description) -> Ceiling:
    """The ceiling of (type, name, inputs) resources, as the plan or the engine has them."""
    p = prices()
    lines = [x for t, n, i in resources if (x := line(t, n, i, desc, p)) is not None]
    lines.sort(key=lambda x: (KINDS.index(x.kind), x.resource))
    return Ceiling(tuple(lines), p.read)
