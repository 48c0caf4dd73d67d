"""Arguments shared by commands that take a workload (model, cluster, GPUs, batch, sequence)."""
from __future__ import annotations

import argparse

from clusters import load_cluster
from specs.errors import UsageError  # noqa: F401  (re-exported for the commands)
from specs.models import load_model
from specs.workload import Workload


def add_workload_args(p: argparse.ArgumentParser, *, gpus_required: bool = False) -> None:
    p.add_argument("--model", required=True, help="preset name, model YAML, or HF config.json")
    p.add_argument("--cluster", required=True, help="hardware kind (clusters/*.yaml) or a YAML file")
    p.add_argument("--gpus", type=int, default=None, required=gpus_required,
                   help="number of devices (default: one node)")
    p.add_argument("--gbs", type=int, required=True, help="global batch size in sequences")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--precision", default="bf16",
                   help="bf16, fp8 (any fp8 recipe the hardware has) or one recipe: "
                        "fp8-tensorwise, fp8-delayed, fp8-blockwise, mxfp8")


def workload_from_args(args) -> Workload:
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpus)
    return Workload(model=model, cluster=cluster, gbs=args.gbs, seq=args.seq or model.seq_length)


def add_stack_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", default="auto",
                   help="target stack profile: auto (gpu-full on GPUs, cpu-local on CPU), gpu-full, "
                        "gpu-te (no DeepEP/HybridEP), gpu-plain (no TransformerEngine), cpu-local")


def completed_plan(args, workload):
    """The user's (possibly partial) --plan completed with documented defaults, and the profile."""
    from specs.stack import profile_for
    from tuner.complete import complete_plan
    profile = profile_for(workload.cluster, getattr(args, "stack", "auto"))
    return complete_plan(args.plan, workload, profile, args.precision), profile


def positive_int(text: str) -> int:
    """argparse type for sizes and counts: a whole number > 0 (argparse prints the error, exit 2)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {v}")
    return v


def add_cost_model_args(p: argparse.ArgumentParser) -> None:
    """--tables and --calibration: which performance tables and which calibration term to use."""
    p.add_argument("--tables", default=None,
                   help="Table directory to use; by default the measured $MOETUNE_HOME/tables/<kind> when "
                        "`moetune profile` wrote it, else the shipped clusters/tables/<kind>.")
    p.add_argument("--calibration", default=None,
                   help="Calibration JSON to use; by default $MOETUNE_HOME/calibration/<kind>.json when it was "
                        "fitted on the tables in use, else the shipped GPU fit (identity on CPU).")
