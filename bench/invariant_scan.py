"""Validation only: the cost model's invariants on a wider sample than tests/test_properties.py
(issue 22, "no invariant violation on sampled plans"): eight workloads over the "full" plan space
(cp, explicit layouts, per-expert GEMMs, every fp8 recipe), up to 1,500 realizable plans each drawn at
random (seeded), every more-work knob (2x seq, 2x gbs, routing imbalance 1.3 and 2, top-k + 1, pp*vpp
more layers, one more MTP layer), and memory per GPU (2x the GPUs, recompute on, the distributed
optimizer on, 2x the micro-batch); a fifth of the sampled plans also with the fields the space never
searches (Megatron FSDP, token drop, drop-and-pad: PINNED).

    PYTHONPATH=$PWD python bench/invariant_scan.py [--seed N] [--plans N]

Prints one line per workload: "ok", or per broken invariant the count and the first plan. Minutes on
a 2-core host. The counterexamples it found are kept as tests (tests/test_properties.py
`test_wide_scan_regression_*`).
"""
from __future__ import annotations

import argparse
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
from tests.invariants import (  # noqa: E402 - the property tests' own rules
    KNOBS,
    REL,
    layers_apply,
    memory_breaks,
    realizable,
    step,
    twice_the_gpus,
)
from tuner.rank.train import _RECOMPUTE_RESET  # noqa: E402
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
# the tests' knobs, and a milder imbalance beside their 2.0
SCAN_KNOBS = {**{k: v for k, v in KNOBS.items() if k != "layers"},
              "imbalance 1.3": lambda w, p: (w, p, {"imbalance": 1.3})}


# fields the space never searches (a user pins them): each sampled plan is also checked with them
PINNED = (dict(fsdp=True), dict(capacity_factor=1.25), dict(capacity_factor=1.0, pad_to_capacity=True))


def pinned_variants(w, pool):
    """The realizable variants of `pool` with the PINNED fields (Megatron FSDP, token drop,
    drop-and-pad)."""
    return [q for p in pool for q in (p.replace(**kw) for kw in PINNED) if realizable(w, q)]


def scan(w, precision, rng, n):
    pool = []
    for p in iter_realizable(default_space(w, GPU_FULL, precision, level="full"), w, GPU_FULL, 0, 50):
        if rng.random() < 0.05:
            pool.append(p)
        if len(pool) >= n:
            break
    pool = pool + pinned_variants(w, pool[: max(1, n // 5)])
    fails = {}

    def fail(name, p):
        fails.setdefault(name, [0, p.canonical()])[0] += 1

    base = cost_model.predict_arrays(w, pool)
    for name, more in SCAN_KNOBS.items():  # vectorised: the knob changes the workload, not the plan
        w2, _, kw = more(w, pool[0])
        for j in np.nonzero(cost_model.predict_arrays(w2, pool, **kw)["step_time_s"] < base["step_time_s"] * (1 - REL))[0]:
            fail(name, pool[j])
    for p in pool[:300]:
        if layers_apply(w, p):
            w2, p2, kw = KNOBS["layers"](w, p)
            if step(w2, p2, **kw) < step(w, p) * (1 - REL):
                fail("layers", p)
    w2 = twice_the_gpus(w)
    ok = [p for p in pool if realizable(w2, p)]
    if ok:
        m1 = cost_model.predict_arrays(w, ok)["peak_memory_gib"]
        for j in np.nonzero(cost_model.predict_arrays(w2, ok)["peak_memory_gib"] > m1 * (1 + REL))[0]:
            fail("memory, 2x GPUs", ok[j])
    for j, p in enumerate(pool[:400]):
        for name in memory_breaks(w, p, float(base["peak_memory_gib"][j])):
            fail("memory, " + name, p)
        if p.recompute != "none" and float(base["step_time_s"][j]) < step(w, p.replace(**_RECOMPUTE_RESET)) * (1 - REL):
            fail("step, recompute", p)
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
