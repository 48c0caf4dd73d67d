"""Counterfactual, not shipped (issue 22): what pricing the GPU idle after the dropless dispatcher's
stream drains would do to the shared training rows and to the HybridEP overlap A/B.

    PYTHONPATH=$PWD python bench/host_idle_counterfactual.py

The Nsight A/B in Megatron-Bridge skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md has the
overlap-off step at 24.714 s against a 22.821 s GPU-active union: >= 1.89 s idle over 48 layers x 64
microbatches of MoE forwards, ~616 us each; with overlap the union (21.221 s) covers the step, so the
other microbatch's queued work fills it. In megatron-core 0.16.1 HybridEP's blocking dispatch drains
the stream twice per MoE forward (deep_ep hybrid_ep_buffer.py: a stream synchronize after the
metadata preprocess, a blocking copy of tokens_per_expert after the dispatch), so ~308 us per drain;
the alltoall and DeepEP dispatchers drain once (the counts' device-to-host sync, DeepEP's host wait
for the notify), the allgather dispatcher and drop-and-pad never. The model prices ~32 us per
forward (`blocks.moe_host_sync`). This adds `R` x drains per MoE forward without a2a overlap (none
with it) and refits the one scale on the shared rows. The shipped model does not do this: it would
take the A/B from -17% to -24% (measured -15%), because the model hides 3.7 s of the A/B's
communication where the same Nsight's split says 1.4 s; both need to land together.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import cost_model.model as model  # noqa: E402
from cost_model import predict  # noqa: E402
from cost_model.blocks import moe_host_sync  # noqa: E402
from cost_model.calibration import IDENTITY, fit_calibration  # noqa: E402
from cost_model.fit_default_calibration import row_case, rows  # noqa: E402

DRAINS = np.array([1.0, 0.0, 1.0, 2.0])  # per dispatcher code: alltoall, allgather, DeepEP, HybridEP
NSIGHT_IDLE_PER_DRAIN_S = (24.714 - 22.821) / (48 * 64 * 2)


def with_drain_idle(r_s: float):
    def priced(x, after, after_gpu_s, extra_syncs=0.0):
        extra = r_s * DRAINS[x.pa.dispatch] * (1.0 - x.pa.a2a_overlap.astype(float))
        return moe_host_sync(x, after, after_gpu_s, extra_syncs) + extra * (1.0 if x.ops.async_launch else 0.0)
    return priced


def main() -> int:
    from bench.qwen3_30b_components import cases
    print(f"idle per drain from the Nsight: {NSIGHT_IDLE_PER_DRAIN_S * 1e6:.0f} us")
    for r_s in (0.0, NSIGHT_IDLE_PER_DRAIN_S / 2, NSIGHT_IDLE_PER_DRAIN_S):
        model.moe_host_sync = with_drain_idle(r_s)
        pairs = []
        for r in rows():
            w, p, meas, label, opts = row_case(r)
            pairs.append((predict(w, p, calibration=IDENTITY, **opts).step_time_s, meas, label))
        cal, rep = fit_calibration(pairs)
        res = cases()
        ab = res[("bf16", True)].step_time_s / res[("bf16", False)].step_time_s - 1
        print(f"R = {r_s * 1e6:3.0f} us: scale {cal.scale:.4f}; A/B bf16 HybridEP {ab:+.1%} (measured -15.1%)")
        for x in rep["rows"]:
            print(f"   {x['label']:60s} fitted {x['calibrated_rel_err']:+6.1%}  leave-one-out {x['loo_rel_err']:+6.1%}")
    model.moe_host_sync = moe_host_sync
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
