"""Measure a spread of realizable tiny-moe plans on this CPU host with the Megatron trial backend
and write the CSV `moetune calibrate --measurements` reads.

  PYTHONPATH=. python bench/cpu_calibration_set.py OUT.csv [--model tiny-moe] [--gbs 16] [--seq 256]
      [--plans 16] [--iters 5] [--warmup 2] [--passes 2]

Plans: `tuner.space.train.default_space(workload, profile_for(cluster), "bf16", level="core")` filtered
by `tuner.space.train.iter_realizable`, then an evenly spaced subset of that (deterministic) list, so the
set spans pp/vpp, ep/etp, mbs, dispatcher and recompute. Each plan is run in `--passes` separate
passes over the list (so a burst of load from other processes on a shared host hits one pass,
not every run of a plan); rows already in OUT.csv keep their passes (resume).
Columns: model, cluster, gpus, gbs, seq, plan, step_time_s (median over all timed iterations),
min_step_time_s (least-interfered iteration), spread_s, status, passes, iters, warmup,
step_times_s (all, ';'-joined), wall_s, date.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COLUMNS = ["model", "cluster", "gpus", "gbs", "seq", "plan", "step_time_s", "min_step_time_s", "spread_s",
           "status", "passes", "iters", "warmup", "step_times_s", "wall_s", "date"]


def select_plans(workload, n: int) -> list:
    from specs.stack import profile_for
    from tuner.space.train import default_space, iter_realizable
    prof = profile_for(workload.cluster)
    plans = list(iter_realizable(default_space(workload, prof, "bf16", level="core"), workload, prof))
    if len(plans) <= n:
        return plans
    step = len(plans) / n
    return [plans[int(i * step + step / 2)] for i in range(n)]


def main(argv=None) -> int:
    from clusters import load_cluster
    from specs.models import load_model
    from specs.workload import Workload
    from trials.base import Failure, Resources
    from trials.megatron.backend import MegatronBackend

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--cluster", default="cpu-local")
    ap.add_argument("--gbs", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--plans", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--passes", type=int, default=2)
    a = ap.parse_args(argv)
    cluster = load_cluster(a.cluster)
    w = Workload(model=load_model(a.model), cluster=cluster, gbs=a.gbs, seq=a.seq)
    out = Path(a.out)
    done = {}
    if out.exists():
        with open(out, newline="") as f:
            done = {r["plan"]: r for r in csv.DictReader(f)}
    plans = select_plans(w, a.plans)
    for ps in range(a.passes):
        for plan in plans:
            text = plan.canonical()
            prev = done.get(text)
            if prev and (prev["status"] != "ok" or int(prev.get("passes") or 1) > ps):
                continue
            t0 = time.time()
            r = MegatronBackend().run(plan, w, Resources(w.world, a.timeout), iters=a.iters, warmup=a.warmup)
            row = dict(model=a.model, cluster=a.cluster, gpus=w.world, gbs=a.gbs, seq=a.seq, plan=text,
                       iters=a.iters, warmup=a.warmup, passes=ps + 1,
                       wall_s=f"{time.time() - t0 + float((prev or {}).get('wall_s') or 0):.1f}",
                       date=datetime.datetime.now().isoformat(timespec="seconds"))
            if isinstance(r, Failure):
                row.update(step_time_s="", min_step_time_s="", spread_s="", step_times_s="", status=r.kind)
            else:
                times = [float(x) for x in (prev or {}).get("step_times_s", "").split(";") if x] + list(r.step_times_s)
                row.update(step_time_s=f"{statistics.median(times):.5f}", min_step_time_s=f"{min(times):.5f}",
                           spread_s=f"{max(times) - min(times):.5f}", status="ok",
                           step_times_s=";".join(f"{x:.5f}" for x in times))
            done[text] = row
            print(f"pass {ps + 1} {row['status']:<6} {row['step_time_s']:>9} {row['min_step_time_s']:>9} "
                  f"{row['wall_s']:>6}s  {text}", flush=True)
            tmp = out.with_suffix(".tmp")
            with open(tmp, "w", newline="") as f:
                wr = csv.DictWriter(f, fieldnames=COLUMNS)
                wr.writeheader()
                wr.writerows(done.values())
            os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
