"""The Slurm policy rendered from the description: every value traced back to it."""

from __future__ import annotations

import pytest

from gpupool.render import ansible_yaml, slurm
from gpupool.render.scheduling import class_policies, preemption_pairs, team_quotas
from gpupool.spec import loader
from gpupool.spec.facts import gpu_nodes, rack_places
from gpupool.spec.model import duration_seconds
from tests.conftest import ROOT, mutate, raw_stack

STACKS = ["lab", "example"]


@pytest.fixture(params=STACKS)
def desc(request):
    return loader.load_stack(request.param)


@pytest.mark.parametrize(("names", "expected"), [
    (["gpu1", "gpu2", "gpu3"], "gpu[1-3]"),
    (["a1", "a3", "a4", "b"], "a[1,3-4],b"),
    (["x-0", "x-1", "y-7"], "x-[0-1],y-7"),
    (["node"], "node"),
    (["n9", "n10", "n11"], "n[9-11]"),
])
def test_hostlist(names, expected):
    assert slurm.hostlist(names) == expected


def test_time_limit():
    assert slurm.time_limit(3600) == "0-01:00:00"
    assert slurm.time_limit(2 * 86400 + 61) == "2-00:01:01"


def test_nodes_come_from_the_description(desc):
    conf = slurm.slurm_conf(desc)
    nodes = slurm.records(conf, "NodeName")
    places = rack_places(desc)
    for name in gpu_nodes(desc):
        node = desc.nodes[name]
        gpu = desc.node_classes[node.class_].gpu
        rec = nodes[name]
        assert rec["NodeAddr"] == node.addresses["management"]
        assert rec["Gres"] == f"gpu:{gpu.model}:{gpu.count}"
        assert rec["CPUs"] == str(desc.node_classes[node.class_].cpus)
        assert places[node.rack].leaf in rec["Feature"].split(",")
        assert rec["State"] == "UNKNOWN"
    for group_name, group in desc.burst_groups.items():
        cloud = [n for n, r in nodes.items() if f"burst,{group_name}" in r["Feature"]]
        assert len(cloud) == group.max_nodes
        assert all(nodes[n]["State"] == "CLOUD" and "NodeAddr" not in nodes[n] for n in cloud)
    ctl = next(n for n, node in desc.nodes.items() if "controller" in node.roles)
    assert f"SlurmctldHost={ctl}({desc.nodes[ctl].addresses['management']})" in conf
    assert ctl not in nodes  # the controller runs no jobs


def test_partitions_follow_task_classes(desc):
    parts = slurm.records(slurm.slurm_conf(desc), "PartitionName")
    classes = class_policies(desc)
    assert list(parts) == [c.name for c in classes]
    onprem = slurm.hostlist(gpu_nodes(desc))
    for i, c in enumerate(classes):
        p = parts[c.name]
        assert int(p["PriorityTier"]) == c.priority
        assert p["MaxTime"] == slurm.time_limit(duration_seconds(desc.task_classes[c.name]
                                                                 .max_runtime))
        assert p["PreemptMode"] == ("REQUEUE" if c.preemptible else "OFF")
        assert p.get("GraceTime") == (str(c.grace_s) if c.preemptible and c.grace_s else None)
        assert p["TRESBillingWeights"] == "CPU=0,GRES/gpu=1"
        assert p["QOS"] == c.name
        # The top class starts by preemption on-prem, never waiting for a cloud boot.
        assert (p["Nodes"] == onprem) == (i == 0 and bool(desc.burst_groups))


def test_preemption_relation_matches_the_model(desc):
    """partition_prio: higher tier preempts lower tiers whose PreemptMode is not OFF."""
    parts = slurm.records(slurm.slurm_conf(desc), "PartitionName")
    derived = {(a, b) for a, pa in parts.items() for b, pb in parts.items()
               if int(pa["PriorityTier"]) > int(pb["PriorityTier"])
               and pb["PreemptMode"] != "OFF"}
    assert derived == preemption_pairs(desc)


def _unchecked(desc, cls, **update):
    """desc with one task class changed, past validation (which refuses what follows):
    the renderer must still refuse rather than render another policy."""
    changed = desc.task_classes[cls].model_copy(update=update)
    return desc.model_copy(update={"task_classes": {**desc.task_classes, cls: changed}})


def test_inexpressible_preemption_is_refused(desc):
    with pytest.raises(slurm.SlurmPolicyError, match="partition priority preemption"):
        slurm.slurm_conf(_unchecked(desc, "training", preempts=[]))


def test_priority_above_slurm_maximum_is_refused(desc):
    with pytest.raises(slurm.SlurmPolicyError, match="PriorityTier"):
        slurm.slurm_conf(_unchecked(desc, "interactive", priority=70000))


def test_topology_tree_from_leaf_switches(desc):
    switches = slurm.records(slurm.topology_conf(desc), "SwitchName")
    places = rack_places(desc)
    for name in gpu_nodes(desc):
        leaf = places[desc.nodes[name].rack].leaf
        members = switches[leaf]["Nodes"]
        assert name in members or name.rstrip("0123456789") in members
    for site, s in desc.sites.items():
        assert set(slurm.hostlist(s.leaf_switches).split(",")) >= set(
            switches[site]["Switches"].split(","))
    for group in desc.burst_groups:
        assert group in switches  # cloud nodes are kept off the on-prem tree


def test_lab_topology_exact():
    lines = slurm.topology_conf(loader.load_stack("lab"))
    assert "SwitchName=leaf1 Nodes=lab-gpu[1-2]" in lines
    assert "SwitchName=leaf2 Nodes=lab-gpu3" in lines
    assert "SwitchName=lab Switches=leaf[1-2]" in lines


def test_gres_lab_fixture_devices_and_production_nvml():
    lab = slurm.gres_conf(loader.load_stack("lab"))
    assert "AutoDetect=nvml" not in lab
    assert lab == ["NodeName=lab-gpu[1-3],l4-burst-[0-1] Name=gpu Type=l4 "
                   "File=/dev/nvidia[0-3]"]
    prod = slurm.gres_conf(loader.load_stack("example"))
    assert prod[0] == "AutoDetect=nvml"
    assert any("Type=h100 File=/dev/nvidia[0-7]" in line for line in prod)


def test_environment_tuning():
    lab = slurm.slurm_conf(loader.load_stack("lab"))
    prod = slurm.slurm_conf(loader.load_stack("example"))
    assert "ProctrackType=proctrack/linuxproc" in lab
    assert "ProctrackType=proctrack/cgroup" in prod
    assert "ConstrainDevices=yes" in slurm.cgroup_conf(loader.load_stack("example"))


def test_accounting_from_teams(desc):
    plan = slurm.accounting(desc)
    assert plan["cluster"] == desc.pool.name
    quotas = team_quotas(desc)
    limits = {lim["account"]: dict(kv.split("=") for kv in lim["GrpTRES"].split(","))
              for lim in plan["limits"]}
    for team in desc.teams:
        mine = [q for q in quotas if q.team == team]
        for q in mine:
            assert int(limits[team][f"gres/gpu:{q.model}"]) == q.nominal + q.borrowing
        assert int(limits[team]["gres/gpu"]) == sum(q.nominal + q.borrowing for q in mine)
        account = next(a for a in plan["accounts"] if a["name"] == team)
        assert account["Fairshare"] == sum(q.nominal for q in mine)
        assert account["Organization"] == desc.teams[team].cost_centre
        members = {u for us in desc.teams[team].members.values() for u in us}
        assert {u["name"] for u in plan["users"] if u["account"] == team} == members
    # Every limit names a TRES that accounting registers first.
    named = {k for lim in limits.values() for k in lim}
    assert named <= set(plan["tres"])
    assert f"AccountingStorageTRES={','.join(plan['tres'])}" in slurm.slurm_conf(desc)
    qos = {q["name"]: q for q in plan["qos"]}
    for c in class_policies(desc):
        assert qos[c.name]["Priority"] == c.priority
        assert qos[c.name]["MaxWall"] == slurm.time_limit(c.max_runtime_s)


def test_member_of_two_teams_keeps_one_default_account():
    users = slurm.accounting(loader.load_stack("lab"))["users"]
    carol = [u for u in users if u["name"] == "carol"]
    assert {u["account"] for u in carol} == {"vision", "nlp"}
    assert {u["DefaultAccount"] for u in carol} == {"vision"}


def test_burst_config_and_power_saving(desc):
    conf = slurm.slurm_conf(desc)
    burst = slurm.burst_config(desc)["groups"]
    assert set(burst) == set(desc.burst_groups)
    for name, group in desc.burst_groups.items():
        assert burst[name]["instance_types"] == list(group.instance_types)
        assert burst[name]["nodes"] == slurm.burst_node_names(name, group.max_nodes)
    assert f"ResumeProgram={slurm.RESUME_PROGRAM}" in conf
    assert f"SuspendExcNodes={slurm.hostlist(gpu_nodes(desc))}" in conf


def test_no_burst_no_power_saving():
    data = mutate(raw_stack("lab"), [
        {"delete": "burst_groups"},
        *({"set": f"teams.{t}.{k}", "value": {"l4": 6}}
          for t in ("vision", "nlp") for k in ("quota", "borrowing_limit"))])
    conf = slurm.slurm_conf(loader.parse(data))
    assert not any(line.startswith(("ResumeProgram", "SuspendTime")) for line in conf)
    parts = slurm.records(conf, "PartitionName")
    assert {p["Nodes"] for p in parts.values()} == {"lab-gpu[1-3]"}


def test_plan_and_files(desc):
    plan = slurm.plan(desc)
    files = slurm.render_files(desc)
    assert set(files) == {"slurm.conf", "gres.conf", "topology.conf", "cgroup.conf"}
    assert files["slurm.conf"].splitlines()[1:] == plan["slurm_conf"]
    expected = ({n.name: n.gpus for n in slurm.nodes(desc)}
                if desc.pool.environment == "lab" else {})
    assert slurm.fixture_gpu_devices(desc) == expected
    assert set(plan["fixture_devices"]) == set(expected)
    # On-prem nodes have the class's GPUs; cloud nodes (the lab's burst hosts) are counted.
    assert all(expected[n] == desc.node_classes[desc.nodes[n].class_].gpu.count
               for n in gpu_nodes(desc) if expected)


def test_cli_render(tmp_path, capsys):

    from gpupool import cli  # noqa: PLC0415

    assert cli.main(["slurm", "render", "--stack", "lab", "--out", str(tmp_path / "o"),
                     "--vars", str(tmp_path / "v.yml")]) == 0
    assert (tmp_path / "o" / "topology.conf").read_text() == slurm.render_files(
        loader.load_stack("lab"))["topology.conf"]
    plan = ansible_yaml.load((tmp_path / "v.yml").read_text())["gpupool_slurm"]
    assert plan == slurm.plan(loader.load_stack("lab"))


def test_cli_refuses_inexpressible_policy(tmp_path):
    import yaml  # noqa: PLC0415

    from gpupool import cli  # noqa: PLC0415

    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(mutate(raw_stack("lab"), [
        {"set": "task_classes.training.preempts", "value": []}])))
    assert cli.main(["slurm", "render", "--file", str(path)]) == 1


def test_sched_interval_is_read_from_the_rendered_tuning() -> None:
    """The replay's top-class target is two scheduling cycles of what slurm.conf says."""
    assert slurm.sched_interval_s(loader.load_stack("lab", ROOT)) == 2
    assert slurm.sched_interval_s(loader.load_stack("example", ROOT)) == \
        slurm.SCHED_INTERVAL_DEFAULT_S


def test_the_fixture_devices_file_is_the_one_gres_conf_reads() -> None:
    """Each lab node's fixture devices file (the role writes it on-prem, the lab writes it
    into burst hosts): a device per GPU, or per MIG instance on a MIG class, numbered and
    named as gres.conf lists them, with the NVIDIA major for GPUs."""
    desc = loader.load_stack("lab")
    plan = slurm.plan(desc)
    assert set(plan["fixture_devices"]) == {n.name for n in slurm.nodes(desc)}
    for n in slurm.nodes(desc):
        text = plan["fixture_devices"][n.name]
        assert text == slurm.fixture_gpus_conf(desc, n.name)
        rows = [r.split() for r in text.splitlines() if not r.startswith("#")]
        assert [r[1] for r in rows] == [slurm.GPU_DEVICE.format(i) for i in range(n.gpus)]
        assert [r[-1] for r in rows] == [f"{slurm.GPU_FIXTURE_MAJOR}:{i}" for i in range(n.gpus)]
    assert slurm.plan(loader.load_stack("example"))["fixture_devices"] == {}


def test_researchers_see_only_their_own_jobs_usage_users_and_accounts(desc) -> None:
    """PrivateData hides other users' jobs, usage, users, accounts and reservations from
    everyone but root, SlurmUser and operators (and coordinators, their accounts'): the
    scheduler exporter reads every job from root's snapshot instead
    (tests/test_slurm_exporter_role.py); `cloud` (burst nodes listed while powered down) is
    added where the pool bursts. One line: Slurm would keep only the last."""
    private = "PrivateData=accounts,jobs,reservations,usage,users"
    assert desc.burst_groups  # both stacks burst
    assert [ln for ln in slurm.slurm_conf(desc) if ln.startswith("PrivateData")] == [
        private + ",cloud"]
    onprem = desc.model_copy(update={"burst_groups": {}})
    assert [ln for ln in slurm.slurm_conf(onprem) if ln.startswith("PrivateData")] == [
        private]


def test_slurmdbd_hides_the_same_from_sacct_and_sacctmgr() -> None:
    """sacct and sacctmgr ask slurmdbd, which applies its own PrivateData, not slurm.conf's:
    without it `sacct -a` would list every team's jobs to anyone. The same flags (`cloud` is
    no slurmdbd flag), once."""
    text = (ROOT / "roles" / "slurm" / "templates" / "slurmdbd.conf.j2").read_text()
    assert [ln for ln in text.splitlines() if ln.startswith("PrivateData")] == [
        "PrivateData=" + ",".join(slurm.PRIVATE_DATA)]
