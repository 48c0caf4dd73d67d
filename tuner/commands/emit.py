"""`moetune emit megatron|sglang`: the launch script of a training plan (Megatron-LM) or the launch
commands of a serving plan (SGLang 0.5.23: one node, several nodes, or a prefill/decode pair with
the router).

Refuses an unrealizable plan with its reasons (exit 2), writing nothing.
"""
from __future__ import annotations

import os
import sys

from specs.fileio import write_atomic
from tuner.commands.common import (
    UsageError,
    add_plan_args,
    add_stack_arg,
    add_workload_args,
    check_output_file,
    devices,
    plan_completion,
    plan_text,
    positive_int,
    require_realizable,
    tokens,
    workload_from_args,
)

SUMMARY = "Write the launch script of a training plan (Megatron-LM) or a serving plan (SGLang, vLLM)."
DESCRIPTION = ("Complete a partial plan (--complete best: the fastest realizable completion the cost model "
               "predicts; defaults: the documented defaults) and write the torchrun launch script for "
               "Megatron-LM's pretrain_gpt.py that reproduces it; a plan the target stack cannot run is refused "
               "with its reasons (exit code 2) and nothing is written. `emit sglang` prints the SGLang 0.5.23 launch "
               "commands of a serving plan and `emit vllm` the vLLM server command (--gbs is not used; for vllm, "
               "--isl/--osl set the context length).")


def add_parser(subparsers):
    p = subparsers.add_parser("emit", help=SUMMARY, description=DESCRIPTION)
    p.add_argument("target", choices=["megatron", "sglang", "vllm"],
                   help="Which launcher: megatron (a training plan), sglang or vllm (a serving plan).")
    add_workload_args(p, gbs_required=False)
    add_stack_arg(p)
    add_plan_args(p, required=True)
    p.add_argument("--out", default=None, help="Path of the script to write; by default it is printed to stdout.")
    p.add_argument("--train-iters", type=positive_int, default=50,
                   help="Training iterations the script runs (default 50).")
    p.add_argument("--nnodes", type=devices, default=None,
                   help="For sglang, nodes per server (default: as many as the plan's instance needs).")
    p.add_argument("--pd", action="store_true",
                   help="For sglang, a prefill/decode-disaggregated deployment (the plan's pd ratio, 1:1 if none) "
                        "with the router.")
    p.add_argument("--model-path", default=None,
                   help="For sglang, the model directory in the commands (default: a config-only directory "
                        "written from the model spec under the --out folder or ./<model>-config).")
    p.add_argument("--isl", type=tokens, default=None, help="Serving (vllm): input tokens per request.")
    p.add_argument("--osl", type=tokens, default=None, help="Serving (vllm): output tokens per request.")
    return p


def run(args) -> int:
    if args.out:  # before any work: a path that cannot be written is one line
        check_output_file(args.out, "--out")
    if args.target == "sglang":
        return _run_sglang(args)
    if args.target == "vllm":
        from tuner.commands._serving import run_vllm
        return run_vllm(args)
    if args.gbs is None:
        raise UsageError("emit megatron: --gbs is required")
    from tuner.emit import megatron_script
    w = workload_from_args(args)
    completion, profile = plan_completion(args, w)
    plan = completion.plan
    # one line: a script that wraps `emit` reads a single error line
    require_realizable(w, plan, profile, one_line=True)
    text = megatron_script(w, plan, profile, train_iters=args.train_iters)
    if args.out:
        write_atomic(args.out, text)
        os.chmod(args.out, 0o755)
        print(f"wrote {args.out}  ({plan_text(plan, w, profile, args.canonical)})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    print(f"completion: {completion.describe()}", file=sys.stderr)
    return 0


def _run_sglang(args) -> int:
    from clusters import load_cluster
    from specs.hf_export import write_model_dir
    from specs.models import load_model
    from specs.serve_plan import ServePlan
    from tuner.emit_sglang import launch_commands, render
    from tuner.serve_realize import realize, server_nodes
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpus)
    plan = ServePlan.parse(args.plan)
    if args.pd and not plan.pd:
        plan = plan.replace(pd="1:1")
    if plan.pd and not args.pd:
        raise UsageError(f"plan has pd={plan.pd}: pass --pd to emit the prefill/decode deployment")
    v = realize(plan, model, cluster)
    if not v.ok:
        raise UsageError("unrealizable serving plan: " + "; ".join(str(r) for r in v.reasons))
    need = server_nodes(plan.replace(dp=1, pd="") if plan.pd else plan, cluster.devices_per_node)
    if args.nnodes is not None and args.nnodes != need:
        raise UsageError(f"--nnodes {args.nnodes}: this plan's server spans {need} node(s) of "
                         f"{cluster.devices_per_node} GPUs")
    path = args.model_path
    if path is None:
        base = os.path.dirname(os.path.abspath(args.out)) if args.out else os.getcwd()
        path = str(write_model_dir(model, os.path.join(base, f"{model.name}-config")))
    text = render(launch_commands(plan, path, model, cluster, nnodes=need, pd=bool(plan.pd)))
    if v.effective.rewrites:
        text = "# SGLang rewrites: " + ", ".join(v.effective.rewrites) + "\n" + text
    if args.out:
        write_atomic(args.out, text)
        print(f"wrote {args.out}  ({plan.canonical()})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
