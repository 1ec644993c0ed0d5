"""The burst user-data's template (gpupool/render/templates/burst-user-data.sh.tmpl) and its
renderer (gpupool.render.shell_template): the script every shipped stack's burst groups
boot with is valid bash (and clean under shellcheck, where it is installed), and a hostile
description value stays one shell word wherever the template writes it: run in
test_burst_boot's sandbox, nothing it holds is executed and every command gets it whole."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from gpupool.render import node_labels, shell_template
from gpupool.render.cloud import launch, names, storage
from gpupool.spec import loader, model
from gpupool.spec.model import BurstGroup, Description
from tests.conftest import ROOT
from tests.test_burst_boot import KEY_B64, _boot

# Quotes of both kinds, command substitutions of both forms, a comment, a newline and a
# here-document's end: each would end its word, or the script's line, if written unquoted.
HOSTILE = "x'$(touch PWNED)'\"; touch PWNED; # `touch PWNED`\nEOF\ntouch PWNED"


def _descriptions() -> dict[str, Description]:
    """Every shipped description: each stack's, and any pool file no stack names."""
    paths = {loader.description_path(s, ROOT) for s in loader.stacks(ROOT)}
    paths |= set((ROOT / "pools").glob("*.yaml"))
    return {p.stem: loader.load_file(p) for p in sorted(paths)}


def _groups() -> list[tuple[str, Description, str, BurstGroup]]:
    found = [(stack, desc, n, g) for stack, desc in _descriptions().items()
             for n, g in desc.burst_groups.items()]
    assert {stack for stack, *_ in found} >= {"lab", "example"}
    return found


@pytest.mark.parametrize(("stack", "desc", "name", "group"), _groups(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_shipped_boot_script_is_valid_bash(stack: str, desc: Description, name: str,
                                                 group: BurstGroup, tmp_path: Path) -> None:
    script = tmp_path / f"{stack}-{name}.sh"
    script.write_text(launch.user_data(desc, name, group))
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian's package shellcheck): bash -n only")
    done = subprocess.run(["shellcheck", "--shell=bash", str(script)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout


def _hostile(desc: Description) -> tuple[Description, str, BurstGroup]:
    """desc with HOSTILE in every value the boot script writes that is not checked at
    boot (validation refuses them: it is bypassed here): the pool's name (its secret, its
    profiles, its cluster name, its kubelet labels), a team's, the group's region and a
    tier's mount path (its mount unit)."""
    tier_name, tier = next((n, t) for n, t in desc.storage_tiers.items()
                           if t.mount is not None and t.mount.fstype in model.SHARED_FSTYPES)
    assert tier.mount is not None
    mount = tier.mount.model_copy(update={"path": f"/{HOSTILE}"})
    desc = desc.model_copy(update={
        "pool": desc.pool.model_copy(update={"name": HOSTILE}),
        "teams": {**desc.teams, HOSTILE: next(iter(desc.teams.values()))},
        "storage_tiers": {**desc.storage_tiers,
                          tier_name: tier.model_copy(update={"mount": mount})}})
    name, group = next(iter(desc.burst_groups.items()))
    return desc, name, group.model_copy(update={"region": HOSTILE})


@pytest.mark.parametrize("gate", ["pass", "fail"])
def test_a_hostile_value_stays_one_word_in_the_boot_script(tmp_path: Path, gate: str) -> None:
    desc, name, group = _hostile(loader.load_stack("example", ROOT))
    assert desc.kubernetes is not None  # the kubelet section is written too
    script = launch.user_data(desc, name, group)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True, timeout=30)
    done = _boot(tmp_path, script, NODE_TAG="prod-h100-burst-3", MUNGE_B64=KEY_B64,
                 LIFE_CYCLE="unknown", LOCAL_IPV4="10.0.0.7", GATE=gate)
    assert done.rc == (0 if gate == "pass" else 1), done.stderr
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()
    # The stub writes one argument a line: the values are the words between the options.
    secret = names.munge_secret_name(desc)
    assert f"--region\n{HOSTILE}\n--secret-id\n{secret}\n--query\n" in done.log("aws.args")
    swap = done.log("ec2.calls")
    assert f"Name={names.run_profile_name(desc, name)} " in swap
    for unit in storage.mount_units(desc):
        assert f"systemctl start {unit}\n" in done.log("commands")
    facts = (tmp_path / launch.FACTS_PATH.lstrip("/")).read_text()
    assert json.loads(facts) == json.loads(json.dumps(launch.burst_facts(desc, name, group)))
    kinds = node_labels.burst_nodes(desc, name)
    kubelet = (tmp_path / "etc/default/kubelet").read_text()
    spot = node_labels.kubelet_args(kinds[node_labels.SPOT])
    assert kubelet == f'KUBELET_EXTRA_ARGS="{spot}"\n'
    if gate == "fail":  # the client configuration it reports its failure with
        conf = (tmp_path / launch.CLIENT_CONF.lstrip("/")).read_text()
        assert conf.startswith(f"ClusterName={HOSTILE}\nSlurmctldHost=")


def test_values_are_quoted_and_the_renderer_is_strict() -> None:
    template = "@@# not in the script\necho @@one @@{many}x\n@@lines\n@@if on\nkept\n@@end\n"
    words = ["a b", "$(id)", "'", "\n"]
    out = shell_template.render(template, {"one": HOSTILE, "many": words},
                                blocks={"lines": ["l1", "l2"]}, flags={"on": True})
    assert out == (f"echo {shlex.quote(HOSTILE)} {' '.join(map(shlex.quote, words))}x\n"
                   "l1\nl2\nkept\n")
    printf = shell_template.render("printf '%s\\0' @@one @@{many}x\n",
                                   {"one": HOSTILE, "many": words})
    echoed = subprocess.run(["bash", "-c", printf], capture_output=True, text=True,
                            timeout=30, check=True).stdout
    assert echoed.split("\0")[:-1] == [HOSTILE, *words[:-1], words[-1] + "x"]
    assert shell_template.render("@@if on\nx @@gone\n@@end\n", {}, flags={"on": False}) == "\n"
    with pytest.raises(KeyError):
        shell_template.render("echo @@missing\n", {})
    with pytest.raises(ValueError, match="never used"):
        shell_template.render("echo\n", {"spare": "x"})
    with pytest.raises(ValueError, match="given twice"):
        shell_template.render("echo @@a\n", {"a": "x"}, verbatim={"a": "y"})
    with pytest.raises(ValueError, match="@@end"):
        shell_template.render("@@if on\n", {}, flags={"on": True})
