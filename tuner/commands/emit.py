"""`moetune emit megatron`: write the Megatron-LM launch script that reproduces a plan.

Refuses an unrealizable plan with its reasons (exit 2), writing nothing.
"""
from __future__ import annotations

import os
import sys

from specs.fileio import write_atomic
from tuner.commands.common import UsageError, add_stack_arg, add_workload_args, completed_plan, workload_from_args


def add_parser(subparsers):
    p = subparsers.add_parser("emit", help="emit a launch script for a plan (megatron)")
    p.add_argument("target", choices=["megatron"], help="which stack to emit")
    add_workload_args(p)
    add_stack_arg(p)
    p.add_argument("--plan", required=True, help="canonical or partial plan string")
    p.add_argument("--out", default=None, help="script path (default: print to stdout)")
    p.add_argument("--train-iters", type=int, default=50)
    return p


def run(args) -> int:
    from tuner.emit import megatron_script
    from tuner.realize import check
    w = workload_from_args(args)
    plan, profile = completed_plan(args, w)
    reasons = check(w, plan, profile)
    if reasons:
        raise UsageError(f"plan is not realizable on {profile.name}: " + "; ".join(str(r) for r in reasons))
    text = megatron_script(w, plan, profile, train_iters=args.train_iters)
    if args.out:
        write_atomic(args.out, text)
        os.chmod(args.out, 0o755)
        print(f"wrote {args.out}  ({plan.canonical()})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
