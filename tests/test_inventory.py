"""The Ansible inventory and the summary are derived from the description alone."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool import cli
from gpupool.render import ansible_yaml, inventory
from gpupool.spec import loader
from gpupool.spec.errors import DescriptionError
from gpupool.spec.facts import controller
from gpupool.spec.model import NodeRole
from tests.conftest import BIN, ROOT, raw_stack


def _graph(inv: Path) -> str:
    return subprocess.run([BIN / "ansible-inventory", "-i", str(inv), "--graph"],
                          check=True, capture_output=True, text=True).stdout


def _plain(value: Any) -> Any:
    """ansible-inventory's JSON with the `!unsafe` wrappers of string values taken off."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if isinstance(value, list) else value


def _list(inv: Path) -> dict:
    return _plain(json.loads(subprocess.run(
        [BIN / "ansible-inventory", "-i", str(inv), "--list"],
        check=True, capture_output=True, text=True).stdout))


def test_ansible_never_evaluates_a_value_from_the_description(tmp_path: Path) -> None:
    """Validation refuses template syntax; should a value carry it anyway, the inventory
    file holds it !unsafe and Ansible renders it as the text it is."""
    desc = loader.load_stack("lab", ROOT)
    name = next(iter(desc.nodes))
    klass, cls = next(iter(desc.task_classes.items()))
    hostile = "r{{ 7 * 7 }}{% if true %}x{% endif %}"
    desc.task_classes[klass] = cls.model_copy(update={"description": hostile})
    inv = tmp_path / "inventory.yml"
    inv.write_text(ansible_yaml.dump(inventory.build(desc)))
    assert _resolved(inv, name, f"gpupool_task_classes['{klass}'].description") == hostile
    # The connection variables stay plain strings for the tools that read them (testinfra).
    assert isinstance(json.loads(subprocess.run(
        [BIN / "ansible-inventory", "-i", str(inv), "--host", name], check=True,
        capture_output=True, text=True).stdout)["ansible_host"], str)
    raw = raw_stack("lab")
    klass = next(iter(raw["node_classes"]))
    raw["node_classes"][klass]["description"] = "a {{ lookup('pipe', 'id') }}"
    with pytest.raises(DescriptionError) as info:
        loader.parse(raw)
    assert [(p.path, p.rule) for p in info.value.problems] == [
        (f"node_classes.{klass}.description", "template-syntax")]


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_inventory_drives_ansible_inventory(stack: str, tmp_path: Path) -> None:
    inv = tmp_path / "inventory.yml"
    assert cli.main(["inventory", "--stack", stack, "-o", str(inv)]) == cli.EXIT_OK
    desc = loader.load_stack(stack, ROOT)
    graph = _graph(inv)
    listed = _list(inv)
    hostvars = listed["_meta"]["hostvars"]
    assert set(hostvars) == set(desc.nodes)
    for name, node in desc.nodes.items():
        assert hostvars[name]["ansible_host"] == node.addresses["management"]
        assert hostvars[name]["gpupool_node"]["rack"] == node.rack
        assert name in listed[f"rack_{node.rack}"]["hosts"]
        assert name in listed[f"class_{node.class_.replace('-', '_')}"]["hosts"]
        assert f"--{name}" in graph
    # The pool-wide variables are held once, by the primary controller, and every host
    # reads them in a play.
    assert [h for h, v in hostvars.items() if inventory.POOL_WIDE in v] == [controller(desc)]
    driver = _resolved(inv, next(reversed(desc.nodes)), "gpupool_software.nvidia_driver")
    assert driver == desc.software.nvidia_driver


def _resolved(inv: Path, host: str, expression: str) -> Any:
    """What a play on host sees for expression (Ansible's debug action, no connection)."""
    out = subprocess.run(
        [BIN / "ansible", "-i", str(inv), host, "-m", "ansible.builtin.debug",
         "-a", f"msg={{{{ {expression} | to_json }}}}"],
        check=True, capture_output=True, text=True, cwd=inv.parent).stdout
    return json.loads(json.loads(out.split("=>", 1)[1])["msg"])


def test_listed_host_variables_do_not_grow_with_the_pool() -> None:
    """`ansible-inventory --list` (how AWX and Semaphore sync) writes every host with its
    groups' variables merged in: a host's share must not grow with the pool, or the listing
    grows with its square (1.2 GB at 1,000 nodes when `all` held slurm.conf's node lines)."""
    from bench.plan import synthetic  # noqa: PLC0415

    def listed_bytes(nodes: int) -> int:
        inv = inventory.build(synthetic(nodes))["all"]
        host = inv["hosts"]["n0001"]
        return len(json.dumps({**inv["vars"], **host}))

    small, large = listed_bytes(100), listed_bytes(1000)
    assert large < 1.1 * small, (small, large)


def test_lab_inventory_groups(tmp_path: Path) -> None:
    inv = tmp_path / "inventory.yml"
    cli.main(["inventory", "--stack", "lab", "-o", str(inv)])
    listed = _list(inv)
    # Both controllers run slurmctld; the primary alone holds the database and the timers.
    assert sorted(listed["role_controller"]["hosts"]) == ["lab-ctl", "lab-ctl2"]
    assert listed["controller_primary"]["hosts"] == ["lab-ctl"]
    assert sorted(listed["role_compute"]["hosts"]) == ["lab-gpu1", "lab-gpu2", "lab-gpu3"]
    assert sorted(listed["leaf_leaf1"]["hosts"]) == ["lab-ctl", "lab-gpu1", "lab-gpu2"]
    assert listed["team_nlp"]["hosts"] == ["lab-gpu3"]
    assert sorted(listed["gpu_l4"]["hosts"]) == ["lab-gpu1", "lab-gpu2", "lab-gpu3"]
    assert "burst_l4_burst" in _graph(inv)


def test_show_totals(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["show", "--stack", "example", "--json"]) == cli.EXIT_OK
    s = json.loads(capsys.readouterr().out)
    assert s["capacity_totals"] == {"on-prem": 152, "on-demand": 8, "spot": 56, "total": 216}
    assert s["quota_totals"] == {"h100": 136, "l40s": 32}
    assert s["unassigned"] == {"h100": 40, "l40s": 8}
    assert [c["class"] for c in s["task_classes"]] == ["interactive", "training", "deferred"]
    assert cli.main(["show", "--stack", "example"]) == cli.EXIT_OK
    human = capsys.readouterr().out
    assert "GPU capacity of pool prod" in human and "Team quotas" in human


def test_inventory_grows_linearly_with_the_pool() -> None:
    # Sizes, not times: every host once carried every source address of every flow, so
    # 4x the nodes made a 16x inventory (about 2 GB at 3,000 nodes).
    from bench.plan import synthetic  # noqa: PLC0415
    from gpupool.render import inventory  # noqa: PLC0415

    small, large = (len(json.dumps(inventory.build(synthetic(n)))) for n in (100, 400))
    assert large < 5 * small


BURST = "burst"  # _firewall's name for a burst image's ruleset


def _firewall(stack: str, node: str) -> str:
    """The hardening role's nftables ruleset for an on-prem node, or for the stack's burst
    image where node is BURST."""
    import jinja2  # noqa: PLC0415

    from gpupool.render.cloud import names  # noqa: PLC0415

    desc = loader.load_stack(stack, ROOT)
    if node == BURST:
        image = inventory.burst_image_vars(desc, names.regions(desc)[0])
        inbound, sources = image["gpupool_node"]["inbound"], image["gpupool_flow_sources"]
    else:
        inv = inventory.build(desc)["all"]
        inbound = inv["hosts"][node]["gpupool_node"]["inbound"]
        sources = inv["hosts"][controller(desc)][inventory.POOL_WIDE]["gpupool_flow_sources"]
    env = jinja2.Environment(  # as Ansible's template module: trim_blocks  # noqa: S701
        loader=jinja2.FileSystemLoader(ROOT / "roles" / "hardening" / "templates"),
        trim_blocks=True, undefined=jinja2.StrictUndefined)
    # The Ansible test and filters the template's refusals use (issue 14).
    env.tests["search"] = lambda value, pattern: re.search(pattern, value) is not None
    env.filters["to_json"] = json.dumps
    env.filters["mandatory"] = lambda value, msg=None: value
    defaults = yaml.safe_load((ROOT / "roles/hardening/defaults/main.yml").read_text())
    return env.get_template("nftables.conf.j2").render(
        ansible_managed="test", inventory_hostname=node,
        hardening_inbound=inbound, hardening_sources=sources,
        hardening_metadata_addresses=defaults["hardening_metadata_addresses"])


def _nft_check(ruleset: str, tmp_path: Path) -> None:
    nft = shutil.which("nft")
    if nft is None or os.geteuid() != 0:
        pytest.skip("nft -c needs the nftables package and root (scripts/bootstrap.sh)")
    path = tmp_path / "nftables.conf"
    path.write_text(ruleset)
    proc = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("stack", "node"), [("lab", "lab-gpu1"), ("lab", "lab-ctl"),
                                             ("example", "h100-a1"), ("example", "mgmt1"),
                                             ("lab", BURST), ("example", BURST)])
def test_firewall_ruleset_is_valid_nftables(stack: str, node: str, tmp_path: Path) -> None:
    ruleset = _firewall(stack, node)
    assert "policy drop" in ruleset and "@src_" in ruleset
    _nft_check(ruleset, tmp_path)


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_only_root_reaches_the_metadata_service_from_the_image_and_the_user_data(
        stack: str, tmp_path: Path) -> None:
    """The node role's credentials are one GET away at the metadata service, and a job is
    a local process: the image's firewall (role hardening) and, before anything else, the
    burst node's user-data reject every packet to it but root's, and forward none there.
    Both name the same addresses; both rulesets load (nft -c)."""
    from gpupool.render.cloud import launch  # noqa: PLC0415

    defaults = yaml.safe_load((ROOT / "roles/hardening/defaults/main.yml").read_text())
    assert tuple(defaults["hardening_metadata_addresses"]) == launch.METADATA_ADDRESSES
    desc = loader.load_stack(stack, ROOT)
    for ruleset in (_firewall(stack, BURST), "\n".join(launch.metadata_root_only())):
        for address in launch.METADATA_ADDRESSES:
            family = "ip6" if ":" in address else "ip"
            assert f"{family} daddr {address} meta skuid != 0 reject" in ruleset
            assert f"    {family} daddr {address} reject" in ruleset
        _nft_check(ruleset, tmp_path)
    for name, group in desc.burst_groups.items():
        script = launch.user_data(desc, name, group)
        block = "nft -f - <<'EOF'\n" + "\n".join(launch.metadata_root_only()) + "\nEOF\n"
        # Before the first line that could ask the metadata service anything.
        assert script.index(block) < script.index("169.254.169.254/latest")


def test_srun_is_reached_on_its_port_range_where_it_runs() -> None:
    """A step spanning nodes: each node's slurmstepd, and slurmctld, connect back to the
    srun that launched it. The firewall admits them on SrunPortRange only, from the Slurm
    hosts, on the hosts that run srun (compute nodes' batch scripts, login nodes). Without
    it the bench's replay of a 4-GPU training job placed on two nodes never ended: its srun
    waited for the far node's tasks, whose slurmstepd the batch host's firewall dropped."""
    from gpupool.render import flows, slurm  # noqa: PLC0415
    from gpupool.spec.catalog import SRUN_PORTS  # noqa: PLC0415

    desc = loader.load_stack("lab", ROOT)
    lo, hi = SRUN_PORTS
    assert f"SrunPortRange={lo}-{hi}" in slurm.render_files(desc)["slurm.conf"]
    for src, dst in (("lab-gpu3", "lab-gpu1"), ("lab-ctl", "lab-gpu1"), ("lab-ctl2", "lab-gpu2"),
                     ("lab-gpu1", "lab-ctl")):
        assert flows.allowed(desc, src, dst, "management", lo)
        assert flows.allowed(desc, src, dst, "management", hi)
        assert not flows.allowed(desc, src, dst, "management", hi + 1)
    assert not flows.allowed(desc, "lab-gpu1", "lab-ctl2", "management", lo)  # runs no srun
    assert not flows.allowed(desc, "lab-gpu3", "lab-gpu1", "storage", lo)
    assert f"tcp dport {{ {lo}-{hi} }}" in _firewall("lab", "lab-gpu1")
    assert f"{lo}-{hi}" not in _firewall("lab", "lab-ctl2")


@pytest.mark.parametrize("stack", ["lab", "example"])
def test_a_burst_node_keeps_the_management_plane_closed_to_flows_of_all(stack: str) -> None:
    """A burst node's security groups admit a flow of protocol `all` whole (they cannot
    leave ports out), so its image carries the host firewall too: the flows to the burst
    segment on any of its addresses, the management plane's ports (sshd, slurmd, the
    exporters) closed to all but management, srun's range from the Slurm hosts, and a
    worker's Kubernetes ports where a cluster is declared."""
    from gpupool.render import flows  # noqa: PLC0415
    from gpupool.spec.catalog import BURST_SEGMENT, SRUN_PORTS  # noqa: PLC0415

    desc = loader.load_stack(stack, ROOT)
    allowances = flows.burst_inbound(desc)
    assert {a.segment for a in allowances} == {BURST_SEGMENT}

    def admitted(source: str, port: int) -> bool:
        return any(a.source_segment == source and a.admits(port) for a in allowances)

    assert admitted("management", 22) and admitted("management", 6818)
    peers = {f.from_ for f in desc.network.flows
             if f.to == BURST_SEGMENT and f.protocol == "all"} - {"management"}
    for source in peers:
        assert admitted(source, 40000)
        for port in (22, 6818, 9100):
            assert not admitted(source, port), (source, port)
    lo, hi = SRUN_PORTS
    assert admitted(flows.SLURM_HOSTS, lo) and admitted(flows.SLURM_HOSTS, hi)
    kubelet = admitted(flows.KUBERNETES_CONTROL_PLANE, flows.KUBELET)
    assert kubelet == (desc.kubernetes is not None)
    ruleset = _firewall(stack, BURST)
    inbound = ruleset.split("chain output")[0]
    assert "ip daddr" not in inbound and "policy drop" in inbound
    assert "tcp dport != { 22," in ruleset
    assert flows.burst_inbound(desc.model_copy(update={"burst_groups": {}})) == []


def _with_a_cpu_node(raw: dict[str, Any]) -> dict[str, Any]:
    """The lab stack with its third compute node in a class without GPUs."""
    raw["node_classes"]["cpu"] = {k: v for k, v in raw["node_classes"]["lab-l4"].items()
                                  if k != "gpu"}
    raw["nodes"]["lab-gpu3"]["class"] = "cpu"
    for team in raw["teams"].values():
        team["quota"] = {m: min(q, 4) for m, q in team["quota"].items()}
        team.pop("borrowing_limit", None)
    return raw


@pytest.mark.parametrize("pool", ["lab", "example", "lab-with-a-cpu-node"])
def test_gpu_software_play_selects_exactly_the_gpu_compute_nodes(pool: str,
                                                                  tmp_path: Path) -> None:
    """site.yml's GPU play picks its hosts by the inventory's GPU groups, not by a `when:`
    on each role: the hosts Ansible selects are the compute nodes whose class has GPUs."""
    from ansible.inventory.manager import InventoryManager  # noqa: PLC0415
    from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415

    desc = (loader.parse(_with_a_cpu_node(raw_stack("lab"))) if pool.endswith("cpu-node")
            else loader.load_stack(pool, ROOT))
    inv = tmp_path / "inventory.yml"
    inv.write_text(ansible_yaml.dump(inventory.build(desc)))
    plays = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    play = next(p for p in plays if any(r["role"] == "nvidia_driver" for r in p.get("roles", [])))
    assert not any("when" in r for r in play["roles"]), play
    selected = {h.name for h in InventoryManager(DataLoader(), [str(inv)]).get_hosts(
        play["hosts"])}
    wanted = {n for n, node in desc.nodes.items() if NodeRole.COMPUTE in node.roles
              and desc.node_classes[node.class_].gpu is not None}
    assert selected == wanted
    if pool.endswith("cpu-node"):
        assert "lab-gpu3" not in selected and wanted
