"""What the commands share: the workload flags, the stack and cost-model flags, how a `--plan` is
completed and checked, and how a plan is printed. One implementation each, so every command that
takes a plan treats it the same way."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from clusters import load_cluster
from specs.errors import UsageError
from specs.models import load_model
from specs.workload import Workload
from tuner.conventions import UnrealizablePlanError, unrealizable

__all__ = ["UsageError", "UnrealizablePlanError", "add_workload_args", "workload_from_args", "add_stack_arg",
           "add_plan_args", "add_canonical_arg", "add_complete_arg", "completed_plan", "plan_completion",
           "unrealizable", "require_realizable", "plan_text", "positive_int",
           "check_output_dir", "check_output_file", "check_home",
           "CPU_MEMORY_SHARE", "host_available_gib", "default_cpu_memory_cap", "count", "number", "devices", "batch", "tokens", "seconds",
           "minutes", "gib", "MAX_DEVICES", "MAX_BATCH", "MAX_TOKENS", "MAX_COUNT", "MAX_SECONDS", "MAX_GIB",
           "add_cost_model_args", "cost_model_inputs", "fmt_seconds", "fmt_gib", "fmt_flops"]


# ---- numeric flags ---------------------------------------------------------------------------
# Every numeric flag of every command is parsed by one of the types below: finite numbers only (no
# nan, no inf), whole numbers where a count is meant, and an upper bound wherever a physical one
# exists. The bounds are far above any real deployment, so they only refuse typos and nonsense:
MAX_DEVICES = 1_000_000  # the largest training clusters announced by 2025 hold ~10^5 GPUs
MAX_BATCH = 1 << 24  # sequences per global batch (DeepSeek-V3 trained at 15360, arXiv 2412.19437)
MAX_TOKENS = 1 << 24  # tokens of one sequence or request (16 Mi; the longest contexts are ~10^7)
MAX_COUNT = 1_000_000  # iterations, trials, actors, requests in flight, ranked plans shown
MAX_SECONDS = 7 * 24 * 3600.0  # timeouts, budgets: a week
MAX_GIB = 1_000_000  # memory per rank, GiB (~1 PiB)


def count(lo: int = 1, hi: int = MAX_COUNT, what: str = "a whole number"):
    """argparse type: a whole number in [lo, hi] (the parser prints one line, exit 2)."""
    rng = f"a positive {what[2:] if what.startswith('a ') else what} up to {hi:,}" if lo == 1 \
        else f"{what} from {lo:,} to {hi:,}"

    def parse(text: str) -> int:
        try:
            v = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {rng}, got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be {rng}, got {v:,}")
        return v
    parse.__name__ = "whole number"  # argparse names the type in "invalid <name> value" messages
    return parse


def number(lo: float = 0.0, hi: float = float("inf"), *, lo_open: bool = False, hi_open: bool = False,
           what: str = "a number"):
    """argparse type: a finite number in [lo, hi] (`lo_open` / `hi_open`: the bound itself excluded)."""
    lo_s = f"{'>' if lo_open else '>='} {lo:g}"
    hi_s = "" if hi == float("inf") else f" and {'<' if hi_open else '<='} {hi:g}"

    def parse(text: str) -> float:
        try:
            v = float(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} {lo_s}{hi_s}, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"expected a finite number {lo_s}{hi_s}, got {text!r}")
        if (v <= lo if lo_open else v < lo) or (v >= hi if hi_open else v > hi):
            raise argparse.ArgumentTypeError(f"must be {lo_s}{hi_s}, got {v:g}")
        return v
    parse.__name__ = "number"
    return parse


positive_int = count(1, MAX_COUNT)  # sizes and counts with no tighter bound
devices = count(1, MAX_DEVICES)
batch = count(1, MAX_BATCH)
tokens = count(1, MAX_TOKENS)
seconds = number(0.0, MAX_SECONDS, lo_open=True, what="a number of seconds")
minutes = number(0.0, MAX_SECONDS / 60, lo_open=True, what="a number of minutes")
gib = number(0.0, MAX_GIB, lo_open=True, what="a size in GiB")


# ---- output paths ---------------------------------------------------------------------------
# Checked before a command does any work, so that a path that cannot be written costs one line
# (exit 2) and leaves nothing behind; nothing is created by the checks themselves.

def _nearest_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_creatable_dir(d: Path, flag: str, shown: Path) -> None:
    """`d` is a writable folder, or could be made as one (its nearest existing ancestor is a
    writable folder); errors name `flag` and `shown` (the path the user gave)."""
    base = _nearest_existing(d)
    if not base.is_dir():
        raise UsageError(f"{flag} {shown}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {shown}: {base} is not writable")


def check_output_dir(path, flag: str) -> Path:
    """A folder the command will write into (made if missing); UsageError if that cannot work."""
    d = Path(path)
    if not str(path).strip():
        raise UsageError(f"{flag}: an empty path")
    _check_creatable_dir(d, flag, d)
    return d


def check_output_file(path, flag: str) -> Path:
    """A file the command will write (its folder made if missing); UsageError if that cannot work."""
    f = Path(path)
    if not str(path).strip():
        raise UsageError(f"{flag}: an empty path")
    if f.is_dir():
        raise UsageError(f"{flag} {f}: is a folder, expected a file path")
    if f.exists() and not os.access(f, os.W_OK):
        raise UsageError(f"{flag} {f}: is not writable")
    _check_creatable_dir(f.parent, flag, f)
    return f


# Share of the host's available memory a CPU trial's ranks may use together by default: the rest is
# left to the launcher, Ray and the other users of the host (a trial over it is killed as OOM by
# the rank watcher rather than by the kernel's OOM killer).
CPU_MEMORY_SHARE = 0.8


def host_available_gib() -> float:
    import psutil
    return psutil.virtual_memory().available / 2**30


def default_cpu_memory_cap(world: int) -> float:
    """The per-rank memory cap of a CPU trial when --memory-cap-gib is not given."""
    return CPU_MEMORY_SHARE * host_available_gib() / max(int(world), 1)


def check_home() -> Path:
    """$MOETUNE_HOME (user state: tables, calibrations, Ray token, logs) as a usable folder."""
    from specs.home import moetune_home
    home = moetune_home()
    if home.exists() and not home.is_dir():
        raise UsageError(f"MOETUNE_HOME {home}: is a file, not a folder")
    base = _nearest_existing(home)
    if not base.is_dir():  # writability is checked by the commands that write there
        raise UsageError(f"MOETUNE_HOME {home}: {base} is a file, not a folder")
    return home


def add_workload_args(p: argparse.ArgumentParser, *, gpus_required: bool = False, gbs_required: bool = True) -> None:
    """--model, --cluster, --gpus, --gbs, --seq and --precision: what is trained, on what."""
    p.add_argument("--model", required=True,
                   help="Model to train: a preset name, a model YAML file or a Hugging Face config.json.")
    p.add_argument("--cluster", required=True,
                   help="Hardware kind (one of clusters/*.yaml) or a cluster YAML file.")
    p.add_argument("--gpus", type=devices, default=None, required=gpus_required,
                   help="Number of devices; by default one node of the cluster.")
    p.add_argument("--gbs", type=batch, required=gbs_required, help="Global batch size in sequences.")
    p.add_argument("--seq", type=tokens, default=None,
                   help="Sequence length in tokens; by default the model's own.")
    p.add_argument("--precision", default="bf16",
                   help="Training precision: bf16, fp8 (the best fp8 recipe the hardware has) or one recipe "
                        "(fp8-tensorwise, fp8-delayed, fp8-blockwise, mxfp8). Serving: the weight format only "
                        "when the checkpoint sets none and --weight-dtype is auto.")


def workload_from_args(args) -> Workload:
    """The Workload the workload flags describe (bad values raise an InputError: one line, exit 2)."""
    for flag in ("gbs", "seq", "gpus"):  # also for callers that build `args` without the parser
        v = getattr(args, flag, None)
        if v is not None and v <= 0:
            raise UsageError(f"--{flag} must be a positive whole number, got {v}")
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpus)
    seq = args.seq if args.seq is not None else model.seq_length
    return Workload(model=model, cluster=cluster, gbs=args.gbs, seq=seq)


def add_stack_arg(p: argparse.ArgumentParser) -> None:
    """--stack: which software stack the plan must be realizable on."""
    p.add_argument("--stack", default="auto",
                   help="Target stack profile: auto (gpu-full on GPUs, cpu-local on CPU), gpu-full "
                        "(megatron-core 0.16.1, TE 2.9, DeepEP, HybridEP), gpu-full-te2.11 (the same with TE "
                        "2.11), gpu-te (no DeepEP or HybridEP), gpu-plain (no TransformerEngine), installed "
                        "(this machine's packages) or cpu-local.")


def add_plan_args(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    """--plan (partial or canonical) and --canonical (print full plan strings)."""
    p.add_argument("--plan", required=required, default=None if required else "",
                   help='Plan string, canonical or partial (e.g. "tp=2,pp=8,vpp=4,ep=64"); the fields '
                        "not given are completed as --complete says.")
    add_complete_arg(p)
    add_canonical_arg(p)


def add_complete_arg(p: argparse.ArgumentParser, what: str = "--plan") -> None:
    p.add_argument("--complete", choices=["best", "defaults"], default="best",
                   help=f"How the fields {what} leaves out are completed: best (default: the realizable, "
                        "memory-feasible choice of recompute, overlaps, dispatcher and flex backend, precision "
                        "recipe within --precision, grouped GEMM and pipeline split with the highest predicted "
                        "throughput; parallel fields not given take the defaults) or defaults (the documented "
                        "defaults of tuner/rank/complete.py).")


def add_canonical_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--canonical", action="store_true",
                   help="Print plans as full canonical strings rather than their short form "
                        "(only the fields that differ from the completion defaults).")


def plan_completion(args, workload, tables=None, calibration=None, *, text: str | None = None):
    """(Completion, profile): the user's (possibly partial) `--plan` (or `text`) completed for
    `--stack` and `--precision` as `--complete` says (`tuner.rank.complete.complete`; a best completion
    scores its candidates with `tables` / `calibration`, None: the cost model's lookup rules).
    Every command that takes a plan goes through here."""
    from specs.stack import profile_for
    from tuner.rank.complete import complete
    profile = profile_for(workload.cluster, getattr(args, "stack", "auto"))
    given = args.plan if text is None else text
    c = complete(given or "", workload, profile, getattr(args, "precision", "bf16"),
                 getattr(args, "complete", "defaults") or "defaults", tables=tables, calibration=calibration)
    return c, profile


def completed_plan(args, workload, tables=None, calibration=None):
    """(plan, profile): `plan_completion`'s plan."""
    c, profile = plan_completion(args, workload, tables, calibration)
    return c.plan, profile


def require_realizable(workload, plan, profile, *, one_line: bool = False, hint: str = "") -> None:
    """Raise `unrealizable(...)` when `tuner.space.megatron_rules.check` finds reasons against `plan`."""
    from tuner.space.megatron_rules import check
    reasons = check(workload, plan, profile)
    if reasons:
        raise unrealizable(reasons, profile, one_line=one_line, hint=hint)


def plan_text(plan, workload, profile, canonical: bool = False) -> str:
    """How a command prints a plan: its short form (what `complete_plan` would not fill in by
    itself; "(defaults)" when that is nothing), or with `canonical` the full canonical string."""
    if canonical:
        return plan.canonical()
    from tuner.rank.complete import short_form
    return short_form(plan, workload, profile) or "(defaults)"


def fmt_seconds(x: float, width: int = 0) -> str:
    """A duration with a unit that suits it (s, ms or us): CPU plans run in milliseconds."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(x) >= 0.1 * scale or unit == "us":
            return f"{x / scale:{width}.3f} {unit}" if unit == "s" else f"{x / scale:{width}.2f} {unit}"
    return f"{x}"


def fmt_gib(x: float, width: int = 0) -> str:
    """A memory size in GiB, or MiB below 1 GiB (CPU toy models use a few MiB)."""
    return f"{x:{width}.1f} GiB" if abs(x) >= 1 or x == 0 else f"{x * 1024:{width}.1f} MiB"


def fmt_flops(tflops: float) -> str:
    """A rate given in TFLOP/s, with the prefix that shows its digits (GFLOP/s on CPU)."""
    for scale, unit in ((1.0, "TFLOP/s"), (1e-3, "GFLOP/s"), (1e-6, "MFLOP/s")):
        if abs(tflops) >= scale or unit == "MFLOP/s":
            return f"{tflops / scale:.1f} {unit}"
    return f"{tflops}"


def add_cost_model_args(p: argparse.ArgumentParser) -> None:
    """--tables and --calibration: which performance tables and which calibration term to use."""
    p.add_argument("--tables", default=None,
                   help="Table directory to use; by default the measured $MOETUNE_HOME/tables/<kind> when "
                        "`moetune profile` wrote it, else the shipped clusters/tables/<kind>.")
    p.add_argument("--calibration", default=None,
                   help="Calibration JSON to use; by default $MOETUNE_HOME/calibration/<kind>.json when it was "
                        "fitted on the tables in use, else the shipped GPU fit (identity on CPU).")


def cost_model_inputs(args, workload):
    """(Tables, Calibration) the flags of `add_cost_model_args` select, loaded once. A bad file
    raises a UsageError that names the flag and the file, e.g. `--calibration bad.json: not a
    calibration file (...)`."""
    import cost_model
    from cost_model.calibration import CalibrationError
    from cost_model.tables import TableError
    tables_arg, cal_arg = getattr(args, "tables", None), getattr(args, "calibration", None)
    try:
        tables = cost_model.resolve_tables(workload, tables_arg)
    except TableError as e:
        raise UsageError(f"--tables {e}" if tables_arg else str(e)) from None
    try:
        calibration = cost_model.resolve_calibration(workload, cal_arg, tables)
    except CalibrationError as e:
        raise UsageError(f"--calibration {e}" if cal_arg else str(e)) from None
    return tables, calibration
