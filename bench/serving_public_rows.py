"""Validation only (never fitted on): the serving model against public closed-loop SGLang runs that
are not calibration rows (issue 23 item 7: "public rows you choose for validation (name them;
never fit on them)").

    PYTHONPATH=$PWD python bench/serving_public_rows.py [--png bench/results/serving_public_rows.png]

Rows (each as its source states it; what the plan pins is the source's server command):
- InferenceX issue 870 (github.com/SemiAnalysisAI/InferenceX/issues/870, 2026-03-05): DeepSeek-R1-0528
  FP8, SGLang v0.5.7, TP8 on 8 H200, random 1k/1k, concurrency 8 / 16 / 32 / 64, 10 x concurrency
  prompts; the server command of InferenceX benchmarks/single_node/fixed_seq_len/dsr1_fp8_h200.sh
  (1k/1k branch: --max-running-requests 512 --cuda-graph-max-bs 512 --chunked-prefill-size 32768
  --mem-fraction-static 0.82 --disable-radix-cache). Reported: output tok/s per GPU and mean TPOT.
- InferenceX PR 3173 (github.com/SemiAnalysisAI/InferenceX/pull/3173, 2026-09-16, the published
  baseline of 2026-05-17 it quotes): the same family on SGLang v0.5.12 (lmsysorg/sglang:v0.5.12-cu130),
  TP8 on 8 H200, 1k/1k and 8k/1k at concurrency 4 / 8 / 16 / 32 / 64 (the script's 8k/1k branch:
  --max-running-requests 256 --cuda-graph-max-bs 256, otherwise as above). Output tok/s per GPU and
  mean TPOT.
- InferenceX PR 3183 (2026-09-16, the published baseline of 2026-05-22): DeepSeek-R1-0528 NVFP4
  (nvidia/DeepSeek-R1-0528-FP4-V2), SGLang v0.5.12, B300, 1k/1k at concurrency 1 / 2 / 4 / 8 / 16 / 32,
  TP4 EP4 (4 GPUs) and TP8 EP8 (8 GPUs); the server command of dsr1_fp4_b300.sh: --cuda-graph-max-bs
  256 --max-running-requests 256 --mem-fraction-static 0.85 --kv-cache-dtype fp8_e4m3
  --chunked-prefill-size 16384 --ep-size EP --quantization modelopt_fp4
  --enable-flashinfer-allreduce-fusion --enable-symm-mem --attention-backend trtllm_mla
  --moe-runner-backend flashinfer_trtllm. Its concurrency-1 rows are batch-1 TPOT on one node.
- InferenceX PR 3175 (2026-09-16, the published baseline of 2026-05-22): DeepSeek-R1-0528 FP8 on B300,
  SGLang v0.5.12, TP8 EP1 1k/1k at concurrency 1-64 and 8k/1k at concurrency 1-4 on TP4 / TP8 (the 12
  points the PR shows); the server command of dsr1_fp8_b300.sh: SGL_ENABLE_JIT_DEEPGEMM=false,
  --kv-cache-dtype fp8_e4m3 --enable-flashinfer-allreduce-fusion --attention-backend trtllm_mla
  --moe-runner-backend flashinfer_trtllm --quantization fp8, TP8: --cuda-graph-max-bs 128
  --max-running-requests 128 --mem-fraction-static 0.82 --chunked-prefill-size 32768, TP4 (8k/1k
  only): 32 / 32 / 0.95 / 8192.
- InferenceX PR 3363 (2026-09-22, the published baseline of 2026-05-22): the same on B200 (dsr1_fp8_b200.sh,
  the recipe the B300 script reuses): TP8 1k/1k at concurrency 1-64, 8k/1k TP4 at 1-2 and TP8 at 1 (the
  points with figures).
  InferenceX draws every length uniformly in [0.8 L, L] (its benchmark template's RANDOM_RANGE_RATIO
  0.8, utils/bench_serving's random sampler): priced at the mean, 0.9 L.
- tenstorrent/tt-inference-server issue 356 (2025-07-09): DeepSeek-R1-0528 on 16 H100 (two nodes,
  SGLang over InfiniBand), concurrency 1, 128 output tokens: TPOT at several input lengths; the
  server flags are not published, priced as plain TP16 (SGLang's defaults).
- sgl-project/sglang PR #7687 (2025-07-01, SGLang after 0.4.8 with its triton 3.3.1 fused-MoE configs):
  DeepSeek-V3 FP8 (DeepSeek-R1's architecture) on 16 H200 (two nodes), `--tp 16` and SGLang's
  defaults otherwise, random 1k/512 with --random-range-ratio 1, concurrency 8, 200 prompts: 102,400
  output tokens in 409.60 s with the PR's tuned config (437.69 s before) -> 15.6 output tok/s per GPU.
  No TPOT published.
- gist.github.com/BenHamm/78563d0d0a08d7cb61b4737392633384 ("SGLang B200 Benchmark Sweep", 2026-02-16:
  8 B200 with clocks locked at their maximum, SGLang v0.5.8.post1, sglang.bench_serving random
  1k/1k, each model at the SGLang cookbook's config): TPOT at concurrency 1 of Qwen3-235B-A22B BF16
  TP8 (6.70 ms), gpt-oss-120b MXFP4 TP8 (2.41 ms) and DeepSeek-R1-0528 FP4 TP8 (5.74 ms); the cookbook
  flags beyond TP8 are not in the gist, priced as plain TP8 (SGLang's defaults). Other architectures
  than DeepSeek's at batch 1, where the kernels of a layer decide the step.
- gpustack docs/performance-lab/deepseek-r1/h200.md (SGLang v0.5.3, the page's optimized
  `--tp 8 --enable-dp-attention`, 8 H200, `vllm bench serve` with every prompt sent at once): its
  two "Other Benchmark Cases" that are not calibration rows (the page's ShareGPT, 2K and 32K
  results are r02-r04 of cost_model/data/published_serving_reference.csv): random 4000 / 200, 500
  prompts (1,997,530 / 100,000 tokens printed): 16,096.80 total tok/s; random 128 / 4, 1000 prompts
  (126,882 / 4,000 tokens): 20,448.42 total tok/s. Priced as bursts at the printed mean lengths.
Prints, per row, the raw (identity) and the shipped calibrated prediction beside the published
figure, and the mean absolute error per metric. Medians of the simulated requests are set against
the published means.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clusters import load_cluster  # noqa: E402
from cost_model.serving import predict_serve  # noqa: E402
from cost_model.serving.calibration import IDENTITY, load_default  # noqa: E402
from cost_model.serving.fit_calibration import burst_prediction, total_tokens_per_s  # noqa: E402
from specs.fileio import write_png  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.serve_plan import ServePlan, ServeWorkload  # noqa: E402

IX = "InferenceX#870"
IX12 = "InferenceX#3173"
IXB3 = "InferenceX#3183"
IXB3F = "InferenceX#3175"
IXB2F = "InferenceX#3363"
# sources whose server runs with SGLang's DeepGEMM JIT off (SGL_ENABLE_JIT_DEEPGEMM=false)
NO_DEEPGEMM_JIT = {IXB3F, IXB2F}
TT = "tt-inference-server#356"
GIST = "b200-sweep-gist"
SG = "sglang#7687"
IX_PLAN = "tp=8,max_running=512,cuda_graph_max_bs=512,chunked_prefill=32768,mem_frac=0.82"
IX_PLAN_8K = "tp=8,max_running=256,cuda_graph_max_bs=256,chunked_prefill=32768,mem_frac=0.82"
B300_FLAGS = "max_running=256,cuda_graph_max_bs=256,chunked_prefill=16384,mem_frac=0.85,kv_cache_dtype=fp8_e4m3"
# dsr1_fp8_b300.sh / dsr1_fp8_b200.sh (the same recipe) at TP8 and TP4 (by the row's GPU count)
B300_FP8_TP8 = "max_running=128,cuda_graph_max_bs=128,chunked_prefill=32768,mem_frac=0.82"
B300_FP8_TP4 = "max_running=32,cuda_graph_max_bs=32,chunked_prefill=8192,mem_frac=0.95"
# InferenceX's lengths: uniform in [0.8 L, L], priced at their mean
IX_RANGE = 0.8
# (source, cluster kind, GPUs, plan, precision, isl, osl, length range ratio (1: fixed), concurrency,
# requests (None: 10 x concurrency, at least 16), published output tok/s/GPU or None, published mean
# TPOT ms or None)
ROWS = [
    (IX, "h200-sxm", 8, IX_PLAN, "fp8", 1024, 1024, IX_RANGE, 8, None, 74.6, 12.8),
    (IX, "h200-sxm", 8, IX_PLAN, "fp8", 1024, 1024, IX_RANGE, 16, None, 111.9, 17.2),
    (IX, "h200-sxm", 8, IX_PLAN, "fp8", 1024, 1024, IX_RANGE, 32, None, 151.1, 25.6),
    (IX, "h200-sxm", 8, IX_PLAN, "fp8", 1024, 1024, IX_RANGE, 64, None, 223.6, 34.6),
    (IX12, "h200-sxm", 8, IX_PLAN, "fp8", 1024, 1024, IX_RANGE, 4, None, 49.17, 9.7),
    (IX12, "h200-sxm", 8, IX_PLAN, "fp8", 1024, 1024, IX_RANGE, 8, None, 82.37, 11.73),
    (IX12, "h200-sxm", 8, IX_PLAN, "fp8", 1024, 1024, IX_RANGE, 16, None, 126.62, 15.28),
    (IX12, "h200-sxm", 8, IX_PLAN, "fp8", 1024, 1024, IX_RANGE, 32, None, 177.14, 21.8),
    (IX12, "h200-sxm", 8, IX_PLAN, "fp8", 1024, 1024, IX_RANGE, 64, None, 259.8, 29.77),
    (IX12, "h200-sxm", 8, IX_PLAN_8K, "fp8", 8192, 1024, IX_RANGE, 4, None, 43.12, 10.94),
    (IX12, "h200-sxm", 8, IX_PLAN_8K, "fp8", 8192, 1024, IX_RANGE, 8, None, 68.33, 13.88),
    (IX12, "h200-sxm", 8, IX_PLAN_8K, "fp8", 8192, 1024, IX_RANGE, 16, None, 93.89, 20.02),
    (IX12, "h200-sxm", 8, IX_PLAN_8K, "fp8", 8192, 1024, IX_RANGE, 32, None, 121.01, 31.37),
    (IX12, "h200-sxm", 8, IX_PLAN_8K, "fp8", 8192, 1024, IX_RANGE, 64, None, 150.98, 49.33),
] + [
    (IXB3, "b300", g, f"tp={g},ep={g},{B300_FLAGS}", "nvfp4", 1024, 1024, IX_RANGE, conc, None, out, tpot)
    for g, conc, out, tpot in ((4, 1, 41.56, 5.94), (8, 1, 21.87, 5.64), (4, 2, 73.14, 6.71), (8, 2, 38.98, 6.29),
                               (4, 4, 123.74, 7.72), (8, 4, 68.79, 6.93), (4, 8, 209.84, 9.2), (8, 8, 120.33, 8.0),
                               (4, 16, 332.82, 11.5), (8, 16, 199.71, 9.56), (4, 32, 511.26, 14.54),
                               (8, 32, 318.21, 11.57))
] + [
    (src, kind, g, f"tp={g},{B300_FP8_TP4 if g == 4 else B300_FP8_TP8},kv_cache_dtype=fp8_e4m3", "fp8", isl, 1024,
     IX_RANGE, conc, None, out, tpot)
    for src, kind, points in (
        (IXB3F, "b300", ((8, 1024, 1, 17.58, 7.04), (8, 1024, 2, 32.14, 7.64), (8, 1024, 4, 57.48, 8.3),
                         (8, 1024, 8, 95.35, 10.12), (8, 1024, 16, 154.31, 12.35), (8, 1024, 32, 245.81, 15.46),
                         (8, 1024, 64, 356.88, 21.17), (4, 8192, 1, 30.63, 7.76), (8, 8192, 1, 16.61, 7.23),
                         (4, 8192, 2, 53.39, 8.87), (8, 8192, 2, 29.52, 8.08), (4, 8192, 4, 83.82, 11.11))),
        (IXB2F, "b200", ((8, 1024, 1, 17.01, 7.18), (8, 1024, 2, 30.74, 7.93), (8, 1024, 4, 53.72, 8.82),
                         (8, 1024, 8, 87.31, 10.96), (8, 1024, 16, 145.25, 13.09), (8, 1024, 32, 234.01, 16.21),
                         (8, 1024, 64, 338.97, 21.73), (4, 8192, 1, 29.78, 7.96), (8, 8192, 1, 16.18, 7.39),
                         (4, 8192, 2, 51.72, 9.13))))
    for g, isl, conc, out, tpot in points
] + [
    (TT, "h100-sxm", 16, "tp=16", "fp8", 128, 128, 1.0, 1, None, None, 23.1),
    (TT, "h100-sxm", 16, "tp=16", "fp8", 1024, 128, 1.0, 1, None, None, 23.2),
    (TT, "h100-sxm", 16, "tp=16", "fp8", 4096, 128, 1.0, 1, None, None, 23.7),
    (SG, "h200-sxm", 16, "tp=16", "fp8", 1024, 512, 1.0, 8, 200, 102400 / 409.60 / 16, None),
] + [
    # batch-1 TPOT of other architectures on 8 B200 (GIST, module doc): (..., model) as the 13th field
    (GIST, "b200", 8, "tp=8", prec, 1024, 1024, 1.0, 1, None, None, tpot, model)
    for model, prec, tpot in (("qwen3-235b-a22b", "bf16", 6.70), ("gpt-oss-120b", "mxfp4", 2.41),
                              ("deepseek-r1", "nvfp4", 5.74))
]
GS = "gpustack deepseek-r1/h200"
# bursts: (source, plan, prompts, input tokens printed, output tokens printed, published total tok/s)
BURSTS = [
    (GS, "tp=8,attn_dp=8", 500, 1997530, 100000, 16096.80),
    (GS, "tp=8,attn_dp=8", 1000, 126882, 4000, 20448.42),
]


def mean_length(n: int, ratio: float) -> int:
    """Mean of lengths drawn uniformly in [ratio x n, n]."""
    return round(n * (1.0 + ratio) / 2.0)


def _model(row) -> str:
    """A row's model preset: its 13th field where it has one, else DeepSeek-R1 (every other source)."""
    return row[12] if len(row) > 12 else "deepseek-r1"


def predict_rows(rows=ROWS, calibrations=None):
    """Per row: (row, raw prediction, calibrated prediction)."""
    cals = calibrations or (IDENTITY, load_default())
    models = {name: load_model(name) for name in {_model(row) for row in rows}}
    out = []
    for row in rows:
        src, kind, gpus, text, prec, isl, osl, ratio, conc, n, out_pub, tpot_pub = row[:12]
        model = models[_model(row)]
        w = ServeWorkload(isl=mean_length(isl, ratio), osl=mean_length(osl, ratio), concurrency=conc)
        preds = [predict_serve(model, load_cluster(kind, gpus), ServePlan.parse(text), w, precision=prec, calibration=c,
                               n_requests=n or max(10 * conc, 16), deepgemm_jit=src not in NO_DEEPGEMM_JIT)
                 for c in cals]
        out.append((row, *preds))
    return out


def _plot(points, path: Path) -> None:
    """Predicted against published, per closed-loop row: TPOT (left, the issue's 20% band) and output
    tok/s/GPU (right, 15%), raw filled and calibrated hollow, one colour per source."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 (matplotlib.ticker below)
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    sources = sorted({p[0] for p in points})
    for ax, (i, name, band) in zip(axes, ((1, "mean TPOT, ms", 0.20), (2, "output tok/s/GPU", 0.15))):
        vals = [v for p in points if p[i] is not None for v in (p[i][0], p[i][1], p[i][2])]
        lo, hi = min(vals) * 0.8, max(vals) * 1.25
        ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)], color="0.9",
                        label=f"+-{band:.0%}")
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for k, src in enumerate(sources):
            pts = [p[i] for p in points if p[0] == src and p[i] is not None]
            if not pts:
                continue
            color = f"C{k}"
            ax.scatter([q[0] for q in pts], [q[1] for q in pts], color=color, s=18, label=f"{src} raw")
            ax.scatter([q[0] for q in pts], [q[2] for q in pts], facecolors="none", edgecolors=color, s=18,
                       label=f"{src} calibrated")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # the minor labels collide
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(f"published {name}")
        ax.set_ylabel(f"predicted {name}")
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("Serving model vs public closed-loop SGLang rows (validation only, never fitted)", fontsize=10)
    fig.tight_layout()
    write_png(fig, path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--png", type=Path, default=None, help="also write the predicted-vs-published plot here")
    a = ap.parse_args(argv)
    points = []
    cal = load_default()
    print(f"{'source':24s} {'gpus':>4s} {'isl/osl':>9s} {'conc':>4s} {'out/GPU pub':>11s} {'raw':>7s} {'cal':>7s} "
          f"{'TPOT pub':>8s} {'raw':>6s} {'cal':>6s}")
    errs: dict = {}
    for row, raw, calp in predict_rows(calibrations=(IDENTITY, cal)):
        src, kind, gpus, text, prec, isl, osl, ratio, conc, n, out_pub, tpot_pub = row[:12]
        tr, tc = (p.extra.get("tpot_p50_s") * 1e3 for p in (raw, calp))
        t = f"{'':8s} {tr:6.1f} {tc:6.1f}"
        if tpot_pub is not None:
            for k, v in (("TPOT raw", tr), ("TPOT cal", tc)):
                errs.setdefault(src, {}).setdefault(k, []).append(v / tpot_pub - 1)
            t = f"{tpot_pub:8.2f} {tr:6.2f} {tc:6.2f}"
        o = ""
        if out_pub is not None:
            o = f"{out_pub:11.1f} {raw.output_tokens_per_s_per_gpu:7.1f} {calp.output_tokens_per_s_per_gpu:7.1f}"
            for k, p in (("out raw", raw), ("out cal", calp)):
                errs.setdefault(src, {}).setdefault(k, []).append(p.output_tokens_per_s_per_gpu / out_pub - 1)
        print(f"{src:24s} {gpus:4d} {isl:>4d}/{osl:<4d} {conc:4d} {o:27s} {t}")
        points.append((src, None if tpot_pub is None else (tpot_pub, tr, tc),
                       None if out_pub is None else (out_pub, raw.output_tokens_per_s_per_gpu,
                                                     calp.output_tokens_per_s_per_gpu)))
    print("signed errors (prediction / published - 1), per source:")
    for src, by in errs.items():
        for k, v in by.items():
            print(f"  {src:24s} {k:9s} " + " ".join(f"{e:+.1%}" for e in v) + f"   MAPE {sum(abs(e) for e in v) / len(v):.1%}")
    print("bursts, total tok/s of the 8 GPUs (prediction / published - 1):")
    for src, text, n, tin, tout, pub in BURSTS:
        tot = [total_tokens_per_s(burst_prediction("deepseek-r1", "h200-sxm", 8, text, n, tin / n, tout / n, sharegpt=False,
                                                   precision="fp8", cal=c), 8) for c in (IDENTITY, cal)]
        print(f"  {src} {text} {round(tin / n)}/{round(tout / n)} x{n}: published {pub:,.0f}  raw {tot[0]:,.0f} "
              f"({tot[0] / pub - 1:+.1%})  calibrated {tot[1]:,.0f} ({tot[1] / pub - 1:+.1%})")
    if a.png:
        _plot(points, a.png)
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
