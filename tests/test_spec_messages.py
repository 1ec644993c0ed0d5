"""What a refused description says (issue 52, "Messages"): a mistyped key names the key
meant, an unknown catalog name lists the known ones, a YAML syntax error is one plain
message with its line and column (a tab says so), a file that is no description says what
was expected, nothing ends in "(got None)" or shows a Python repr, hostile keys are never
echoed raw, and the header lines of the human output do not wrap when piped."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool import cli
from gpupool.cli import output
from gpupool.spec import loader
from gpupool.spec.catalog import GPU_MODELS, INSTANCE_TYPES
from gpupool.spec.errors import DescriptionError, Problem
from tests.conftest import ROOT, mutate, raw_stack

LAB = loader.description_path("lab", ROOT)


def _problems(data: Any) -> list[Problem]:
    with pytest.raises(DescriptionError) as info:
        loader.parse(data, "test")
    return info.value.problems


def _file_problems(tmp_path: Path, text: str | bytes) -> list[Problem]:
    path = tmp_path / "d.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(DescriptionError) as info:
        loader.load_file(path)
    return info.value.problems


def _only(problems: list[Problem], path: str) -> Problem:
    (found,) = [p for p in problems if p.path == path]
    return found


def _cli_lines(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def piped(monkeypatch: pytest.MonkeyPatch) -> None:
    """No terminal anywhere and COLUMNS unset: rich falls back to 80 columns."""
    def no_terminal(*_: object) -> os.terminal_size:
        raise OSError("not a terminal")

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    for console in (output.out, output.err):
        monkeypatch.setattr(console, "_width", None)
        monkeypatch.setattr(console, "_height", None)
    assert output.out.width == output.err.width == 80


# -- a mistyped key names the key meant -------------------------------------------------

@pytest.mark.parametrize(("ops", "path", "meant"), [
    # An alias is what a description writes (Node.class_ is `class`, Flow.from_ `from`).
    ([{"rename": "nodes.lab-gpu1.class", "to": "clas"}], "nodes.lab-gpu1.clas", "class"),
    ([{"rename": "network.flows[0].from", "to": "form"}], "network.flows[0].form", "from"),
    ([{"rename": "node_classes", "to": "node_class"}], "node_class", "node_classes"),
    ([{"rename": "pool.cost_centre", "to": "cost_center"}], "pool.cost_center",
     "cost_centre"),
    ([{"set": "burst_groups.l4-burst.max_node", "value": 2}],
     "burst_groups.l4-burst.max_node", "max_nodes"),
    ([{"set": "task_classes.interactive.idle_reclaim.actoin", "value": "cancel"}],
     "task_classes.interactive.idle_reclaim.actoin", "action"),
])
def test_a_mistyped_key_suggests_the_nearest_valid_one(ops: list[dict[str, Any]], path: str,
                                                        meant: str) -> None:
    problem = _only(_problems(mutate(raw_stack("lab"), ops)), path)
    assert problem.rule == "extra-forbidden"
    assert problem.message == f"unknown field; did you mean `{meant}`?"


def test_the_rest_still_comes_all_at_once() -> None:
    problems = _problems(mutate(raw_stack("lab"), [
        {"rename": "nodes.lab-gpu1.class", "to": "clas"},
        {"set": "software.cuda", "value": "12.x"}]))
    assert {(p.path, p.rule) for p in problems} >= {
        ("nodes.lab-gpu1.clas", "extra-forbidden"), ("nodes.lab-gpu1.class", "missing"),
        ("software.cuda", "pinned-version")}
    clas = _only(problems, "nodes.lab-gpu1.clas")
    assert str(clas) == ("nodes.lab-gpu1.clas: [extra-forbidden] unknown field; did you mean "
                         "`class`? (got 'lab-l4')")


def test_a_key_near_none_lists_the_keys_allowed_there() -> None:
    problem = _only(_problems(mutate(raw_stack("lab"), [
        {"set": "task_classes.interactive.idle_reclaim.zzz", "value": 1}])),
        "task_classes.interactive.idle_reclaim.zzz")
    # In the model's order, which is the order the documentation writes them in.
    assert problem.message == ("unknown field; expected one of: after, warn, action, "
                               "threshold_percent")


@pytest.mark.parametrize("key", [
    "\x1b[31mclas\x1b[0m",  # ANSI escapes
    "cla\u202ess",  # a bidirectional override
    "clas\nclass: evil",  # a newline
    "clas" + "x" * 100_000,  # huge
])
def test_a_hostile_key_is_never_echoed_raw(key: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    data = mutate(raw_stack("lab"), [{"rename": "nodes.lab-gpu1.class", "to": key}])
    (problem,) = [p for p in _problems(data) if p.rule == "extra-forbidden"]
    assert problem.message.startswith("unknown field; ")
    assert key not in problem.message and not re.search(r"[\x00-\x1f\x7f-\x9f\u202e]",
                                                        problem.message)
    assert len(problem.message) < 400
    src = tmp_path / "hostile.yaml"
    src.write_text(yaml.safe_dump(data))
    code, _, err = _cli_lines(["validate", "--file", str(src)], capsys)
    assert code == cli.EXIT_INVALID
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", err), repr(err[:500])
    assert len(err) < 5_000 and "Traceback" not in err


# -- an unknown catalog name lists the known ones ---------------------------------------

def test_an_unknown_instance_type_lists_the_known_ones() -> None:
    problem = _only(_problems(mutate(raw_stack("lab"), [
        {"set": "burst_groups.l4-burst.instance_types", "value": ["g6.12xlarg"]}])),
        "burst_groups.l4-burst.instance_types")
    assert problem.rule == "instance-type-known" and problem.value == "g6.12xlarg"
    assert problem.message == ("unknown instance type; did you mean `g6.12xlarge`? known: "
                               + ", ".join(sorted(INSTANCE_TYPES)))


def test_an_unknown_gpu_model_lists_the_known_ones() -> None:
    problem = _only(_problems(mutate(raw_stack("lab"), [
        {"set": "node_classes.lab-l4.gpu.model", "value": "L4"}])),
        "node_classes.lab-l4.gpu.model")
    assert problem.rule == "gpu-model-known"
    assert problem.message == ("unknown GPU model; did you mean `l4`? known: "
                               + ", ".join(sorted(GPU_MODELS)))


def test_a_name_near_no_known_one_only_lists_them() -> None:
    problem = _only(_problems(mutate(raw_stack("lab"), [
        {"set": "burst_groups.l4-burst.instance_types", "value": ["\x1b[2J" * 50]}])),
        "burst_groups.l4-burst.instance_types")
    assert problem.message == "unknown instance type; known: " + ", ".join(
        sorted(INSTANCE_TYPES))


# -- YAML syntax: one plain message with its line and column ------------------------------

LIBYAML = pytest.mark.parametrize("libyaml", [True, False], ids=["libyaml", "pure-python"])


@pytest.fixture
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader.yaml, "__with_libyaml__", request.param)


BOTH_READERS = pytest.mark.parametrize("reader", [True, False], indirect=True,
                                       ids=["libyaml", "pure-python"])
TAB = "tabs are not allowed for indentation in YAML; use spaces"


@BOTH_READERS
@pytest.mark.parametrize(("text", "where"), [
    ("version: 1\npool:\n\tname: lab\n", "line 3, column 1"),
    ("version: 1\npool:\n  name: lab\n \tdomain: x\n", "line 4, column 2"),
    ("pool:\n  name: lab\n\tdomain: x\n", "line 3, column 1"),
    ("a: |\n  x\n\ty\n", "line 3, column 1"),
    ("teams:\n\t- a\n", "line 2, column 1"),
])
def test_a_tab_says_so_with_line_and_column(tmp_path: Path, reader: None, text: str,
                                            where: str) -> None:
    (problem,) = _file_problems(tmp_path, text)
    assert (problem.path, problem.rule, problem.message, problem.value) == (
        where, "yaml", TAB, None)


def _plain(message: str) -> None:
    """A message for people: no Python repr, no PyYAML internals, no 'None'."""
    for bad in ("<unicode string>", "None", "'\\t'", "#x", "Mark", "instance of",
                "Input should be", "\n"):
        assert bad not in message, message


@BOTH_READERS
@pytest.mark.parametrize(("text", "where", "says"), [
    ("version: 1\npool: [a\n", "line 3, column 1",
     "while parsing a flow sequence at line 2, column 7"),
    ("pool: {name: lab\n", "line 2, column 1",
     "while parsing a flow mapping at line 1, column 7"),
    ("a: b: c\n", "line 1, column 5", "mapping values are not allowed"),
    ("a: 'unclosed\n", "line 2, column 1", "quoted scalar at line 1, column 4"),
    ("a: b\x1bc\n", "line 1, column 5", "character U+001B is not allowed in YAML"),
])
def test_a_syntax_error_is_one_plain_message(tmp_path: Path, reader: None, text: str,
                                             where: str, says: str) -> None:
    (problem,) = _file_problems(tmp_path, text)
    assert (problem.path, problem.rule, problem.value) == (where, "yaml", None)
    assert says in problem.message
    _plain(problem.message)
    assert "(got" not in str(problem)


@BOTH_READERS
@pytest.mark.parametrize(("text", "where", "message"), [
    ("version: 1\npool: {}\nversion: 1\n", "line 3, column 1",
     "duplicate key 'version' (first at line 1, column 1); a key may appear only once "
     "in a mapping"),
    ("nodes:\n  a: 1\n  \"a\": 2\n", "line 3, column 3",
     "duplicate key 'a' (first at line 2, column 3); a key may appear only once in a "
     "mapping"),
])
def test_a_duplicate_key_names_both_places(tmp_path: Path, reader: None, text: str,
                                           where: str, message: str) -> None:
    (problem,) = _file_problems(tmp_path, text)
    assert (problem.path, problem.rule, problem.message, problem.value) == (
        where, "yaml", message, None)


def test_a_hostile_duplicate_key_is_not_echoed_raw(tmp_path: Path) -> None:
    key = "\u202eevil" + "k" * 1000  # YAML's longest implicit key is 1024 characters
    (problem,) = _file_problems(tmp_path, f"{key}: 1\n{key}: 2\n".encode())
    assert problem.rule == "yaml" and len(problem.message) < 300
    assert "\u202e" not in problem.message and "\\u202e" in problem.message


# -- a file that is no description says what was expected ---------------------------------

@pytest.mark.parametrize(("text", "says", "value"), [
    ("", "the file is empty", None),
    ("# only\n# comments\n", "the file is empty", None),
    ("---\n", "the file is empty", None),
    ("- a\n- b\n", "the top level is a list", ["a", "b"]),
    ("hello\n", "the top level is a single value", "hello"),
    ("42\n", "the top level is a single value", 42),
])
def test_a_file_that_is_no_description_says_what_was_expected(
        tmp_path: Path, text: str, says: str, value: Any) -> None:
    (problem,) = _file_problems(tmp_path, text)
    assert (problem.path, problem.rule, problem.value) == ("(top)", "model-type", value)
    assert problem.message.startswith(says)
    assert "expected a pool description: a mapping with the keys version, pool, " in (
        problem.message)
    _plain(problem.message)
    assert not str(problem).endswith("(got None)")


@pytest.mark.parametrize(("ops", "path", "message"), [
    ([{"set": "pool", "value": None}], "pool",
     "expected a mapping with the keys name, environment, cost_centre, cloud_region, "
     "domain, operators, controller_login, monthly_budget_usd; it is empty"),
    ([{"set": "pool", "value": ["lab"]}], "pool",
     "expected a mapping with the keys name, environment, cost_centre, cloud_region, "
     "domain, operators, controller_login, monthly_budget_usd; it is a list"),
    ([{"set": "nodes", "value": "lab-gpu1"}], "nodes",
     "expected a mapping; it is a single value"),
    ([{"set": "pool.operators", "value": "alice"}], "pool.operators",
     "expected a list; it is a single value"),
    ([{"delete": "pool.name"}], "pool.name", "a required field is missing"),
])
def test_a_section_of_the_wrong_shape_says_what_was_expected(
        ops: list[dict[str, Any]], path: str, message: str) -> None:
    problem = _only(_problems(mutate(raw_stack("lab"), ops)), path)
    assert problem.message == message
    _plain(problem.message)


@pytest.mark.parametrize("text", ["", "# nothing\n", "version: 1\nversion: 1\n",
                                  "version: 1\npool: [a\n", "pool:\n\tname: x\n", "- 1\n"])
def test_nothing_ends_in_got_none(text: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "d.yaml"
    src.write_text(text)
    code, _, err = _cli_lines(["validate", "--file", str(src)], capsys)
    assert code == cli.EXIT_INVALID
    assert "(got None)" not in err and "<unicode string>" not in err, err
    assert "Traceback" not in err


def test_a_problem_without_a_value_says_no_got() -> None:
    assert str(Problem("pool.name", "missing", "a required field is missing")) == (
        "pool.name: [missing] a required field is missing")
    assert str(Problem("x", "r", "m", 0)) == "x: [r] m (got 0)"
    assert str(Problem("x", "r", "m", "")) == "x: [r] m (got '')"


# -- header lines do not wrap when piped --------------------------------------------------

def test_the_invalid_header_does_not_wrap_when_piped(
        piped: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path / ("a-very-long-folder-name-for-a-pool-project-" * 3) / "pools"
    deep.mkdir(parents=True)
    src = deep / "lab-with-a-long-name.yaml"
    src.write_text(yaml.safe_dump(mutate(raw_stack("lab"), [
        {"rename": "nodes.lab-gpu1.class", "to": "clas"}])))
    code, _, err = _cli_lines(["validate", "--file", str(src)], capsys)
    assert code == cli.EXIT_INVALID
    lines = err.splitlines()
    assert lines[0] == (f"invalid: {src}: 2 problem(s); nothing was changed"), err
    assert lines[1:] == [
        "  nodes.lab-gpu1.clas: [extra-forbidden] unknown field; did you mean `class`? "
        "(got 'lab-l4')",
        "  nodes.lab-gpu1.class: [missing] a required field is missing"]


def test_validate_s_header_lines_do_not_wrap_when_piped(
        piped: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli_lines(["validate", "--stack", "lab", "--project", str(ROOT)], capsys)
    assert code == cli.EXIT_OK
    lines = out.splitlines()
    assert re.fullmatch(r"valid: pool lab \(\d+ nodes, \d+ teams\)", lines[0])
    assert re.fullmatch(r"warning: pool lab is a lab description; it weakens \d+ control\(s\) "
                        r"production keeps:", lines[1]), lines[1]


def test_show_s_titles_do_not_wrap_or_pad_when_piped(
        piped: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = "lab-" + "x" * 36  # the longest a lab pool's bucket names allow
    src = tmp_path / "long.yaml"
    src.write_text(yaml.safe_dump(mutate(raw_stack("lab"), [
        {"set": "pool.name", "value": name}])))
    code, out, _ = _cli_lines(["show", "--file", str(src)], capsys)
    assert code == cli.EXIT_OK, out
    lines = out.splitlines()
    assert f"GPU capacity of pool {name} (lab)" in lines
    for title in ("Network segments", "Team quotas (GPUs; + borrowing limit)",
                  "Task classes"):
        assert title in lines
    # The tables themselves still fit 80 columns.
    assert max(len(line) for line in lines if line[:1] in "┏┃┡│├└") <= 80


def test_a_title_wider_than_the_console_is_whole_and_the_table_still_fits(
        piped: None, capsys: pytest.CaptureFixture[str]) -> None:
    # A production pool's name may take 63 characters: its capacity title takes 97.
    title = f"GPU capacity of pool {'p' * 63} (production)"
    capsys.readouterr()
    output.out.print(output.table(title, ["model", "notes"], [["h100", "word " * 40]], None))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == title
    assert max(len(line) for line in lines[1:]) <= 80
    assert sum("word" in line for line in lines) > 1  # the body still wraps at 80
