"""Environment images (issue 54, the declaration): the description's `environment_images`
parse; every bad input is refused with its field named (a CUDA runtime the locked driver
cannot run, a package without a version, a name or base reference a registry refuses, a
team or class that does not exist); the declaration's digest ignores key order and YAML
formatting and changes with any field; the Containerfile carries exactly the pins, in a
form no value can break out of; `gpupool images` lists and prints them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.render import environment_image
from gpupool.spec import cuda_driver, loader
from gpupool.spec.errors import DescriptionError, Problem
from gpupool.spec.model import Description
from tests.conftest import raw_stack
from tests.test_spec_messages import _cli_lines

FIXTURE = Path(__file__).parent / "fixtures" / "environment-images.yaml"
SHA = "0123456789abcdef" * 4


def _images() -> dict[str, Any]:
    return yaml.safe_load(FIXTURE.read_text())["environment_images"]


def _raw(images: dict[str, Any] | None = None) -> dict[str, Any]:
    data = raw_stack("example")
    data["environment_images"] = _images() if images is None else images
    return data


def _with(**fields: Any) -> dict[str, Any]:
    """The example with the fixture's `pytorch` image changed as given."""
    images = _images()
    images["pytorch"] = {**images["pytorch"], **fields}
    return _raw(images)


def _problems(data: dict[str, Any]) -> list[Problem]:
    with pytest.raises(DescriptionError) as info:
        loader.parse(data, "test")
    return info.value.problems


def _paths(data: dict[str, Any]) -> set[str]:
    return {p.path for p in _problems(data)}


@pytest.fixture(scope="module")
def desc() -> Description:
    return loader.parse(_raw(), "test")


def test_a_declaration_parses(desc: Description) -> None:
    image = desc.environment_images["pytorch"]
    assert image.cuda == "12.8.1" and image.version == "1.4.0"
    assert image.packages["python3"] == "3.13.5-1"
    assert desc.environment_images["tools"].teams == ["platform"]


def test_absent_means_no_images() -> None:
    assert loader.parse(raw_stack("example"), "test").environment_images == {}


# CUDA against the driver lock.

def test_a_cuda_runtime_newer_than_the_driver_is_refused() -> None:
    data = _with(cuda="12.8.1")
    data["software"]["nvidia_driver"] = "560.35.05"
    [p] = [p for p in _problems(data) if p.rule == "image-cuda-driver"]
    assert p.path == "environment_images.pytorch.cuda"
    assert "570.124.06" in p.message and "560.35.05" in p.message
    assert "CUDA 12.8 Update 1" in p.message


def test_each_release_s_driver_must_run_the_image() -> None:
    """Nodes of a release with its own driver lock run the image under that driver: a
    runtime it cannot run is refused, naming the release's lock."""
    data = _with(cuda="12.8.1")
    data["software"]["per_release"] = {"debian-13": {"nvidia_driver": "560.35.05"}}
    [p] = [p for p in _problems(data) if p.rule == "image-cuda-driver"]
    assert p.path == "environment_images.pytorch.cuda"
    assert "software.per_release.debian-13.nvidia_driver is locked at 560.35.05 " \
           "(debian-13 nodes)" in p.message


def test_the_strict_toolkit_column_decides() -> None:
    # 12.x's minor-version compatibility floor (525) would pass 12.4 on 535: the rule does
    # not, since 12.4 GA's toolkit needs 550.54.14.
    data = _with(cuda="12.4")
    data["software"]["nvidia_driver"] = "535.309.01"
    assert "environment_images.pytorch.cuda" in _paths(data)
    data["software"]["nvidia_driver"] = "550.54.14"
    assert "environment_images.pytorch.cuda" not in _any_paths(data)


def _any_paths(data: dict[str, Any]) -> set[str]:
    """The problems' paths; none when the description is valid."""
    try:
        loader.parse(data, "test")
    except DescriptionError as exc:
        return {p.path for p in exc.problems}
    return set()


def test_the_driver_the_release_needs_is_enough() -> None:
    data = _with(cuda="12.4")
    data["software"]["nvidia_driver"] = "580.178.04"
    loader.parse(data, "test")


def test_an_unknown_cuda_release_is_refused() -> None:
    [p] = [p for p in _problems(_with(cuda="12.7")) if p.path.endswith(".cuda")]
    assert p.rule == "image-cuda-known" and "12.8.0" in p.message


@pytest.mark.parametrize("cuda", [12.4, "12", "v12.4", "12.4.1.1", "12.x", ""])
def test_a_malformed_cuda_release_is_refused(cuda: Any) -> None:
    assert "environment_images.pytorch.cuda" in _paths(_with(cuda=cuda))


def test_a_number_where_a_version_belongs_says_to_quote_it() -> None:
    [p] = [p for p in _problems(_with(cuda=12.4)) if p.path.endswith(".cuda")]
    assert p.rule == "version-text" and "quotes" in p.message


def test_every_table_row_reads() -> None:
    rows = cuda_driver.releases()
    assert rows["12.4.0"].driver == "550.54.14" and rows["12.0.0"].driver == "525.60.13"
    assert cuda_driver.release("12.8") == rows["12.8.0"]
    for row in rows.values():
        assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", row.toolkit)
        assert re.fullmatch(r"[0-9]{3}\.[0-9]+(\.[0-9]+)?", row.driver)


# Packages.

@pytest.mark.parametrize("version", [None, ""])
def test_a_package_without_a_version_is_refused(version: Any) -> None:
    images = _images()
    images["pytorch"]["packages"]["git"] = version
    [p] = [p for p in _problems(_raw(images)) if "git" in p.path]
    assert p.path == "environment_images.pytorch.packages.git"
    assert p.rule == "package-pinned"


@pytest.mark.parametrize("name", ["Git", "g", "-git", "git pkg", "git;id", "$(id)"])
def test_a_bad_package_name_is_refused(name: str) -> None:
    images = _images()
    images["pytorch"]["packages"][name] = "1.0-1"
    assert any(p.path.startswith("environment_images.pytorch.packages")
               for p in _problems(_raw(images)))


@pytest.mark.parametrize("version", ["latest", "1.0 -y", "1.0;id", "*", ">=1.0", "a1.0",
                                     "$(id)", "1.0\n", "1:2:3"])
def test_a_bad_package_version_is_refused(version: str) -> None:
    images = _images()
    images["pytorch"]["packages"]["git"] = version
    assert "environment_images.pytorch.packages.git" in _paths(_raw(images))


@pytest.mark.parametrize("pin", ["torch", "torch>=2.0", "torch==2.*", "torch==2.0; os",
                                 "torch[cuda]==2.0", "torch==latest", "torch == 2.0",
                                 "torch==2.0+cu128", "-e git+https://x/y"])
def test_a_python_package_not_pinned_exactly_is_refused(pin: str) -> None:
    assert "environment_images.pytorch.python_packages[0]" in _paths(
        _with(python_packages=[pin]))


def test_a_python_package_pinned_twice_is_refused() -> None:
    [p] = [p for p in _problems(_with(python_packages=["Numpy==2.2.6", "numpy==2.2.5"]))
           if p.rule == "python-package-unique"]
    assert p.path == "environment_images.pytorch.python_packages[1]"


# Names and references.

@pytest.mark.parametrize("name", ["PyTorch", "py..torch", "-pytorch", "pytorch-", "a" * 64,
                                  "$(id)", "py\ntorch", "py torch", "py/torch", "_x", ""])
def test_a_name_a_registry_refuses_is_refused(name: str) -> None:
    images = _images()
    images[name] = images.pop("pytorch")
    assert any(p.path.startswith("environment_images") for p in _problems(_raw(images)))


@pytest.mark.parametrize("name", ["a", "py.torch-2_x", "a" * 63])
def test_a_name_a_registry_takes_passes(name: str) -> None:
    images = _images()
    images[name] = images.pop("pytorch")
    loader.parse(_raw(images), "test")


@pytest.mark.parametrize("version", ["1.4", "v1.4.0", "1.4.0+build", "1.4.0-", "latest",
                                     "1.4.0 ", "1.4.0-$(id)"])
def test_a_bad_image_version_is_refused(version: str) -> None:
    assert "environment_images.pytorch.version" in _paths(_with(version=version))


@pytest.mark.parametrize("base", [
    "debian", "debian:latest\nRUN id", "debian:trixie RUN", "debian:trixie;id",
    "debian:$(id)", "Debian:trixie", "debian:trixie@sha256:abc", "debian@md5:" + SHA,
    "/debian:trixie", "debian:trixie/", "debian::trixie", "`id`", "debian:" + "t" * 129,
    "registry.example:99999999/x:1", "debian:trixie\t", "debian:tr'xie"])
def test_a_bad_base_reference_is_refused(base: str) -> None:
    assert "environment_images.pytorch.base" in _paths(_with(base=base))


@pytest.mark.parametrize("base", [
    "debian:trixie", "docker.io/library/debian:trixie-20251117-slim",
    "nvcr.io/nvidia/cuda:12.8.1-runtime-ubuntu24.04", f"debian@sha256:{SHA}",
    f"localhost:5000/team/base:1.0@sha256:{SHA}", "10.0.0.5:5000/base__x:1"])
def test_a_good_base_reference_passes(base: str) -> None:
    loader.parse(_with(base=base), "test")


# Users.

def test_an_unknown_team_or_class_is_refused() -> None:
    problems = _problems(_with(teams=["vision", "visoin"], task_classes=["nope"]))
    by_path = {p.path: p for p in problems}
    assert by_path["environment_images.pytorch.teams[1]"].rule == "image-user-known"
    assert "did you mean `vision`" in by_path["environment_images.pytorch.teams[1]"].message
    assert by_path["environment_images.pytorch.task_classes[0]"].rule == "image-user-known"


def test_an_image_nobody_uses_is_refused() -> None:
    [p] = [p for p in _problems(_with(teams=[], task_classes=[]))
           if p.rule == "image-users"]
    assert p.path == "environment_images.pytorch"


def test_an_unknown_field_is_refused() -> None:
    assert any(p.path.startswith("environment_images.pytorch")
               for p in _problems(_with(packges={})))


# The digest.

def _digest(images: dict[str, Any], name: str = "pytorch") -> str:
    d = loader.parse(_raw(images), "test")
    return environment_image.digest(name, d.environment_images[name])


def test_the_digest_ignores_key_order_and_formatting(desc: Description) -> None:
    base = environment_image.digest("pytorch", desc.environment_images["pytorch"])
    images = _images()
    reordered = {k: images["pytorch"][k] for k in reversed(list(images["pytorch"]))}
    reordered["packages"] = dict(reversed(list(reordered["packages"].items())))
    reordered["python_packages"] = list(reversed(reordered["python_packages"]))
    assert _digest({**images, "pytorch": reordered}) == base
    # The same declaration written in flow style, with comments, as text.
    flow = yaml.safe_load("pytorch: {cuda: '12.8.1', version: 1.4.0,  # c\n"
                          + "  " + yaml.safe_dump(
                              {k: v for k, v in images["pytorch"].items()
                               if k not in ("cuda", "version")},
                              default_flow_style=True).strip()[1:-1] + "}\n")
    assert _digest({**images, **flow}) == base
    # Defaults written out are the same declaration.
    assert _digest({**images, "pytorch": {**images["pytorch"]}}) == base
    assert _digest({**images, "tools": {**images["tools"], "python_packages": []}},
                   "tools") == _digest(images, "tools")


@pytest.mark.parametrize("change", [
    {"version": "1.4.1"}, {"base": "debian:trixie-slim"}, {"cuda": "12.8.0"},
    {"packages": {"python3": "3.13.5-2", "git": "1:2.47.3-0+deb13u1"}},
    {"python_packages": ["torch==2.7.1"]}, {"teams": ["nlp"]},
    {"task_classes": ["interactive"]}])
def test_the_digest_changes_with_any_field(desc: Description, change: dict[str, Any]) -> None:
    base = environment_image.digest("pytorch", desc.environment_images["pytorch"])
    assert _digest(_with(**change)["environment_images"]) != base


def test_the_digest_names_the_image(desc: Description) -> None:
    image = desc.environment_images["pytorch"]
    assert environment_image.digest("pytorch", image) != environment_image.digest("x", image)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", environment_image.digest("x", image))


# The Containerfile.

def _instructions(text: str, word: str) -> list[str]:
    return [line.removeprefix(word + " ") for line in text.splitlines()
            if line.startswith(word + " ")]


def test_the_containerfile_carries_exactly_the_pins(desc: Description) -> None:
    image = desc.environment_images["pytorch"]
    text = environment_image.containerfile("pytorch", image)
    assert _instructions(text, "FROM") == [image.base]
    runs = [json.loads(r) for r in _instructions(text, "RUN")]
    [apt] = [r for r in runs if r[:2] == ["apt-get", "install"]]
    assert "--no-install-recommends" in apt
    assert [a for a in apt if "=" in a] == [f"{k}={v}" for k, v in sorted(image.packages.items())]
    [pip] = [r for r in runs if r[:4] == ["python3", "-m", "pip", "install"]]
    assert pip[4:] == sorted(image.python_packages)
    labels = _instructions(text, "LABEL")[0]
    assert f'gpupool.declaration-digest="{environment_image.digest("pytorch", image)}"' in labels
    assert 'org.opencontainers.image.version="1.4.0"' in labels
    assert 'org.opencontainers.image.title="pytorch"' in labels


def test_an_image_without_packages_installs_nothing() -> None:
    d = loader.parse(_with(packages={}, python_packages=[]), "test")
    text = environment_image.containerfile("pytorch", d.environment_images["pytorch"])
    assert not _instructions(text, "RUN")


def test_hostile_but_valid_values_cannot_break_out() -> None:
    # The oddest values each pattern takes: epochs, tildes, plus signs, dots, digests.
    odd = {"version": "0.0.0-rc.1.a",
           "base": f"a-b.c:1/x__y.z/w--v:T_a.g-1@sha256:{SHA}",
           "packages": {"g++-14": "1:14.2.0~rc1+dfsg-1~exp.2", "lib.x+y": "0~0"},
           "python_packages": ["A._-b==1.2.3rc4.post5.dev6"]}
    d = loader.parse(_with(**odd), "test")
    text = environment_image.containerfile("pytorch", d.environment_images["pytorch"])
    lines = text.splitlines()
    assert lines[0].startswith("# Written by gpupool")
    for line in lines[1:]:
        word, _, rest = line.partition(" ")
        assert word in {"FROM", "ARG", "LABEL", "RUN"}, line
        assert "\\" not in line and "$" not in line and "\t" not in line
        if word == "RUN":
            argv = json.loads(rest)
            assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
            assert all(" " not in a and not set(a) & set(";&|`'\"<>") for a in argv)
    assert _instructions(text, "FROM") == [odd["base"]]
    # Each label value is one JSON string: nothing after it but the next key.
    label = _instructions(text, "LABEL")[0]
    pairs = re.findall(r'([a-z.-]+)=("[^"]*")', label)
    assert " ".join(f"{k}={v}" for k, v in pairs) == label


def test_the_reference_names_registry_pool_image_and_version(desc: Description) -> None:
    [pytorch, tools] = environment_image.render(desc, "registry.lab:5000")
    assert pytorch.reference == f"registry.lab:5000/{desc.pool.name}/pytorch:1.4.0"
    assert tools.name == "tools"


@pytest.mark.parametrize("registry", ["", "a b", "host/x", "host:port", "host\n", "-host",
                                      "$(id)"])
def test_a_bad_registry_is_refused(desc: Description, registry: str) -> None:
    with pytest.raises(ValueError, match="registry"):
        environment_image.render(desc, registry)


# The command.

@pytest.fixture
def described(tmp_path: Path) -> Path:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(_raw()))
    return path


def test_images_lists_digests_and_references(described: Path, desc: Description,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli_lines(["images", "--file", str(described), "--json",
                         "--registry", "reg.example:5000"], capsys)
    assert code == 0
    listed = json.loads(out)
    assert listed["registry"] == "reg.example:5000"
    assert [i["name"] for i in listed["images"]] == ["pytorch", "tools"]
    assert listed["images"][0]["digest"] == environment_image.digest(
        "pytorch", desc.environment_images["pytorch"])
    code, out, _ = _cli_lines(["images", "--file", str(described)], capsys)
    assert code == 0 and "pytorch" in out and "sha256:" in out


def test_images_prints_a_containerfile(described: Path, desc: Description,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli_lines(["images", "--file", str(described), "--containerfile", "pytorch"],
                        capsys)
    assert code == 0
    assert out == environment_image.containerfile("pytorch",
                                                  desc.environment_images["pytorch"])


@pytest.mark.parametrize("argv", [["--containerfile", "pytroch"],
                                  ["--registry", "bad host"]])
def test_images_refuses_with_a_message(described: Path, argv: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli_lines(["images", "--file", str(described), *argv], capsys)
    assert code == 2 and "Traceback" not in out + err
    assert "--containerfile" in err or "--registry" in err
    if "pytroch" in argv:
        assert "did you mean `pytorch`" in err


def test_images_of_a_pool_without_any(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli_lines(["images", "--stack", "lab", "--json"], capsys)
    assert code == 0 and json.loads(out)["images"] == []
