"""Validation only (nothing is fitted on it): the training model against the optimization history
of Megatron-LM's "DeepSeek-V3 on GB200" notes (github.com/NVIDIA/Megatron-LM
docs/discussions/deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md, at
3c1b98efdc^, "3. Summary and Outlook"): DeepSeek-V3, 256 GB200, MXFP8, TP1 PP8 VPP4 EP32 MBS1
GBS2048, layout Et|(tt|)*30L (no MTP layer: the layout has no `m`), fp8 parameters, recompute of
the dense MLPs and the MLA up-projection, and then one change per row.

    PYTHONPATH=$PWD python bench/dsv3_gb200_history.py

Each row the plan space expresses is priced (calibrated, shipped GPU calibration) and its step
ratio against the previous expressible row is set beside the notes' TFLOPS ratio. The rows that are
kernel or host work inside the stack (the permute kernel and scaling-factor fixes, DeepEP tuning,
CPU-side optimization, PDL, fused swizzle, graphing the shared expert, quantization fused into the
norm) are not plan fields: the model prices megatron-core 0.16.1 / TE 2.9 as they are, so the
change of a later expressible row is set against the last expressible one before it.
Writes bench/results/dsv3_gb200_history.md.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clusters import load_cluster  # noqa: E402
from cost_model import predict  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan  # noqa: E402
from specs.workload import Workload  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "dsv3_gb200_history.md"
BASE = Plan(tp=1, pp=8, vpp=4, ep=32, mbs=1, precision="mxfp8", dispatcher="alltoall", pp_layout="Et|(tt|)*30L",
            recompute="selective", recompute_modules=("mla_up_proj", "mlp"), fp8_param=True, router_fusion=False)
GRAPHS = dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "moe_router", "moe_preprocess"))
# (the notes' row, its TFLOPS/GPU, the plan fields it changes, or None when not a plan field)
HISTORY = [
    ("Baseline", 494.46, None),
    ("Fuse torch.zeros for scaling factor allocation & Permute kernel Optimization", 529.55, {}),
    ("Router fusion", 540.00, dict(router_fusion=True)),
    ("Enable DeepEP", 566.07, dict(dispatcher="flex", flex_backend="deepep")),
    ("Remove up_proj recompute", 610.71, dict(recompute_modules=("mlp",))),
    ("CUDA Graphs", 663.27, GRAPHS),
    ("Tune DeepEP", 691.49, None),
    ("CPU-side optimization", 762.12, None),
    ("PDL for quantization kernels & Fuse MXFP8 swizzle scaling factor", 797.67, None),
    ("CUDA Graphs capture shared expert", 829.93, None),
    ("HybridEP", 943.56, dict(flex_backend="hybridep")),
    ("CPU-side optimization", 956.21, None),
    ("Fuse quantization to normalization (cuDNN 9.14)", 970.01, None),
]


def main() -> int:
    spec = dataclasses.replace(load_model("deepseek-v3"), mtp_num_layers=0)
    w = Workload(spec, load_cluster("gb200-nvl72", 256), 2048, 4096)
    lines = ["# DeepSeek-V3 on 256 GB200: Megatron-LM's optimization history against the model "
             "(validation only, not fitted)", "",
             "| row | measured TFLOPS/GPU | model TFLOPS/GPU (calibrated) | measured ratio | model ratio |",
             "|---|---|---|---|---|"]
    plan, prev = BASE, None  # prev: (measured, model) of the last expressible row
    for name, measured, change in HISTORY:
        if change is None:
            lines.append(f"| {name} | {measured:.1f} | (not a plan field) | | |")
            continue
        plan = plan.replace(**change)
        model = predict(w, plan).model_tflops_per_gpu
        ratios = ("", "") if prev is None else (f"x{measured / prev[0]:.3f}", f"x{model / prev[1]:.3f}")
        lines.append(f"| {name} | {measured:.1f} | {model:.1f} | {ratios[0]} | {ratios[1]} |")
        prev = (measured, model)
    lines += ["", f"Last plan: `{plan.canonical()}`"]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
