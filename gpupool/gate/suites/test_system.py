"""System checks: OS, kernel, time sync, SSH hardening, firewall, audit, users and sudo.

Settings the hardening and common roles render are read back from the live system
(`sshd -T`, `nft`, `getent`), not from the files the roles wrote.
"""

from __future__ import annotations

import json
import re

import pytest

from gpupool.gate.actions import Action
from gpupool.gate.expect import NodeExpect
from gpupool.gate.plugin import Measure
from gpupool.spec import os_release

# The releases the roles and this gate are proven on (gpupool/spec/os_release.py PROVEN), by
# os-release's ID and VERSION_ID's major: the lab converges and gates hosts of each. No
# role converges and no gate runs on any other release, so none is admitted
# (tests/gate/test_os_release.py; the roles' meta platforms: tests/test_role_platforms.py).
SUPPORTED_OS = {("debian", r.number): f"Debian {r.number} ({r.codename})"
                for r in os_release.PROVEN}
MIN_KERNEL = (5, 10)
WEAK_CRYPTO = re.compile(r"cbc|3des|arcfour|hmac-md5|hmac-sha1\b|diffie-hellman-group1")
TIME_SERVICES = ("chrony", "chronyd", "systemd-timesyncd")


@pytest.mark.action(Action.RECONFIGURE)
def test_reachable(host, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    out = host.run("true")
    measure(out.rc, 0, out.rc == 0, "the node does not run commands")


def os_verdict(distribution: str | None, release: str | None,
               codename: str | None = None, declared: str = "") -> tuple[bool, str]:
    """Whether os-release's ID, VERSION_ID (and VERSION_CODENAME, for the message) name a
    supported release and, where the node's class declares one (`os`, as "debian-13"),
    that release; and why not."""
    dist, release = (distribution or "").lower(), release or ""
    major = release.split(".")[0]
    named = " ".join(filter(None, (dist or "an unknown OS", release,
                                   f"({codename})" if codename else "")))
    if (dist, major) not in SUPPORTED_OS:
        return False, (f"{named} is not a supported release: the roles and the gate are "
                       f"proven on {', '.join(SUPPORTED_OS.values())} only; reinstall the "
                       "node with it")
    if declared and f"{dist}-{major}" != declared:
        # Its packages are locked per release (software.per_release): another release's
        # Slurm may not even talk to the controllers.
        return False, (f"{named} is not the release its class declares ({declared}); "
                       f"reinstall the node with {declared}, or declare the class's os")
    return True, ""


@pytest.mark.action(Action.ISOLATE)
def test_os_supported(host, expect: NodeExpect, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    # Re-running the roles cannot change the OS: the node stays out until it is reinstalled.
    info = host.system_info
    ok, message = os_verdict(info.distribution, info.release, info.codename, expect.os)
    measure({"id": info.distribution, "version_id": info.release, "codename": info.codename},
            list(SUPPORTED_OS.values()), ok, message)


@pytest.mark.tier("standard")
@pytest.mark.action(Action.REBOOT)
def test_kernel_recent(host, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    release = host.check_output("uname -r")
    version = tuple(int(p) for p in re.findall(r"\d+", release)[:2])
    measure(release, ">= {}.{}".format(*MIN_KERNEL), version >= MIN_KERNEL)


@pytest.mark.action(Action.RECONFIGURE)
def test_time_sync(host, expect: NodeExpect, in_container: bool,  # type: ignore[no-untyped-def]
                   measure: Measure) -> None:
    # `systemctl is-enabled` of a unit that does not exist exits 4 on Debian 13's systemd
    # (1 on 12's), which testinfra's Service.is_enabled takes for an error: asked directly.
    enabled = [s for s in TIME_SERVICES
               if host.run(f"systemctl is-enabled {s}").rc == 0]
    if in_container:
        # A container cannot set the clock; the host's clock is what it gets.
        measure(enabled, "a time sync service enabled", bool(enabled))
        return
    synced = host.run("timedatectl show -p NTPSynchronized --value").stdout.strip()
    measure({"enabled": enabled, "synchronized": synced}, {"synchronized": "yes"},
            bool(enabled) and synced == "yes")


def _sshd_config(host) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """sshd's effective settings, as it reads its files (`sshd -T`)."""
    return dict(line.split(" ", 1) for line in host.check_output("sshd -T").splitlines()
                if " " in line)


@pytest.mark.action(Action.RECONFIGURE)
def test_sshd_hardened(host, expect: NodeExpect, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    cfg = _sshd_config(host)
    want = {"passwordauthentication": "no", "kbdinteractiveauthentication": "no",
            "pubkeyauthentication": "yes",
            "permitrootlogin": "without-password" if expect.lab else "no"}
    got = {k: cfg.get(k) for k in want}
    weak = [a for key in ("ciphers", "macs", "kexalgorithms")
            for a in cfg.get(key, "").split(",") if WEAK_CRYPTO.search(a)]
    measure({**got, "weak_algorithms": weak}, {**want, "weak_algorithms": []},
            got == want and not weak)


# An account line of sshd's PAM stack that pam_slurm_adopt decides (`-account` too: PAM
# skips a missing module then, and the check below sees the module itself).
ADOPT_LINE = re.compile(r"^-?account\s+(required|requisite|\[[^]]*\])\s+pam_slurm_adopt\.so\b")


@pytest.mark.action(Action.RECONFIGURE)
def test_ssh_only_through_a_job(host, expect: NodeExpect, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    # Users reach a GPU node only through the scheduler: sshd lets in only the pool's groups
    # (AllowGroups, on every node) and, on a compute node, asks pam_slurm_adopt in its
    # account stage, so a researcher logs in only while a job of theirs runs there (the
    # hardening and slurm roles).
    cfg = _sshd_config(host)  # sshd -T prints one allowgroups line per group: the last
    got: dict[str, object] = {"allowgroups": bool(cfg.get("allowgroups", "").split())}
    want: dict[str, object] = {"allowgroups": True}
    if "compute" in expect.roles:
        pam = host.run("cat /etc/pam.d/sshd").stdout.splitlines()
        module = host.run("ls /lib/*/security/pam_slurm_adopt.so /lib/security/pam_slurm_adopt.so"
                          " 2>/dev/null").stdout.split()
        got |= {"usepam": cfg.get("usepam"),
                "pam_slurm_adopt": any(ADOPT_LINE.match(ln.strip()) for ln in pam) and bool(module)}
        want |= {"usepam": "yes", "pam_slurm_adopt": True}
    measure(got, want, got == want)


@pytest.mark.action(Action.RECONFIGURE)
def test_firewall_default_drop(host, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    out = host.run("nft -j list chain inet gpupool input")
    chains = [o["chain"] for o in json.loads(out.stdout or '{"nftables": []}')["nftables"]
              if "chain" in o] if out.rc == 0 else []
    policy = chains[0].get("policy") if chains else None
    measure(policy, "drop", policy == "drop", "inet gpupool input chain missing or not "
            "dropping by default")


@pytest.mark.tier("standard")
@pytest.mark.action(Action.RECONFIGURE)
def test_audit_rules(host, in_container: bool, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    if in_container:
        # Containers cannot own the kernel audit subsystem: check the rules are in place.
        rules = host.run("cat /etc/audit/rules.d/*.rules 2>/dev/null").stdout
        count = sum(1 for ln in rules.splitlines() if ln.startswith("-w ") or ln.startswith("-a "))
    else:
        count = len([ln for ln in host.run("auditctl -l").stdout.splitlines()
                     if ln.startswith("-")])
    measure(count, "> 0 audit rules", count > 0)


@pytest.mark.action(Action.RECONFIGURE)
def test_team_groups(host, expect: NodeExpect, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    missing = [t for t in expect.teams if not host.group(f"team-{t}").exists]
    measure(missing, [], not missing, f"team groups missing: {missing}")


@pytest.mark.action(Action.RECONFIGURE)
def test_fixed_ids(host, expect: NodeExpect, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    """Members and team groups carry the description's ids: a node whose uid for a member
    drifted runs that member's jobs as someone else on the shared tiers."""
    want = {**expect.ids.get("users", {}),
            **{f"team-{t}": gid for t, gid in expect.ids.get("teams", {}).items()}}
    found = {u: host.user(u).uid if host.user(u).exists else None
             for u in expect.ids.get("users", {})}
    found |= {f"team-{t}": host.group(f"team-{t}").gid if host.group(f"team-{t}").exists
              else None for t in expect.ids.get("teams", {})}
    wrong = {k: v for k, v in found.items() if v != want[k]}
    measure(wrong, {}, not wrong, f"ids other than the description's: {wrong}")


@pytest.mark.action(Action.RECONFIGURE)
def test_sudo_rules(host, measure: Measure) -> None:  # type: ignore[no-untyped-def]
    # sudoers must parse, and on-call engineers get their limited rules: exact commands,
    # run NOEXEC, no wildcard that would let them pick a unit, a file or a pager.
    check = host.run("visudo -c")
    rules = host.run("cat /etc/sudoers.d/gpupool").stdout
    oncall = [ln for ln in rules.splitlines() if ln.startswith("%gpupool-oncall ")]
    widened = [ln for ln in oncall if "NOEXEC:" not in ln or any(c in ln for c in "*?[\\")]
    ok = check.rc == 0 and bool(oncall) and not widened
    measure({"visudo": check.rc, "oncall_rules": bool(oncall), "widened": widened},
            {"visudo": 0, "oncall_rules": True, "widened": []}, ok)
