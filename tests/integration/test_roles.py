"""Every role converged for real on fresh lab hosts: converge, idempotence, check mode, and
testinfra verification of what each role promises.

The NVIDIA driver packages are the real Debian ones (userspace only: no GPU, no kernel
module here). nvidia-container-toolkit and datacenter-gpu-manager are FIXTURE packages from
the lab mirror (gpupool/lab/mirror.py): these tests check repository setup, pinning, holding,
services and configuration, never GPU behaviour.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import testinfra
import yaml

from gpupool.lab import hosts as labmod
from gpupool.lab import mirror
from gpupool.paths import DATA
from gpupool.render import flows
from gpupool.spec.catalog import MANAGEMENT_PLANE_PORTS, SLURMDBD_PORT, SRUN_PORTS, SSH_PORT
from gpupool.spec.facts import gpu_nodes
from gpupool.spec.model import Description, NodeRole, Role
from tests.conftest import lab_description_path
from tests.integration.conftest import (
    HOST_GLOBAL_SYSCTLS,
    SiteRuns,
    ansible_playbook,
    host_sysctls,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hosts(site: SiteRuns, lab_desc: Description) -> dict[str, Any]:
    key = labmod.key_path(lab_desc)
    # As Ansible connects: each host's recorded key verified.
    extra = " ".join(labmod.ssh_args(lab_desc)[2:])
    return {n: testinfra.get_host(f"ssh://root@{node.addresses['management']}",
                                  ssh_identity_file=str(key), ssh_extra_args=extra)
            for n, node in lab_desc.nodes.items()}


def test_ssh_reaches_a_host_only_with_its_recorded_key(site: SiteRuns, lab_desc: Description,
                                                       tmp_path: Path) -> None:
    """Issue 50: Ansible, the gate and the lab verify each host's key, recorded through
    podman when the host was made. The recorded keys let every host in; a host answering
    with another's key (a host put in its place) is refused."""
    for node in lab_desc.nodes:
        assert labmod.ssh(lab_desc, node, "true").returncode == 0, node
    first, second = list(lab_desc.nodes)[:2]
    lines = labmod.known_hosts_path(lab_desc).read_text().splitlines()
    keys = {ln.split(",", 1)[0]: ln.split(" ", 1)[1] for ln in lines}
    swapped = tmp_path / "known_hosts"
    names = ",".join([first, *lab_desc.nodes[first].addresses.values()])
    swapped.write_text(f"{names} {keys[second]}\n")
    args = [a if not a.startswith("UserKnownHostsFile=") else f"UserKnownHostsFile={swapped}"
            for a in labmod.ssh_args(lab_desc)]
    proc = subprocess.run(["ssh", *args, f"root@{lab_desc.nodes[first].addresses['management']}",
                           "true"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "Host key verification failed" in proc.stderr, proc.stderr


def test_converge_succeeds_on_every_host(site: SiteRuns, lab_desc: Description) -> None:
    assert set(site.converge.recap) == set(lab_desc.nodes)
    assert site.converge.total("failed") == 0 and site.converge.total("unreachable") == 0
    assert site.converge.total("changed") > 0


def test_second_run_changes_nothing(site: SiteRuns) -> None:
    assert site.idempotence.rc == 0, site.idempotence.output[-4000:]
    changed = {h: r["changed"] for h, r in site.idempotence.recap.items() if r["changed"]}
    assert not changed, site.idempotence.output[-6000:]


def test_check_mode_is_clean(site: SiteRuns) -> None:
    assert site.check.rc == 0, site.check.output[-4000:]
    assert site.check.total("failed") == 0 and site.check.total("changed") == 0


def test_systemd_healthy_everywhere(hosts: dict[str, Any]) -> None:
    for name, h in hosts.items():
        state = h.run("systemctl is-system-running").stdout.strip()
        assert state == "running", (name, h.run("systemctl --failed --no-legend").stdout)


# -- common ---------------------------------------------------------------------------

def test_common_users_groups_and_sudo(hosts: dict[str, Any], lab_desc: Description) -> None:
    h = hosts["lab-gpu1"]
    for team, t in lab_desc.teams.items():
        for role, users in t.members.items():
            for user in users:
                groups = h.user(user).groups
                assert f"team-{team}" in groups and f"gpupool-{role.value}" in groups
    assert h.package("chrony").is_installed and h.service("chrony").is_enabled
    assert h.run("visudo -c").rc == 0


def test_team_admins_administer_their_teams_nodes_only(hosts: dict[str, Any],
                                                      lab_desc: Description) -> None:
    """A team's admin runs anything with sudo on the nodes their team owns and nowhere
    else: not on another team's node, not on a controller (the lab declares no pool
    operators, who would have it everywhere). `sudo -l -U USER CMD` answers for a command
    without running it."""
    assert not lab_desc.pool.operators
    for team, t in lab_desc.teams.items():
        for admin in t.members.get(Role.ADMIN, []):
            for name, h in hosts.items():
                owned = lab_desc.nodes[name].owner_team == team
                assert (h.run(f"sudo -n -l -U {admin} /bin/sh").rc == 0) == owned, (admin, name)
    assert any(t.members.get(Role.ADMIN) for t in lab_desc.teams.values())


def test_oncall_sudo_is_exact_commands_only(hosts: dict[str, Any], lab_desc: Description
                                            ) -> None:
    """On-call engineers restart the pool's services and reset GPUs with sudo, and nothing
    else: the escapes a wildcard would open are refused (`sudo -l -U USER CMD` answers for a
    command without running it), every rule runs NOEXEC, and they read the journal
    without sudo."""
    h = hosts["lab-gpu1"]
    oncall = next(u for t in lab_desc.teams.values() for role, users in t.members.items()
                  if role.value == "oncall" for u in users)

    def allowed(cmd: str) -> bool:
        return h.run(f"sudo -n -l -U {oncall} {cmd}").rc == 0

    for cmd in ("/usr/bin/systemctl restart slurmd", "/usr/bin/nvidia-smi -r"):
        assert allowed(cmd), cmd
    for escape in ("/usr/bin/systemctl restart ssh", "/usr/bin/systemctl restart slurmd ssh",
                   "/usr/bin/systemctl status slurmd", "/usr/bin/systemctl edit slurmd",
                   "/usr/bin/journalctl", "/usr/bin/nvidia-smi -f /etc/shadow",
                   "/usr/bin/nvidia-smi -r -f /etc/shadow", "/usr/bin/dcgmi diag -r 3",
                   "/bin/sh", "/usr/bin/less /etc/shadow"):
        assert not allowed(escape), escape
    assert "NOEXEC" in h.run(f"sudo -n -l -U {oncall}").stdout
    assert "systemd-journal" in h.user(oncall).groups


# -- hardening ------------------------------------------------------------------------

def test_sshd_keys_only_modern_ciphers(hosts: dict[str, Any]) -> None:
    cfg = hosts["lab-ctl"].run("sshd -T").stdout
    assert "passwordauthentication no" in cfg
    assert "permitrootlogin without-password" in cfg  # lab only; "no" elsewhere
    ciphers = next(line for line in cfg.splitlines() if line.startswith("ciphers "))
    assert "cbc" not in ciphers and "chacha20-poly1305@openssh.com" in ciphers


def test_sshd_allow_groups_follow_host_roles(hosts: dict[str, Any],
                                            lab_desc: Description) -> None:
    """sshd lets in the operators everywhere and the teams on login and compute nodes only
    (the lab's backup controller, lab-ctl2, is neither: operators only)."""
    teams = {f"team-{t}" for t in lab_desc.teams}
    for name, h in hosts.items():
        # sshd -T prints one allowgroups line per group.
        allowed = {ln.split()[1] for ln in h.run("sshd -T").stdout.splitlines()
                   if ln.startswith("allowgroups ")}
        users = {NodeRole.LOGIN, NodeRole.COMPUTE} & set(lab_desc.nodes[name].roles)
        assert allowed == {"root", "gpupool-admin", "gpupool-oncall",
                           *(teams if users else ())}, name
    assert any(set(n.roles) == {NodeRole.CONTROLLER} for n in lab_desc.nodes.values()), (
        "the lab has a controller-only host")


def test_members_and_teams_have_their_fixed_ids_on_every_host(hosts: dict[str, Any],
                                                              lab_desc: Description) -> None:
    """The description's ids: a member's uid, and their own group's gid, and a team
    group's gid are the same on every host (a job runs under one uid everywhere, and NFS
    compares numbers)."""
    assert lab_desc.ids.users and lab_desc.ids.teams
    for name, h in hosts.items():
        for user, uid in lab_desc.ids.users.items():
            u = h.user(user)
            assert (u.uid, u.gid, u.group) == (uid, uid, user), (name, user)
        for team, gid in lab_desc.ids.teams.items():
            assert h.group(f"team-{team}").gid == gid, (name, team)


def test_members_have_a_shell_only_where_they_log_in(hosts: dict[str, Any],
                                                     lab_desc: Description) -> None:
    """Every member has an account on every host (the same user id for Slurm everywhere),
    but a login shell and a home only where sshd lets them in: on the controller-only
    lab-ctl2 a researcher is an identity, and not even su gives them a shell there."""
    for name, h in hosts.items():
        users = {NodeRole.LOGIN, NodeRole.COMPUTE} & set(lab_desc.nodes[name].roles)
        for t in lab_desc.teams.values():
            for role, members in t.members.items():
                logs_in = bool(users) or role.value in ("admin", "oncall")
                for user in members:
                    u = h.user(user)
                    assert u.exists, (name, user)
                    assert u.shell == ("/bin/bash" if logs_in else "/usr/sbin/nologin"), (
                        name, user, u.shell)
                    if not logs_in:
                        assert not h.file(u.home).exists, (name, user)
                        assert h.run(f"su -c true {user}").rc != 0, (name, user)


def test_users_reach_a_compute_node_only_through_a_job(hosts: dict[str, Any],
                                                      lab_desc: Description) -> None:
    """From the login host, over SSH with a key of their own: a researcher without a job on
    a GPU node is refused there (pam_slurm_adopt) and let in while a job of theirs runs
    there; a researcher of another team is still refused; an on-call engineer logs in
    without a job (pam_access); a user in none of sshd's AllowGroups is refused before
    PAM is asked. The lab's slurmd tracks processes with proctrack/linuxproc (no cgroup
    writes in its containers), so the adoption into the job's extern step is not shown
    here: production's proctrack/cgroup does it."""
    ctl, node = hosts["lab-ctl"], hosts["lab-gpu1"]
    addr = lab_desc.nodes["lab-gpu1"].addresses["management"]
    owner = lab_desc.nodes["lab-gpu1"].owner_team
    members = {role.value: users for role, users in lab_desc.teams[owner].members.items()}
    researcher, oncall = members["researcher"][0], members["oncall"][0]
    other = next(t for t in lab_desc.teams if t != owner)
    outsider = next(users[0] for role, users in lab_desc.teams[other].members.items()
                    if role.value == "researcher")
    stranger = "gpupool-probe"  # a local account in no allowed group
    probe = "/tmp/gpupool-adopt-probe"  # on the lab host

    keys: dict[str, str] = {}

    def key_for(user: str) -> str:
        if user not in keys:
            ctl.run_expect([0], f"rm -rf {probe}-{user} && install -d -o {user} -m 700 "
                                f"{probe}-{user}")
            ctl.run_expect([0], f"runuser -u {user} -- ssh-keygen -q -t ed25519 -N '' "
                                f"-f {probe}-{user}/key")
            keys[user] = ctl.file(f"{probe}-{user}/key.pub").content_string.strip()
        return keys[user]

    def authorize(user: str, login: str) -> None:
        node.run_expect([0], f"install -d -o {login} -g {login} -m 700 ~{login}/.ssh && "
                             f"echo {shlex.quote(key_for(user))} >> ~{login}/.ssh/authorized_keys "
                             f"&& chown {login}: ~{login}/.ssh/authorized_keys")

    def ssh(user: str, login: str | None = None) -> tuple[int, str, str]:
        # The inner ssh's 255 would read as testinfra's own connection failing: its exit
        # status comes back on the last line instead.
        out = ctl.run(f"runuser -u {user} -- ssh -i {probe}-{user}/key -o BatchMode=yes "
                      "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                      f"-o ConnectTimeout=10 -l {login or user} {addr} hostname; echo $?")
        *lines, rc = out.stdout.strip().splitlines() or ["", "-1"]
        return int(rc), "\n".join(lines), out.stderr

    node.run_expect([0], f"id {stranger} >/dev/null 2>&1 || useradd -m -U {stranger}")
    job = ""
    try:
        for user in (researcher, oncall, outsider):
            authorize(user, user)
        authorize(researcher, stranger)

        rc, _, err = ssh(researcher)
        assert rc != 0 and "pam_slurm_adopt" in err, err
        rc, _, err = ssh(oncall)
        assert rc == 0, err
        klass = next(iter(lab_desc.task_classes))
        job = ctl.run_expect([0], f"runuser -u {researcher} -- sbatch --parsable -p {klass} "
                                  f"-A {owner} -w lab-gpu1 --gpus=1 -o /dev/null --chdir=/tmp "
                                  "--wrap 'sleep 300'").stdout.strip()
        state = ""
        for _ in range(60):  # bounded: 60 x 2 s
            state = ctl.run(f"squeue -h -j {job} -o %T").stdout.strip()
            if state == "RUNNING":
                break
            time.sleep(2)
        assert state == "RUNNING", ctl.run(f"squeue -j {job} -o '%T %r'").stdout
        rc, out, err = ssh(researcher)
        assert rc == 0 and out.strip() == "lab-gpu1", err
        rc, _, err = ssh(outsider)
        assert rc != 0 and "pam_slurm_adopt" in err, err
        # The stranger holds a key the node accepts, but is no member of an allowed group.
        rc, _, err = ssh(researcher, stranger)
        assert rc != 0 and "pam_slurm_adopt" not in err, err
        log = node.run(f"journalctl -u ssh --no-pager -n 200 | grep -F 'User {stranger} '"
                       ).stdout
        assert "AllowGroups" in log, log
    finally:
        if job:
            ctl.run(f"scancel {job}")
        node.run(f"userdel -r {stranger}")
        for user in (researcher, oncall, outsider):
            ctl.run(f"rm -rf {probe}-{user}")
            node.run(f"rm -f ~{user}/.ssh/authorized_keys")


def test_firewall_follows_declared_flows(hosts: dict[str, Any], lab_desc: Description
                                         ) -> None:
    for name, node in lab_desc.nodes.items():
        rules = hosts[name].run("nft list table inet gpupool").stdout
        assert "policy drop" in rules
        for flow in lab_desc.network.flows:
            if flow.to in node.addresses and flow.ports:
                daddr = node.addresses[flow.to]
                line = next((r for r in rules.splitlines() if f"ip daddr {daddr}" in r
                             and f"@src_{flow.from_}" in r and str(flow.ports[0]) in r), None)
                assert line, (name, flow)
        # Sources are pool-wide sets, one per flow source segment, and on the hosts that
        # run srun the Slurm hosts' (srun's ports, SrunPortRange: gpupool/render/flows.py).
        runs_srun = bool({NodeRole.COMPUTE, NodeRole.LOGIN} & set(node.roles))
        sets = {ln.split()[1] for ln in rules.splitlines() if ln.strip().startswith("set src_")}
        assert sets == {f"src_{f.from_}" for f in lab_desc.network.flows
                        if f.to in node.addresses} | ({"src_slurm_hosts"} if runs_srun
                                                      else set()), name
        lo, hi = SRUN_PORTS
        srun = [r for r in rules.splitlines() if "@src_slurm_hosts" in r and f"{lo}-{hi}" in r
                and f"ip daddr {node.addresses['management']}" in r]
        assert len(srun) == (1 if runs_srun else 0), (name, srun)


# Run on a lab host: connect from a chosen local address, and say what happened.
CONNECT_FROM = """import socket, sys
for spec in sys.argv[1:]:
    src, dst, port = spec.split(",")
    s = socket.socket()
    s.settimeout(2)
    s.bind((src, 0))
    try:
        s.connect((dst, int(port)))
        state = "open"
    except TimeoutError:
        state = "filtered"
    except ConnectionRefusedError:
        state = "refused"
    finally:
        s.close()
    print(spec, state)
"""


def test_management_plane_closed_to_other_segments_addresses(hosts: dict[str, Any],
                                                               lab_desc: Description) -> None:
    """A flow's source is a host's address in the flow's source segment, never all its
    addresses, and east-west `all` leaves the management plane closed. Each probe stays
    on one segment's network, where lab-gpu1 speaks from its own address there:
    - from its training address, sshd, slurmd and the exporters on lab-gpu2's training
      address are filtered, while the fabric stays open (a port no service listens on
      answers `refused`: the firewall let it through);
    - from its storage address, sshd and slurmdbd on the controller's storage address are
      filtered (a storage address is no management source), NFS's port is not;
    - from its management address, the controller's sshd answers.
    Across segments the lab's bridges masquerade a packet to the gateway's management
    address, which the admin range admits: such a probe would show the lab, not the
    firewall, so there is none."""
    gpu1, gpu2 = lab_desc.nodes["lab-gpu1"].addresses, lab_desc.nodes["lab-gpu2"].addresses
    ctl = lab_desc.nodes["lab-ctl"].addresses
    canary = flows.canary_port(lab_desc)
    # NFS's port, as the description's storage-to-storage flow names it.
    nfs = next(f.ports[0] for f in lab_desc.network.flows if f.from_ == f.to == "storage")
    want: dict[tuple[str, str, int], set[str]] = {
        **{(gpu1["training"], gpu2["training"], port): {"filtered"}
           for port in MANAGEMENT_PLANE_PORTS},
        (gpu1["training"], gpu2["training"], canary): {"refused"},
        (gpu1["storage"], ctl["storage"], SSH_PORT): {"filtered"},
        (gpu1["storage"], ctl["storage"], SLURMDBD_PORT): {"filtered"},
        (gpu1["storage"], ctl["storage"], nfs): {"open", "refused"},
        (gpu1["management"], ctl["management"], SSH_PORT): {"open"},
    }
    specs = {",".join(map(str, k)): states for k, states in want.items()}
    out = hosts["lab-gpu1"].run_expect(
        [0], f"python3 -c {shlex.quote(CONNECT_FROM)} {' '.join(specs)}").stdout
    got = dict(line.split() for line in out.splitlines() if line.strip())
    wrong = {spec: got.get(spec) for spec, states in specs.items() if got.get(spec) not in states}
    assert not wrong, wrong


def test_sysctls_rendered_and_only_namespaced_applied(hosts: dict[str, Any],
                                                      site: SiteRuns) -> None:
    h = hosts["lab-gpu2"]
    rendered = h.file("/etc/sysctl.d/60-gpupool.conf").content_string
    assert "kernel.kptr_restrict = 2" in rendered and "net.ipv4.tcp_syncookies = 1" in rendered
    assert h.run("sysctl -n net.ipv4.conf.all.accept_redirects").stdout.strip() == "0"
    # The host kernel's global settings are untouched by a converge inside containers.
    assert host_sysctls() == site.host_kernel_before, HOST_GLOBAL_SYSCTLS


def test_auditd_and_unattended_upgrades(hosts: dict[str, Any]) -> None:
    h = hosts["lab-gpu1"]
    assert h.service("auditd").is_enabled and not h.service("auditd").is_running
    rules = h.file("/etc/audit/rules.d/50-gpupool.rules").content_string
    assert "-k privilege" in rules
    for watch in ("/etc/munge/ -p wa -k slurm-auth", "/etc/slurm/ -p wa -k slurm-config",
                  "/usr/local/lib/gpupool/ -p wa -k gpupool-programs"):
        assert f"-w {watch}" in rules
    policy = h.file("/etc/apt/apt.conf.d/52gpupool-unattended-upgrades").content_string
    assert "Debian-Security" in policy and '"nvidia-";' in policy


# -- NVIDIA software ------------------------------------------------------------------

def test_driver_pinned_held_and_userspace_only(hosts: dict[str, Any],
                                               lab_desc: Description) -> None:
    for name in gpu_nodes(lab_desc):
        h = hosts[name]
        version = h.run("dpkg-query -W -f='${Version}' nvidia-smi").stdout
        assert version.startswith(lab_desc.software.nvidia_driver + "-")
        held = h.run("apt-mark showhold").stdout.split()
        assert {"nvidia-smi", "libnvidia-ml1", "nvidia-persistenced"} <= set(held)
        pref = h.file("/etc/apt/preferences.d/gpupool-nvidia-driver.pref").content_string
        assert f"Pin: version {lab_desc.software.nvidia_driver}-*" in pref
        assert "Pin-Priority: 1001" in pref
        assert "blacklist nouveau" in h.file(
            "/etc/modprobe.d/gpupool-blacklist-nouveau.conf").content_string
        assert not h.package("nvidia-kernel-dkms").is_installed  # no real GPU here
        svc = h.service("nvidia-persistenced")
        assert svc.is_enabled and not svc.is_running
    assert not hosts["lab-ctl"].package("nvidia-smi").is_installed


def test_fixture_toolkit_and_dcgm_pinned_and_held(hosts: dict[str, Any],
                                                  lab_desc: Description) -> None:
    h = hosts["lab-gpu3"]
    sw = lab_desc.software
    assert h.package("nvidia-container-toolkit").version == f"{sw.container_toolkit}-1"
    assert h.package("datacenter-gpu-manager").version == f"1:{sw.dcgm}"
    assert mirror.FIXTURE_MARK in h.run(
        "dpkg-query -W -f='${Description}' datacenter-gpu-manager").stdout
    assert h.package("datacenter-gpu-manager-exporter").version == f"{sw.dcgm_exporter}-1"
    assert {"nvidia-container-toolkit", "datacenter-gpu-manager",
            "datacenter-gpu-manager-exporter"} <= set(h.run("apt-mark showhold").stdout.split())
    assert 'mode = "auto"' in h.file(
        "/etc/nvidia-container-runtime/config.toml").content_string


def test_dcgm_hostengine_counters_and_health_result(hosts: dict[str, Any]) -> None:
    h = hosts["lab-gpu1"]
    assert h.service("nvidia-dcgm").is_running
    counters = h.file("/etc/dcgm-exporter/counters.csv").content_string
    assert "DCGM_FI_DEV_GPU_UTIL, gauge" in counters
    # The role's exporter unit runs (the fixture's), the package's own unit is masked.
    assert h.service("dcgm-exporter").is_running
    assert h.run("systemctl is-enabled nvidia-dcgm-exporter.service").stdout.strip() == "masked"
    assert h.service("gpupool-dcgm-health.timer").is_enabled
    assert h.run("systemctl start gpupool-dcgm-health.service").rc == 0
    result = json.loads(h.file("/var/lib/gpupool/dcgm-health.json").content_string)
    # The fixture dcgmi cannot check anything: the result must say error, never pass.
    assert result["status"] == "error" and "fixture" in result["detail"]
    metric = h.file("/var/lib/prometheus/node-exporter/gpupool_dcgm_health.prom").content_string
    assert "gpupool_dcgm_health_pass 0" in metric


# -- storage and metrics --------------------------------------------------------------

def test_storage_mounts_rendered_and_teams_separated(hosts: dict[str, Any],
                                                     lab_desc: Description) -> None:
    h = hosts["lab-gpu1"]
    assert h.file("/scratch").mode == 0o1777
    tier = lab_desc.storage_tiers["datasets"].mount
    assert tier is not None
    unit = h.file("/etc/systemd/system/datasets.mount").content_string
    assert f"What={tier.source}" in unit and f"Options={','.join(tier.options)}" in unit
    assert h.service("datasets.mount").is_enabled
    assert h.run("systemd-analyze verify /etc/systemd/system/datasets.mount").rc == 0
    for team in lab_desc.teams:
        d = h.file(f"/checkpoints/{team}")
        assert d.group == f"team-{team}" and d.mode == 0o2770
    # vision's researcher writes into vision's checkpoints; nlp's cannot.
    assert h.run("runuser -u alice -- touch /checkpoints/vision/probe").rc == 0
    assert h.run("runuser -u erin -- touch /checkpoints/vision/probe2").rc != 0


def test_the_lustre_client_comes_from_its_repository_pinned_and_held(
        hosts: dict[str, Any], lab_desc: Description, tmp_path: Path) -> None:
    """The storage role's Lustre client steps (roles/storage/tasks/lustre.yml) through
    Ansible on a lab host. Debian packages no Lustre client, so the role adds the
    description's repository with its own signing key, installs the client at its version
    and holds it; a second run and a check-mode run change nothing. The repository is one
    this test builds and signs in the lab's mirror folder, holding FIXTURE packages named as
    the client's (gpupool/lab/mirror.py: no Lustre, nothing mounts); all of it is removed
    after."""
    node, version = "lab-gpu1", "2.15.6"
    folder = "lustre-fixture"
    repo = labmod.mirror_dir(lab_desc) / folder
    gnupg = Path(tempfile.mkdtemp(prefix="gpl"))  # short: gpg-agent's socket lives there
    packages = list(mirror.LUSTRE_PACKAGES)
    h = hosts[node]
    try:
        key = mirror.build(lab_desc, repo, mirror.lustre_fixture_debs(tmp_path, version), gnupg)
        (repo / "archive-key.asc").write_text(key)
        client = {"repository": f"file:{labmod.MIRROR_MOUNT}/{folder}", "suite": "./",
                  "components": [], "version": version, "packages": packages,
                  "key_url": f"file://{labmod.MIRROR_MOUNT}/{folder}/archive-key.asc"}
        book = tmp_path / "lustre.yml"
        book.write_text(yaml.safe_dump([{"name": "Lustre client", "hosts": node,
                                         "gather_facts": False, "tasks": [{
                                             "ansible.builtin.include_role": {
                                                 "name": "storage", "tasks_from": "lustre.yml",
                                                 "vars_from": "Debian.yml"}}]}]))
        extra = json.dumps({"storage_lustre_client": client})
        inv = labmod.inventory_path(lab_desc)
        first = ansible_playbook(inv, str(book), "-e", extra)
        assert first.rc == 0 and first.recap[node]["changed"] > 0, first.output[-3000:]
        for args in ((), ("--check",)):
            again = ansible_playbook(inv, str(book), "-e", extra, *args)
            assert again.rc == 0 and again.recap[node]["changed"] == 0, again.output[-3000:]
        for name in packages:
            assert h.package(name).version == f"{version}-1"
            assert "FIXTURE" in h.check_output(f"dpkg-query -W -f='${{Description}}' {name}")
        assert set(packages) <= set(h.check_output("apt-mark showhold").split())
        sources = h.file("/etc/apt/sources.list.d/gpupool-lustre.sources").content_string
        assert f"URIs: file:{labmod.MIRROR_MOUNT}/{folder}" in sources
        assert h.file("/etc/apt/keyrings/gpupool-lustre.asc").content_string == key
    finally:
        h.run(f"apt-mark unhold {' '.join(packages)}; dpkg --purge {' '.join(packages)}; "
              "rm -f /etc/apt/sources.list.d/gpupool-lustre.sources "
              "/etc/apt/keyrings/gpupool-lustre.asc /var/lib/apt/lists/*lustre-fixture*")
        subprocess.run(["gpgconf", "--kill", "all"], env={**os.environ, "GNUPGHOME": str(gnupg)},
                       check=False, capture_output=True, timeout=30)
        shutil.rmtree(gnupg, ignore_errors=True)
        shutil.rmtree(repo, ignore_errors=True)
    assert not h.package(packages[0]).is_installed


def test_scratch_is_built_only_on_the_declared_devices(hosts: dict[str, Any],
                                                     lab_desc: Description,
                                                     tmp_path: Path) -> None:
    """The storage role's scratch steps through Ansible on a lab host, reading its real
    lsblk (gpupool/onhost/scratch_devices.py). The lab's hosts have no NVMe devices, so this
    is the refusing side: a declared model no disk has, and a stable path that is no disk,
    stop the play with the finder's reason before anything is built. Building on blank
    devices is covered by tests/test_scratch_devices.py over recorded lsblk trees."""
    node = "lab-gpu1"
    book = tmp_path / "scratch.yml"
    book.write_text(yaml.safe_dump([{"name": "Scratch", "hosts": node, "gather_facts": False,
                                     "tasks": [{"ansible.builtin.include_role": {
                                         "name": "storage", "tasks_from": "scratch.yml",
                                         "vars_from": "Debian.yml"}}]}]))
    cases = [({"storage_scratch_model": "SAMSUNG MZQL23T8HCLS-00A07"},
              "found 0 disk(s) of model 'SAMSUNG MZQL23T8HCLS-00A07'"),
             ({"storage_scratch_paths": ["/dev/disk/by-path/pci-0000:c1:00.0-nvme-1",
                                         "/dev/disk/by-path/pci-0000:c2:00.0-nvme-1"]},
              "/dev/disk/by-path/pci-0000:c1:00.0-nvme-1 is not a disk here")]
    for named, reason in cases:
        extra = {"storage_scratch_count": 2, "storage_scratch_model": None,
                 "storage_scratch_paths": [], **named}
        run = ansible_playbook(labmod.inventory_path(lab_desc), str(book),
                               "-e", json.dumps(extra))
        assert run.rc != 0 and f"scratch devices: {reason}" in run.output, run.output[-3000:]
        assert run.recap[node]["changed"] == 0
    assert not hosts[node].file("/dev/md/scratch").exists


def test_node_exporter_serves_on_management_address(hosts: dict[str, Any],
                                                    lab_desc: Description) -> None:
    addr = lab_desc.nodes["lab-gpu2"].addresses["management"]
    out = hosts["lab-ctl"].run(f"curl -sf http://{addr}:9100/metrics")
    assert out.rc == 0 and "node_cpu_seconds_total" in out.stdout


# -- gpu_operator (no Kubernetes cluster here: rendered values checked against the chart) --

SCHEMAS = DATA / "schemas" / "gpu-operator-v26.7.0"


def _unknown_keys(rendered: dict[str, Any], chart: dict[str, Any], crd: dict[str, Any],
                  path: str = "") -> list[str]:
    """Keys of rendered that neither the chart's values.yaml nor the CRD section knows."""
    bad = []
    for key, value in rendered.items():
        props = crd.get("properties", {})
        if key not in chart and key not in props:
            bad.append(path + key)
        elif isinstance(value, dict) and not (key in props and
                                              props[key].get("additionalProperties")):
            sub_chart = chart.get(key) if isinstance(chart.get(key), dict) else {}
            bad += _unknown_keys(value, sub_chart, props.get(key, {}), f"{path}{key}.")
    return bad


def test_gpu_operator_values_match_chart_and_clusterpolicy(
        hosts: dict[str, Any], lab_desc: Description) -> None:
    ctl = hosts["lab-ctl"]
    values = yaml.safe_load(ctl.file("/etc/gpupool/gpu-operator/values.yaml").content_string)
    chart = yaml.safe_load((SCHEMAS / "values.yaml").read_text())
    crd_doc = yaml.safe_load((SCHEMAS / "nvidia.com_clusterpolicies.yaml").read_text())
    schema = crd_doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert _unknown_keys(values, chart, schema) == []
    # The chart renders ClusterPolicy.spec from these sections over its defaults.
    spec = {k: ({**chart[k], **values.get(k, {})} if isinstance(chart[k], dict) else chart[k])
            for k in schema["properties"] if k in chart}
    for k, v in values.items():
        if isinstance(v, dict) and k in spec:
            spec[k] = {**spec[k], **{kk: ({**spec[k].get(kk, {}), **vv} if isinstance(vv, dict)
                                         else vv) for kk, vv in v.items()}}
    jsonschema.validate(spec, schema)
    # Host roles own driver, toolkit and DCGM; the exporter runs with gpupool's counters.
    assert values["driver"]["enabled"] is False and values["toolkit"]["enabled"] is False
    assert values["dcgmExporter"]["enabled"] is True
    manifests = yaml.safe_load(ctl.file("/etc/gpupool/gpu-operator/manifests.yaml")
                               .content_string)
    csv = next(m for m in manifests if m["metadata"]["name"] == values["dcgmExporter"]
               ["config"]["name"])["data"]["dcgm-metrics.csv"]
    assert "DCGM_FI_DEV_GPU_UTIL" in csv
    labelled = {m["metadata"]["name"]: m["metadata"]["labels"] for m in manifests
                if m["kind"] == "Node"}
    assert set(labelled) == set(gpu_nodes(lab_desc))
    for name, labels in labelled.items():
        gpu = lab_desc.node_classes[lab_desc.nodes[name].class_].gpu
        assert gpu is not None and labels["gpupool.io/gpu-model"] == gpu.model


def test_cli_status_reports_the_running_lab(site: SiteRuns, lab_desc: Description,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from gpupool.cli import main  # noqa: PLC0415

    assert main(["lab", "status", "--file", str(lab_description_path()), "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["ready"] and set(state["hosts"]) == set(lab_desc.nodes)
    # Each host's own CPU time (its cgroup), which the onboarding benchmark splits out.
    assert all((labmod.host_cpu_s(lab_desc, n) or 0) > 1 for n in lab_desc.nodes)
    assert state["networks"] == {labmod.network_name(lab_desc, s): seg.cidr
                                 for s, seg in lab_desc.network.segments.items()}


def test_every_system_account_of_a_converged_host_is_one_validation_refuses(
        site: SiteRuns, lab_desc: Description) -> None:
    """Issue 50: a member may not be named as a system group or a package's service account
    (sudo, adm, mysql, munge, slurm, prometheus...). Validation reads them from
    gpupool/data/system-accounts, made from these hosts' real passwd and group files: a
    role that brings a new one fails here until the list is made again."""
    from gpupool.lab import system_accounts  # noqa: PLC0415
    from gpupool.spec.catalog import SYSTEM_ACCOUNTS  # noqa: PLC0415

    for node in lab_desc.nodes:
        missing = system_accounts.on_host(lab_desc, node) - SYSTEM_ACCOUNTS
        assert not missing, (
            f"{node} has system accounts validation does not know: {sorted(missing)}; run "
            "`python -m gpupool.lab.system_accounts` on a converged lab (SOURCE.md)")
