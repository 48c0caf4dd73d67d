"""MOSAIC design search on the paper-sized envelope (q 4..12, E up to 512, K up to 8, G 1..8):
wall and CPU seconds of `tuner.design.design` on the issue's two envelopes, and how close the
two-stage layout search (probe options, then every option of the best parallel points) comes to
scoring every realizable core-space plan of a geometry.

    python bench/bench_design.py [--sample N] [--frontier F]

Honest timing: the CPU seconds of this process are printed next to the wall seconds, since the
machine may be shared.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cost_model  # noqa: E402
from clusters import load_cluster  # noqa: E402
from specs.stack import profile_for  # noqa: E402
from specs.workload import Workload  # noqa: E402
from tuner.design import Envelope, _PlanSet, best_layout, design, ladder_model  # noqa: E402
from tuner.space.train import default_space, iter_realizable  # noqa: E402

CASES = (("b200", 256, 20.0), ("h100-sxm", 64, 10.0))


def exhaustive_best(w: Workload, profile) -> tuple[float, int]:
    """Best fitting tokens/s/GPU over every realizable core-space plan with TP = CP = 1."""
    from dataclasses import replace
    space = default_space(w, profile, "bf16", level="core")
    space = replace(space, tp=(1,), cp=(1,), etp=(1,))
    plans = list(iter_realizable(space, w, profile))
    r = cost_model.predict_arrays(w, plans)
    tps = np.where(r["fits"], r["tokens_per_s_per_gpu"], -np.inf)
    return float(tps.max()), len(plans)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=4, help="Geometries compared against exhaustive layout scoring.")
    ap.add_argument("--cases", type=int, default=2, help="How many of the two envelopes to run.")
    ap.add_argument("--frontier", type=int, default=0, help="Lowest-loss geometries always scored (plot cloud).")
    args = ap.parse_args()
    for cluster, gpus, days in CASES[: args.cases]:
        c0, t0 = time.process_time(), time.perf_counter()
        res = design(cluster, gpus, days, frontier=args.frontier)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        o = res.optimum
        print(f"{gpus}x {cluster} {days:g} d: {wall:.1f} s wall, {cpu:.1f} s CPU; {res.stats}")
        print(f"  optimum {o.geometry.name} S {o.geometry.s:.3f} N_act {o.geometry.n_act / 1e9:.2f}B "
              f"MFU {o.mfu:.1%} loss {o.loss:.4f} plan {o.plan}")
        # two-stage layout search against every plan, on the optimum and the next geometries
        cl = load_cluster(cluster, gpus)
        prof = profile_for(cl, "auto")
        env = Envelope.default()
        for c in [o, *res.runner_ups][: args.sample]:
            g = c.geometry
            spec = ladder_model(g.q, g.e, g.k, g.g)
            w = Workload(spec, cl, env.gbs, env.seq)
            t1 = time.perf_counter()
            lay = best_layout(w, _PlanSet(w, prof, env), refine=env.refine)
            t2 = time.perf_counter()
            full, n = exhaustive_best(w, prof)
            t3 = time.perf_counter()
            print(f"  {g.name}: two-stage {lay.tokens_per_s_per_gpu:,.0f} tok/s/GPU ({lay.scored} plans, "
                  f"{t2 - t1:.1f} s) vs all {n} plans {full:,.0f} ({t3 - t2:.1f} s): "
                  f"{lay.tokens_per_s_per_gpu / full:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
