"""The Lustre client's source: Debian packages no Lustre client (bookworm, its backports and
trixie carry none), so a pool that mounts Lustre names the apt repository its nodes install
it from (the description's lustre_client), checked where it enters and refused again where
roles/storage writes it into a sources file."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.render import inventory
from gpupool.spec import loader
from gpupool.spec.errors import DescriptionError
from tests.conftest import ROOT, mutate, raw_stack

TEMPLATE = ROOT / "roles" / "storage" / "templates" / "lustre.sources.j2"
CLIENT = {"repository": "https://packages.example.internal/lustre", "suite": "trixie",
          "components": ["main"], "key_url": "https://packages.example.internal/key.asc",
          "version": "2.16.1"}


def problems(ops: list[dict[str, Any]], stack: str = "example") -> list[tuple[str, str]]:
    try:
        loader.parse(mutate(raw_stack(stack), ops))
    except DescriptionError as exc:
        return sorted((p.path, p.rule) for p in exc.problems)
    return []


def test_a_lustre_tier_without_a_client_source_is_refused_naming_the_field() -> None:
    assert problems([]) == []  # the example names its site's repository
    assert problems([{"delete": "lustre_client"}]) == [("lustre_client", "lustre-client-source")]
    assert problems([], "lab") == [] and "lustre_client" not in raw_stack("lab")  # no Lustre


@pytest.mark.parametrize(("field", "value", "rule"), [
    ("components", [], "apt-suite-components"),
    ("suite", "./", "apt-flat-no-components"),
])
def test_suites_and_components_as_apt_reads_them(field: str, value: Any, rule: str) -> None:
    assert problems([{"set": f"lustre_client.{field}", "value": value}]) == [
        ("lustre_client.components", rule)]


@pytest.mark.parametrize(("field", "value"), [
    ("repository", "https://packages.example.internal/lustre\nTypes: deb-src"),
    ("repository", "ftp://packages.example.internal/lustre"),
    ("repository", "https://packages.example.internal/a b"),
    ("key_url", "http://packages.example.internal/key.asc"),  # a key fetched in clear
    ("key_url", "https://packages.example.internal/key.asc'; id #"),
    ("suite", "trixie main"),
    ("components", ["main contrib"]),
    ("version", "latest"),
    ("packages", ["lustre-client-utils; id"]),
    ("packages", []),
])
def test_values_a_sources_file_or_apt_cannot_carry_are_refused(field: str, value: Any) -> None:
    found = problems([{"set": f"lustre_client.{field}", "value": value}])
    assert found and all(path.startswith(f"lustre_client.{field}") for path, _ in found), found


def test_the_inventory_carries_it_to_the_nodes_and_the_burst_image() -> None:
    desc = loader.load_stack("example")
    assert inventory.pool_vars(desc)["gpupool_lustre_client"]["suite"] == "trixie"
    region = next(iter(desc.burst_groups.values())).region
    assert inventory.burst_image_vars(desc, region)["gpupool_lustre_client"]["version"] == "2.16.1"
    assert inventory.pool_vars(loader.load_stack("lab"))["gpupool_lustre_client"] is None


def _render(client: dict[str, Any], keyring: str = "/etc/apt/keyrings") -> str:
    from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415
    from ansible.template import Templar, trust_as_template  # noqa: PLC0415

    templar = Templar(loader=DataLoader(), variables={
        "storage_lustre_client": client, "storage_keyring_dir": keyring,
        "ansible_managed": "Managed by gpupool"})
    return str(templar.template(trust_as_template(TEMPLATE.read_text()),
                                escape_backslashes=False))


def test_the_sources_file_as_the_role_writes_it() -> None:
    pytest.importorskip("ansible")
    lines = [ln for ln in _render(CLIENT).splitlines() if ln and not ln.startswith("#")]
    assert lines == ["Types: deb", "URIs: https://packages.example.internal/lustre",
                     "Suites: trixie", "Components: main",
                     "Signed-By: /etc/apt/keyrings/gpupool-lustre.asc"]
    flat = {**CLIENT, "suite": "./", "components": []}
    assert "Components" not in _render(flat)


@pytest.mark.parametrize(("field", "value"), [
    ("repository", "https://x.internal/lustre\nTypes: deb-src"),
    ("suite", "trixie\nTrusted: yes"),
    ("components", ["main\nTrusted: yes"]),
])
def test_the_template_refuses_what_validation_would_have(field: str, value: Any) -> None:
    """The second line of defence, for a hand-written inventory: nothing is written."""
    pytest.importorskip("ansible")
    with pytest.raises(Exception, match="gpupool refuses lustre_client"):
        _render({**CLIENT, field: value})


def test_no_lustre_package_is_asked_of_debian() -> None:
    """The role's per-OS package map asks Debian for no Lustre package: it has none."""
    debian = (ROOT / "roles" / "storage" / "vars" / "Debian.yml").read_text()
    assert "lustre: []" in debian
    assert (ROOT / "roles" / "storage" / "tasks" / "lustre.yml").is_file()
