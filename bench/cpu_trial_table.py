"""Measure tiny-moe plans for real on this CPU host with the Megatron trial backend.

  PYTHONPATH=. python bench/cpu_trial_table.py OUT.csv [--model tiny-moe] [--gbs 16] [--seq 256]
      [--iters 5] [--warmup 2] [--world 2]

Writes one CSV row per plan: plan, step_time_s (median), spread_s (max-min), tokens/s per device,
peak memory per rank (GiB, RSS high-water on CPU), final loss, or the failure kind.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clusters import load_cluster  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan, parse_fields  # noqa: E402
from specs.stack import cpu_defaults  # noqa: E402
from specs.workload import Workload  # noqa: E402
from trials.base import Failure, Resources  # noqa: E402
from trials.megatron.backend import MegatronBackend  # noqa: E402

PLANS = [
    "",  # DP=2
    "mbs=2",
    "mbs=4",
    "ep=2",
    "ep=2,mbs=2",
    "ep=2,dispatcher=allgather",
    "pp=2",
    "pp=2,mbs=2",
    "pp=2,vpp=2",
    "pp=2,pp_first=1,pp_last=3",
    "ep=2,recompute=full,recompute_method=uniform,recompute_layers=1",
    "ep=2,recompute=selective,recompute_modules=core_attn+moe",
    "pp=2,recompute=full,recompute_method=block,recompute_layers=2",
    "overlap_grad_reduce=1",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--gbs", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args(argv)
    w = Workload(load_model(a.model), load_cluster("cpu-local", a.world), a.gbs, a.seq)
    rows = []
    for text in PLANS:
        # the CPU stack's own defaults; the plans above are given without a realizability check,
        # on purpose (overlap_grad_reduce=1 runs on CPU though the profile lists it off)
        plan = Plan(**cpu_defaults(parse_fields(text)))
        t0 = time.time()
        r = MegatronBackend().run(plan, w, Resources(a.world, a.timeout), iters=a.iters, warmup=a.warmup)
        if isinstance(r, Failure):
            row = {"plan_short": text or "dp=2", "plan": r.plan, "status": r.kind,
                   "step_time_s": "", "spread_s": "", "tokens_per_s_per_device": "",
                   "peak_mem_gib_max": "", "final_loss": "", "wall_s": f"{time.time() - t0:.1f}"}
        else:
            row = {"plan_short": text or "dp=2", "plan": r.plan, "status": "ok",
                   "step_time_s": f"{r.step_time_s:.4f}", "spread_s": f"{r.step_time_spread_s:.4f}",
                   "tokens_per_s_per_device": f"{r.tokens_per_s_per_gpu:.1f}",
                   "peak_mem_gib_max": f"{max(r.peak_memory_gib):.3f}",
                   "final_loss": f"{r.losses[-1]:.4f}", "wall_s": f"{time.time() - t0:.1f}"}
        rows.append(row)
        print(f"{row['plan_short']:<62} {row['status']:<6} {row['step_time_s']:>8} "
              f"{row['spread_s']:>8} {row['tokens_per_s_per_device']:>9} {row['peak_mem_gib_max']:>6}",
              flush=True)
    with open(a.out, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
