"""Validation only (never fitted on): every public EP-overlap A/B pair the repository knows, the
model's step-time ratio beside the measured one (issue 22: "every published overlap A/B pair's
predicted step ratio within 6 points of the measured one").

    PYTHONPATH=$PWD python bench/overlap_ab_pairs.py

Pairs (the only change inside a pair is the EP a2a overlap):
- Qwen3-30B-A3B, 16 H100, BF16, TP1 PP1 EP16 MBS1 GBS1024, HybridEP, forced balance, TE graphs
  moe_router + moe_preprocess: 24.71 -> 20.99 s (Megatron-Bridge
  skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md, "Measured Evidence").
- The same workload, NCCL alltoall, no CUDA graphs, permute fusion off: 41.25 -> 31.31 s (same file,
  "Correctness-first alltoall smoke", directional).
- Qwen3-235B-A22B, 256 H100, BF16, TP2 PP8 VPP4 EP32 MBS1 GBS2048, DeepEP, recompute norm + act,
  dropless (the table's rows without `--moe-router-force-load-balancing`): 19.7 -> 17.6 s, "+1f1b
  overlap" (yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md, H100 cross-node EP rows,
  branch moe_dev f3e6c5); "on" is the ModelZoo's A2A_OVERLAP=1, which also sets --delay-wgrad-compute.
  94 layers over 32 virtual stages needs the embedding / loss split, as the
  ModelZoo's Qwen3-235B config sets it. Routing imbalance is unknown (priced at 1.0 and 1.3).
Prints each pair raw (the calibration scale cancels in a ratio) and the gap in points.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.modelzoo_rows import A2A_OVERLAP_ON, TP2_EP32, TP2_EP32_STEP_S  # noqa: E402
from clusters import load_cluster  # noqa: E402
from cost_model import predict  # noqa: E402
from cost_model.calibration import IDENTITY  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan  # noqa: E402
from specs.workload import Workload  # noqa: E402

QWEN30 = ("qwen3-30b-a3b", "h100-sxm", 16, 1024, 4096)
QWEN235 = ("qwen3-235b-a22b", "h100-sxm", 256, 2048, 4096)
PAIRS = [
    # label, workload, plan fields, the "on" side's fields, measured (off, on) seconds, predict() options
    ("Qwen3-30B 16xH100 bf16 HybridEP (graphs router+preprocess)", QWEN30,
     dict(tp=1, pp=1, ep=16, mbs=1, precision="bf16", dispatcher="flex", flex_backend="hybridep",
          grad_reduce_bf16=True, cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe_router", "moe_preprocess")),
     dict(a2a_overlap=True), (24.7138, 20.9920), {}),  # "delayed wgrad stayed disabled"
    ("Qwen3-30B 16xH100 bf16 alltoall, permute fusion off (directional)", QWEN30,
     dict(tp=1, pp=1, ep=16, mbs=1, precision="bf16", dispatcher="alltoall", permute_fusion=False, grad_reduce_bf16=True),
     dict(a2a_overlap=True), (41.25, 31.31), {}),
]
for imb in (1.0, 1.3):
    PAIRS.append((f"Qwen3-235B 256xH100 bf16 DeepEP TP2 PP8 VPP4 EP32 (imbalance {imb})", QWEN235,
                  dict(TP2_EP32, mbs=1, precision="bf16"), A2A_OVERLAP_ON, TP2_EP32_STEP_S, {"imbalance": imb}))


def main() -> int:
    print(f"{'pair':66s} {'raw off s':>9s} {'raw on s':>9s} {'model':>7s} {'measured':>8s} {'gap pts':>7s}")
    for label, (model, kind, gpus, gbs, seq), fields, on_fields, (m_off, m_on), opts in PAIRS:
        w = Workload(load_model(model), load_cluster(kind, gpus), gbs, seq)
        off, on = (predict(w, Plan(**fields, **extra), calibration=IDENTITY, **opts).step_time_s for extra in ({}, on_fields))
        r, m = on / off - 1, m_on / m_off - 1
        print(f"{label:66s} {off:9.3f} {on:9.3f} {r:+7.1%} {m:+8.1%} {100 * (r - m):+7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
