"""Validation only: the cost model's invariants on a wider sample than tests/test_properties.py
(issue 22, "no invariant violation on sampled plans"): eight workloads over the "full" plan space
(cp, explicit layouts, per-expert GEMMs, every fp8 recipe), up to 1,500 realizable plans each drawn at
random (seeded), every more-work knob (2x seq, 2x gbs, routing imbalance 1.3 and 2, top-k + 1, pp*vpp
more layers, one more MTP layer), and memory per GPU (2x the GPUs, recompute on, the distributed
optimizer on, 2x the micro-batch).

    PYTHONPATH=$PWD python bench/invariant_scan.py [--seed N] [--plans N]

Prints one line per workload: "ok", or per broken invariant the count and the first plan. Minutes on
a 2-core host. The counterexamples it found are kept as tests (tests/test_properties.py
`test_wide_scan_regression_*`).
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cost_model  # noqa: E402
from clusters import load_cluster  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.stack import GPU_FULL  # noqa: E402
from specs.workload import Workload  # noqa: E402
from tuner.space.megatron_rules import check  # noqa: E402
from tuner.space.train import default_space, iter_realizable  # noqa: E402

WORKLOADS = [  # model, cluster kind, GPUs, gbs, seq, precision
    ("gpt-oss-120b", "h100-sxm", 64, 1280, 4096, "bf16"),
    ("deepseek-v3", "gb200-nvl72", 256, 4096, 4096, "mxfp8"),
    ("qwen3-235b-a22b", "b200", 256, 8192, 4096, "mxfp8"),
    ("qwen3-30b-a3b", "gb200-nvl72", 8, 512, 4096, "mxfp8"),
    ("deepseek-v3", "b200", 256, 4096, 4096, "mxfp8"),
    ("qwen3-235b-a22b", "h100-sxm", 256, 2048, 4096, "fp8"),
    ("qwen3-30b-a3b", "h100-sxm", 16, 1024, 4096, "fp8"),
    ("gpt-oss-20b", "h100-sxm", 8, 256, 4096, "bf16"),
]
REL = 1e-9  # batched table lookups can differ in the last bits


def _with_model(w, **kw):
    return Workload(dataclasses.replace(w.model, **kw), w.cluster, w.gbs, w.seq)


KNOBS = {  # the same workload with more work, and predict() options
    "seq": lambda w: (Workload(w.model, w.cluster, w.gbs, 2 * w.seq), {}),
    "gbs": lambda w: (Workload(w.model, w.cluster, 2 * w.gbs, w.seq), {}),
    "imbalance 2": lambda w: (w, {"imbalance": 2.0}),
    "imbalance 1.3": lambda w: (w, {"imbalance": 1.3}),
    "topk": lambda w: (_with_model(w, moe_router_topk=min(w.model.num_experts, w.model.moe_router_topk + 1)), {}),
    "mtp": lambda w: (_with_model(w, mtp_num_layers=w.model.mtp_num_layers + 1), {}),
}


def _one(w, p, key="step_time_s"):
    return float(cost_model.predict_arrays(w, [p])[key][0])


def scan(w, precision, rng, n):
    pool = []
    for p in iter_realizable(default_space(w, GPU_FULL, precision, level="full"), w, GPU_FULL, 0, 50):
        if rng.random() < 0.05:
            pool.append(p)
        if len(pool) >= n:
            break
    fails = {}
    base = cost_model.predict_arrays(w, pool)
    for name, more in KNOBS.items():
        w2, kw = more(w)
        bad = np.nonzero(cost_model.predict_arrays(w2, pool, **kw)["step_time_s"] < base["step_time_s"] * (1 - REL))[0]
        if len(bad):
            fails[name] = (len(bad), pool[bad[0]].canonical())
    layers = [p for p in pool[:300] if not p.pp_layout]  # an explicit layout names every layer
    for p in layers:
        k, m = p.pp * p.vpp, w.model
        w2 = Workload(dataclasses.replace(m, num_layers=m.num_layers + k, moe_layers=tuple(m.moe_layers) + (True,) * k),
                      w.cluster, w.gbs, w.seq)
        if not check(w2, p, GPU_FULL) and _one(w2, p) < _one(w, p) * (1 - REL):
            fails.setdefault("layers", [0, p.canonical()])[0] += 1
    w2 = Workload(w.model, load_cluster(w.cluster.kind, 2 * w.world), w.gbs, w.seq)
    ok = [p for p in pool if not check(w2, p, GPU_FULL)]
    if ok:
        m1 = cost_model.predict_arrays(w, ok)["peak_memory_gib"]
        bad = np.nonzero(cost_model.predict_arrays(w2, ok)["peak_memory_gib"] > m1 * (1 + REL))[0]
        if len(bad):
            fails["memory, 2x GPUs"] = (len(bad), ok[bad[0]].canonical())
    for j, p in enumerate(pool[:400]):
        mem = float(base["peak_memory_gib"][j])
        if p.recompute != "none":
            q = p.replace(recompute="none", recompute_modules=(), recompute_method="", recompute_layers=0)
            if not check(w, q, GPU_FULL):
                if mem > _one(w, q, "peak_memory_gib") * (1 + REL):
                    fails.setdefault("memory, recompute", [0, p.canonical()])[0] += 1
                if float(base["step_time_s"][j]) < _one(w, q) * (1 - REL):
                    fails.setdefault("step, recompute", [0, p.canonical()])[0] += 1
        if p.dist_opt and mem > _one(w, p.replace(dist_opt=False, overlap_param_gather=False), "peak_memory_gib") * (1 + REL):
            fails.setdefault("memory, distributed optimizer", [0, p.canonical()])[0] += 1
        big = p.replace(mbs=2 * p.mbs)
        if not check(w, big, GPU_FULL) and _one(w, big, "peak_memory_gib") < mem * (1 - REL):
            fails.setdefault("memory, 2x mbs", [0, p.canonical()])[0] += 1
    return len(pool), fails


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    ap.add_argument("--plans", type=int, default=1500, help="plans per workload (default 1500)")
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    broken = 0
    for model, kind, gpus, gbs, seq, precision in WORKLOADS:
        w = Workload(load_model(model), load_cluster(kind, gpus), gbs, seq)
        n, fails = scan(w, precision, rng, a.plans)
        broken += bool(fails)
        print(f"{model} {gpus}x{kind} {precision}: {n} plans, " + ("ok" if not fails else
              "; ".join(f"{k}: {c} e.g. {p}" for k, (c, p) in fails.items())), flush=True)
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
