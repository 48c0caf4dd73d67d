"""Shared pieces of the serving commands (`serve-trial`, `tune --mode serve`): the serving workload
and plan flags."""
from __future__ import annotations

import argparse

from specs.errors import UsageError
from specs.serve_plan import ServePlan
from tuner.commands.common import MAX_COUNT, count, number, tokens
from tuner.space.serve_precision import WEIGHT_DTYPES


def add_weight_dtype_arg(p) -> None:
    p.add_argument("--weight-dtype", dest="weight_dtype", choices=WEIGHT_DTYPES, default="auto",
                   help="Serving weight format: auto (default: the checkpoint's quantization_config, e.g. fp8 for "
                        "DeepSeek-V3; else --precision), bf16, fp8 (the server quantizes bf16 weights online), or "
                        "nvfp4 (an NVIDIA NVFP4 checkpoint of the model, e.g. nvidia/DeepSeek-R1-0528-FP4; Blackwell).")


def add_serve_args(p) -> None:
    g = p.add_argument_group("serving (--mode serve)")
    g.add_argument("--phase", default="both", choices=("both", "prefill", "decode"),
                   help="Serving phase: both (aggregated), or prefill or decode (one pool of a disaggregated deployment).")
    g.add_argument("--isl", type=tokens, default=None, help="Input tokens per request.")
    g.add_argument("--osl", type=tokens, default=None, help="Output tokens per request.")
    g.add_argument("--concurrency", type=count(1, MAX_COUNT), default=None,
                   help="Requests in flight over the whole deployment (default 8 per GPU; plans --rank sweeps "
                        "1..128 per GPU unless given); with --phase decode, the decode batch per GPU (default 16).")
    g.add_argument("--routing-skew", type=number(0.0, 10.0), default=0.0,
                   help="Zipf exponent of expert popularity for the distinct-experts term (0 = uniform).")
    g.add_argument("--ttft-slo", type=number(0.0, 3600.0, lo_open=True), default=None,
                   help="TTFT p90 bound in seconds. plans --rank: each plan at the most throughput within it; "
                        "predict: the prediction is checked against it; tune: the verdict's winner must meet it measured.")
    g.add_argument("--tpot-slo", type=number(0.0, 3600.0, lo_open=True), default=None,
                   help="TPOT p90 bound in seconds (as --ttft-slo).")


def add_serve_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--isl", type=tokens, required=True, help="Input tokens per request.")
    p.add_argument("--osl", type=tokens, required=True, help="Output tokens per request.")
    p.add_argument("--concurrency", type=count(1, MAX_COUNT), default=None,
                   help="Requests in flight (closed loop; default 8 per device, tuner.rank.serve_predict.default_concurrency).")
    p.add_argument("--request-rate", type=number(0.0, 1e6), default=0.0,
                   help="Requests per second, Poisson arrivals (default 0: closed loop at --concurrency).")


def require_backend_runs_on(backend: str, cluster) -> None:
    """Refuse (exit 2, before any start-up) a serving engine that cannot run on `cluster`."""
    if backend == "sglang" and not cluster.is_gpu:
        raise UsageError("--backend sglang needs GPUs: SGLang 0.5.23 has no CPU kernels on PyPI (use vllm)")


def serve_plan_from_args(args, devices: int) -> ServePlan:
    plan = ServePlan.parse(args.plan)
    if plan.gpus > devices:
        raise UsageError(f"plan {plan.canonical()} needs {plan.gpus} devices (tp*pp*dp), --gpus is {devices}")
    return plan
