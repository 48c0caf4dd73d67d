"""How close the routed-expert kernel of a decode step gets to HBM bandwidth, by the bytes of one
weight row of an expert shard, N x bytes per weight (N = moe_ffn_hidden_size / moe_tp): thin
expert-TP shards stay far below it. Why row bytes: the kernel's CTAs each stream BLOCK_N x BLOCK_K
weights, so the bytes in flight over the whole kernel grow with N x bytes per weight.

Source: public timings of the whole fused-MoE call (both expert GEMMs, activation, alignment) at
decode batches with the untuned default block configuration, copied with their sources into
cost_model/data/fused_moe_kernel_latency.csv. For each shape the times are fitted by

    t(B) = t0 + weight_bytes(B) / (eff * HBM peak),
    weight_bytes(B) = E (1 - (1 - k/E)^B) x 3 x hidden x N x bytes per weight

(the distinct experts a batch of B tokens activates under uniform routing, as the benchmarks route);
`eff` is the fraction of the datasheet HBM bandwidth the kernel reaches. Between the measured
row bytes eff is interpolated in log row bytes; outside them it is held at the nearest one (no
extrapolation). Assumed: eff, as a fraction of each GPU's own peak, carries over between GPUs
(the rows are an H200 fp8 shape, 192 B rows, and a B200 bf16 one, 1536 B rows). The intercept t0 (~25 us on
both shapes) is not used: it is the kernels' minimum durations, which the step prices apart
(constants.KERNEL_MIN_S), and matches them (5 kernels x 5 us).
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "data" / "fused_moe_kernel_latency.csv"
_FIT: tuple | None = None


def fitted_shapes() -> list[dict]:
    """One dict per measured shape: n_shard, row_bytes, eff (fraction of HBM peak), t0_us, source."""
    shapes: dict = {}
    for r in csv.DictReader(DATA.open()):
        key = (r["gpu"], r["model"], r["n_shard"])
        shapes.setdefault(key, []).append(r)
    out = []
    for rows in shapes.values():
        r0 = rows[0]
        E, k = float(r0["num_experts"]), float(r0["topk"])
        per_expert = 3.0 * float(r0["hidden"]) * float(r0["n_shard"]) * float(r0["weight_bytes"])
        B = np.array([float(r["batch"]) for r in rows])
        nbytes = E * (1.0 - (1.0 - k / E) ** B) * per_expert
        t = np.array([float(r["kernel_us"]) for r in rows]) * 1e-6
        slope, t0 = np.polyfit(nbytes, t, 1)  # seconds per byte, seconds
        out.append({"n_shard": float(r0["n_shard"]), "gpu": r0["gpu"],
                    "row_bytes": float(r0["n_shard"]) * float(r0["weight_bytes"]),
                    "eff": float(1.0 / (slope * float(r0["hbm_tbps"]) * 1e12)), "t0_us": float(t0 * 1e6),
                    "source": r0["source"]})
    return sorted(out, key=lambda s: s["row_bytes"])


def expert_bandwidth_efficiency(n_shard, weight_bytes: float):
    """Fraction of the datasheet HBM bandwidth the routed-expert kernel reaches at per-expert
    shard width `n_shard` (array or float) with `weight_bytes` bytes per weight."""
    global _FIT
    if _FIT is None:
        s = fitted_shapes()
        _FIT = (np.log([x["row_bytes"] for x in s]), np.array([x["eff"] for x in s]))
    ln, eff = _FIT
    return np.interp(np.log(np.maximum(np.asarray(n_shard, float) * weight_bytes, 1.0)), ln, eff)
