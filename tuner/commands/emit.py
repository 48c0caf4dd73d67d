"""`moetune emit megatron|sglang`: the launch script of a training plan (Megatron-LM) or the launch
commands of a serving plan (SGLang 0.5.23: one node, several nodes, or a prefill/decode pair with
the router).

Refuses an unrealizable plan with its reasons (exit 2) and a plan the cost model predicts will not
fit in memory (exit 3, naming the numbers; --force writes it, labelled), writing nothing. Every file
starts with the header of tuner/emit/header.py.
"""
from __future__ import annotations

import argparse
import os
import sys

from specs.fileio import write_atomic
from tuner.commands._serving import add_weight_dtype_arg
from tuner.commands.common import (
    MAX_COUNT,
    UsageError,
    add_cost_model_args,
    add_plan_args,
    add_stack_arg,
    add_workload_args,
    check_output_file,
    cost_model_inputs,
    count,
    devices,
    plan_completion,
    plan_text,
    positive_int,
    require_realizable,
    tokens,
    unrealizable,
    workload_from_args,
)

SUMMARY = "Write the launch script of a training plan (Megatron-LM) or a serving plan (SGLang, vLLM)."
DESCRIPTION = ("Complete a partial plan (--complete best: the fastest realizable completion the cost model "
               "predicts; defaults: the documented defaults) and write the torchrun / Slurm launch script for "
               "Megatron-LM's pretrain_gpt.py that reproduces it; `emit sglang` writes the SGLang 0.5.23 launch "
               "commands of a serving plan and `emit vllm` the vLLM server command, each with the matching "
               "benchmark command (--gbs is not used there; --isl/--osl/--concurrency are the workload). "
               "Every file starts with a header: moetune's version, the target stack, the plan, the workload, "
               "what was assumed and the predicted numbers in the target's own log units, with the `moetune "
               "predict` command that reproduces them. Exit codes: 2 for a plan the target cannot run "
               "(with its reasons), 3 for a plan the cost model predicts will not fit in memory (--force "
               "writes it, labelled); nothing is written then.")


def add_parser(subparsers):
    p = subparsers.add_parser("emit", help=SUMMARY, description=DESCRIPTION)
    p.add_argument("target", choices=["megatron", "sglang", "vllm"],
                   help="Which launcher: megatron (a training plan), sglang or vllm (a serving plan).")
    add_workload_args(p, gbs_required=False)
    add_stack_arg(p)
    add_plan_args(p, required=True)
    add_cost_model_args(p)
    p.add_argument("--out", default=None, help="Path of the file to write; by default it is printed to stdout "
                                               "and nothing is written.")
    p.add_argument("--force", action="store_true",
                   help="Write the file even when the cost model predicts the plan does not fit in memory "
                        "(the header says FORCED and why).")
    p.add_argument("--train-iters", type=positive_int, default=50,
                   help="Megatron: training iterations the script runs (default 50).")
    g = p.add_argument_group("serving (sglang, vllm)")
    g.add_argument("--isl", type=tokens, default=None, help="Input tokens per request (required).")
    g.add_argument("--osl", type=tokens, default=None, help="Output tokens per request (required).")
    g.add_argument("--concurrency", type=count(1, MAX_COUNT), default=None,
                   help="Requests in flight over the deployment, as priced and as the benchmark command sends "
                        "them (default 8 per GPU).")
    add_weight_dtype_arg(g)
    g.add_argument("--model-path", default=None,
                   help="Model directory or Hugging Face id the server loads (default: the preset's Hugging Face "
                        "id, or the --model config.json's directory).")
    g.add_argument("--benchmark", action="store_true",
                   help="Random weights (--load-format dummy): a speed benchmark needing only the config. "
                        "A model with no Hugging Face id then gets a config-only directory beside --out.")
    g.add_argument("--nnodes", type=devices, default=None,
                   help="SGLang: nodes per server (default: as many as the plan's instance needs).")
    g.add_argument("--pd", action="store_true",
                   help="SGLang: a prefill/decode-disaggregated deployment (the plan's pd ratio, 1:1 if none) "
                        "with the router.")
    return p


def run(args) -> int:
    if args.out:  # before any work: a path that cannot be written is one line
        check_output_file(args.out, "--out")
    if args.target in ("sglang", "vllm"):
        return _run_serving(args)
    if args.gbs is None:
        raise UsageError("emit megatron: --gbs is required")
    import cost_model
    from tuner.emit.header import EXIT_DOES_NOT_FIT, megatron_does_not_fit, megatron_header, train_predict_argv
    from tuner.emit.megatron import megatron_script
    w = workload_from_args(args)
    tables, cal = cost_model_inputs(args, w)
    completion, profile = plan_completion(args, w, tables, cal)
    plan = completion.plan
    # one line: a script that wraps `emit` reads a single error line
    require_realizable(w, plan, profile, one_line=True)
    pred = cost_model.predict(w, plan, tables=tables, calibration=cal)
    if not pred.feasible and not args.force:
        print(f"moetune emit: {megatron_does_not_fit(pred)}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    header = megatron_header(w, plan, profile, pred, tables, cal, train_predict_argv(args, plan),
                             train_iters=args.train_iters, forced=not pred.feasible)
    text = megatron_script(w, plan, profile, train_iters=args.train_iters, header=header)
    if args.out:
        write_atomic(args.out, text)
        os.chmod(args.out, 0o755)
        print(f"wrote {args.out}  ({plan_text(plan, w, profile, args.canonical)})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    print(f"completion: {completion.describe()}", file=sys.stderr)
    return 0


def _model_path(args, model, out_dir: str | None) -> tuple[str, str | None]:
    """(the path or HF id the server loads, a config-only directory to write or None).

    Real weights need a real checkpoint: --model-path, the --model config.json's directory, or the
    preset's Hugging Face id. Only --benchmark (dummy weights) may fall back to a config-only
    directory, and only beside --out: printing a command writes nothing."""
    from pathlib import Path

    from specs.models import hf_id, is_hub_id
    if args.model_path:
        return args.model_path, None
    if is_hub_id(args.model):  # read from the local cache; the server loads the same id
        return args.model, None
    ref = Path(args.model)
    if ref.name == "config.json" and ref.exists():
        return str(ref.parent), None
    if ref.is_dir() and (ref / "config.json").exists():
        return str(ref), None
    repo = hf_id(model)
    if repo and getattr(args, "weight_dtype", "auto") == "nvfp4" and not args.benchmark:
        # the preset's repository holds its published (fp8 / bf16) weights, not an NVFP4 export
        raise UsageError(f"--weight-dtype nvfp4: {repo} is not an NVFP4 checkpoint; pass --model-path with one "
                         "(e.g. nvidia/DeepSeek-R1-0528-FP4) or --benchmark")
    if repo:
        return repo, None
    if not args.benchmark:
        raise UsageError(f"{model.name} has no published checkpoint: pass --model-path DIR (real weights) or "
                         "--benchmark (random weights from a generated config)")
    if not out_dir:
        raise UsageError(f"{model.name} has no published checkpoint: --benchmark writes its config-only "
                         "directory beside --out, so pass --out (or --model-path)")
    d = os.path.join(out_dir, f"{model.name}-config")
    return d, d


def _run_serving(args) -> int:
    from clusters import load_cluster
    from specs.models import load_model
    from tuner.emit.header import (
        EXIT_DOES_NOT_FIT,
        serve_memory_problem,
        serve_predict_argv,
        serving_header,
    )
    from tuner.rank.serve_predict import serve_prediction
    from tuner.space.serve_precision import resolve as resolve_weights
    if args.isl is None or args.osl is None:
        raise UsageError(f"emit {args.target} needs --isl and --osl: the header's predicted numbers and the "
                         "benchmark command are for that workload")
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpus)
    weights = resolve_weights(args, model, cluster)
    completion = serve_completion_for_emit(args, model, cluster, weights["precision"])
    plan = completion.plan
    if args.pd and not plan.pd:
        plan = plan.replace(pd="1:1")
    if plan.pd and not args.pd and args.target == "sglang":
        raise UsageError(f"plan has pd={plan.pd}: pass --pd to emit the prefill/decode deployment")
    if plan.gpus > cluster.num_devices:
        raise UsageError(f"plan {plan.canonical()} needs {plan.gpus} devices (tp*pp*dp), --gpus is {cluster.num_devices}")
    if args.target == "sglang":
        from tuner.space.sglang_rules import realize
        v = realize(plan, model, cluster)
        if not v.ok:
            from tuner.space.sglang_rules import SERVING_STACK
            raise unrealizable(list(v.reasons), SERVING_STACK, one_line=True)
    else:
        from trials.serving.vllm_args import vllm_reasons
        why = vllm_reasons(plan, cpu=not cluster.is_gpu)
        if why:
            raise UsageError(f"vLLM cannot run plan {plan.canonical()}: " + "; ".join(f"{c}: {s}" for c, s in why))
    conc = args.concurrency or 8 * cluster.num_devices
    # priced exactly as `moetune predict --mode serve` prices it (the header's reproduce line)
    pargs = argparse.Namespace(model=args.model, cluster=args.cluster, gpus=args.gpus, isl=args.isl, osl=args.osl,
                               concurrency=conc, phase="both", plan=plan.canonical(), precision=args.precision,
                               weight_dtype=args.weight_dtype, tables=args.tables, calibration=args.calibration,
                               imbalance=1.0, routing_skew=0.0)
    d = serve_prediction(pargs)
    problem = serve_memory_problem(d)
    if problem and not args.force:
        hint = f"; {d['would_fit']}" if d.get("would_fit") else ""
        print(f"moetune emit: does not fit: {problem}{hint} (--force writes it anyway, labelled)", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    out_dir = os.path.dirname(os.path.abspath(args.out)) if args.out else None
    model_path, config_dir = _model_path(args, model, out_dir)
    argv = serve_predict_argv(args, plan.canonical(), conc)
    if args.target == "sglang":
        body, stack, bench = _sglang_body(args, plan, model, cluster, model_path, weights, conc)
    else:
        body, stack, bench = _vllm_body(args, plan, model, cluster, model_path, weights, conc)
    header = serving_header(args.target, d, stack=stack, model_path=model_path, weight=weights,
                            benchmark=args.benchmark, predict_argv=argv, bench_line=bench, forced=bool(problem))
    text = "\n".join(header) + "\n" + body
    if args.out:
        if config_dir:
            from specs.hf_export import write_model_dir
            write_model_dir(model, config_dir)
        write_atomic(args.out, text)
        print(f"wrote {args.out}  ({plan.canonical()})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    print(f"completion: {completion.describe()}", file=sys.stderr)
    return 0


def _sglang_body(args, plan, model, cluster, model_path, weights, conc):
    from specs.serve_resolve import server_nodes
    from tuner.emit.sglang import bench_command, launch_commands, render
    need = server_nodes(plan.replace(dp=1, pd="") if plan.pd else plan, cluster.devices_per_node)
    if args.nnodes is not None and args.nnodes != need:
        raise UsageError(f"--nnodes {args.nnodes}: this plan's server spans {need} node(s) of "
                         f"{cluster.devices_per_node} GPUs")
    text = render(launch_commands(plan, model_path, model, cluster, nnodes=need, pd=bool(plan.pd),
                                  quantization=weights["quantization"], dummy=args.benchmark))
    bench = bench_command(model_path, args.isl, args.osl, conc, pd=bool(plan.pd))
    return text + "# benchmark (after the server is up)\n" + bench + "\n", "SGLang 0.5.23", bench


def _vllm_body(args, plan, model, cluster, model_path, weights, conc):
    from tuner.emit.vllm import bench_command, vllm_command
    cmd, why = vllm_command(plan, model_path, served_name=model.name, max_model_len=args.isl + args.osl,
                            cpu=not cluster.is_gpu, dummy=args.benchmark, quantization=weights["quantization"])
    if why:
        raise UsageError(f"vLLM cannot run plan {plan.canonical()}: " + "; ".join(f"{c}: {s}" for c, s in why))
    bench = bench_command(model.name, model_path, args.isl, args.osl, conc)
    return cmd + "\n# benchmark (after the server is up)\n" + bench + "\n", "vLLM 0.32.0", bench
def serve_completion_for_emit(args, model, cluster, precision: str):
    """`--complete` of `emit sglang`: best needs the workload (--isl/--osl; concurrency 8 per GPU, as
    `predict --mode serve`); without it the plan keeps SGLang's defaults, said so."""
    from tuner.rank.serve_complete import complete_serve
    from tuner.rank.serve_predict import serve_workload_from_args
    how = getattr(args, "complete", None) or "defaults"
    if how == "best" and not (args.isl and args.osl):
        c = complete_serve(args.plan, model, cluster, None, "defaults")
        c.note = "best needs --isl and --osl"
        return c
    # the workload every serving command builds (and refuses, e.g. beyond the model's context), before
    # the completion's search
    w = serve_workload_from_args(args, cluster.num_devices, what=f"emit {args.target}", model=model) if how == "best" else None
    return complete_serve(args.plan, model, cluster, w, how, precision=precision)
