"""The published Megatron-Bridge runs against the raw and the calibrated GPU cost model.

    PYTHONPATH=$PWD python bench/published_rows.py

Part 1, the four calibration rows (cost_model/data/published_training_calibration.csv, each
completed with the flags its recipe sets: cost_model/fit_default_calibration.py OVERRIDES):
raw prediction, calibrated with the scale fitted on all four, leave-one-out (scale fitted on the
other three), measured step time, and the fitted scale.
Per row, the components issue 22 added or split (EP serial / beyond its pair / SM share / HBM
share, the dispatcher's metadata preprocess, every kernel's fixed slot, the wgrad's main-grad
accumulation, the SMs and HBM bandwidth hidden DP collectives take, the SMs and HBM bandwidth of the
interleaved schedule's hidden PP send/recv, the dispatcher's host sync, the launch floor, fp8
casts, router/permute and elementwise bytes, the bubble) and the row's split and CUDA graph fields.
Part 2, memory: every calibration row plus the published layouts named in issue 10, with their
recipe flags (sources below), must fit the card; prints peak GiB per stage and the usable HBM.
Nothing here is fitted to the part-2 layouts' throughputs (their step times are not used).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clusters import load_cluster  # noqa: E402
from cost_model import predict  # noqa: E402
from cost_model.calibration import IDENTITY  # noqa: E402
from cost_model.fit_default_calibration import fit, row_case, rows  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan  # noqa: E402
from specs.workload import Workload  # noqa: E402

MB = "NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/"
# (label, model, cluster, gpus, gbs, plan, model-spec fills, predict options, source)
LAYOUTS = [
    ("gpt-oss-120b 64xH100 tp1 pp4 ep8 mbs4", "gpt-oss-120b", "h100-sxm", 64, 1280,
     Plan(tp=1, pp=4, ep=8, mbs=4, precision="bf16", recompute="selective",
          recompute_modules=("layernorm", "moe_act")),
     dict(window_size=128, window_attn_skip_freq=2, attention_sinks=True), {},
     "issue 10 (published layout, MBS4); recompute_modules from " + MB +
     "gpt_oss/gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2 "
     "(that preset itself runs MBS1); fp32 grad reduction (the GPT-OSS perf builder was not read)"),
    ("gpt-oss-120b 64xH100 tp1 pp4 ep8 mbs4 + offload fc1/act", "gpt-oss-120b", "h100-sxm", 64, 1280,
     Plan(tp=1, pp=4, ep=8, mbs=4, precision="bf16", recompute="selective",
          recompute_modules=("layernorm", "moe_act")),
     dict(window_size=128, window_attn_skip_freq=2, attention_sinks=True),
     dict(offload_modules=("expert_fc1", "moe_act")),
     "HYPOTHETICAL completion: megatron-core 0.16.1 fine-grained activation offloading of expert_fc1 "
     "and moe_act inputs; no recipe read in this session sets it for this layout"),
    ("deepseek-v3 256xGB200 tp1 pp4 vpp4 ep64 (FP8_CS_V2)", "deepseek-v3", "gb200-nvl72", 256, 4096,
     Plan(tp=1, pp=4, vpp=4, ep=64, mbs=1, precision="fp8-tensorwise", dispatcher="flex",
          flex_backend="hybridep", recompute="selective", recompute_modules=("mlp",), grad_reduce_bf16=True),
     dict(mtp_num_layers=1), {},
     MB + "deepseek/deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_V2 "
     "(hybridep, recompute_modules=[mlp]); deepseek_llm_pretrain.py (grad_reduce_in_fp32=False)"),
    ("deepseek-v3 256xGB200 tp1 pp4 vpp4 ep64 (BF16_V2)", "deepseek-v3", "gb200-nvl72", 256, 4096,
     Plan(tp=1, pp=4, vpp=4, ep=64, mbs=1, precision="bf16", dispatcher="flex",
          flex_backend="hybridep", recompute="selective", recompute_modules=("mla_up_proj",),
          grad_reduce_bf16=True),
     dict(mtp_num_layers=1), {},
     MB + "deepseek/deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_BF16_V2 "
     "(recompute_modules=[mla_up_proj]); deepseek_llm_pretrain.py (grad_reduce_in_fp32=False)"),
]


def _fill(spec, fills):
    fill = {k: v for k, v in fills.items() if not getattr(spec, k)}
    return dataclasses.replace(spec, **fill) if fill else spec


def main() -> int:
    cal, rep = fit()
    print(f"calibration scale fitted on the 4 rows: {cal.scale:.4f}")
    print(f"{'row':58s} {'raw s':>7s} {'cal s':>7s} {'LOO s':>7s} {'meas s':>7s} {'cal err':>8s} {'LOO err':>8s}")
    for r in rep["rows"]:
        m = r["measured_s"]
        print(f"{r['label']:58s} {r['raw_pred_s']:7.2f} {m * (1 + r['calibrated_rel_err']):7.2f} "
              f"{m * (1 + r['loo_rel_err']):7.2f} {m:7.2f} {r['calibrated_rel_err']:+8.1%} {r['loo_rel_err']:+8.1%}")
    print(f"max |cal err| {rep['max_abs_rel_err']:.1%}   max |LOO err| {rep['loo_max_abs_rel_err']:.1%}")
    print("\nper row, the issue-22 components (raw seconds per step; plan's split, CUDA graph and token drop fields):")
    parts = ("ep_dispatch_combine", "ep_overlap_beyond", "ep_overlap_sm_share", "ep_overlap_hbm_share",
             "dispatcher_preprocess", "kernel_latency", "wgrad_main_grad", "dp_overlap_sm_share",
             "dp_overlap_hbm_share", "pp_p2p_sm_share", "pp_p2p_hbm_share", "moe_host_sync", "cpu_launch_floor",
             "fp8_quantize", "router_permutation", "elementwise", "pipeline_bubble")
    for i, k in enumerate(parts):
        print(f"  [{i:2d}] {k}")
    print(f"  {'row':58s} " + " ".join(f"{f'[{i}]':>7s}" for i in range(len(parts))) + "  split / graphs / drop")
    for r in rows():
        w, p, _m, label, opts = row_case(r)
        bd = predict(w, p, calibration=IDENTITY, **opts).breakdown_s
        split = f"emb={int(p.pp_embedding)} loss={int(p.pp_loss)} layout={p.pp_layout or '-'}"
        graphs = f"{p.cuda_graph_impl}:{'+'.join(p.cuda_graph_scope) or '-'}"
        drop = (f"capacity {p.capacity_factor:g}{' padded' if p.pad_to_capacity else ''}" if p.capacity_factor
                else "dropless")
        print(f"  {label:58s} " + " ".join(f"{bd.get(k, 0.0):7.3f}" for k in parts) + f"  {split} / {graphs} / {drop}")
    print("\nmemory (peak GiB per stage; usable = HBM x (1 - reserve)):")
    bad = 0
    cases = []
    for r in rows():
        w, p, _m, label, opts = row_case(r)
        cases.append((label, w, p, opts))
    for label, model, kind, gpus, gbs, plan, fills, opts, _src in LAYOUTS:
        w = Workload(_fill(load_model(model), fills), load_cluster(kind, gpus), gbs, 4096)
        cases.append((label, w, plan, opts))
    for label, w, p, opts in cases:
        pr = predict(w, p, calibration=IDENTITY, **opts)
        usable = w.cluster.hbm_gib * 0.9
        ok = "fits" if pr.feasible else "OOM"
        bad += not pr.feasible
        print(f"  {label:58s} peak {pr.peak_memory_gib:6.1f} / {usable:5.1f} GiB  {ok}  "
              f"stages {pr.memory_by_stage_gib}")
    print(f"\n{bad} of {len(cases)} published layouts predicted out of memory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
