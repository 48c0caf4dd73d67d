"""One hierarchy for bad input. Anything derived from `InputError` is the user's to fix: the CLI
prints its message on one line and exits with code 2 (`tuner.cli`)."""
from __future__ import annotations


class InputError(ValueError):
    """Bad user input (a flag, a file, a plan string); one line, exit 2."""


class SpecError(InputError):
    """A model, cluster, workload or stack description that cannot be used."""


class PlanSyntaxError(InputError):
    """A plan string that does not parse or names an unknown field or value."""


class LayoutError(InputError):
    """A pipeline split that Megatron-core cannot build for this model."""


class UsageError(InputError):
    """A command-line combination that makes no sense (e.g. `--shard 3/2`)."""
