"""Role storage's network mounts (roles/storage/templates/net.mount.j2): shared tiers are
always mounted nosuid,nodev, whatever the description's options, so a set-id program or a
device node anyone wrote on shared storage is never honoured on a node."""

from __future__ import annotations

import re
from typing import Any

import jinja2
import pytest

from gpupool.spec import loader
from tests.conftest import ROOT


def _render(name: str, **variables: object) -> str:
    """The template as Ansible renders it (trim_blocks), with the one Ansible test it
    uses that Jinja lacks (`search`, for its refusals); tests/test_template_escaping.py
    renders it with Ansible itself."""
    env = jinja2.Environment(  # a unit file: no HTML escaping  # noqa: S701
        loader=jinja2.FileSystemLoader(ROOT / "roles" / "storage" / "templates"),
        trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.tests["search"] = lambda value, pattern: re.search(pattern, value) is not None
    return env.get_template(name).render(ansible_managed="test", **variables)


def _unit(fstype: str, options: list[str]) -> str:
    item: dict[str, Any] = {"key": "datasets", "value": {
        "purpose": "datasets", "temperature": "warm",
        "mount": {"fstype": fstype, "source": "nfs1:/export/datasets", "path": "/datasets",
                  "options": options}}}
    return _render("net.mount.j2", item=item)


def _options(unit: str) -> list[str]:
    [line] = [ln for ln in unit.splitlines() if ln.startswith("Options=")]
    return line.removeprefix("Options=").split(",")


@pytest.mark.parametrize("fstype", ["nfs", "lustre"])
@pytest.mark.parametrize(("given", "want"), [
    ([], ["_netdev", "nosuid", "nodev"]),
    (["ro", "noatime", "vers=4.2"], ["ro", "noatime", "vers=4.2", "_netdev", "nosuid", "nodev"]),
    # Said already: once, and last, so nothing before them turns them back off.
    (["nosuid", "defaults", "nodev", "_netdev"], ["defaults", "_netdev", "nosuid", "nodev"]),
    (["rw", "rw", "hard"], ["rw", "hard", "_netdev", "nosuid", "nodev"]),
])
def test_network_tiers_are_always_nosuid_nodev(fstype: str, given: list[str],
                                                want: list[str]) -> None:
    assert _options(_unit(fstype, given)) == want


def test_the_lab_tiers_keep_their_options_first() -> None:
    """tests/integration/test_roles.py reads the description's options as the start of
    the unit's Options= line."""
    desc = loader.load_stack("lab")
    for name, tier in desc.storage_tiers.items():
        if tier.mount is None or tier.mount.fstype not in ("nfs", "lustre"):
            continue
        options = _options(_unit(tier.mount.fstype, list(tier.mount.options)))
        assert options[:len(tier.mount.options)] == list(tier.mount.options), name
        assert options[-2:] == ["nosuid", "nodev"], name
