"""Bench for `moetune tune` on this CPU host (cpu-local, real megatron-core trials).

  PYTHONPATH=. python bench/bench_tune.py [--out bench/out/tune_space.csv] [--gbs 8 --seq 128]
      [--iters 3 --warmup 1] [--tpe-seeds 10 --tpe-asks 1000] [--remeasure]

1. A small space: the realizable core-level plans of tiny-moe on 2 cores with recompute none and
   the alltoall dispatcher (every parallel layout x mbs), ~12-20 plans. Every plan is measured for
   real once (exhaustive search; cached in --out, reused unless --remeasure).
2. (a) cost-model accuracy on the measured plans: MAPE of step time uncalibrated, calibrated
   in-sample (one scale fitted on all pairs) and leave-one-out calibrated (fitted without the plan).
3. (b) trials needed to reach >= 0.98 x the exhaustive best throughput, replaying the measured
   table: the cost-model-guided sampler (tuner.study.sampler.GuidedSampler, refitted after every trial,
   deterministic) vs Optuna TPE over the plan fields (tuner.study.sampler.TPEProposer, --tpe-seeds seeds)
   vs uniform random order (expected), against the exhaustive count (= the number of plans).
"""
from __future__ import annotations

import argparse
import csv
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cost_model  # noqa: E402
from clusters import load_cluster  # noqa: E402
from cost_model.calibration import fit_calibration  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.stack import profile_for  # noqa: E402
from specs.workload import Workload  # noqa: E402
from tuner.space.train import default_space, iter_realizable  # noqa: E402
from tuner.study.sampler import GuidedSampler, TPEProposer  # noqa: E402


def small_space(workload, profile):
    space = default_space(workload, profile, "bf16", level="core")
    return [p for p in iter_realizable(space, workload, profile)
            if p.recompute == "none" and p.dispatcher == "alltoall"]


def measure_all(workload, plans, args) -> dict:
    from trials.base import Resources
    from trials.megatron.backend import MegatronBackend
    out = Path(args.out)
    rows = {}
    if out.exists() and not args.remeasure:
        with open(out) as f:
            for r in csv.DictReader(f):
                rows[r["plan"]] = float(r["step_time_s"]) if r["step_time_s"] else None
    todo = [p for p in plans if p.canonical() not in rows]
    backend = MegatronBackend()
    for i, p in enumerate(todo):
        t = time.time()
        res = backend.run(p, workload, Resources(devices=workload.world, timeout_s=180),
                          iters=args.iters, warmup=args.warmup)
        ok = hasattr(res, "step_time_s")
        rows[p.canonical()] = res.step_time_s if ok else None
        print(f"  [{i + 1}/{len(todo)}] {time.time() - t:5.1f}s  "
              f"{res.step_time_s if ok else 'FAIL ' + res.kind}  {p.canonical()[:60]}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["plan", "step_time_s"])
        for k, v in rows.items():
            w.writerow([k, "" if v is None else v])
    return rows


def trials_to_reach(order, tps, target) -> int | None:
    for i, p in enumerate(order):
        if tps.get(p) is not None and tps[p] >= target:
            return i + 1
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/out/tune_space.csv")
    ap.add_argument("--gbs", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tpe-seeds", type=int, default=10)
    ap.add_argument("--tpe-asks", type=int, default=1000, help="TPE asks per seed (invalid or repeated proposals included)")
    ap.add_argument("--remeasure", action="store_true")
    args = ap.parse_args(argv)
    w = Workload(model=load_model("tiny-moe"), cluster=load_cluster("cpu-local", 2), gbs=args.gbs, seq=args.seq)
    profile = profile_for(w.cluster)
    plans = small_space(w, profile)
    print(f"small space: {len(plans)} plans (tiny-moe, 2 x cpu-local, gbs {args.gbs}, seq {args.seq})")
    t0 = time.time()
    meas = measure_all(w, plans, args)
    print(f"measured in {time.time() - t0:.0f} s")
    names = [p.canonical() for p in plans]
    r = cost_model.predict_arrays(w, plans)
    raw = {n: float(x) for n, x in zip(names, r["raw_step_time_s"])}
    ok = [n for n in names if meas.get(n)]
    tps = {n: (w.tokens_per_step / (meas[n] * w.world) if meas.get(n) else None) for n in names}

    # (a) accuracy
    cal, rep = fit_calibration([(raw[n], meas[n], n) for n in ok])
    mape = lambda errs: 100 * statistics.mean(abs(e) for e in errs)  # noqa: E731
    unc = mape([raw[n] / meas[n] - 1 for n in ok])
    ins = mape([row["calibrated_rel_err"] for row in rep["rows"]])
    loo = mape([row["loo_rel_err"] for row in rep["rows"]])
    pr = statistics.correlation([math.log(raw[n]) for n in ok], [math.log(meas[n]) for n in ok]) if len(ok) > 2 else float("nan")
    print(f"(a) step-time MAPE over {len(ok)} measured plans: uncalibrated {unc:.1f}%, calibrated "
          f"(scale {cal.scale:.3g}) in-sample {ins:.1f}%, leave-one-out {loo:.1f}%; "
          f"log-log Pearson r {pr:.2f}")

    # (b) trials to reach 0.98 x exhaustive best
    best = max(v for v in tps.values() if v)
    target = 0.98 * best
    g = GuidedSampler([{"plan": n, "raw_step_time_s": raw[n]} for n in names])
    order = []
    while True:
        p = g.propose()
        if p is None:
            break
        order.append(p)
        g.observe(p, meas.get(p) or None)
        if g.measured:
            g.refit()
    guided = trials_to_reach(order, tps, target)
    tpe = []
    for seed in range(args.tpe_seeds):
        tpe_order = []
        for p in TPEProposer(names, seed=seed).run(lambda p: tps.get(p), max_asks=args.tpe_asks):
            tpe_order.append(p)
            if (tps.get(p) or 0) >= target:
                break
        tpe.append(trials_to_reach(tpe_order, tps, target) or len(names) + 1)
    rnd = []
    rng = random.Random(0)
    for _ in range(2000):
        o = names[:]
        rng.shuffle(o)
        rnd.append(trials_to_reach(o, tps, target))
    n_hit = sum(1 for v in tps.values() if v and v >= target)
    print(f"(b) trials to reach >= 0.98 x exhaustive best ({best:.1f} tok/s/GPU; {n_hit} of {len(names)} "
          f"plans qualify): guided {guided}; TPE median {statistics.median(tpe):g} (mean "
          f"{statistics.mean(tpe):.1f}, max {max(tpe)}, {args.tpe_seeds} seeds; {len(names) + 1} = never); "
          f"random mean {statistics.mean(rnd):.1f}; exhaustive {len(names)}")
    print(f"    guided order: {[names.index(p) for p in order]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
