"""A readable summary of a pool: capacity, segments, quotas and classes, with totals."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpupool.render.scheduling import team_share
from gpupool.spec.facts import CAPACITY_TYPES, gpu_capacity, node_class
from gpupool.spec.model import Description, duration_seconds


def summarize(desc: Description) -> dict[str, Any]:
    cap = gpu_capacity(desc)
    capacity = [{"model": m, **c, "total": sum(c.values())} for m, c in cap.items()]
    totals = {k: sum(row[k] for row in capacity) for k in (*CAPACITY_TYPES, "total")}

    segments = []
    for name, seg in desc.network.segments.items():
        members = [n for n, node in desc.nodes.items() if name in node.addresses]
        gpus = sum((node_class(desc, n).gpu.count if node_class(desc, n).gpu else 0)
                   for n in members)
        segments.append({"segment": name, "cidr": seg.cidr, "vlan": seg.vlan, "mtu": seg.mtu,
                         "nodes": len(members), "gpus": gpus})

    models = list(cap)
    quotas = []
    for team, t in desc.teams.items():
        share = team_share(desc, team)
        quotas.append({"team": team, "cost_centre": t.cost_centre,
                       "quota": {m: share.nominal_of(m) for m in models},
                       "borrowing_limit": {m: share.borrowing_of(m) for m in models},
                       "members": sum(len(u) for u in t.members.values())})
    quota_totals = {m: sum(q["quota"][m] for q in quotas) for m in models}

    classes = [{"class": n, "priority": c.priority, "max_runtime": c.max_runtime,
                "max_runtime_s": duration_seconds(c.max_runtime), "preemptible": c.preemptible,
                "requeue": c.requeue, "grace_time": c.grace_time, "preempts": c.preempts}
               for n, c in sorted(desc.task_classes.items(), key=lambda kv: -kv[1].priority)]
    return {
        "pool": desc.pool.name,
        "environment": desc.pool.environment,
        "nodes": dict(Counter(n.class_ for n in desc.nodes.values())),
        "capacity": capacity,
        "capacity_totals": totals,
        "segments": segments,
        "quotas": quotas,
        "quota_totals": quota_totals,
        "unassigned": {m: totals_m - quota_totals[m]
                       for m, totals_m in ((r["model"], r["total"]) for r in capacity)},
        "task_classes": classes,
        "burst_groups": {n: {"region": g.region, "instance_types": g.instance_types,
                             "capacity": [c.value for c in g.capacity],
                             "min_nodes": g.min_nodes, "max_nodes": g.max_nodes}
                         for n, g in desc.burst_groups.items()},
    }
