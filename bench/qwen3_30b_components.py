"""Per-component raw breakdown of the issue-22 workload, Qwen3-30B-A3B on 16 H100 (gbs 1024, seq
4096, tp1 pp1 ep16 mbs1, flex/HybridEP as the 26.04 recipe runs it), bf16 and fp8 (current scaling),
without and with EP a2a overlap; then the overlap A/B (step ratio) per dispatcher and fp8 / bf16.

    PYTHONPATH=$PWD python bench/qwen3_30b_components.py

Raw seconds per step (calibration off). Measured references (not fitted): the overlap A/B on this
workload, BF16 HybridEP, is -15% step time (Megatron-Bridge skills/nemo-mbridge-perf-moe-comm-overlap
SKILL.md "Measured Evidence"), BF16 alltoall without CUDA graphs or permute fusion -24% (the same
file, "Correctness-first alltoall smoke", directional; priced with permute_fusion=0 as it ran); no public DeepEP pair on this workload; fp8
vs bf16 equal or slower (issue 22's sources).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clusters import load_cluster  # noqa: E402
from cost_model import predict  # noqa: E402
from cost_model.calibration import IDENTITY  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan  # noqa: E402
from specs.workload import Workload  # noqa: E402


def W():
    return Workload(load_model("qwen3-30b-a3b"), load_cluster("h100-sxm", 16), 1024, 4096)


def cases():
    w = W()
    out = {}
    for prec in ("bf16", "fp8-tensorwise"):
        for a2a in (False, True):
            p = Plan(tp=1, pp=1, ep=16, mbs=1, precision=prec, dispatcher="flex", flex_backend="hybridep",
                     a2a_overlap=a2a, grad_reduce_bf16=True)
            out[(prec, a2a)] = predict(w, p, calibration=IDENTITY)
    return out


def main() -> int:
    res = cases()
    keys = list(res)
    comps = sorted({k for r in res.values() for k, v in r.breakdown_s.items() if abs(v) > 1e-9},
                   key=lambda k: list(res[keys[0]].breakdown_s).index(k))
    print(f"{'component (raw s/step)':28s} " + " ".join(f"{p[:6] + (' a2a' if a else ''):>12s}" for p, a in keys))
    for c in comps:
        print(f"{c:28s} " + " ".join(f"{res[k].breakdown_s.get(c, 0.0):12.3f}" for k in keys))
    print(f"{'step (raw)':28s} " + " ".join(f"{res[k].step_time_s:12.3f}" for k in keys))
    for prec in ("bf16", "fp8-tensorwise"):
        r = res[(prec, True)].step_time_s / res[(prec, False)].step_time_s - 1
        print(f"a2a overlap A/B {prec} hybridep: {r:+.1%} step time (measured bf16: -15%)")
    # the alltoall smoke ran moe_permute_fusion=false (its note: TE fused permutation failed in
    # bring-up): priced as it ran (permute_fusion=0), and with the fused kernels beside it
    measured = {("alltoall", False): "-24% (directional, permute fusion off)", ("alltoall", True): "no public pair",
                ("deepep", True): "no public pair"}
    for disp, backend, pf in (("alltoall", None, False), ("alltoall", None, True), ("flex", "deepep", True)):
        steps = [predict(W(), Plan(tp=1, pp=1, ep=16, mbs=1, precision="bf16", dispatcher=disp,
                                   a2a_overlap=a2a, grad_reduce_bf16=True, permute_fusion=pf,
                                   **({"flex_backend": backend} if backend else {})),
                         calibration=IDENTITY).step_time_s for a2a in (False, True)]
        print(f"a2a overlap A/B bf16 {backend or disp} permute_fusion={int(pf)}: {steps[1] / steps[0] - 1:+.1%} "
              f"step time (measured: {measured[backend or disp, pf]})")
    for a in (False, True):
        r = res[("fp8-tensorwise", a)].step_time_s / res[("bf16", a)].step_time_s - 1
        print(f"fp8 vs bf16 (a2a={a}): {r:+.1%} step time (public: equal or slower)")
    # delay_wgrad under a2a overlap (the backward dispatch / combine also hide under the wgrad GEMMs
    # the first communication left); measured: the same alltoall smoke, 31.31 -> 31.20 s (directional)
    measured = {"alltoall": "-0.35% (directional, permute fusion off)", "deepep": "no public pair",
                "hybridep": "no public pair"}
    for disp, backend in (("alltoall", None), ("flex", "deepep"), ("flex", "hybridep")):
        steps = [predict(W(), Plan(tp=1, pp=1, ep=16, mbs=1, precision="bf16", dispatcher=disp, a2a_overlap=True,
                                   delay_wgrad=d, grad_reduce_bf16=True, permute_fusion=disp != "alltoall",
                                   **({"flex_backend": backend} if backend else {})),
                         calibration=IDENTITY).step_time_s for d in (False, True)]
        print(f"delay_wgrad A/B bf16 {backend or disp} (a2a overlap on): {steps[1] / steps[0] - 1:+.1%} step time "
              f"(measured: {measured[backend or disp]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
