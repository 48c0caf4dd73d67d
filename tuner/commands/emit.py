"""`moetune emit megatron`: write the Megatron-LM launch script that reproduces a plan.

Refuses an unrealizable plan with its reasons (exit 2), writing nothing.
"""
from __future__ import annotations

import os
import sys

from specs.fileio import write_atomic
from tuner.commands.common import (
    add_plan_args,
    add_stack_arg,
    add_workload_args,
    plan_completion,
    plan_text,
    positive_int,
    require_realizable,
    workload_from_args,
)

SUMMARY = "Write the launch script that runs a plan with Megatron-LM."
DESCRIPTION = ("Complete a partial plan (--complete best: the fastest realizable completion the cost model "
               "predicts; defaults: the documented defaults) and write the torchrun launch script for "
               "Megatron-LM's pretrain_gpt.py that reproduces it; a plan the target stack cannot run is refused "
               "with its reasons (exit code 2) and nothing is written.")


def add_parser(subparsers):
    p = subparsers.add_parser("emit", help=SUMMARY, description=DESCRIPTION)
    p.add_argument("target", choices=["megatron"], help="Which launcher to write the script for (megatron).")
    add_workload_args(p)
    add_stack_arg(p)
    add_plan_args(p, required=True)
    p.add_argument("--out", default=None, help="Path of the script to write; by default it is printed to stdout.")
    p.add_argument("--train-iters", type=positive_int, default=50,
                   help="Training iterations the script runs (default 50).")
    return p


def run(args) -> int:
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
