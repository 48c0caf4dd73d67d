"""The `moetune` console script.

Each subcommand lives in `tuner/commands/<name>.py` and exposes `SUMMARY` (one sentence, for the
command list), `DESCRIPTION` (for its own --help), `add_parser(subparsers)` and `run(args) -> int`;
they are discovered here, so adding a command touches no other file. User errors
(`specs.errors.InputError` and its kinds, and argparse's own) print one line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import optuna

import tuner.commands as commands_pkg
from specs.errors import InputError

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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2): a code, for callers of main() too
        return e.code if isinstance(e.code, int) else 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the one place: libraries log, the CLI decides
    try:
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


if __name__ == "__main__":
    sys.exit(main())
