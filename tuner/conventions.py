"""What the CLI promises callers: its exit codes, its version, and the shape of `--json` errors.

Exit codes (README "Exit codes"): 0 ok; 2 bad input or a plan the target stack cannot run
(unrealizable); 3 a plan the cost model predicts will not fit in memory (`predict` prints it
first; `emit` writes nothing unless --force). In `--json` mode an error is one JSON object on
stdout, `{"schema_version", "ok": false, "exit_code", "error": {"code", "message", "reasons":
[{"code", "message"}]}}`, besides the one line on stderr; every `--json` result of predict carries
`schema_version` too.
"""
from __future__ import annotations

import json
from importlib import metadata

from specs.errors import UsageError

EXIT_OK, EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT = 0, 2, 3
SCHEMA_VERSION = 1

# exception class name -> the error's code in JSON (specs.errors and tuner.commands.common)
_ERROR_CODES = {"SpecError": "bad-spec", "PlanSyntaxError": "bad-plan", "LayoutError": "bad-layout",
                "UsageError": "bad-usage", "UnrealizablePlanError": "unrealizable"}


def moetune_version() -> str:
    """The installed distribution's version (pyproject.toml); "unknown" when run from a bare tree."""
    try:
        return metadata.version("moetune")
    except metadata.PackageNotFoundError:
        return "unknown"


def error_json(exc: Exception, exit_code: int = EXIT_BAD_INPUT) -> str:
    """One `--json` error object for an InputError (realizability reasons as {code, message})."""
    reasons = [{"code": r.code, "message": r.sentence} if hasattr(r, "sentence") else {"code": "", "message": str(r)}
               for r in getattr(exc, "reasons", [])]
    code = next((_ERROR_CODES[t.__name__] for t in type(exc).__mro__ if t.__name__ in _ERROR_CODES), "bad-input")
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return json.dumps({"schema_version": SCHEMA_VERSION, "ok": False, "exit_code": exit_code,
                       "error": {"code": code, "message": message, "reasons": reasons}}, indent=1)


def workload_json(mode: str, model: str, cluster: str, gpus: int, precision: str, **specific) -> dict:
    """The fields every `--json` result of predict starts with, the same keys for training and
    serving (`specific`: gbs/seq for training, isl/osl/concurrency/phase for serving)."""
    return {"schema_version": SCHEMA_VERSION, "moetune_version": moetune_version(), "mode": mode,
            "workload": {"model": model, "cluster": cluster, "gpus": gpus, "precision": precision, **specific}}


class UnrealizablePlanError(UsageError):
    """A plan the target stack cannot run. `reasons` are the realizability checker's `Reason`s."""

    def __init__(self, message: str, reasons: list):
        super().__init__(message)
        self.reasons = reasons


def unrealizable(reasons: list, target, *, one_line: bool = False, hint: str = "") -> UnrealizablePlanError:
    """The error for a plan with realizability `reasons` on `target` (a stack profile, or the name
    of the serving stack): a first line naming the first reason, then one line per other reason, or
    (`one_line`) the reasons joined by "; "."""
    head = f"plan is not realizable on {getattr(target, 'name', target)}"
    if one_line:
        return UnrealizablePlanError(f"{head}: " + "; ".join(str(r) for r in reasons), reasons)
    # the first line names the problem on its own (the first reason); any others follow, one a line
    more = [f"{len(reasons) - 1} more below"] if len(reasons) > 1 else []
    note = "; ".join(more + ([hint] if hint else []))
    first = f"{head}: {reasons[0]}" + (f" ({note})" if note else "") if reasons else head
    return UnrealizablePlanError("\n".join([first] + [f"  {r}" for r in reasons[1:]]), reasons)
