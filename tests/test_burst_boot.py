"""A burst instance boots into the pool by itself: the launch template's user-data takes the
node name from the instance tags (IMDSv2), the munge key from Secrets Manager, and starts
slurmd configless. The rendered script runs here in a sandbox: /etc moved under a
temporary folder, and stubs for curl (the metadata service), aws, systemctl, chown and
sleep, so its behaviour, not only its text, is checked, hostile values included."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
import yaml
from moto import mock_aws

from gpupool.lab import burst_hosts, localaws
from gpupool.onhost import burst
from gpupool.render.cloud import launch, names, storage
from gpupool.spec import catalog, loader
from gpupool.spec.model import BurstGroup, Description
from tests.conftest import ROOT

KEY = bytes(range(256)) * 4  # a munge key is binary: every byte value survives the trip
KEY_B64 = base64.b64encode(KEY).decode()

CURL = r"""#!/bin/bash
printf '%s\n' "$*" >> "$LOG/curl"
case "$*" in
  *"-X PUT"*) [ -z "${IMDS_DOWN:-}" ] || exit 7; echo token ;;
  *tags/instance/gpupool:slurm-node*) [ -n "${NODE_TAG+x}" ] || exit 22
    printf '%s' "$NODE_TAG" ;;
  *instance-life-cycle*) echo "${LIFE_CYCLE:-spot}" ;;
  *meta-data/instance-id*) echo i-0fixture ;;
  *local-ipv4*) [ -n "${LOCAL_IPV4+x}" ] || exit 22
    printf '%s' "$LOCAL_IPV4" ;;
  *) exit 22 ;;
esac
"""
# aws: Secrets Manager's answer (MUNGE_B64), and EC2's profile association: the boot
# profile's (ASSOCIATED, a profile ARN; NO_ASSOCIATION=1 for none), replaced unless
# SWAP_DENIED=1. Each EC2 call is logged as one line in ec2.calls.
AWS = r"""#!/bin/bash
if [ "$1" = ec2 ]; then
  printf '%s\n' "$*" >> "$LOG/ec2.calls"
  case "$2" in
    describe-iam-instance-profile-associations)
      [ -z "${NO_ASSOCIATION:-}" ] || { printf 'None\tNone\n'; exit 0; }
      profile=${ASSOCIATED:-arn:aws:iam::1:instance-profile/boot}
      printf 'iip-assoc-0123456789abcdef0\t%s\n' "$profile" ;;
    replace-iam-instance-profile-association)
      [ -z "${SWAP_DENIED:-}" ] || { echo 'UnauthorizedOperation' >&2; exit 254; }
      echo "$*" >> "$LOG/swapped" ;;
    *) exit 252 ;;
  esac
  exit 0
fi
printf '%s\n' "$@" > "$LOG/aws.args"
echo x >> "$LOG/aws.calls"
[ -n "${MUNGE_B64:-}" ] || { echo 'ResourceNotFoundException' >&2; exit 254; }
echo "$MUNGE_B64"
"""
LOGGER = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> "$LOG/commands"
"""
# The image's gate (gpupool/gate/boot.py), by outcome: GATE=pass, fail, or absent (an
# image without it: python3 cannot find the module).
GATE = r"""#!/bin/bash
printf '%s\n' "python3 $* PYTHONPATH=$PYTHONPATH" >> "$LOG/commands"
case "${GATE:-pass}" in
  pass) exit 0 ;;
  fail) echo "gpupool gate failed: gpu.gpu_count, software.locked_version_held[nvidia_driver]"
        exit 1 ;;
  *) echo "No module named gpupool.gate.boot" >&2; exit 1 ;;
esac
"""
# systemctl: logged; MOUNT_DOWN=1 makes a mount unit fail to start (no hybrid link).
SYSTEMCTL = r"""#!/bin/bash
printf '%s\n' "systemctl $*" >> "$LOG/commands"
[[ -n "${MOUNT_DOWN:-}" && "$1" == start && "$2" == *.mount ]] && exit 1
exit 0
"""
# What role node_exporter leaves in the image (roles/node_exporter/templates/defaults.j2).
NODE_EXPORTER_ARGS = ('ARGS="--web.listen-address=0.0.0.0:9100 --collector.textfile.directory='
                      '/var/lib/prometheus/node-exporter --collector.systemd"\n')
SCONTROL = r"""#!/bin/bash
printf '%s\n' "SLURM_CONF=$SLURM_CONF scontrol $*" >> "$LOG/commands"
"""


def _stacks() -> list[tuple[Description, str, BurstGroup]]:
    out = []
    for stack in ("lab", "example"):
        desc = loader.load_stack(stack, ROOT)
        out += [(desc, n, g) for n, g in desc.burst_groups.items()]
    return out


@dataclass
class Boot:
    rc: int
    root: Path  # stands for /
    stderr: str

    def log(self, name: str) -> str:
        path = self.root / "log" / name
        return path.read_text() if path.exists() else ""


def _boot(tmp: Path, script: str, **env: str) -> Boot:
    """Run a rendered user-data with /etc under tmp and the world stubbed."""
    bin_, log = tmp / "bin", tmp / "log"
    # The image has /etc/munge and /etc/default (packages installed by the roles).
    for d in (bin_, log, tmp / "etc/munge", tmp / "etc/default"):
        d.mkdir(parents=True, exist_ok=True)
    (tmp / launch.NODE_EXPORTER_DEFAULTS.lstrip("/")).write_text(NODE_EXPORTER_ARGS)
    for name, text in {"curl": CURL, "aws": AWS, "systemctl": SYSTEMCTL, "chown": LOGGER,
                       "sleep": LOGGER, "python3": GATE, "scontrol": SCONTROL}.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    for top in ("/etc/", "/run/", "/var/"):
        script = script.replace(f" {top}", f" {tmp}{top}")
    path = tmp / "user-data"
    path.write_text(script)
    done = subprocess.run(
        ["bash", str(path)], capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": f"{bin_}:{os.environ['PATH']}", "LOG": str(log), **env})
    return Boot(done.returncode, tmp, done.stderr)


def test_the_tag_key_the_controller_port_and_the_watcher_agree_with_their_owners() -> None:
    assert names.TAG_SLURM_NODE == burst.NODE_TAG
    defaults = yaml.safe_load((ROOT / "roles/slurm/defaults/main.yml").read_text())
    assert defaults["slurm_ctld_port"] == catalog.SLURMCTLD_PORT
    assert defaults["slurm_slurmd_port"] == catalog.SLURMD_PORT
    compute = (ROOT / "roles/slurm/tasks/node_files.yml").read_text()
    assert f"dest: /etc/systemd/system/{launch.SPOT_WATCH_UNIT.format('')}\n" in compute


def test_the_boot_rebinds_the_exporters_the_image_has() -> None:
    """The unit and file the user-data edits are role node_exporter's on Debian, the
    fixture's ARGS line is the role's template with the image's values, and role dcgm's
    unit reads the listen host the boot's drop-in sets."""
    debian = yaml.safe_load((ROOT / "roles/node_exporter/vars/Debian.yml").read_text())
    assert (debian["node_exporter_service"], debian["node_exporter_defaults_file"]) == (
        launch.NODE_EXPORTER_UNIT, launch.NODE_EXPORTER_DEFAULTS)
    template = (ROOT / "roles/node_exporter/templates/defaults.j2").read_text()
    (line,) = [t for t in template.splitlines() if t.startswith("ARGS=")]
    role = yaml.safe_load((ROOT / "roles/node_exporter/defaults/main.yml").read_text())
    for name, value in {"node_exporter_address": "0.0.0.0",  # noqa: S104 (the image's)
                        "node_exporter_port": str(role["node_exporter_port"]),
                        "node_exporter_textfile_dir": role["node_exporter_textfile_dir"],
                        "node_exporter_extra_args | join(' ')":
                            " ".join(role["node_exporter_extra_args"])}.items():
        line = line.replace("{{ " + name + " }}", value)
    assert line + "\n" == NODE_EXPORTER_ARGS
    unit = (ROOT / "roles/dcgm/templates/dcgm-exporter.service.j2").read_text()
    assert "--address ${DCGM_EXPORTER_HOST}:" in unit
    assert f"dest: /etc/systemd/system/{launch.DCGM_EXPORTER_UNIT}.service," in (
        ROOT / "roles/dcgm/tasks/main.yml").read_text()


@pytest.mark.parametrize(("desc", "name", "group"), _stacks(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_user_data_is_valid_bash_and_keeps_the_facts(desc: Description, name: str,
                                                     group: BurstGroup) -> None:
    script = launch.user_data(desc, name, group)
    assert script.startswith("#!/bin/bash\nset -euo pipefail\n")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True, timeout=30)
    assert "/etc/gpupool/burst.json" in script
    secret = (f"--region {group.region} --secret-id {names.munge_secret_name(desc)} "
              "--query SecretBinary")
    assert secret in script
    servers = ",".join(f"{a}:{catalog.SLURMCTLD_PORT}"
                       for _, a in launch.controller_addresses(desc))
    assert f"conf_server={servers}\n" in script
    # The key is in place and munge restarted, then the gate passed, before slurmd starts.
    assert (script.index("systemctl restart munge") < script.index("gpupool.gate.boot")
            < script.index("/etc/default/slurmd") < script.index("systemctl restart slurmd"))


@pytest.mark.parametrize("life_cycle", ["spot", "on-demand"])
def test_a_booted_instance_writes_the_key_and_starts_slurmd_configless(tmp_path: Path,
                                                                       life_cycle: str) -> None:
    desc = loader.load_stack("example", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    done = _boot(tmp_path, launch.user_data(desc, name, group), NODE_TAG="prod-h100-burst-3",
                 MUNGE_B64=KEY_B64, LIFE_CYCLE=life_cycle, LOCAL_IPV4="10.20.30.40")
    assert done.rc == 0, done.stderr
    key = tmp_path / "etc/munge/munge.key"
    assert key.read_bytes() == KEY
    assert stat.S_IMODE(key.stat().st_mode) == 0o400
    assert not (tmp_path / "etc/munge/munge.key.new").exists()
    [(_, address)] = launch.controller_addresses(desc)
    assert (tmp_path / "etc/default/slurmd").read_text() == (
        f'SLURMD_OPTIONS="--conf-server {address}:6817 -N prod-h100-burst-3"\n')
    # Debian's unit needs /etc/slurm/slurm.conf, which a configless node never has.
    assert (tmp_path / launch.SLURMD_DROPIN.lstrip("/")).read_text() == (
        "[Unit]\nConditionPathExists=\n")
    commands = done.log("commands").splitlines()
    assert f"chown munge:munge {tmp_path}/etc/munge/munge.key.new" in commands
    watcher = ([f"systemctl enable --now {launch.SPOT_WATCH_UNIT.format('prod-h100-burst-3')}"]
               if life_cycle == "spot" else [])
    mounts = [f"systemctl start {u}" for u in storage.mount_units(desc)]
    assert mounts, "the example declares network tiers"
    assert [c for c in commands if c.startswith("systemctl")] == [
        "systemctl restart munge", *mounts,
        f"systemctl enable --now {launch.NODE_EXPORTER_UNIT}", "systemctl daemon-reload",
        f"systemctl enable --now {launch.DCGM_EXPORTER_UNIT}", "systemctl daemon-reload",
        "systemctl enable slurmd", "systemctl restart slurmd", *watcher]
    assert done.log("aws.args").splitlines() == [
        "secretsmanager", "get-secret-value", "--region", group.region,
        "--secret-id", names.munge_secret_name(desc), "--query", "SecretBinary",
        "--output", "text", "--cli-connect-timeout", "5", "--cli-read-timeout", "10"]
    # The node and DCGM exporters serve on the instance's address, on the image's ports.
    assert (tmp_path / launch.NODE_EXPORTER_DEFAULTS.lstrip("/")).read_text() == (
        NODE_EXPORTER_ARGS.replace("0.0.0.0:9100", "10.20.30.40:9100"))
    assert (tmp_path / launch.DCGM_EXPORTER_DROPIN.lstrip("/")).read_text() == (
        "[Service]\nEnvironment=DCGM_EXPORTER_HOST=10.20.30.40\n")
    # IMDSv2: a token first, then the tag with it.
    assert "X-aws-ec2-metadata-token: token" in done.log("curl")
    assert KEY_B64[:40] not in done.stderr  # the key never reaches the log


def test_a_burst_node_knows_the_backup_controller(tmp_path: Path) -> None:
    # The lab declares failover: slurmd asks the primary for its configuration and turns
    # to the backup when the primary does not answer.
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    done = _boot(tmp_path, launch.user_data(desc, name, group), NODE_TAG="l4-burst-1",
                 MUNGE_B64=KEY_B64)
    assert done.rc == 0, done.stderr
    assert (tmp_path / "etc/default/slurmd").read_text() == (
        'SLURMD_OPTIONS="--conf-server 10.231.30.10:6817,10.231.30.20:6817 -N l4-burst-1"\n')


@pytest.mark.parametrize("tag", ['n1"; touch PWNED; "', "$(touch PWNED)", "-N", "Node1",
                                 "", "a" * 64, "n1\nSLURMD_OPTIONS=--foo"])
def test_a_hostile_node_tag_stops_the_boot_before_anything_starts(tmp_path: Path,
                                                                  tag: str) -> None:
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    done = _boot(tmp_path, launch.user_data(desc, name, group), NODE_TAG=tag, MUNGE_B64="eA==")
    assert done.rc != 0 and "invalid Slurm node name tag" in done.stderr, done.stderr
    assert not (tmp_path / "etc/default/slurmd").exists()
    assert not (tmp_path / "etc/munge/munge.key").exists()
    assert "systemctl" not in done.log("commands")
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


def test_missing_tag_or_secret_fails_after_bounded_tries(tmp_path: Path) -> None:
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    script = launch.user_data(desc, name, group)
    no_tag = _boot(tmp_path / "tag", script, MUNGE_B64="eA==")
    assert no_tag.rc != 0 and "no Slurm node name tag" in no_tag.stderr
    assert no_tag.log("commands").count("sleep") == launch.BOOT_ATTEMPTS
    no_imds = _boot(tmp_path / "imds", script, IMDS_DOWN="1", NODE_TAG="n1")
    assert no_imds.rc != 0 and no_imds.log("commands").count("sleep") == launch.BOOT_ATTEMPTS
    no_key = _boot(tmp_path / "key", script, NODE_TAG="lab-burst-1")
    assert no_key.rc != 0
    assert names.munge_secret_name(desc) in no_key.stderr
    assert len(no_key.log("aws.calls").split()) == launch.BOOT_ATTEMPTS
    assert not (tmp_path / "key/etc/default/slurmd").exists()


def test_hostile_description_values_reach_commands_as_single_words(tmp_path: Path) -> None:
    # Validation refuses these; the script still quotes them (validation bypassed here).
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    pool = desc.pool.model_copy(update={"name": "p'$(touch PWNED)'\"; touch PWNED; #"})
    desc = desc.model_copy(update={"pool": pool})
    group = group.model_copy(update={"region": "eu-west-1 $(touch PWNED) `touch PWNED`"})
    script = launch.user_data(desc, name, group)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True, timeout=30)
    done = _boot(tmp_path, script, NODE_TAG="n1", MUNGE_B64="eA==")
    assert done.rc == 0, done.stderr
    args = done.log("aws.args").splitlines()
    assert args[args.index("--region") + 1] == group.region
    assert args[args.index("--secret-id") + 1] == names.munge_secret_name(desc)
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


def test_the_gate_runs_on_the_facts_before_slurmd_and_a_pass_starts_it(tmp_path: Path) -> None:
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    done = _boot(tmp_path, launch.user_data(desc, name, group), NODE_TAG="l4-burst-1",
                 MUNGE_B64="eA==", GATE="pass")
    assert done.rc == 0, done.stderr
    commands = done.log("commands").splitlines()
    gate = (f"python3 -m gpupool.gate.boot {tmp_path}{launch.FACTS_PATH} l4-burst-1 "
            f"{tmp_path}{launch.GATE_REPORTS} PYTHONPATH={launch.GATE_LIB}")
    assert commands.index(gate) < commands.index("systemctl restart slurmd")
    assert json.loads((tmp_path / launch.FACTS_PATH.lstrip("/")).read_text()) == (
        launch.burst_facts(desc, name, group))
    assert "scontrol" not in done.log("commands")


@pytest.mark.parametrize(("outcome", "reason"), [
    ("fail", "gpupool gate failed: gpu.gpu_count, software.locked_version_held[nvidia_driver]"),
    ("absent", "gpupool gate could not run (no gate in the image?)")])
def test_a_node_that_does_not_pass_drains_itself_and_never_starts_slurmd(
        tmp_path: Path, outcome: str, reason: str) -> None:
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    done = _boot(tmp_path, launch.user_data(desc, name, group), NODE_TAG="l4-burst-2",
                 MUNGE_B64="eA==", GATE=outcome)
    assert done.rc != 0
    assert f"gpupool: {reason}" in done.stderr
    # The lab declares a backup controller: scontrol turns to it when the primary is down.
    assert (tmp_path / launch.CLIENT_CONF.lstrip("/")).read_text() == (
        f"ClusterName={desc.pool.name}\nSlurmctldHost=lab-ctl(10.231.30.10)\n"
        "SlurmctldHost=lab-ctl2(10.231.30.20)\n")
    scontrol = [c for c in done.log("commands").splitlines() if " scontrol " in c]
    # Powered down (Slurm requeues its job, the suspend program terminates the instance),
    # then drained with the reason, which the power-down would otherwise have reset.
    assert scontrol == [
        f"SLURM_CONF={launch.CLIENT_CONF} scontrol update nodename=l4-burst-2 "
        "state=power_down_force",
        f"SLURM_CONF={launch.CLIENT_CONF} scontrol update nodename=l4-burst-2 state=drain "
        f"reason={reason}"]
    assert "slurmd" not in done.log("commands")
    assert not (tmp_path / "etc/default/slurmd").exists()


def test_a_tier_that_does_not_mount_is_reported_and_left_to_the_gate(tmp_path: Path) -> None:
    """Every network tier's unit is started, each bounded; one that fails is said on stderr
    and the boot goes on to the gate, whose storage.mount_present fails the node for it
    (the gate's facts carry the tiers: test_burst_hosts, gate/expect.burst_expect)."""
    desc = loader.load_stack("example", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    done = _boot(tmp_path, launch.user_data(desc, name, group), NODE_TAG="prod-h100-burst-3",
                 MUNGE_B64=KEY_B64, MOUNT_DOWN="1", GATE="fail")
    assert done.rc == 1
    for unit in storage.mount_units(desc):
        assert f"gpupool: {unit} did not mount" in done.stderr
    assert "python3 -m gpupool.gate.boot" in done.log("commands")
    assert "systemctl restart slurmd" not in done.log("commands")


@pytest.mark.parametrize("address", [None, "", "10.0.0.1/ -e s/x/y", "1.2.3.4;reboot",
                                     "10.0.0.1\n10.0.0.2", "fd00::1", "999.1.1.1.1"])
def test_no_address_or_a_hostile_one_leaves_the_exporters_as_the_image_has_them(
        tmp_path: Path, address: str | None) -> None:
    """The exporters are bound only to a dotted IPv4 address from the metadata service;
    anything else is said on stderr and the boot goes on (its metrics are not its
    admission: the gate is)."""
    desc = loader.load_stack("example", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    env = {} if address is None else {"LOCAL_IPV4": address}
    done = _boot(tmp_path, launch.user_data(desc, name, group), NODE_TAG="prod-h100-burst-3",
                 MUNGE_B64=KEY_B64, **env)
    assert done.rc == 0, done.stderr
    assert "no private address to bind the node and DCGM exporters to" in done.stderr
    assert (tmp_path / launch.NODE_EXPORTER_DEFAULTS.lstrip("/")).read_text() == NODE_EXPORTER_ARGS
    assert not (tmp_path / launch.DCGM_EXPORTER_DROPIN.lstrip("/")).exists()
    assert launch.NODE_EXPORTER_UNIT not in done.log("commands")
    assert launch.DCGM_EXPORTER_UNIT not in done.log("commands")
    assert "systemctl restart slurmd" in done.log("commands")


# --- the boot profile swapped for the run profile --------------------------------------

def test_the_boot_swaps_its_profile_for_the_run_profile_once_the_key_is_in_place(
        tmp_path: Path) -> None:
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    script = launch.user_data(desc, name, group)
    # After the key is written, before munge uses it and anything else runs.
    assert (script.index(f"{launch.MUNGE_KEY_PATH}.new {launch.MUNGE_KEY_PATH}")
            < script.index("replace-iam-instance-profile-association")
            < script.index("systemctl restart munge"))
    done = _boot(tmp_path, script, NODE_TAG="l4-burst-1", MUNGE_B64="eA==")
    assert done.rc == 0, done.stderr
    run = names.run_profile_name(desc, name)
    cli = f"--region {group.region} --cli-connect-timeout 5 --cli-read-timeout 10"
    assert done.log("ec2.calls").splitlines() == [
        f"ec2 describe-iam-instance-profile-associations {cli} --filters "
        "Name=instance-id,Values=i-0fixture Name=state,Values=associated --query "
        "IamInstanceProfileAssociations[0].[AssociationId,IamInstanceProfile.Arn] "
        "--output text",
        f"ec2 replace-iam-instance-profile-association {cli} --association-id "
        f"iip-assoc-0123456789abcdef0 --iam-instance-profile Name={run} --output text"]
    assert "systemctl restart slurmd" in done.log("commands")


@pytest.mark.parametrize("env", [{"NO_ASSOCIATION": "1"}, {"SWAP_DENIED": "1"}])
def test_a_boot_that_cannot_swap_fails_loudly_after_bounded_tries(
        tmp_path: Path, env: dict[str, str]) -> None:
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    done = _boot(tmp_path, launch.user_data(desc, name, group), NODE_TAG="l4-burst-1",
                 MUNGE_B64="eA==", **env)
    assert done.rc == 1
    assert (f"gpupool: could not swap the boot profile for "
            f"{names.run_profile_name(desc, name)}: the boot fails") in done.stderr
    assert done.stderr.count("the instance profile swap failed") == launch.BOOT_ATTEMPTS
    describes = [c for c in done.log("ec2.calls").splitlines() if "describe-" in c]
    assert len(describes) == launch.BOOT_ATTEMPTS
    commands = done.log("commands")
    assert "systemctl restart munge" not in commands and "slurmd" not in commands
    assert not (tmp_path / "etc/default/slurmd").exists()


def test_an_association_already_naming_the_run_profile_counts_as_swapped(
        tmp_path: Path) -> None:
    """A replace whose reply was lost: the run role cannot replace again, and need not."""
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    arn = f"arn:aws:iam::1:instance-profile/{names.run_profile_name(desc, name)}"
    done = _boot(tmp_path, launch.user_data(desc, name, group), NODE_TAG="l4-burst-1",
                 MUNGE_B64="eA==", ASSOCIATED=arn, SWAP_DENIED="1")
    assert done.rc == 0, done.stderr
    assert "replace-" not in done.log("ec2.calls")


def _swap_lines(desc: Description, name: str, group: BurstGroup) -> str:
    """The user-data's swap, as a script of its own: imds() answers the instance id."""
    lines = launch.user_data(desc, name, group).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("instance=$(imds"))
    end = next(i for i, line in enumerate(lines) if "could not swap the boot profile" in line)
    return "\n".join(["set -euo pipefail", 'imds() { printf "%s" "$INSTANCE_ID"; }',
                      *lines[start:end + 1], ""])


def test_the_swap_against_moto_leaves_the_instance_with_the_run_profile(
        tmp_path: Path) -> None:
    """The launch template's boot profile on a launched instance, then the user-data's own
    swap lines run with the AWS CLI against moto: the association names the run profile,
    and a second run (a reply lost) finds it so and replaces nothing."""
    if shutil.which("aws") is None or subprocess.run(
            ["aws", "--version"], capture_output=True, check=False).returncode != 0:
        pytest.skip("no AWS CLI here (the burst image carries Debian's)")
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    with localaws.endpoint() as url:
        ec2 = boto3.client("ec2", region_name=group.region, endpoint_url=url)
        burst_hosts.declare_profiles(
            boto3.client("iam", region_name=group.region, endpoint_url=url), desc)
        image = ec2.describe_images(MaxResults=1)["Images"][0]["ImageId"]
        instance = ec2.run_instances(
            ImageId=image, MinCount=1, MaxCount=1, InstanceType=group.instance_types[0],
            IamInstanceProfile={"Name": names.boot_profile_name(desc, name)},
        )["Instances"][0]["InstanceId"]
        script = tmp_path / "swap.sh"
        script.write_text(_swap_lines(desc, name, group))
        env = {**os.environ, **localaws.FIXTURE_CREDENTIALS, "AWS_ENDPOINT_URL": url,
               "INSTANCE_ID": instance, "HOME": str(tmp_path)}
        for _ in range(2):
            done = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                                  env=env, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
            (assoc,) = ec2.describe_iam_instance_profile_associations(Filters=[
                {"Name": "instance-id", "Values": [instance]}])["IamInstanceProfileAssociations"]
            assert assoc["IamInstanceProfile"]["Arn"].endswith(
                f":instance-profile/{names.run_profile_name(desc, name)}")
            assert "swap failed" not in done.stderr


def test_the_swap_sequence_in_moto_names_the_run_profile() -> None:
    """The same sequence through boto3 in moto's in-process mock: the boot profile is the
    instance's, describe (by instance id, associated) finds its association, replace names
    the run profile; the instance's own record follows."""
    desc = loader.load_stack("lab", ROOT)
    name, group = next(iter(desc.burst_groups.items()))
    boot, run = names.boot_profile_name(desc, name), names.run_profile_name(desc, name)
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=group.region)
        burst_hosts.declare_profiles(boto3.client("iam", region_name=group.region), desc)
        image = ec2.describe_images(MaxResults=1)["Images"][0]["ImageId"]
        instance = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1,
                                     IamInstanceProfile={"Name": boot})["Instances"][0]
        filters = [{"Name": "instance-id", "Values": [instance["InstanceId"]]},
                   {"Name": "state", "Values": ["associated"]}]
        (before,) = ec2.describe_iam_instance_profile_associations(
            Filters=filters)["IamInstanceProfileAssociations"]
        assert before["IamInstanceProfile"]["Arn"].endswith(f":instance-profile/{boot}")
        ec2.replace_iam_instance_profile_association(
            AssociationId=before["AssociationId"], IamInstanceProfile={"Name": run})
        (after,) = ec2.describe_iam_instance_profile_associations(
            Filters=filters)["IamInstanceProfileAssociations"]
        assert after["IamInstanceProfile"]["Arn"].endswith(f":instance-profile/{run}")
