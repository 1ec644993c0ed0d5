"""The description's reference (issue 52): the JSON Schema gpupool ships and `gpupool schema`
prints, and docs/description-reference.md, are what the model generates now, and the schema
accepts and refuses what the loader does."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gpupool import cli
from gpupool.cli.commands.init import STARTERS
from gpupool.paths import SHARE
from gpupool.spec import loader, model, reference
from gpupool.spec.model import Description
from tests.conftest import ROOT

STALE = (f"out of date with gpupool/spec/model.py: run `{reference.REGENERATE}` and commit "
         "what it rewrites")
# The shipped descriptions and gpupool init's starters (the same files in a checkout).
SHIPPED = sorted({*ROOT.glob("pools/*.yaml"),
                  *(loader.description_path(s, SHARE) for s in STARTERS)})


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return json.loads(reference.SCHEMA_FILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def validator(schema: dict[str, Any]) -> Any:
    jsonschema = pytest.importorskip(
        "jsonschema", reason="jsonschema comes with the cloud extra: pip install "
                             "'gpupool[cloud]'")
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_shipped_schema_is_what_the_model_generates() -> None:
    assert reference.SCHEMA_FILE.read_text(encoding="utf-8") == reference.schema_text(), \
        f"{reference.SCHEMA_FILE.relative_to(ROOT)} is {STALE}"


def test_the_reference_page_is_what_the_model_generates() -> None:
    page = reference.REFERENCE_PAGE
    assert page.read_text(encoding="utf-8") == reference.reference(), \
        f"{page.relative_to(ROOT)} is {STALE}"
    assert reference.REGENERATE in page.read_text(encoding="utf-8").splitlines()[2]


def _sections(schema: dict[str, Any]) -> Iterator[tuple[type[BaseModel], dict[str, Any]]]:
    yield Description, schema
    for name, node in schema["$defs"].items():
        cls = getattr(model, name)
        if issubclass(cls, BaseModel):
            yield cls, node


def test_every_section_has_the_model_s_keys_and_required_fields(schema: dict[str, Any]
                                                                ) -> None:
    """The keys are the YAML keys (aliases: `class`, `from`), a section refuses any other,
    and a field is required exactly when the model has no default for it."""
    for cls, node in _sections(schema):
        fields = cls.model_fields
        assert list(node["properties"]) == [f.alias or n for n, f in fields.items()], cls
        assert set(node.get("required", [])) == {
            f.alias or n for n, f in fields.items() if f.is_required()}, cls
        assert node["additionalProperties"] is (cls.model_config.get("extra") != "forbid")
    assert "class" in schema["$defs"]["Node"]["properties"]
    assert "from" in schema["$defs"]["Flow"]["properties"]


def test_every_field_is_described(schema: dict[str, Any]) -> None:
    """By its comment in model.py (above the field or after it), the one source of a
    field's description; a field of an enum type the enum's docstring describes needs
    none."""
    undescribed = []
    for cls, node in _sections(schema):
        for key, prop in node["properties"].items():
            enum = schema["$defs"].get(prop.get("$ref", "").rsplit("/", 1)[-1], {})
            if not prop.get("description") and not enum.get("description"):
                undescribed.append(f"{cls.__name__}.{key}")
    assert undescribed == [], "comment these fields in gpupool/spec/model.py"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_the_shipped_descriptions_follow_the_schema(path: Path, validator: Any) -> None:
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(loader.read_yaml(path))]
    assert errors == []


def test_a_mistyped_key_is_refused(validator: Any) -> None:
    data = loader.read_yaml(ROOT / "pools" / "lab.yaml")
    for path, typo in (((), "node_clases"), (("nodes", "lab-gpu1"), "clas"),
                       (("pool",), "cost_center"), (("network", "flows", 0), "port")):
        wrong = copy.deepcopy(data)
        _at(wrong, path)[typo] = "x"
        messages = [e.message for e in validator.iter_errors(wrong)]
        assert any(repr(typo) in m for m in messages), (typo, messages)
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            Description.model_validate(wrong)


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _mappings(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(doc, dict):
        yield path
        for key, child in doc.items():
            yield from _mappings(child, (*path, key))
    elif isinstance(doc, list):
        for i, child in enumerate(doc):
            yield from _mappings(child, (*path, i))


def test_the_schema_and_the_model_agree_on_every_key_left_out_or_added(
        validator: Any) -> None:
    """Every mapping of the example description, with each of its keys left out in turn
    and with an unknown key added: the schema accepts exactly what the model does (the
    model's types; the relational rules are gpupool validate's)."""
    data = loader.read_yaml(ROOT / "pools" / "example.yaml")
    disagree = []
    for path in _mappings(data):
        for key in [*_at(data, path), "colour_"]:
            doc = copy.deepcopy(data)
            mapping = _at(doc, path)
            if key in mapping:
                del mapping[key]
            else:
                mapping[key] = {}
            try:
                Description.model_validate(doc)
                accepted = True
            except ValidationError:
                accepted = False
            if validator.is_valid(doc) != accepted:
                disagree.append(f"{'.'.join(map(str, (*path, key)))}: model "
                                f"{'accepts' if accepted else 'refuses'}")
    assert disagree == []


@pytest.mark.parametrize("page", [False, True], ids=["schema", "reference"])
def test_the_verb_writes_what_gpupool_ships(page: bool, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    shipped = reference.REFERENCE_PAGE if page else reference.SCHEMA_FILE
    flags = ["--reference"] if page else []
    out = tmp_path / "out"
    assert cli.main(["schema", *flags, "-o", str(out)]) == cli.EXIT_OK
    assert out.read_bytes() == shipped.read_bytes()
    # Its own file it replaces; another only with --force.
    assert cli.main(["schema", *flags, "-o", str(out)]) == cli.EXIT_OK
    other = tmp_path / "notes.txt"
    other.write_text("mine\n")
    assert cli.main(["schema", *flags, "-o", str(other)]) == cli.EXIT_INVALID
    assert other.read_text() == "mine\n"
    assert cli.main(["schema", *flags, "-o", str(other), "--force"]) == cli.EXIT_OK
    capsys.readouterr()
    assert cli.main(["schema", *flags]) == cli.EXIT_OK
    assert capsys.readouterr().out == shipped.read_text(encoding="utf-8")
