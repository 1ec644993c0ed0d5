"""The `gpupool` command line: parse, load the description, run one verb.

Exit codes: 0 success; 1 the description (or what was checked) is invalid, or a file or
the lab failed; 2 usage error; 70 an internal error (a bug: --debug shows the traceback).
The gate adds 3: a node could not be gated.

Every verb takes --json: stdout then holds one JSON object, for success and for every
failure. A success is the verb's own object, which has no "error" key. A failure, whatever
stopped the verb (usage, a missing extra, an invalid description, a file, a refused output,
a bug), is {"command": VERB or null, "exit_code": N, "error": {"kind": KIND, "message":
TEXT, ...}} with KIND one of FAILURE_KINDS; an invalid description adds "valid": false,
"stack", "description", "source" and "problems", as `validate --json` gives them when
valid. People's one line still goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import NoReturn

from rich.markup import escape

from gpupool.cli import registry
from gpupool.cli.output import (
    EXIT_INTERNAL,
    EXIT_INVALID,
    EXIT_USAGE,
    Failure,
    OutputRefused,
    UsageError,
    busy,
    emit_json,
    err,
    header,
    named,
    problem_line,
    tell,
)
from gpupool.paths import PROJECT_FILE, find_project
from gpupool.spec import connection, loader
from gpupool.spec.errors import DescriptionError, Problem, printable
from gpupool.spec.model import Description

DEFAULT_STACK = "lab"


def project(args: argparse.Namespace) -> Path:
    """The pool project a command works in: --project, else the nearest folder from here
    upwards that holds a Pulumi.yaml. Stacks, their descriptions and stack settings resolve
    there, never beside the installed package."""
    if args.project:
        root = Path(args.project).resolve()
        if not (root / PROJECT_FILE).is_file():
            raise DescriptionError(str(root), [Problem(
                "--project", "project-exists", f"no {PROJECT_FILE} in this folder", str(root))])
        return root
    found = find_project(Path.cwd())
    if found is None:
        raise DescriptionError(str(Path.cwd()), [Problem(
            "--project", "project-exists", f"no {PROJECT_FILE} here or in a folder above: "
            "run `gpupool init DIR` to create a pool project, or pass --project DIR",
            str(Path.cwd()))])
    return found


def default_stack(root: Path) -> str:
    """A project made by `gpupool init` has one stack, and its verbs should not need
    --stack; with several, the lab's (a misspelled or missing one lists those that exist)."""
    found = loader.stacks(root)
    return found[0] if len(found) == 1 else DEFAULT_STACK


def load(args: argparse.Namespace) -> Description:
    """The description; for a stack, its connection settings too (args.connection), checked
    by every verb as the description is."""
    args.connection = None
    # A spinner on stderr, shown only on a terminal: thousands of nodes take seconds.
    with busy("reading and validating the description"):
        if args.file:
            args.description = Path(args.file).resolve()
            return loader.load_file(Path(args.file))
        args.stack = args.stack or default_stack(args.project_root)
        args.description = loader.description_path(args.stack, args.project_root)
        desc, args.connection = connection.load(args.stack, args.project_root)
    return desc


class _Version(argparse.Action):
    """--version, looked up only when asked for (reading package metadata costs more than
    a light verb's whole run)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        import importlib.metadata  # noqa: PLC0415 - see the class docstring

        try:
            version = importlib.metadata.version("gpupool")
        except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
            version = "(not installed)"
        parser.exit(message=f"gpupool {version}\n")


def _document_defaults(p: argparse.ArgumentParser) -> None:
    """Every option with a default says it in its help (a verb's own wording wins)."""
    for action in p._actions:  # argparse has no public walk of a parser's options
        if (action.option_strings and action.default not in (None, False, argparse.SUPPRESS)
                and action.default != [] and action.nargs != 0
                and "default" not in (action.help or "")):
            shown = (",".join(map(str, action.default)) if isinstance(action.default, list)
                     else str(action.default))
            action.help = f"{action.help or ''} (default: {shown})".lstrip()


def _common(p: argparse.ArgumentParser) -> None:
    """The options every verb that reads a description takes."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--stack", help=f"stack name (default: the project's only stack, "
                                     f"else {DEFAULT_STACK})")
    src.add_argument("--file", help="a description file instead of a stack")
    p.add_argument("--project", help="the pool project folder (default: the nearest "
                                     f"folder from here upwards with a {PROJECT_FILE})")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _missing_extra(p: argparse.ArgumentParser, verb: str) -> None:
    """A verb whose extra is not installed: its help says which to install, and whatever
    it is given, running it says so too (main, exit 2)."""
    extra, module = registry.MISSING[verb]
    p.description = (f"{registry.VERBS[verb][1]}. Needs the {extra} extra, which is not "
                     f"installed (no module {module}): pip install 'gpupool[{extra}]'")


def build_parser(wanted: str | None = None, *, light: bool = False) -> argparse.ArgumentParser:
    """The parser, with the wanted verb's own options (every verb's when wanted is None).
    light: import no verb's module unless wanted is a verb (`--help`, `--version` and a
    mistyped verb list the verbs from registry.VERBS alone)."""
    if wanted in registry.VERBS or not light:
        registry.load(wanted if wanted in registry.VERBS else None)
    parser = _Parser(prog="gpupool", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_) in registry.VERBS.items():
        p = sub.add_parser(name, help=help_)
        if name in registry.MISSING:
            _missing_extra(p, name)
        elif name in registry.COMMANDS:
            _common(p)
        p.add_argument("--debug", action="store_true",
                       help="show the traceback of an internal error")
        if name in registry.COMMANDS:
            registry.COMMANDS[name][2](p)
        elif name in registry.PLAIN:
            registry.PLAIN[name][2](p)
        _document_defaults(p)
    return parser


def report_invalid(exc: DescriptionError, args: argparse.Namespace) -> int:
    if args.json:
        failed = Failure("invalid", f"{exc.source}: {len(exc.problems)} problem(s); nothing "
                         "was changed", EXIT_INVALID)
        # A file's full path, as a valid description's "source" is (validate).
        source = Path(exc.source)
        emit_json({**failed.as_json(args.command), "valid": False, **named(args),
                   "source": str(source.resolve()) if source.is_file() else exc.source,
                   "problems": [p.as_dict() for p in exc.problems]})
    else:
        # One line per problem: readable, and greppable in CI logs.
        header(err, f"[bold red]invalid[/]: {escape(printable(str(exc.source), 10_000))}: "
                    f"{len(exc.problems)} problem(s); nothing was changed")
        for p in exc.problems:
            err.print(problem_line(p), highlight=False, soft_wrap=True)
    return EXIT_INVALID


def run(args: argparse.Namespace) -> int:
    if args.command in registry.PLAIN:
        return registry.PLAIN[args.command][1](args)
    _, handler, _ = registry.COMMANDS[args.command]
    collecting = gc.isenabled()
    if args.command in registry.BATCH:
        gc.disable()  # reference counting still frees all but cycles: see registry.BATCH
    args.description = None
    try:
        args.project_root = None if args.file and not args.project else project(args)
        return handler(args, load(args))
    except DescriptionError as exc:
        return report_invalid(exc, args)
    finally:
        if collecting:
            gc.enable()


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are a JSON failure on stdout under --json."""

    json_for: str | bool | None = False  # main sets it: the verb, under --json

    def error(self, message: str) -> NoReturn:
        if _Parser.json_for is not False:
            self.print_usage(sys.stderr)
            err.print(f"{self.prog}: error: {message}", markup=False, highlight=False)
            emit_json(Failure("usage", f"{self.prog}: {message}", EXIT_USAGE).as_json(
                _Parser.json_for))
            self.exit(EXIT_USAGE)
        super().error(message)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    wanted = next((a for a in argv if not a.startswith("-")), None)
    verb = wanted if wanted in registry.VERBS else None
    as_json = "--json" in argv
    _Parser.json_for = verb if as_json else False
    try:
        parser = build_parser(wanted, light=True)
        if wanted in registry.MISSING and not {"-h", "--help"} & set(argv):
            # Whatever the verb was given: its options are unknown without its module.
            return tell(missing_extra(wanted, *registry.MISSING[wanted]), wanted, as_json)
        args = parser.parse_args(argv)
    finally:
        _Parser.json_for = False
    try:
        return run(args)
    except KeyboardInterrupt:
        return tell(Failure("interrupted", "interrupted", 130), args.command,
                    getattr(args, "json", False))
    except Exception as exc:
        if args.debug:
            raise
        return tell(failure(exc, args.command), args.command, getattr(args, "json", False))


def failure(exc: Exception, command: str) -> Failure:
    """What stopped a verb: a usage error, a file, a missing extra, an encoding, the
    project's own errors, or a bug."""
    for cls, kind, code in ((UsageError, "usage", EXIT_USAGE),
                            (OutputRefused, "output", EXIT_INVALID)):
        if isinstance(exc, cls):
            return Failure(kind, str(exc), code)
    if isinstance(exc, OSError):
        # A file the command reads or writes: name it, as validation names a field.
        where = str(exc.filename or "(file)")
        return Failure("file", f"{where}: [file] {exc.strerror or exc}", EXIT_INVALID,
                       {"path": exc.filename})
    extra = registry.extra_of(exc)
    if extra is not None:
        return missing_extra(command, extra, getattr(exc, "name", ""))
    if isinstance(exc, UnicodeDecodeError):
        return Failure("encoding", f"[encoding] an input file is not UTF-8 text (byte "
                       f"0x{exc.object[exc.start]:02x} at offset {exc.start})", EXIT_INVALID)
    if type(exc).__module__.startswith("gpupool."):
        # The project's own errors (the lab, Slurm, a trace) carry a message for people.
        return Failure("failed", str(exc), EXIT_INVALID)
    return Failure("internal", f"{type(exc).__name__}: {exc} (run again with --debug for "
                   "the traceback)", EXIT_INTERNAL)


def missing_extra(command: str, extra: str, module: str) -> Failure:
    install = f"pip install 'gpupool[{extra}]'"
    return Failure("extra", f"[extra] `gpupool {command}` needs the {extra} extra (no module "
                   f"{module}): {install}", EXIT_USAGE, {"extra": extra, "install": install})
