"""`moetune trial`: run one plan for real with the Megatron-core trial backend and print the
measurement (exit 0) or the classified failure (exit 1); bad input exits 2.

  moetune trial --model tiny-moe --cluster cpu-local --gbs 16 --seq 256 --plan "ep=2" \
      [--iters 5 --warmup 2] [--timeout 120] [--memory-cap-gib X] [--json] [--no-check]

A partial plan is completed by `tuner.complete.complete_plan` (on cpu-local: dist_opt,
overlap_grad_reduce, overlap_param_gather and grouped_gemm off unless given) and checked by
`tuner.realize.check`; an unrealizable plan is reported without launching (unless --no-check,
which hands it to megatron-core as given so its own validation answers).
"""
from __future__ import annotations

import json

from tuner.commands.common import UsageError, add_stack_arg, add_workload_args, completed_plan, workload_from_args
from tuner.realize import check


def add_parser(subparsers):
    p = subparsers.add_parser("trial", help="run one plan with real megatron-core training steps",
                              description=__doc__.splitlines()[0])
    add_workload_args(p)
    add_stack_arg(p)
    p.add_argument("--plan", required=True, help="plan string, e.g. 'ep=2,mbs=2' (partial allowed)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up iterations (default 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the trial is killed")
    p.add_argument("--memory-cap-gib", type=float, default=None, help="per-rank memory cap (GiB)")
    p.add_argument("--no-check", action="store_true",
                   help="skip the realizability check and let megatron-core validate the plan")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def run(args) -> int:
    from trials import get_backend
    from trials.base import Failure, Resources

    if args.iters < 1 or args.warmup < 0:
        raise UsageError("--iters must be >= 1 and --warmup >= 0")
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    if args.memory_cap_gib is not None and args.memory_cap_gib <= 0:
        raise UsageError("--memory-cap-gib must be positive")
    workload = workload_from_args(args)
    plan, profile = completed_plan(args, workload)
    reasons = [str(r) for r in check(workload, plan, profile)]
    if reasons and not args.no_check:
        result = Failure(plan=plan.canonical(), kind="unrealizable", message="; ".join(reasons),
                         backend="megatron")
    else:
        backend = get_backend("megatron", enforce_cpu_support=not args.no_check)
        result = backend.run(plan, workload, Resources(devices=workload.world, timeout_s=args.timeout,
                                                       memory_cap_gib=args.memory_cap_gib),
                             iters=args.iters, warmup=args.warmup)
    ok = not isinstance(result, Failure)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    elif ok:
        m = result
        print(f"plan            {m.plan}")
        print(f"step time       {m.step_time_s:.4f} s median (spread {m.step_time_spread_s:.4f} s, "
              f"{len(m.step_times_s)} iters)")
        print(f"tokens/s/device {m.tokens_per_s_per_gpu:.1f}")
        print(f"peak memory     {', '.join(f'{x:.3f}' for x in m.peak_memory_gib)} GiB per rank")
        print(f"losses          {', '.join(f'{x:.4f}' for x in m.losses)}")
        print(f"versions        {m.versions}")
    else:
        print(f"plan     {result.plan}")
        print(f"FAILED   {result.kind}: {result.message}")
    return 0 if ok else 1
