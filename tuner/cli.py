"""`moetune` console script. Each subcommand lives in `tuner/commands/<name>.py` and exposes
`add_parser(subparsers)` and `run(args) -> int`; they are discovered here, so adding a command
touches no other file. User errors (`specs.errors.InputError` and its kinds) print one line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import optuna

import tuner.commands as commands_pkg
from specs.errors import InputError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moetune", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("_") or mod.name == "common":
            continue
        module = importlib.import_module(f"tuner.commands.{mod.name}")
        module.add_parser(sub).set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the one place: libraries log, the CLI decides
    try:
        return int(args._run(args) or 0)
    except InputError as e:
        print(f"moetune {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"moetune {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
