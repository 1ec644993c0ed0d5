"""Hostile and broken inputs: every one is a problem in the usual format with exit 1 (or a
usage error, exit 2), never a traceback, and the loader refuses costly files cheaply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool import cli
from gpupool.spec import loader
from gpupool.spec.errors import DescriptionError
from gpupool.workload import audit
from tests.conftest import ROOT
from tests.test_audit import TRACE as ALIBABA

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi",
                                                                   strict=True))
# name -> (file content, the one problem's rule)
FILES: dict[str, tuple[bytes, str]] = {
    "billion-laughs": (LAUGHS.encode(), "yaml-aliases"),
    "binary-garbage": (b"\xff\xfe\x00garbage\x00\x01\x02", "encoding"),
    "latin-1": ("pool: {name: caf\u00e9}\n".encode("latin-1"), "encoding"),
    "python-tag": (b"pool: !!python/object/apply:os.system [id]\n", "yaml"),
    "unhashable-key": (b"? [a, b]\n: 1\n", "yaml"),
    "deep-nesting": (b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n", "yaml"),
    "unclosed-flow": (b"pool: {name: lab\n", "yaml"),
    "too-large": (b"x: " + b"a" * (loader.MAX_BYTES + 10) + b"\n", "file-size"),
    "duplicate-after-merge": (b"a: &a {b: 1}\nc:\n  <<: *a\n  d: 1\n  d: 2\n", "yaml"),
    # Python refuses to convert decimals of over 4,300 digits; hex has no such limit.
    "huge-decimal": (b"version: " + b"9" * 5000 + b"\n", "yaml"),
    "huge-hex": (b"version: 0x" + b"f" * 5000 + b"\n", "yaml"),
}


@pytest.mark.parametrize("libyaml", [True, False], ids=["libyaml", "pure-python"])
@pytest.mark.parametrize("name", FILES)
def test_hostile_file_is_one_problem(tmp_path: Path, name: str, libyaml: bool,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Both readers: libyaml's where PyYAML has it, the pure-Python one where it does not.
    monkeypatch.setattr(loader.yaml, "__with_libyaml__", libyaml)
    content, rule = FILES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content)
    with pytest.raises(DescriptionError) as info:
        loader.load_file(path)
    (problem,) = info.value.problems
    assert problem.rule == rule, problem
    assert len(repr(problem.value)) < 200  # echoed values are cut short


def test_not_a_mapping_and_empty_file(tmp_path: Path) -> None:
    for text in ("- 1\n- 2\n", "", "42\n"):
        path = tmp_path / "d.yaml"
        path.write_text(text)
        with pytest.raises(DescriptionError) as info:
            loader.load_file(path)
        assert [p.path for p in info.value.problems] == ["(top)"]


def test_merge_keys_are_accepted(tmp_path: Path) -> None:
    text = loader.description_path("lab", ROOT).read_text()
    head = "    class: lab-l4\n    rack: r1\n    owner_team: vision\n"
    assert text.count("  lab-gpu1:\n" + head) == 1 and text.count("  lab-gpu2:\n" + head) == 1
    text = text.replace("  lab-gpu1:\n" + head, "  lab-gpu1: &gpu\n" + head)
    text = text.replace("  lab-gpu2:\n" + head, "  lab-gpu2:\n    <<: *gpu\n")
    path = tmp_path / "merged.yaml"
    path.write_text(text)
    merged = loader.load_file(path)
    plain = loader.load_stack("lab", ROOT)
    assert merged.nodes == plain.nodes  # lab-gpu2 keeps its own addresses over the merged


def test_a_byte_order_mark_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + loader.description_path("lab", ROOT).read_bytes())
    assert loader.load_file(path).pool.name == "lab"


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # argparse: usage errors
        rc = int(exc.code or 0)
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {"missing": tmp_path / "missing.csv", "directory": tmp_path,
             "binary": tmp_path / "binary.csv", "wrong-header": tmp_path / "wrong.csv",
             "bad-values": tmp_path / "values.csv", "nul": tmp_path / "nul.csv"}
    files["binary"].write_bytes(b"\xff\xfe\x00\x01")
    files["wrong-header"].write_text("a,b\n1,2\n")
    files["bad-values"].write_text(
        "job_id,team,class,gpus,submit_s,duration_s\n1,vision,training,many,0,1\n")
    files["nul"].write_bytes(b"job_id,team\x00\n1,2\n")
    return files


@pytest.mark.parametrize("verb", ["audit --sacct", "audit --alibaba", "replay --trace",
                                  "replay --alibaba", "validate --file", "show --file",
                                  "inventory --file", "slurm render --file", "plan --file",
                                  "policy --file", "gate --file", "drill all --file",
                                  "lab status --file"])
def test_every_verb_turns_bad_files_into_problems(tmp_path: Path, verb: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for what, path in _bad_files(tmp_path).items():
        args = verb.split()
        argv = [*args, str(path)]
        if "--file" not in args:
            argv = [*argv, "--stack", "lab", "--out", str(tmp_path / "out")]
        rc, output = _cli(argv, capsys)
        assert "Traceback" not in output, (verb, what, output)
        assert rc in (cli.EXIT_INVALID, cli.EXIT_USAGE), (verb, what, rc, output)


@pytest.mark.parametrize("argv", [
    ["inventory", "--stack", "lab", "-o", "/nonexistent/folder/inventory.yml"],
    ["slurm", "render", "--stack", "lab", "--out", "/proc/no/such"],
    ["slurm", "render", "--stack", "lab", "--vars", "/proc/no/such/vars.yml"],
    ["validate", "--stack", "no-such-stack"],
    ["validate", "--stack", "../../etc/passwd"],
    ["audit", "--stack", "lab", "--wait-target", "soon"],
    # A target that is no number of seconds is refused, not sized for (nan passed `< 0`).
    *(["audit", "--stack", "lab", "--alibaba", str(ALIBABA), *bad] for bad in (
        ["--wait-target", "nan"], ["--wait-target", "inf"], ["--wait-target", "-1"],
        ["--wait-percentile", "nan"], ["--wait-percentile", "0"], ["--wait-percentile", "101"])),
    # Refused before the lab is touched (an unknown policy once ran as the baseline).
    *(["replay", "--stack", "lab", *bad] for bad in (
        ["--jobs", "-5"], ["--jobs", "0"], ["--jobs", "1e9"], ["--jobs", "20000"],
        ["--horizon", "nan"], ["--horizon", "-1"], ["--load", "inf"], ["--speedup", "0"],
        ["--timeout", "-3"], ["--policies", "nope"], ["--policies", ","],
        ["--policies", "gpupool,baseline,x"])),
    ["frobnicate"],
])
def test_bad_arguments_and_unwritable_outputs(argv: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rc, output = _cli(argv, capsys)
    assert "Traceback" not in output, output
    assert rc in (cli.EXIT_INVALID, cli.EXIT_USAGE), (rc, output)


def test_a_drill_report_that_is_not_one_is_refused_before_the_lab(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Drills take minutes and end by merging their figures into --report: a file that is
    not a drills report (run as root, `--report /etc/passwd`), a folder or a link is
    refused first, and left as it was."""
    foreign = tmp_path / "passwd"
    foreign.write_text("root:x:0:0:root:/root:/bin/bash\n")
    other = tmp_path / "other.json"
    other.write_text('{"not": "drills"}\n')
    link = tmp_path / "link.json"
    link.symlink_to(other)
    for path in (foreign, other, link, tmp_path):
        rc, output = _cli(["drill", "preemption", "--stack", "lab", "--report", str(path)],
                          capsys)
        assert rc == cli.EXIT_INVALID and "nothing was run" in output, (path, output)
    assert foreign.read_text().startswith("root:x:0:0")
    assert other.read_text() == '{"not": "drills"}\n'


@pytest.mark.parametrize("argv", [["inventory", "--stack", "lab", "-o"],
                                  ["slurm", "render", "--stack", "lab", "--vars"],
                                  ["inventory", "--stack", "lab", "--json", "-o"]])
def test_outputs_replace_only_what_gpupool_wrote(argv: list[str], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Run as root, `-o /etc/passwd` must not replace the system's: an existing file
    gpupool did not write is left alone without --force, a link or a folder always; a file
    gpupool wrote is regenerated in place."""
    foreign = tmp_path / "passwd"
    foreign.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "link").symlink_to(foreign)
    for path, rule in ((foreign, "output-exists"), (tmp_path / "link", "output-not-a-file"),
                       (tmp_path, "output-not-a-file")):
        rc, output = _cli([*argv, str(path)], capsys)
        assert rc == cli.EXIT_INVALID and f"{path}: [{rule}]" in output, output
        assert foreign.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    for path in (tmp_path / "link", tmp_path):
        rc, output = _cli([*argv, str(path), "--force"], capsys)
        assert rc == cli.EXIT_INVALID and "[output-not-a-file]" in output, output
    ours = tmp_path / "ours.yml"
    assert _cli([*argv, str(ours)], capsys)[0] == cli.EXIT_OK
    again = _cli([*argv, str(ours)], capsys)[0]
    # JSON carries no comment to say who wrote it: its second write needs --force.
    assert again == (cli.EXIT_INVALID if "--json" in argv else cli.EXIT_OK)
    assert _cli([*argv, str(foreign), "--force"], capsys)[0] == cli.EXIT_OK
    assert foreign.read_text() == ours.read_text()


def test_slurm_files_are_all_checked_before_any_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "slurm"
    assert _cli(["slurm", "render", "--stack", "lab", "--out", str(out)], capsys)[0] == 0
    (out / "topology.conf").write_text("# an operator's own\n")
    before = {p.name: p.read_text() for p in out.iterdir()}
    (out / "slurm.conf").write_text(before["slurm.conf"] + "# edited\n")
    rc, output = _cli(["slurm", "render", "--stack", "lab", "--out", str(out)], capsys)
    assert rc == cli.EXIT_INVALID and "topology.conf: [output-exists]" in output, output
    assert (out / "slurm.conf").read_text().endswith("# edited\n")  # nothing was written
    assert _cli(["slurm", "render", "--stack", "lab", "--out", str(out), "--force"],
                capsys)[0] == 0
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        **before, "topology.conf": (out / "topology.conf").read_text()}


def test_an_internal_error_is_one_line_unless_debugging(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gpupool.render import summary  # noqa: PLC0415

    def broken(_desc: object) -> object:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(summary, "summarize", broken)
    rc, output = _cli(["show", "--stack", "lab"], capsys)
    assert rc == cli.EXIT_INTERNAL and "Traceback" not in output
    assert "ZeroDivisionError: a bug" in output and "--debug" in output
    with pytest.raises(ZeroDivisionError):
        cli.main(["show", "--stack", "lab", "--debug"])


def test_invalid_json_output_names_the_problem(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS)
    rc, output = _cli(["validate", "--file", str(path), "--json"], capsys)
    assert rc == cli.EXIT_INVALID
    assert json.loads(output)["problems"][0]["rule"] == "yaml-aliases"


MARKUP = "x[/]y[bold]z"  # a closing tag with nothing to close, and a style


def test_values_that_look_like_markup_are_printed_as_they_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The consoles read markup; a value (a description's, a path, a trace's QoS class, a
    node name) is text: printed whole, never a style and never an internal error."""
    text = loader.description_path("lab", ROOT).read_text()
    described = tmp_path / "markup.yaml"
    described.write_text(text.replace("name: lab\n", f"name: '{MARKUP}'\n", 1))
    assert f"'{MARKUP}'" in described.read_text()
    pods = tmp_path / "pods.csv"
    pods.write_text(",".join(audit.ALIBABA_COLUMNS) + f"\np0,1,1000,{MARKUP},0,100,10\n")
    for argv, code in [
            (["validate", "--file", str(described)], cli.EXIT_INVALID),
            (["gate", MARKUP, "--stack", "lab"], cli.EXIT_USAGE),
            (["init", "--stack", MARKUP, str(tmp_path / "p1")], cli.EXIT_USAGE),
            (["init", str(tmp_path / MARKUP)], cli.EXIT_OK),
            (["audit", "--stack", "lab", "--alibaba", str(pods), "--out",
              str(tmp_path / MARKUP)], cli.EXIT_OK)]:
        rc, output = _cli(argv, capsys)
        assert (rc, MARKUP in " ".join(output.split())) == (code, True), (argv, rc, output)
    # The next step is pasted into a shell: the path is quoted for one.
    rc, output = _cli(["init", str(tmp_path / "a;b c")], capsys)
    assert f"cd '{tmp_path}/a;b c' && gpupool validate" in " ".join(output.split())
