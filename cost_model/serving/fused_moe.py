"""How close the routed-expert kernel of a decode step gets to HBM bandwidth, by the bytes of one
weight row of an expert shard, N x bytes per weight (N = moe_ffn_hidden_size / moe_tp): thin
expert-TP shards stay far below it. Why row bytes: the kernel's CTAs each stream BLOCK_N x BLOCK_K
weights, so the bytes in flight over the whole kernel grow with N x bytes per weight.

Source: public timings of the whole fused-MoE call (both expert GEMMs, activation, alignment) at
decode batches, copied with their sources into cost_model/data/fused_moe_kernel_latency.csv, in two
classes by the block configuration the call ran: the default one (no tuned file for the shape) and a
tuned one. They differ most at decode: SGLang's default for block-fp8 weights tiles 64 rows per
expert (fused_moe_triton_config.get_default_config: BLOCK_SIZE_M 64 at every M), its tuned files 16
(e.g. triton_3_5_1/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json
up to 256 tokens), where SGLang 0.5.23's kernel also swaps A and B on SM90
(fused_moe_triton_kernels.should_enable_swap_ab: BLOCK_SIZE_M < 64, BLOCK_SIZE_N >= 64). For each
shape the times are fitted by

    t(B) = t0 + weight_bytes(B) / (eff * HBM peak),
    weight_bytes(B) = L (1 - (1 - k/E)^B) x 3 x hidden x N x bytes per weight

(the distinct experts of the L on the GPU - E, or an EP shard's - that a batch of B tokens activates
under uniform routing over E, as the benchmarks route);
`eff` is the fraction of the datasheet HBM bandwidth the kernel reaches. Within a class, eff is
interpolated between the measured row bytes in log row bytes and held at the nearest one outside them
(no extrapolation). A tuned configuration is never slower than the default it replaces (the tuner
keeps the fastest it finds), so a tuned call reaches the larger of the two classes' figures.
Blackwell's flashinfer_trtllm MoE runner (routing, the permuting gated-activation GEMM, the second
GEMM and the finalize of TRT-LLM's generated kernels) is a third class of its own timings (one
shape: DeepSeek-V3's EP8 shard in NVFP4 on B300, flashinfer PR #5301, fitted over the batches at
which fewer than 90% of the shard's experts are active, beyond which the bytes stop growing), held
at that shape at every row width: a TP-sharded expert's thinner rows on that runner are an
extrapolation. Assumed: eff, as a fraction of each GPU's own peak, carries over between GPUs (the
rows: H200 fp8 192 B rows default and 256 B rows tuned, B200 bf16 1536 B rows default, B300 NVFP4
1152 B rows flashinfer_trtllm). The intercept t0 (~25 us on every shape) is not used: it is the
kernels' minimum durations, which the step prices apart (constants.KERNEL_MIN_S), and matches them
(5 kernels x 5 us). Measured, not used: the tuned class's marginal rate over its largest calls
(16-32 tokens) is ~90% of peak, above the straight-line fit; calls beyond the measured bytes (a
DeepSeek TP8 decode call at 64 tokens reads ~3x the largest) are priced at the fit.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "data" / "fused_moe_kernel_latency.csv"
# The same kernel at prefill-sized calls (1024-4096 tokens), where its GEMMs, not the weight read,
# set its time: the throughput ceiling `step.fused_moe_fp8_peak_fraction` is measured on them
PREFILL_DATA = DATA.with_name("fused_moe_prefill_latency.csv")
# tokens of a measured call whose GEMMs set its time (top-8 of 128 experts: ~100 rows per expert and
# more; at 1024 tokens the measured call sits near its weight-read floor)
PREFILL_MIN_TOKENS = 1536
# Rows of the kernel's tile, to which each expert's routed rows are padded (moe_align_block_size):
# sglang 0.5.23 fused_moe_triton_config.py get_default_config gives fp8 block-quantised weights
# BLOCK_SIZE_M 64 at every M; its tuned configs take 16 while M <= E and 64 above (e.g.
# triton_3_5_1/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json: 16
# up to 256 tokens, 32 at 512, 64 from 1024; triton_3_2_0/E=128,N=768,...H200 fp8: 16 for 4-128,
# 64 from 256)
FUSED_MOE_BLOCK_M = 64
FUSED_MOE_BLOCK_M_SMALL = 16
# the `config` column of the timings: the kernel each class ran (Triton fused_moe unless named)
KERNEL_OF_CONFIG = {"flashinfer_trtllm": "flashinfer_trtllm"}
_FIT: tuple | None = None


def fitted_shapes() -> list[dict]:
    """One dict per measured shape: n_shard, row_bytes, eff (fraction of HBM peak), t0_us, tuned
    (the call ran a tuned block config), kernel (the MoE runner timed), source."""
    shapes: dict = {}
    for r in csv.DictReader(DATA.open()):
        key = (r["gpu"], r["model"], r["n_shard"], r["config"])
        shapes.setdefault(key, []).append(r)
    out = []
    for rows in shapes.values():
        r0 = rows[0]
        E, k = float(r0["num_experts"]), float(r0["topk"])
        local = float(r0["local_experts"] or E)  # an EP shard's experts (all E without one)
        per_expert = 3.0 * float(r0["hidden"]) * float(r0["n_shard"]) * float(r0["weight_bytes"])
        B = np.array([float(r["batch"]) for r in rows])
        nbytes = local * (1.0 - (1.0 - k / E) ** B) * per_expert
        t = np.array([float(r["kernel_us"]) for r in rows]) * 1e-6
        slope, t0 = np.polyfit(nbytes, t, 1)  # seconds per byte, seconds
        out.append({"n_shard": float(r0["n_shard"]), "gpu": r0["gpu"],
                    "row_bytes": float(r0["n_shard"]) * float(r0["weight_bytes"]),
                    "eff": float(1.0 / (slope * float(r0["hbm_tbps"]) * 1e12)), "t0_us": float(t0 * 1e6),
                    "tuned": r0["config"] == "tuned", "kernel": KERNEL_OF_CONFIG.get(r0["config"], "triton_fused_moe"),
                    "source": r0["source"]})
    return sorted(out, key=lambda s: s["row_bytes"])


def _class_eff(shapes: list[dict], row_bytes):
    """eff interpolated over `shapes` (one config class) in log row bytes, held at its ends."""
    ln = np.log([x["row_bytes"] for x in shapes])
    return np.interp(np.log(np.maximum(row_bytes, 1.0)), ln, np.array([x["eff"] for x in shapes]))


def expert_bandwidth_efficiency(n_shard, weight_bytes: float, tuned=False, kernel="triton_fused_moe"):
    """Fraction of the datasheet HBM bandwidth the routed-expert kernel reaches at per-expert
    shard width `n_shard` (array or float) with `weight_bytes` bytes per weight. Triton fused_moe
    with SGLang's default block configuration, or (`tuned`, array or bool) a tuned one: the larger
    of the tuned and the default figure; Blackwell's flashinfer_trtllm runner (`kernel`, array or
    str, `kernel_path.moe_path`) at its own measured figure. Other kernels (DeepGEMM's grouped
    GEMMs under DeepEP) have no decode timing here and take the Triton default's."""
    global _FIT
    if _FIT is None:
        s = fitted_shapes()
        triton = [x for x in s if x["kernel"] == "triton_fused_moe"]
        _FIT = ([x for x in triton if not x["tuned"]], [x for x in triton if x["tuned"]],
                [x for x in s if x["kernel"] == "flashinfer_trtllm"])
    default, tuned_shapes, trtllm = _FIT
    rb = np.asarray(n_shard, float) * weight_bytes
    base = _class_eff(default, rb)
    triton = np.where(np.asarray(tuned, bool), np.maximum(base, _class_eff(tuned_shapes, rb)), base)
    return np.where(np.asarray(kernel) == "flashinfer_trtllm", _class_eff(trtllm, rb), triton)


# ---- SGLang's tuned fused-MoE configs ---------------------------------------------------------------
# SGLang ships tuned configurations for the shapes its users run (one JSON per E, N, device, dtype;
# sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py get_config_file_name /
# get_moe_configs, which falls back across its triton_* directories). Decode calls read their weights
# at the tuned class's bandwidth above; compute-bound (prefill-sized) calls run faster by
# TUNED_CONFIG_SPEEDUP. The list of shipped NVIDIA configs is copied into
# cost_model/data/sglang_fused_moe_configs.csv (`python -m cost_model.serving.fused_moe --refresh
# SGLANG_PACKAGE_DIR` rewrites it from an installed sglang).
TUNED_DATA = DATA.with_name("sglang_fused_moe_configs.csv")
# Tuned / default kernel speed at prefill-sized calls, fp8 w8a8, from public kernel-level A/Bs of the
# same kernel at the same shape: vLLM PR #35457 (H200, E=128 N=96 fp8: 5-6% at batch 1024-2048, 8-11%
# at 48-128), vLLM PR #53819 (L40S, E=256 N=512 fp8: 2.6-7.5% over M = 2..8192, median 6.6%): ~1.08.
TUNED_CONFIG_SPEEDUP = 1.08
_TUNED: set | None = None


def _tuned_shapes() -> set:
    """{(E, N, device_name, dtype)} of the shipped configs; dtype "" for bf16 / fp16 (no dtype in
    the name), "fp8_w8a8" whatever its block shape or per-channel suffix."""
    global _TUNED
    if _TUNED is None:
        _TUNED = {(int(r["E"]), int(r["N"]), r["device_name"], r["dtype"]) for r in csv.DictReader(TUNED_DATA.open())}
    return _TUNED


def ships_tuned_config(cluster, local_experts, n_shard, fp8: bool):
    """Whether SGLang ships a tuned fused-MoE config for `local_experts` experts of shard width
    `n_shard` (arrays or floats) on `cluster`'s device, at fp8 w8a8 (`fp8`) or 16-bit weights. The
    expert count may carry one more: SGLang fuses the shared expert into the routed kernel as an
    extra expert on some paths (configs for E=257 sit beside E=256), so either counts."""
    from clusters import torch_device_name
    dev = torch_device_name(cluster)  # the name SGLang keys its configs by
    e = np.atleast_1d(np.asarray(local_experts, float)).astype(int)
    n = np.atleast_1d(np.asarray(n_shard, float)).astype(int)
    e, n = np.broadcast_arrays(e, n)
    shapes, dt = _tuned_shapes(), ("fp8_w8a8" if fp8 else "")
    # a ranking prices tens of thousands of plans over a handful of distinct shapes
    pairs, inverse = np.unique(np.stack([e.ravel(), n.ravel()], axis=1), axis=0, return_inverse=True)
    hit = np.array([(a, b, dev, dt) in shapes or (a + 1, b, dev, dt) in shapes for a, b in pairs.tolist()])
    return hit[inverse.ravel()].reshape(e.shape)


def _refresh(sglang_dir: str) -> int:
    """Rewrite TUNED_DATA from an installed sglang package directory (NVIDIA configs, the first
    GEMM's file of each shape: a "_down" file pairs with one), each row with the file it came from."""
    import re
    from importlib.metadata import version
    root = Path(sglang_dir) / "srt" / "layers" / "moe" / "moe_runner" / "triton_utils" / "configs"
    pat = re.compile(r"^E=(\d+),N=(\d+),device_name=(NVIDIA[^,]*?)(?:,dtype=([a-z0-9_]+))?(?:,block_shape=\[[^]]*\])?"
                     r"(?:,per_channel_quant=True)?\.json$")
    rows: dict = {}
    for f in sorted(root.glob("triton_*/*.json")):
        m = pat.match(f.name)
        if m and not f.stem.endswith("_down"):
            rows.setdefault((int(m[1]), int(m[2]), m[3], m[4] or ""), f"{f.parent.name}/{f.name}")
    src = f"sglang {version('sglang')} srt/layers/moe/moe_runner/triton_utils/configs/"
    with TUNED_DATA.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["E", "N", "device_name", "dtype", "source"])
        w.writerows([*k, src + v] for k, v in sorted(rows.items()))
    print(f"wrote {TUNED_DATA} ({len(rows)} shapes from {root})")
    return 0


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="rewrite the list of SGLang's shipped tuned fused-MoE configs")
    ap.add_argument("--refresh", metavar="SGLANG_PACKAGE_DIR", required=True)
    raise SystemExit(_refresh(ap.parse_args().refresh))
