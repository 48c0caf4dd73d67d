"""Validation only (never fitted on): the serving model against the LMSYS post "Deploying DeepSeek
with PD Disaggregation and Large-scale Expert Parallelism on 96 H100 GPUs" (lmsys.org/blog,
2025-05-05): DeepSeek-V3 FP8, prefill pool of 4 nodes (EP32) and decode pool of 9 nodes (EP72),
DeepEP + two-batch overlap + EPLB, 2000-token inputs; reported ~52.3k input tok/s and ~22.3k
output tok/s per node, i.e. ~6.5k input and ~2.8k output tok/s per GPU (decode at 256 requests
per GPU).
Plans carry the flags of the post's reproduction commands (SGLang issue 6017: prefill
--mem-fraction-static 0.85 --chunked-prefill-size 524288 --deepep-mode normal --page-size 64;
decode --mem-fraction-static 0.835 --max-running-requests 18432 --cuda-graph-bs 256 --deepep-mode
low_latency; both --enable-two-batch-overlap --ep-num-redundant-experts 32 --moe-dense-tp-size 1:
the post's "DP for dense FFNs", each rank running the 3 dense layers on its own tokens with full
weights). SGLang's default
mem_fraction_static formula would not start these servers (attention-DP 32/72 graph padding
alone exceeds 80 GB), which is why the commands pin it.

    python bench/serving_lmsys_validation.py

Prints and writes bench/results/serving_lmsys_validation.md: our raw (identity calibration) and
calibrated numbers for the two pools as separate deployments (phase prefill / phase decode).
"""
from __future__ import annotations

from pathlib import Path

from clusters import load_cluster
from cost_model.serving import predict_serve
from cost_model.serving.calibration import IDENTITY, load_default
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload

OUT = Path(__file__).resolve().parent / "results" / "serving_lmsys_validation.md"
CASES = [
    # name, gpus, plan, workload, published tok/s/GPU, metric
    ("prefill EP32 (4 nodes)", 32, "tp=32,attn_dp=32,moe_dense_tp=1,a2a=deepep,deepep_mode=normal,tbo=1,eplb_redundant=32,"
     "mem_frac=0.85,chunked_prefill=524288,page_size=64",
     ServeWorkload(isl=2000, osl=100, concurrency=32 * 16, phase="prefill"), 52300 / 8, "input"),
    ("decode EP72 (9 nodes), 256 req/GPU", 72, "tp=72,attn_dp=72,moe_dense_tp=1,a2a=deepep,deepep_mode=low_latency,tbo=1,"
     "eplb_redundant=32,mem_frac=0.835,max_running=18432,cuda_graph_max_bs=256,page_size=64",
     ServeWorkload(isl=2000, osl=100, concurrency=256, phase="decode"), 22300 / 8, "output"),
]


def main() -> int:
    m = load_model("deepseek-v3")
    lines = ["# Serving model vs LMSYS 96xH100 large-scale EP (validation only, not fitted)", "",
             "| pool | plan | published tok/s/GPU | ours raw | ours calibrated | TTFT / TPOT (cal.) | max batch/GPU | mem_frac |",
             "|---|---|---|---|---|---|---|---|"]
    for name, gpus, text, w, pub, metric in CASES:
        cl = load_cluster("h100-sxm", gpus)
        p = ServePlan.parse(text)
        raw, cal = (predict_serve(m, cl, p, w, precision="fp8", calibration=c) for c in (IDENTITY, load_default()))
        key = f"{metric}_tokens_per_s_per_gpu"
        lat = f"TTFT {cal.ttft_p90_s:.2f} s" if metric == "input" else f"TPOT {cal.tpot_p90_s * 1e3:.0f} ms"
        lines.append(f"| {name} | {text} | {pub:.0f} | {getattr(raw, key):.0f} | {getattr(cal, key):.0f} | {lat} | "
                     f"{raw.max_batch:.0f}{'' if raw.feasible else ' (' + ','.join(raw.reasons) + ')'} | {raw.extra['mem_frac']:.3f} |")
    cal = load_default()
    lines += ["", "calibration: " + ", ".join(f"{k} x{cal.factor(k):.4f}" for k in ("prefill", "decode"))
              + " (per phase, fitted on cost_model/data/published_serving_reference.csv only)"]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
