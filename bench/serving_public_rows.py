"""Validation only (never fitted on): the serving model against public closed-loop SGLang runs that
are not calibration rows (issue 23 item 7: "public rows you choose for validation (name them;
never fit on them)").

    PYTHONPATH=$PWD python bench/serving_public_rows.py

Rows (each as its source states it; what the plan pins is the source's server command):
- InferenceX issue 870 (github.com/SemiAnalysisAI/InferenceX/issues/870, 2026-03-05): DeepSeek-R1-0528
  FP8, SGLang v0.5.7, TP8 on 8 H200, random 1k/1k, concurrency 8 / 16 / 32 / 64, 10 x concurrency
  prompts; the server command of InferenceX benchmarks/single_node/fixed_seq_len/dsr1_fp8_h200.sh
  (1k/1k branch: --max-running-requests 512 --cuda-graph-max-bs 512 --chunked-prefill-size 32768
  --mem-fraction-static 0.82 --disable-radix-cache). Reported: output tok/s per GPU and mean TPOT.
  (The script's random-range ratio draws lengths below 1k; priced at exactly 1k/1k.)
- tenstorrent/tt-inference-server issue 356 (2025-07-09): DeepSeek-R1-0528 on 16 H100 (two nodes,
  SGLang over InfiniBand), concurrency 1, 128 output tokens: TPOT at several input lengths; the
  server flags are not published, priced as plain TP16 (SGLang's defaults).
- sgl-project/sglang PR #7687 (2025-07-01, SGLang after 0.4.8 with its triton 3.3.1 fused-MoE configs):
  DeepSeek-V3 FP8 (DeepSeek-R1's architecture) on 16 H200 (two nodes), `--tp 16` and SGLang's
  defaults otherwise, random 1k/512 with --random-range-ratio 1, concurrency 8, 200 prompts: 102,400
  output tokens in 409.60 s with the PR's tuned config (437.69 s before) -> 15.6 output tok/s per GPU.
  No TPOT published.
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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clusters import load_cluster  # noqa: E402
from cost_model.serving import predict_serve  # noqa: E402
from cost_model.serving.calibration import IDENTITY, load_default  # noqa: E402
from cost_model.serving.fit_calibration import burst_prediction, total_tokens_per_s  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.serve_plan import ServePlan, ServeWorkload  # noqa: E402

IX = "InferenceX#870"
TT = "tt-inference-server#356"
IX_PLAN = "tp=8,max_running=512,cuda_graph_max_bs=512,chunked_prefill=32768,mem_frac=0.82"
SG = "sglang#7687"
# (source, cluster kind, GPUs, plan, isl, osl, concurrency, requests (None: 10 x concurrency, at least
# 16), published output tok/s/GPU or None, published mean TPOT ms or None)
ROWS = [
    (IX, "h200-sxm", 8, IX_PLAN, 1024, 1024, 8, None, 74.6, 12.8),
    (IX, "h200-sxm", 8, IX_PLAN, 1024, 1024, 16, None, 111.9, 17.2),
    (IX, "h200-sxm", 8, IX_PLAN, 1024, 1024, 32, None, 151.1, 25.6),
    (IX, "h200-sxm", 8, IX_PLAN, 1024, 1024, 64, None, 223.6, 34.6),
    (TT, "h100-sxm", 16, "tp=16", 128, 128, 1, None, None, 23.1),
    (TT, "h100-sxm", 16, "tp=16", 1024, 128, 1, None, None, 23.2),
    (TT, "h100-sxm", 16, "tp=16", 4096, 128, 1, None, None, 23.7),
    (SG, "h200-sxm", 16, "tp=16", 1024, 512, 8, 200, 102400 / 409.60 / 16, None),
]
GS = "gpustack deepseek-r1/h200"
# bursts: (source, plan, prompts, input tokens printed, output tokens printed, published total tok/s)
BURSTS = [
    (GS, "tp=8,attn_dp=8", 500, 1997530, 100000, 16096.80),
    (GS, "tp=8,attn_dp=8", 1000, 126882, 4000, 20448.42),
]


def main() -> int:
    model = load_model("deepseek-r1")
    cal = load_default()
    print(f"{'source':24s} {'gpus':>4s} {'isl/osl':>9s} {'conc':>4s} {'out/GPU pub':>11s} {'raw':>7s} {'cal':>7s} "
          f"{'TPOT pub':>8s} {'raw':>6s} {'cal':>6s}")
    errs = {"out raw": [], "out cal": [], "tpot raw": [], "tpot cal": []}
    for src, kind, gpus, text, isl, osl, conc, n, out_pub, tpot_pub in ROWS:
        cl = load_cluster(kind, gpus)
        w = ServeWorkload(isl=isl, osl=osl, concurrency=conc)
        n = n or max(10 * conc, 16)
        raw, calp = (predict_serve(model, cl, ServePlan.parse(text), w, precision="fp8", calibration=c, n_requests=n)
                     for c in (IDENTITY, cal))
        tr, tc = (p.extra.get("tpot_p50_s") * 1e3 for p in (raw, calp))
        t = f"{'':8s} {tr:6.1f} {tc:6.1f}"
        if tpot_pub is not None:
            errs["tpot raw"].append(tr / tpot_pub - 1)
            errs["tpot cal"].append(tc / tpot_pub - 1)
            t = f"{tpot_pub:8.1f} {tr:6.1f} {tc:6.1f}"
        o = "" if out_pub is None else f"{out_pub:11.1f} {raw.output_tokens_per_s_per_gpu:7.1f} {calp.output_tokens_per_s_per_gpu:7.1f}"
        if out_pub is not None:
            errs["out raw"].append(raw.output_tokens_per_s_per_gpu / out_pub - 1)
            errs["out cal"].append(calp.output_tokens_per_s_per_gpu / out_pub - 1)
        print(f"{src:24s} {gpus:4d} {isl:>4d}/{osl:<4d} {conc:4d} {o:27s} {t}")
    print("signed errors (prediction / published - 1):")
    for k, v in errs.items():
        print(f"  {k:9s} " + " ".join(f"{e:+.1%}" for e in v) + f"   MAPE {sum(abs(e) for e in v) / len(v):.1%}")
    print("bursts, total tok/s of the 8 GPUs (prediction / published - 1):")
    for src, text, n, tin, tout, pub in BURSTS:
        tot = [total_tokens_per_s(burst_prediction("deepseek-r1", "h200-sxm", 8, text, n, tin / n, tout / n, sharegpt=False,
                                                   precision="fp8", cal=c), 8) for c in (IDENTITY, cal)]
        print(f"  {src} {text} {round(tin / n)}/{round(tout / n)} x{n}: published {pub:,.0f}  raw {tot[0]:,.0f} "
              f"({tot[0] / pub - 1:+.1%})  calibrated {tot[1]:,.0f} ({tot[1] / pub - 1:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
