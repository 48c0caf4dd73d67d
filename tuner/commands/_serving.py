"""Shared pieces of the serving commands (`serve-trial`, `tune --mode serve`): the serving workload
and plan flags."""
from __future__ import annotations

import argparse

from specs.errors import UsageError
from specs.serve_plan import ServePlan


def add_serve_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--isl", type=int, required=True, help="Input tokens per request.")
    p.add_argument("--osl", type=int, required=True, help="Output tokens per request.")
    p.add_argument("--concurrency", type=int, default=None,
                   help="Requests in flight (closed loop; default 8 per device, tuner.predict_serve.default_concurrency).")
    p.add_argument("--request-rate", type=float, default=0.0,
                   help="Requests per second, Poisson arrivals (default 0: closed loop at --concurrency).")


def serve_plan_from_args(args, devices: int) -> ServePlan:
    plan = ServePlan.parse(args.plan)
    if plan.gpus > devices:
        raise UsageError(f"plan {plan.canonical()} needs {plan.gpus} devices (tp*pp*dp), --gpus is {devices}")
    return plan
