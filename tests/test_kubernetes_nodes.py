"""Kubernetes on the pool: every label a ResourceFlavor selects is set on some node, and
the host firewall admits what the cluster needs, only on its nodes, only when declared."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.render import flows, inventory, k8s_objects, node_labels
from gpupool.render.cloud import launch, network
from gpupool.spec import loader
from gpupool.spec.catalog import BURST_SEGMENT
from gpupool.spec.model import Cni, Description, Kubernetes
from tests.conftest import ROOT
from tests.test_inventory import _firewall

K8S_PORTS = {flows.API_SERVER, flows.KUBELET, *flows.ETCD, 8472, 179, 4240}


def with_kubernetes(desc: Description, cni: Cni = Cni.FLANNEL) -> Description:
    ctl = next(n for n, node in desc.nodes.items() if "controller" in node.roles)
    return desc.model_copy(update={"kubernetes": Kubernetes(cni=cni, control_plane=[ctl])})


def clusters() -> list[Description]:
    """The example declares a cluster; the lab does not, so it gets one here."""
    return [loader.load_stack("example", ROOT),
            with_kubernetes(loader.load_stack("lab", ROOT))]


def every_path(desc: Description) -> list[dict[str, Any]]:
    """Registrations as the nodes really receive them: the inventory's hostvars (on-prem,
    read by roles/kubernetes_node) and each burst group's user data."""
    hosts = inventory.build(desc)["all"]["hosts"]
    out = [h["gpupool_node"]["kubernetes"] for h in hosts.values()
           if h["gpupool_node"]["kubernetes"] is not None]
    for name, group in desc.burst_groups.items():
        script = launch.user_data(desc, name, group)
        for reg in node_labels.burst_nodes(desc, name).values():
            assert node_labels.kubelet_args(reg) in script
            out.append(reg)
    return out


@pytest.mark.parametrize("desc", clusters(), ids=["example", "lab+k8s"])
def test_every_flavor_selects_labels_some_node_registers_with(desc: Description) -> None:
    paths = every_path(desc)
    flavors = [m for m in k8s_objects.manifests(desc) if m["kind"] == "ResourceFlavor"]
    assert flavors
    for f in flavors:
        want = f["spec"]["nodeLabels"]
        taints = f["spec"].get("nodeTaints", [])
        carriers = [p for p in paths if want.items() <= p["labels"].items()]
        assert carriers, f"no node is labelled {want} for flavor {f['metadata']['name']}"
        # Nodes the flavor selects carry its taints, and nothing else selects tainted nodes.
        assert all(p["taints"] == taints for p in carriers), f["metadata"]["name"]


@pytest.mark.parametrize("desc", clusters(), ids=["example", "lab+k8s"])
def test_onprem_gpu_nodes_register_with_their_model_and_class(desc: Description) -> None:
    hosts = inventory.build(desc)["all"]["hosts"]
    for name, node in desc.nodes.items():
        reg = hosts[name]["gpupool_node"]["kubernetes"]
        gpu = desc.node_classes[node.class_].gpu
        if "compute" in node.roles and gpu is not None:
            assert reg["labels"][node_labels.LABEL_MODEL] == gpu.model
            assert reg["labels"][node_labels.LABEL_CAPACITY] == node_labels.ONPREM
            assert reg["labels"][node_labels.LABEL_CLASS] == node.class_
            assert reg["taints"] == []


def test_no_cluster_no_registration_and_no_kubelet_arguments() -> None:
    desc = loader.load_stack("lab", ROOT)
    inv = inventory.build(desc)["all"]
    assert inventory.pool_vars(desc)["gpupool_kubernetes"] is None
    assert all(h["gpupool_node"]["kubernetes"] is None for h in inv["hosts"].values())
    for name, group in desc.burst_groups.items():
        assert "kubelet" not in launch.user_data(desc, name, group)


def test_spot_registration_is_tainted_and_picked_by_the_instance() -> None:
    desc = loader.load_stack("example", ROOT)
    script = launch.user_data(desc, "h100-burst", desc.burst_groups["h100-burst"])
    assert "instance-life-cycle" in script
    assert "--register-with-taints=gpupool.io/capacity-type=spot:NoSchedule" in script
    # Metadata unreachable: the node registers as spot (tainted), never as on-demand.
    fallback = next(line for line in script.splitlines() if line.startswith("  *)"))
    assert "capacity-type=spot" in fallback


def test_gpu_product_is_feature_discoverys_name() -> None:
    assert node_labels.gpu_product("h100") == "NVIDIA-H100-80GB-HBM3"
    assert node_labels.gpu_product("l4") == "NVIDIA-L4"


def _ports(allowances: list[flows.Allowance]) -> dict[tuple[str, str], set[int]]:
    out: dict[tuple[str, str], set[int]] = {}
    for a in allowances:
        out.setdefault((a.source_segment, a.protocol), set()).update(a.ports)
    return out


def _kubernetes_only(allowances: list[flows.Allowance]) -> dict[tuple[str, str], set[int]]:
    return {k: v for k, v in _ports(allowances).items() if k[0].startswith("kubernetes-")}


@pytest.mark.parametrize(("cni", "pod_network"), [
    (Cni.FLANNEL, {("kubernetes-nodes", "udp"): {8472}}),
    (Cni.CALICO, {("kubernetes-nodes", "tcp"): {179}}),
    (Cni.CILIUM, {("kubernetes-nodes", "udp"): {8472}, ("kubernetes-nodes", "tcp"): {4240}}),
])
def test_firewall_admits_what_kubernetes_needs_and_nothing_more(
        cni: Cni, pod_network: dict[tuple[str, str], set[int]]) -> None:
    desc = with_kubernetes(loader.load_stack("lab", ROOT), cni)
    sources = flows.segment_sources(desc)
    control = {
        ("kubernetes-api-clients", "tcp"): {6443},
        ("kubernetes-control-plane", "tcp"): {2379, 2380, 10250},
    }
    worker = {("kubernetes-control-plane", "tcp"): {10250}}
    for key, ports in pod_network.items():
        control[key] = control.get(key, set()) | ports
        worker[key] = worker.get(key, set()) | ports
    assert _kubernetes_only(flows.inbound(desc, "lab-ctl", sources)) == control
    for node in ("lab-gpu1", "lab-gpu2", "lab-gpu3"):
        assert _kubernetes_only(flows.inbound(desc, node, sources)) == worker
    # All on the management addresses, kubelet's node IP.
    assert {a.segment for n in desc.nodes for a in flows.inbound(desc, n, sources)
            if a.source_segment.startswith("kubernetes-")} == {"management"}
    # etcd and kubelet only from the control plane; the API server also from the admins.
    ctl_addr = desc.nodes["lab-ctl"].addresses["management"]
    assert sources["kubernetes-control-plane"] == (ctl_addr,)
    assert set(desc.network.admin_cidrs) <= set(sources["kubernetes-api-clients"])
    assert not set(desc.network.admin_cidrs) & set(sources["kubernetes-nodes"])
    # Burst nodes join from their one address, in the burst segment's cloud block.
    assert desc.network.segments[BURST_SEGMENT].cloud_cidr in sources["kubernetes-nodes"]
    assert desc.network.segments["management"].cloud_cidr not in sources["kubernetes-nodes"]


@pytest.mark.parametrize("cni", list(Cni))
def test_burst_security_groups_admit_what_kubernetes_needs_and_nothing_more(cni: Cni) -> None:
    """The cloud side of the same cluster: the burst nodes' group (their subnets' segment)
    lets kubelet in from the control plane, lets the API server out to it, and carries the
    pod network both ways with the other burst nodes and the cluster's on-prem nodes, each
    side a prefix list of exactly those nodes' management addresses. Nothing else, on no
    other group, and nothing at all without a cluster or without bursting."""
    desc = with_kubernetes(loader.load_stack("lab", ROOT), cni)
    control, nodes = flows.KUBERNETES_CONTROL_PLANE, flows.KUBERNETES_NODES
    mgmt = {n: f"{node.addresses['management']}/32" for n, node in desc.nodes.items()}
    assert network.prefix_lists(desc) == {
        control: {mgmt["lab-ctl"]: "lab-ctl"},
        nodes: {mgmt[n]: n for n in ("lab-ctl", "lab-gpu1", "lab-gpu2", "lab-gpu3")}}
    want = {("ingress", control, "tcp", flows.KUBELET),
            ("egress", control, "tcp", flows.API_SERVER)}
    for protocol, ports in flows.CNI_PORTS[cni]:
        want |= {(d, peer, protocol, p) for d in ("ingress", "egress")
                 for peer in (BURST_SEGMENT, nodes) for p in ports}
    rules = network.kubernetes_rules(desc)
    assert {r.segment for r in rules} == {BURST_SEGMENT}
    assert {(r.direction, r.peer, r.protocol, r.port) for r in rules} == want
    # The program declares them (firewall_rules) unless a flow already opens the same.
    declared = {r.key: r for r in network.firewall_rules(desc)}
    assert {r.key for r in rules} <= set(declared)
    for r in (declared[r.key] for r in rules if declared[r.key].flow is None):
        assert network.rule_description(desc, r).startswith("Kubernetes: "), r
    for plain in (loader.load_stack("lab", ROOT), desc.model_copy(update={"burst_groups": {}})):
        assert network.kubernetes_rules(plain) == set()
        assert network.prefix_lists(plain) == {}


def test_login_and_storage_only_hosts_open_nothing_for_kubernetes() -> None:
    desc = loader.load_stack("example", ROOT)
    sources = flows.segment_sources(desc)
    for name, node in desc.nodes.items():
        if name in desc.kubernetes.control_plane or "compute" in node.roles:
            continue
        assert not _kubernetes_only(flows.inbound(desc, name, sources)), name


def test_no_cluster_opens_nothing_extra() -> None:
    desc = loader.load_stack("lab", ROOT)
    declared = {(f.from_, f.to) for f in desc.network.flows}
    sources = flows.segment_sources(desc)
    assert not [s for s in sources if s.startswith("kubernetes-")]
    for name in desc.nodes:
        for a in flows.inbound(desc, name, sources):
            # Slurm's own allowance (srun's ports: tests/test_inventory.py) aside.
            assert (a.source_segment, a.segment) in declared or (
                a.source_segment == flows.SLURM_HOSTS and not a.ports)
    declared_ports = {p for f in desc.network.flows for p in f.ports}
    assert not (K8S_PORTS - declared_ports) & {
        p for n in desc.nodes for a in flows.inbound(desc, n, sources) for p in a.ports}


def test_rendered_nftables_carry_the_kubernetes_sets_on_cluster_nodes() -> None:
    ctl = _firewall("example", "mgmt1")
    assert "set src_kubernetes_control_plane" in ctl
    assert "tcp dport { 6443 }" in ctl and "tcp dport { 2379, 2380 }" in ctl
    gpu = _firewall("example", "h100-a1")
    assert "udp dport { 8472 }" in gpu and "tcp dport { 10250 }" in gpu
    assert "6443" not in gpu and "2379" not in gpu
    lab = _firewall("lab", "lab-gpu1")
    assert "kubernetes" not in lab and "10250" not in lab


def test_kubelet_role_writes_the_registration_the_flavors_select() -> None:
    import jinja2  # noqa: PLC0415

    desc = loader.load_stack("example", ROOT)
    host = inventory.build(desc)["all"]["hosts"]["h100-a1"]["gpupool_node"]
    env = jinja2.Environment(  # as Ansible's template module: trim_blocks  # noqa: S701
        loader=jinja2.FileSystemLoader(ROOT / "roles" / "kubernetes_node" / "templates"),
        trim_blocks=True, undefined=jinja2.StrictUndefined)
    text = env.get_template("kubelet.j2").render(
        ansible_managed="test", kubernetes_node_registration=host["kubernetes"],
        kubernetes_node_ip=host["addresses"]["management"])
    line = next(x for x in text.splitlines() if x.startswith("KUBELET_EXTRA_ARGS="))
    assert line == (f'KUBELET_EXTRA_ARGS="--node-ip={host["addresses"]["management"]} '
                    f'{node_labels.kubelet_args(host["kubernetes"])}"')
    spot = {"labels": {"a": "b"}, "taints": node_labels.flavor_taints("spot")}
    text = env.get_template("kubelet.j2").render(
        ansible_managed="test", kubernetes_node_registration=spot, kubernetes_node_ip="x")
    assert f'{node_labels.kubelet_args(spot)}"' in text
