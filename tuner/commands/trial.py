"""`moetune trial`: run one plan for real with the Megatron-core trial backend and print the
measurement (exit 0) or the classified failure (exit 1); bad input, including a plan the target
stack cannot run, exits 2.

  moetune trial --model tiny-moe --cluster cpu-local --gbs 16 --seq 256 --plan "ep=2" \
      [--iters 5 --warmup 2] [--timeout 120] [--memory-cap-gib X] [--json] [--no-check]

A partial plan is completed by `tuner.rank.complete.complete_plan` (on cpu-local: dist_opt,
overlap_grad_reduce, overlap_param_gather and grouped_gemm off unless given) and checked by
`tuner.space.megatron_rules.check`; an unrealizable plan is refused with its reasons without launching (unless
--no-check, which hands it to megatron-core as given so its own validation answers).
"""
from __future__ import annotations

import json

from tuner.commands.common import (
    CPU_MEMORY_SHARE,
    MAX_COUNT,
    UsageError,
    add_plan_args,
    add_stack_arg,
    add_workload_args,
    count,
    fmt_gib,
    gib,
    host_available_gib,
    plan_completion,
    plan_text,
    positive_int,
    seconds,
    unrealizable,
    workload_from_args,
)
from tuner.space.megatron_rules import check

SUMMARY = "Run one plan with real megatron-core training steps and print what was measured."
DESCRIPTION = ("Run one plan for real with the Megatron-core trial backend (one process per rank) and print "
               "the measured step time, throughput, memory and losses (exit code 0) or the classified "
               "failure (exit code 1); a plan the target stack cannot run is refused with its reasons "
               "(exit code 2) unless --no-check.")


def add_parser(subparsers):
    p = subparsers.add_parser("trial", help=SUMMARY, description=DESCRIPTION)
    add_workload_args(p)
    add_stack_arg(p)
    add_plan_args(p, required=True)
    p.add_argument("--iters", type=positive_int, default=5, help="Timed training iterations (default 5).")
    p.add_argument("--warmup", type=count(0, MAX_COUNT), default=2, help="Untimed warm-up iterations before them (default 2).")
    p.add_argument("--timeout", type=seconds, default=600.0,
                   help="Seconds after which the trial is killed and reported as a timeout (default 600).")
    p.add_argument("--memory-cap-gib", type=gib, default=None,
                   help="Memory cap per rank in GiB; a rank above it fails as out of memory, and a plan predicted "
                        "above it is not launched (default: none on GPUs; on CPU 80%% of the host's available "
                        "memory over the ranks).")
    p.add_argument("--no-check", action="store_true",
                   help="Skip the realizability check and let megatron-core validate the plan itself.")
    p.add_argument("--json", action="store_true", help="Print the measurement or failure as one JSON object.")
    return p


def host_memory_cap(workload, plan, cap_gib: float | None) -> float | None:
    """The per-rank memory cap of a CPU trial (`cap_gib`, else CPU_MEMORY_SHARE of the host's
    available memory over the ranks), after refusing a plan whose predicted peak per rank is above
    it (UsageError with the numbers; nothing launched). None on GPUs (their memory is the plan's
    realizability business)."""
    if workload.cluster.is_gpu:
        return cap_gib
    import cost_model
    available = host_available_gib()
    world = workload.world
    cap = cap_gib if cap_gib is not None else CPU_MEMORY_SHARE * available / world
    need = float(cost_model.predict(workload, plan).peak_memory_gib)
    if need > cap:
        src = "--memory-cap-gib" if cap_gib is not None else \
            f"{CPU_MEMORY_SHARE:.0%} of the {fmt_gib(available)} this host has available, over {world} ranks"
        raise UsageError(f"the plan needs {fmt_gib(need)} per rank by the cost model ({fmt_gib(need * world)} for "
                         f"{world} ranks), above the cap of {fmt_gib(cap)} per rank ({src}); not launched")
    return cap


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
    completion, profile = plan_completion(args, workload)
    plan = completion.plan
    reasons = check(workload, plan, profile)
    if reasons and not args.no_check:
        raise unrealizable(reasons, profile, hint="--no-check hands it to megatron-core as given")
    cap = host_memory_cap(workload, plan, args.memory_cap_gib)
    backend = get_backend("megatron", enforce_cpu_support=not args.no_check)
    result = backend.run(plan, workload, Resources(devices=workload.world, timeout_s=args.timeout,
                                                   memory_cap_gib=cap),
                         iters=args.iters, warmup=args.warmup)
    ok = not isinstance(result, Failure)
    if args.json:
        print(json.dumps({**result.to_dict(), "completion": completion.to_dict()}, indent=2))
        return 0 if ok else 1
    shown = plan_text(plan, workload, profile, args.canonical)  # result.plan is its canonical string
    if ok:
        m = result
        print(f"plan            {shown}")
        print(f"completion      {completion.describe()}")
        print(f"step time       {m.step_time_s:.4f} s median (spread {m.step_time_spread_s:.4f} s, "
              f"{len(m.step_times_s)} iters)")
        print(f"tokens/s/device {m.tokens_per_s_per_gpu:.1f}")
        print(f"peak memory     {', '.join(f'{x:.3f}' for x in m.peak_memory_gib)} GiB per rank")
        print(f"losses          {', '.join(f'{x:.4f}' for x in m.losses)}")
        print(f"versions        {m.versions}")
    else:
        print(f"plan     {shown}")
        print(f"complete {completion.describe()}")
        print(f"FAILED   {result.kind}: {result.message}")
    return 0 if ok else 1
