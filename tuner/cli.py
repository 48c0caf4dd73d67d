"""The `moetune` console script.

Each subcommand lives in `tuner/commands/<name>.py` and exposes `SUMMARY` (one sentence, for the
command list), `DESCRIPTION` (for its own --help), `add_parser(subparsers)` and `run(args) -> int`;
they are discovered here, so adding a command touches no other file. User errors
(`specs.errors.InputError` and its kinds, and argparse's own) print one line and exit 2. Any other
error prints one line naming a log file that holds the traceback ($MOETUNE_HOME/logs/) and exits 1;
a closed stdout (`moetune predict ... | head -1`) ends the command quietly.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import os
import pkgutil
import sys
import tempfile
import traceback
from pathlib import Path

import optuna

import tuner.commands as commands_pkg
from specs.errors import InputError
from specs.home import moetune_home
from tuner.commands.common import check_home

DESCRIPTION = "Find the fastest realizable way to train a Mixture-of-Experts model with Megatron-core on a cluster."
HELP_TEXT = "Show this help message and exit."


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (and a pointer to --help) instead of the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parsers(parser: argparse.ArgumentParser):
    """The parser and every subcommand parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _parsers(sub)


def build_parser() -> argparse.ArgumentParser:
    from tuner.conventions import moetune_version
    parser = Parser(prog="moetune", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"moetune {moetune_version()}",
                        help="Show moetune's version and exit.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                title="commands", parser_class=Parser)
    for mod in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("_") or mod.name == "common":
            continue
        module = importlib.import_module(f"tuner.commands.{mod.name}")
        module.add_parser(sub).set_defaults(_run=module.run)
    for p in _parsers(parser):  # argparse's own "-h" text is lower case with no full stop
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                action.help = HELP_TEXT
    return parser


def _write_crash_log(command: str) -> str:
    """The current exception's traceback in a new file under $MOETUNE_HOME/logs/ (or the temporary
    folder when that cannot be written); its path, for the one line the user sees."""
    text = traceback.format_exc()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for folder in (moetune_home() / "logs", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=folder, prefix=f"moetune-{command}-{stamp}-", suffix=".log")
            with os.fdopen(fd, "w") as f:
                f.write(f"moetune {' '.join(sys.argv[1:])}\n{text}")
            return name
        except OSError:
            continue
    return "(no writable log folder)"


def _quiet_broken_pipe() -> None:
    """stdout's reader went away (`| head -1`): point stdout at /dev/null so that the interpreter's
    own flush at exit does not raise a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2): a code, for callers of main() too
        return e.code if isinstance(e.code, int) else 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the one place: libraries log, the CLI decides
    try:
        check_home()  # every command may read or write user state there
        return int(args._run(args) or 0)
    except InputError as e:
        print(f"moetune {args.command}: error: {e}", file=sys.stderr)
        if getattr(args, "json", False):  # a caller parsing stdout gets the error too
            from tuner.conventions import error_json
            print(error_json(e))
        return 2
    except KeyboardInterrupt:
        print(f"moetune {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 0
    except OSError as e:
        if e.filename is None:
            return _internal_error(args.command, e)
        # a file or folder that cannot be read or written (a path the user named, MOETUNE_HOME):
        # theirs to fix. The commands check their outputs first; this is the net under them.
        where = e.filename if e.filename2 is None else f"{e.filename} -> {e.filename2}"
        print(f"moetune {args.command}: error: {where}: {e.strerror or e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a bug or an environment problem: one line, the traceback in the log
        return _internal_error(args.command, e)


def _internal_error(command: str, e: BaseException) -> int:
    """One line for an error nobody anticipated (exit 1); its traceback goes to a log file."""
    log = _write_crash_log(command)
    first = (str(e).strip().splitlines() or [""])[0][:300]
    print(f"moetune {command}: internal error: {type(e).__name__}: {first} (traceback in {log})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
