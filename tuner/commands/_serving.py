"""Shared pieces of the serving commands (`emit vllm`, `serve-trial`): the serving workload and plan
flags, and the body of `emit vllm` (kept here so tuner/commands/emit.py only routes to it)."""
from __future__ import annotations

import argparse
from pathlib import Path

from clusters import load_cluster
from specs.errors import UsageError
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload
from tuner.commands.common import MAX_COUNT, count, number, tokens


def add_serve_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--isl", type=tokens, required=True, help="Input tokens per request.")
    p.add_argument("--osl", type=tokens, required=True, help="Output tokens per request.")
    p.add_argument("--concurrency", type=count(1, MAX_COUNT), default=16, help="Requests in flight (closed loop; default 16).")
    p.add_argument("--request-rate", type=number(0.0, 1e6), default=0.0,
                   help="Requests per second, Poisson arrivals (default 0: closed loop at --concurrency).")


def require_backend_runs_on(backend: str, cluster) -> None:
    """Refuse (exit 2, before any start-up) a serving engine that cannot run on `cluster`."""
    if backend == "sglang" and not cluster.is_gpu:
        raise UsageError("--backend sglang needs GPUs: SGLang 0.5.23 has no CPU kernels on PyPI (use vllm)")


def serve_workload_from_args(args) -> ServeWorkload:
    return ServeWorkload(isl=args.isl, osl=args.osl, concurrency=args.concurrency, request_rate=args.request_rate)


def serve_plan_from_args(args, devices: int) -> ServePlan:
    plan = ServePlan.parse(args.plan)
    if plan.gpus > devices:
        raise UsageError(f"plan {plan.canonical()} needs {plan.gpus} devices (tp*pp*dp), --gpus is {devices}")
    return plan


def run_vllm(args) -> int:
    """`moetune emit vllm`: print the vLLM server command of a serving plan; exit 2 with the reasons
    when vLLM cannot express it."""
    from tuner.emit_vllm import vllm_command
    load_model(args.model)  # a bad model reference is one line, exit 2
    cluster = load_cluster(args.cluster, args.gpus)
    plan = serve_plan_from_args(args, cluster.num_devices)
    ref = Path(args.model)
    model_path = str(ref.parent if ref.name == "config.json" else ref)
    max_len = args.isl + args.osl if args.isl and args.osl else None
    cmd, why = vllm_command(plan, model_path, served_name=ref.stem if ref.suffix else args.model,
                            max_model_len=max_len, cpu=not cluster.is_gpu, dummy=not ref.exists())
    if why:
        raise UsageError(f"vLLM cannot run plan {plan.canonical()}: " + "; ".join(f"{c}: {s}" for c, s in why))
    print(cmd)
    return 0
