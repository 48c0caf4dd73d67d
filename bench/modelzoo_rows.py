"""Validation only (never fitted on): Megatron-MoE-ModelZoo's published Qwen3-235B-A22B layouts
against the model, each pinned as the table gives it and calibrated with the shipped scale.

    PYTHONPATH=$PWD python bench/modelzoo_rows.py

Source: github.com/yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md (H100: 256 GPUs,
BF16, seq 4096, GBS 2048, MBS 1, "InfiniBand 8x50 GB/s"; GB200: HybridEP, NVLink domain 72). The
H100 rows run dropless routing unless the table says forced balance; the model prices balanced
routing (imbalance 1.0), which is one reason a row can run slower than predicted. Rows the plan space
cannot express are left out (Qwen3-Next); the FSDP row runs with plan field fsdp (Megatron FSDP,
optim_grads_params; its "full" recompute as uniform, one layer per checkpoint). 94 layers over 32 virtual stages take the
embedding / loss split (`pp_embedding`, `pp_loss`), as the ModelZoo's Qwen3-235B config sets it
(model_configs/benchmarking/Qwen3-235B-A22B.yaml: --account-for-{embedding,loss}-in-pipeline-split).
GB200: NNODES=64 of 4 GPUs.
Prints predicted vs measured step seconds (H100) or TFLOPS/GPU (GB200) and the MAPE of the H100 rows.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clusters import load_cluster  # noqa: E402
from cost_model import predict  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan  # noqa: E402
from specs.workload import Workload  # noqa: E402

NORM_ACT = dict(recompute="selective", recompute_modules=("layernorm", "moe_act"))
SPLIT = dict(pp_embedding=True, pp_loss=True)
DEEPEP = dict(dispatcher="flex", flex_backend="deepep")
# the cross-node DeepEP layout, published without and with "+1f1b overlap" (EP a2a overlap): the one
# overlap A/B pair of the table (bench/overlap_ab_pairs.py reads it from here)
TP2_EP32 = dict(tp=2, pp=8, vpp=4, ep=32, **DEEPEP, **NORM_ACT, **SPLIT)
TP2_EP32_STEP_S = (19.7, 17.6)  # measured step seconds, overlap off / on
# what the ModelZoo's "+1f1b overlap" sets: A2A_OVERLAP=1 in its sbatch_benchmarking.sh:111-115 adds
# --delay-wgrad-compute beside --overlap-moe-expert-parallel-comm (best_practice/qwen3/run_235b.sh
# runs this layout with A2A_OVERLAP=1)
A2A_OVERLAP_ON = dict(a2a_overlap=True, delay_wgrad=True)
ROWS = [
    # label, cluster kind, GPUs, GBS, plan fields, measured step s, measured TFLOPS/GPU
    ("H100 DeepEP TP2 EP32 PP8 VPP4, recompute norm+act", "h100-sxm", 256, 2048,
     TP2_EP32, TP2_EP32_STEP_S[0], 245),
    ("H100 DeepEP TP2 EP32 PP8 VPP4, recompute norm+act, +1f1b overlap", "h100-sxm", 256, 2048,
     dict(TP2_EP32, **A2A_OVERLAP_ON), TP2_EP32_STEP_S[1], 276),
    ("H100 A2A TP2 EP8 PP32 VPP3, recompute norm+act", "h100-sxm", 256, 2048,
     dict(tp=2, pp=32, vpp=3, ep=8, dispatcher="alltoall", **NORM_ACT, **SPLIT), 24.2, 200),
    ("H100 DeepEP TP4 EP8 PP8 VPP4", "h100-sxm", 256, 2048,
     dict(tp=4, pp=8, vpp=4, ep=8, **DEEPEP, **SPLIT), 29.0, 167),
    ("H100 DeepEP TP2 EP8 PP1 MBS4, FSDP, full recompute", "h100-sxm", 256, 2048,
     dict(tp=2, pp=1, ep=8, mbs=4, fsdp=True, recompute="full", recompute_method="uniform", recompute_layers=1,
          **DEEPEP), 17.6, 276),
    ("GB200 HybridEP BF16 TP1 PP8 EP8, TE graphs attn+moe_router+moe_preprocess", "gb200-nvl72", 256, 8192,
     dict(tp=1, pp=8, ep=8, **SPLIT, dispatcher="flex", flex_backend="hybridep", cuda_graph_impl="transformer_engine",
          cuda_graph_scope=("attn", "moe_router", "moe_preprocess")), None, 750),
]


def main() -> int:
    model = load_model("qwen3-235b-a22b")
    errs = []
    print(f"{'row':78s} {'pred':>9s} {'measured':>9s} {'error':>7s}  memory")
    for label, kind, gpus, gbs, fields, meas_s, meas_tf in ROWS:
        w = Workload(model, load_cluster(kind, gpus), gbs, 4096)
        p = predict(w, Plan(**{"mbs": 1, "precision": "bf16", **fields}))
        mem = f"{p.peak_memory_gib:.1f} GiB {'fits' if p.feasible else 'OOM ' + ';'.join(p.reasons)}"
        if meas_s is not None:
            e = p.step_time_s / meas_s - 1
            errs.append(abs(e))
            print(f"{label:78s} {p.step_time_s:8.2f}s {meas_s:8.2f}s {e:+7.1%}  {mem}")
        else:
            e = p.model_tflops_per_gpu / meas_tf - 1
            print(f"{label:78s} {p.model_tflops_per_gpu:6.0f} TF {meas_tf:6.0f} TF {e:+7.1%}  {mem}")
    print(f"H100 step-time MAPE {100 * sum(errs) / len(errs):.1f}% over {len(errs)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
