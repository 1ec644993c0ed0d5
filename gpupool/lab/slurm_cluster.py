"""The lab's real Slurm: bring-up with the project's own roles, and the operator's commands
on its controller. The drills, the policy replay and the integration tests share it.

Everything runs on the lab hosts (podman exec) or against them over SSH (Ansible); jobs
are submitted as root on behalf of the teams (root is added to every team account).
"""

from __future__ import annotations

import base64
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpupool.lab import hosts
from gpupool.paths import ANSIBLE_CONFIG, PROJECT_ROOT, SHARE
from gpupool.render import slurm
from gpupool.spec.facts import controller
from gpupool.spec.model import Description

PLAYBOOK_TIMEOUT_S = 1200
JOB_SCRIPT = "/var/lib/gpupool/jobs/job.sh"  # on the controller; sbatch copies it
# GET URL [CA_FILE USER PASSWORD_FILE] on a lab host: the body, or an exception (exit 1).
HTTP_GET = """import base64, ssl, sys, urllib.request
url, ca, user, password_file = sys.argv[1:5]
request = urllib.request.Request(url)
if user:
    with open(password_file) as f:
        secret = (user + ":" + f.read().strip()).encode()
    request.add_header("Authorization", "Basic " + base64.b64encode(secret).decode())
context = ssl.create_default_context(cafile=ca) if ca else None
print(urllib.request.urlopen(request, timeout=20, context=context).read().decode())
"""


def monitoring_web() -> dict[str, Any]:
    """Role monitoring's public defaults: the certificate its clients trust, the user and
    the password file they log in with (read where the roles are, not typed again)."""
    path = SHARE / "roles" / "monitoring" / "defaults" / "main.yml"
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def slurm_role_vars() -> dict[str, Any]:
    """The slurm role's paths on the lab's Debian hosts (its lib directory, its python),
    read where the role has them."""
    path = SHARE / "roles" / "slurm" / "vars" / "Debian.yml"
    return yaml.safe_load(path.read_text(encoding="utf-8"))


class SlurmLabError(RuntimeError):
    """The lab's Slurm did not reach the state asked for; the message says which."""


wait_for = hosts.wait_for  # one bounded poll for every lab user


def playbook(desc: Description, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run one of the project's playbooks against the lab (its inventory carries every
    variable the roles need, the Slurm policy included)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_CONFIG),
           "ANSIBLE_ROLES_PATH": str(PROJECT_ROOT / "roles")}
    return subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "ansible-playbook"), "-i",
         str(hosts.inventory_path(desc)), str(PROJECT_ROOT / "playbooks" / name), *extra],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
        timeout=PLAYBOOK_TIMEOUT_S, check=False)


class SlurmLab:
    """Commands on the lab's controller, as an operator would type them."""

    def __init__(self, desc: Description) -> None:
        self.desc = desc
        self.ctl = controller(desc)

    def sh(self, cmd: str, node: str | None = None, check: bool = True,
           timeout: float = 60) -> str:
        host = node or self.ctl
        proc = hosts.exec_(self.desc, host, ["bash", "-c", cmd], timeout=timeout)
        if check and proc.returncode != 0:
            raise SlurmLabError(f"{host}: {cmd}: exit {proc.returncode}: "
                                f"{proc.stderr}{proc.stdout}")
        return proc.stdout

    def http_get(self, port: int, path: str, *, monitoring: bool = False) -> str:
        """GET path from a service on the controller's management address (where the
        roles bind them, not loopback), asked from the controller itself; with monitoring,
        over TLS and basic auth, logged in as role monitoring's clients are to Prometheus
        and Alertmanager (its certificate and password file, from its public defaults)."""
        url = (f"{'https' if monitoring else 'http'}://"
               f"{self.desc.nodes[self.ctl].addresses['management']}:{port}{path}")
        auth = [monitoring_web()[k] for k in ("monitoring_tls_cert", "monitoring_web_user",
                                           "monitoring_web_password_file")] \
            if monitoring else ["", "", ""]
        return self.sh(f"python3 -c {shlex.quote(HTTP_GET)} "
                       + " ".join(shlex.quote(a) for a in (url, *auth)))

    def write(self, path: str, text: str, node: str | None = None, *,
              newline: bool = True) -> None:
        """Write text (and a newline, unless told not to) to path: the bytes as given, in
        base64 so that nothing in them is read by the shell or ends the here-document; an
        existing file keeps its owner and mode."""
        data = base64.b64encode((text + "\n" * newline).encode()).decode()
        self.sh(f"mkdir -p {shlex.quote(str(Path(path).parent))} && "
                f"base64 -d > {shlex.quote(path)} <<'GPUPOOL_EOF'\n{data}\nGPUPOOL_EOF", node)

    def sbatch(self, *args: str, script: str, env: dict[str, str] | None = None) -> str:
        self.write(JOB_SCRIPT, script)
        exports = ",".join(["ALL", *(f"{k}={v}" for k, v in (env or {}).items())])
        out = self.sh(f"sbatch --parsable --export={shlex.quote(exports)} "
                      f"{' '.join(args)} {JOB_SCRIPT}")
        return out.strip().split(";")[0]

    def job(self, jid: str) -> dict[str, str]:
        out = self.sh(f"scontrol -o show job {jid}")
        return dict(p.split("=", 1) for p in out.split() if "=" in p)

    def state(self, jid: str) -> str:
        return self.job(jid)["JobState"]

    def sacct(self, jid: str, fields: str = "State,Start,End,NodeList,Submit") -> list[dict]:
        names = fields.split(",")
        out = self.sh(f"sacct -n -P -X -D -j {jid} -o {fields}")
        return [dict(zip(names, line.split("|"), strict=True)) for line in out.splitlines()]

    def node_states(self) -> dict[str, str]:
        out = self.sh("sinfo -N -h -o '%N %T'")
        return dict(line.split() for line in out.splitlines())

    def reset_usage(self, accounts: list[str]) -> None:
        """Forget the accounts' fairshare history (what earlier jobs, drills or replays left),
        and wait until sshare shows every row of them at zero.

        Only rows with usage are reset. slurmdbd hands a reset to slurmctld some time after
        sacctmgr returns; a reset of a row already at zero cannot be seen arriving, and one
        that arrives after the next job ends wipes that job's usage (which explains the
        rebuild test once waiting 180 s in vain for a finished job's usage). A row seen going
        from its usage to zero is a reset that has arrived."""

        def used() -> list[tuple[str, str]]:
            """(account, user) rows of these accounts with usage; user empty: the account."""
            rows = (line.split("|") for line in
                    self.sh("sshare -n -P -a -o Account,User,RawUsage").splitlines())
            return [(account.strip(), user.strip()) for account, user, usage in rows
                    if account.strip() in accounts and float(usage or 0) != 0]

        # Accounts first (a reset may take their users' usage with it), then whatever user
        # row still has usage: a team member's job (the SSH proof in
        # tests/integration/test_roles.py runs one) may leave usage an account's reset does
        # not clear. One kind at a time, so every reset sent is one seen arriving.
        for kind in ("account", "user"):
            pending = [(a, u) for a, u in used() if bool(u) == (kind == "user")]
            for account, user in pending:
                who = f"user name={user} account={account}" if user else f"account name={account}"
                self.sh(f"sacctmgr -i modify {who} set RawUsage=0")
            wait_for(f"the {kind} usage reset", lambda p=pending: not set(p) & set(used()), 30)

    def cancel_all(self) -> None:
        # A job that requeues itself on SIGTERM (the job convention) comes back pending
        # from the first scancel; the next one cancels it for good.
        def gone() -> bool:
            self.sh("scancel --user=root; true")
            return not self.sh("squeue -h -o %i").strip()

        wait_for("all jobs gone", gone, 60)


def onprem_nodes(desc: Description) -> list[str]:
    return [n.name for n in slurm.nodes(desc) if not n.cloud]


# (pool, playbook) -> the lab containers it was converged on in this process: a second
# bring-up on the same hosts skips the converge (tests share one lab across modules).
_CONVERGED: dict[tuple[str, str], tuple[str, ...]] = {}


def _container_ids(desc: Description) -> tuple[str, ...]:
    proc = hosts.podman("inspect", "-f", "{{.Id}}",
                      *(hosts.container_name(desc, n) for n in desc.nodes), check=False)
    return tuple(proc.stdout.split())


def mark_converged(desc: Description, book: str) -> None:
    """Record that `book` was just converged on the lab's current hosts."""
    _CONVERGED[(desc.pool.name, book)] = _container_ids(desc)


def ready(desc: Description) -> SlurmLab:
    """The converged lab's Slurm, ready for jobs: root in every team account, on-prem
    nodes idle."""
    s = SlurmLab(desc)
    # "Nothing new added" (exit 1) when root is already there: check the outcome instead.
    s.sh(f"sacctmgr -i add user root account={','.join(desc.teams)}", check=False)
    have = set(s.sh("sacctmgr -n -P show assoc user=root format=account").split())
    if missing := set(desc.teams) - have:
        raise SlurmLabError(f"root is not in the team accounts {sorted(missing)}")

    def idle() -> bool:
        try:
            states = s.node_states()
        except SlurmLabError as err:
            # A controller starting or taking control back answers nothing for a while.
            if "Unable to contact slurm controller" in str(err):
                return False
            raise
        return all(states.get(n) == "idle" for n in onprem_nodes(desc))

    wait_for("on-prem nodes idle", idle, 90)
    return s


def bring_up(desc: Description, *, site: bool = False,
             report: Callable[[str], None] = lambda _m: None) -> tuple[SlurmLab, dict[str, Any]]:
    """Lab hosts up, the Slurm role (or, with site, every role) converged, root
    in every team account, on-prem nodes idle. Idempotent. Returns the timings."""
    figures: dict[str, Any] = {}
    start = time.monotonic()
    hosts.up(desc, report)
    figures["lab_up_s"] = round(time.monotonic() - start, 1)
    ids = _container_ids(desc)
    book = "site.yml" if site else "slurm.yml"  # site.yml ends with slurm.yml
    done = {b for (pool, b), on in _CONVERGED.items() if pool == desc.pool.name and on == ids}
    if book in done or "site.yml" in done:
        report(f"{book} already converged on these hosts")
    else:
        t = time.monotonic()
        proc = playbook(desc, book)
        if proc.returncode != 0:
            raise SlurmLabError(f"{book} failed:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}")
        _CONVERGED[(desc.pool.name, book)] = ids
        figures["converge_s"] = round(time.monotonic() - t, 1)
        report(f"{book} converged in {figures['converge_s']}s")
    s = ready(desc)
    figures["bring_up_s"] = round(time.monotonic() - start, 1)
    return s, figures
