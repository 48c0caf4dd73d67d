"""Fit the shipped GPU calibration (cost_model/calibration_default.json) on the published end-to-end
training rows (cost_model/data/published_training_calibration.csv, each row with its source).

    python -m cost_model.fit_default_calibration [--write]

Each row becomes a Workload + Plan (published parallel layout; dispatcher, flex backend, a2a
overlap, recompute, pipeline layout, fp8 recipe and gradient-reduction dtype as the recipe for that
run sets them, see OVERRIDES with sources; dist-opt on, default DP overlaps, fp8 -> fp8-tensorwise
(current scaling) unless the recipe says otherwise, mxfp8 as
published; MTP and sliding-window fields of the model as its HF config has them), the model
predicts the raw step time, and one scale is fitted by soft-L1 least squares
on log step time. The report prints the residual after the fit and leave-one-out.
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

from cost_model.calibration import DEFAULT_GPU_CALIBRATION, IDENTITY, fit_calibration

DATA = Path(__file__).resolve().parent / "data" / "published_training_calibration.csv"


# Schedule/kernel fields the published recipes set beyond the layout columns, keyed by
# (model, hw, release), with their source: (plan fields, model-spec fields the preset may lack,
# predict() options, source). Megatron-Bridge scripts/performance: the per-GPU WorkloadBaseConfig
# presets (configs/<family>/<family>_workload_base_configs.py; moe_a2a_overlap defaults to False
# in utils/utils.py WorkloadBaseConfig) and the per-model builders (configs/<family>/
# <family>_llm_pretrain.py) that pick the dispatcher and set the common perf options.
MB = "NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/"
HF_GPT_OSS = ("huggingface.co/openai/gpt-oss-120b config.json: sliding_window 128, layer_types alternate "
              "sliding/full (Megatron window_attn_skip_freq=2), learned attention sinks")
HF_DSV3 = "huggingface.co/deepseek-ai/DeepSeek-V3 config.json: num_nextn_predict_layers 1"
OVERRIDES = {
    ("qwen3-30b-a3b", "h100-sxm", "26.04.01"): (
        dict(dispatcher="flex", flex_backend="hybridep", grad_reduce_bf16=True), {}, {},
        MB + "qwen/qwen3_workload_base_configs.py QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 "
        "(EP16, GBS1024, moe_flex_dispatcher_backend=hybridep, moe_a2a_overlap=False, no CUDA graphs; "
        "FP8_CS = current scaling = fp8-tensorwise); qwen/qwen3_llm_pretrain.py (moe_token_dispatcher_type="
        "flex; set_qwen3_common_configs: recompute off, ddp.grad_reduce_in_fp32=False, "
        "moe_router_force_load_balancing=True)"),
    ("gpt-oss-120b", "h100-sxm", "26.04.01"): (
        dict(dispatcher="alltoall", recompute="selective", recompute_modules=("layernorm", "moe_act"),
             grad_reduce_bf16=True),
        dict(window_size=128, window_attn_skip_freq=2, attention_sinks=True, moe_expert_bias=True), {},
        MB + "gpt_oss/gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2 "
        "(PP4 EP8 MBS1 GBS1280, recompute_modules=[layernorm, moe_act]); gpt_oss/gpt_oss_llm_pretrain.py "
        "set_gpt_oss_common_configs (ddp.grad_reduce_in_fp32=False, moe_router_force_load_balancing=True) "
        "(both at Megatron-Bridge c8327cfc2^, before the perf configs moved to src/megatron/bridge/perf_recipes); "
        "dispatcher alltoall, bias_activation_fusion=True, add_bias_linear=True, clamp 7.0, softmax_type="
        "learnable from src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py:68-97; the base recipe "
        "(src/megatron/bridge/recipes/gpt_oss/h100/gpt_oss.py:180,193-194) sets no pipeline layout and "
        "account_for_embedding/loss_in_pipeline_split=False, so the LM head sits on the last of 4 even "
        "stages as the model places it; attention: " + HF_GPT_OSS),
    ("qwen3-30b-a3b", "h100-sxm", "25.09"): (
        dict(dispatcher="alltoall", precision="fp8-tensorwise", grad_reduce_bf16=True, capacity_factor=1.0,
             pad_to_capacity=True), {}, {},
        "25.09 row says 'token drop': NVIDIA-NeMo/Megatron-Bridge cac49dcd7 (2025-09-27, 'qwen3 perf configs' for "
        "25.09) scripts/performance/run_script.py applies utils/moe_token_drop.py apply_moe_token_drop "
        "(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True, alltoall dispatcher) to "
        "qwen3_30b_a3b: every expert computes exactly the balanced load (plan capacity_factor=1, "
        "pad_to_capacity=1: no token counts to the host). fp8 = current scaling (tensorwise): "
        "that commit's configs/qwen3/qwen3_30b_a3b_llm_pretrain.yaml perf_matrix lists only bf16 and fp8_cs for "
        "h100 (the layout of this row: pp2 vp24 ep8 gbs512, mbs 2 under fp8_cs), and the 25.11 summary labels "
        "the same H100 layout FP8-CS (the 25.09 table names no recipe; argument_parser.py's --fp8_recipe "
        "default 'ds' finds no fp8_ds preset for h100). bf16 gradient reduction: the same yaml "
        "(mixed_precision.grad_reduce_in_fp32: false)"),
    ("deepseek-v3", "b200", "26.04.01"): (
        dict(dispatcher="flex", flex_backend="deepep", a2a_overlap=True, delay_wgrad=True, recompute="selective",
             recompute_modules=("mla_up_proj", "mlp"), pp_layout="Et*4|(t*4|)*14tmL",
             cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "moe_router", "moe_preprocess"),
             grad_reduce_bf16=True),
        dict(mtp_num_layers=1), {},
        MB + "deepseek/deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 "
        "(PP8 VPP2 EP32 GBS4096: moe_flex_dispatcher_backend=deepep, moe_a2a_overlap=True, "
        "pp_layout=Et*4|(t*4|)*14tmL, recompute_modules=[mla_up_proj, mlp], CUDA graphs attn/moe_router/"
        "moe_preprocess); utils/overrides.py _set_moe_a2a_overlap_overrides (moe_a2a_overlap=True sets "
        "comm_overlap.delay_wgrad_compute=True, since Megatron-Bridge f37f883a8, 2025-09); "
        "deepseek/deepseek_llm_pretrain.py common perf settings (ddp.grad_reduce_in_fp32=False, "
        "moe_router_force_load_balancing=True). The layout's MTP layer (m) is priced by the model on the "
        "loss stage (ModelSpec.mtp_num_layers=1, " + HF_DSV3 + "), where the layout puts it"),
}


def rows():
    with open(DATA, newline="") as f:
        return list(csv.DictReader(f))


def row_case(r):
    """(workload, plan, measured step seconds, label, predict() options) of one published row,
    completed as its recipe runs it (OVERRIDES)."""
    import dataclasses

    from clusters import load_cluster
    from specs.models import load_model
    from specs.plan import Plan
    from specs.workload import Workload
    plan_kw, spec_kw, opts, _src = OVERRIDES.get((r["model"], r["hw"], r["release"]), ({}, {}, {}, ""))
    spec = load_model(r["model"])
    # fill only what the preset lacks (a preset that already carries the field wins)
    fill = {k: v for k, v in spec_kw.items() if not getattr(spec, k)}
    if fill:
        spec = dataclasses.replace(spec, **fill)
    w = Workload(spec, load_cluster(r["hw"], int(r["gpus"])), int(r["gbs"]), int(r["seq"]))
    prec = {"fp8": "fp8-tensorwise", "bf16": "bf16", "mxfp8": "mxfp8"}[r["precision"]]
    plan_kw = {"precision": prec, **plan_kw}  # a recipe's own fp8 recipe wins over the column
    p = Plan(tp=int(r["tp"]), pp=int(r["pp"]), cp=int(r["cp"]), vpp=int(r["vpp"]), ep=int(r["ep"]),
             mbs=int(r["mbs"]), **plan_kw)
    measured = int(r["gbs"]) * int(r["seq"]) / (float(r["tokens_per_s_per_gpu"]) * int(r["gpus"]))
    label = f"{r['model']}@{r['hw']}x{r['gpus']} {r['release']} tp{r['tp']}pp{r['pp']}vpp{r['vpp']}ep{r['ep']}"
    return w, p, measured, label, opts


def regime(plan) -> str:
    """The regime a row's residual belongs to (issue 22: the residual is reported per regime):
    precision, EP a2a overlap, CUDA graphs, dispatcher."""
    disp = plan.flex_backend if plan.dispatcher == "flex" else plan.dispatcher
    graphs = "graphs " + plan.cuda_graph_impl if plan.cuda_graph_impl != "none" else "eager"
    return f"{plan.precision}, {'a2a overlap' if plan.a2a_overlap else 'no overlap'}, {graphs}, {disp}"


def pairs(tables=None):
    from cost_model import predict
    out = []
    for r in rows():
        w, p, meas, label, opts = row_case(r)
        pr = predict(w, p, tables=tables, calibration=IDENTITY, **opts)
        out.append((pr.step_time_s, meas, label))
    return out


def fit(tables=None):
    from cost_model import resolve_tables
    ps = pairs(tables)
    digests = sorted({resolve_tables(row_case(r)[0], tables).digest[:16] for r in rows()})
    return fit_calibration(ps, provenance={"data": "cost_model/data/published_training_calibration.csv "
                                                  "(NVIDIA-NeMo/Megatron-Bridge performance summaries)",
                                           "tables_digests": digests})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {DEFAULT_GPU_CALIBRATION.name}")
    a = ap.parse_args(argv)
    cal, rep = fit()
    print(f"scale = {cal.scale:.4f}  ({cal.label})")
    print(f"{'row':62s} {'raw s':>8s} {'meas s':>8s} {'cal err':>8s} {'LOO err':>8s}  regime")
    regimes = {label: regime(plan) for _w, plan, _m, label, _o in map(row_case, rows())}
    for r in rep["rows"]:
        print(f"{r['label']:62s} {r['raw_pred_s']:8.3f} {r['measured_s']:8.3f} "
              f"{r['calibrated_rel_err']:+8.1%} {r['loo_rel_err']:+8.1%}  {regimes[r['label']]}")
    if a.write:
        cal.save(DEFAULT_GPU_CALIBRATION)
        print(f"wrote {DEFAULT_GPU_CALIBRATION} id={cal.id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
