"""What-ifs: what a plan would gain from a kernel that the pinned stacks do not have.

`megakernel_training` prices Weave's persistent MoE megakernel (kernels/weave.py: dispatch, expert
GEMMs and combine in one kernel with a per-layer (c, K) SM split) in place of the cost model's
forward dispatch + expert GEMM + combine of every MoE layer. The kernel is not part of megatron-core
0.16.1 or SGLang 0.5.23, so a plan that uses it is unrealizable on every shipped stack
(`REASON_CODE`); the what-if says how much faster the plan would be, and nothing is ever chosen or
emitted on its strength.

Scope, stated rather than hidden: Weave is a forward (inference) kernel measured within one NVLink
domain, so only the forward MoE part of a training step is replaced (the backward and any
recomputed forward keep their cost-model prices), and a plan whose expert-parallel group leaves the
scale-up domain gets no what-if (`applicable: false`, with the reason).

`megakernel_serving` does the same for a serving plan: the serving cost model's routed-expert GEMMs
plus MoE communication of one MoE layer of a prefill step (the chunk's tokens per GPU) and of a
decode step (the running batch), against Weave's time for that layer, and what that does to the
workload's objective through the same steady-state composition the model ranks with.

Physics first: Weave's time model (kernels/weave.py) has compute and communication terms but no
weight-read term, so at decode batch sizes it can predict an MoE layer faster than reading the
experts it activates from HBM. Every what-if here floors the kernel's time at that HBM roofline:
the routed-expert weights the layer's tokens activate on one GPU, read once at the datasheet HBM
bandwidth (`hbm_floor_ms`; `weave_model_ms` keeps the kernel model's own figure, `floored` says
when the floor bound).

This module composes two sibling engines (cost_model and kernels), which is why it lives in tuner/.
"""
from __future__ import annotations

import numpy as np

REASON_CODE = "megakernel-not-in-stack"
WHAT_IFS = ("megakernel",)


def _not_applicable(why: str) -> dict:
    return {"what_if": "megakernel", "applicable": False, "why": why, "reason_code": REASON_CODE}


def _floored(r: dict, baseline_ms: float, floor_ms: float) -> tuple[float, float, dict]:
    """(kernel ms, saving fraction, fields): the kernel model's time floored at the HBM roofline of
    the expert weights the layer reads, and the saving against the cost model's `baseline_ms`."""
    model_ms = float(r["weave_ms"])
    ms = max(model_ms, floor_ms)
    saving = min(max(1.0 - ms / baseline_ms, 0.0), 1.0) if baseline_ms > 0 else 0.0
    return ms, saving, {"weave_model_ms": model_ms, "hbm_floor_ms": floor_ms, "floored": ms > model_ms}


def megakernel_training(workload, plan, pred, *, imbalance: float = 1.0, curves=None) -> dict:
    """The Weave-megakernel what-if of one training plan.

    Args:
        workload: the `specs.workload.Workload`.
        plan: the completed `specs.plan.Plan` that `pred` priced.
        pred: its `cost_model.Prediction` (its extra carries the forward dispatch + experts + combine
            time per microbatch and MoE layer, and the MoE layers of the slowest stage).
        imbalance: routed tokens of the busiest expert over the mean (Weave's routing skew).
        curves: `kernels.weave.Curves` to use (default: `load_curves(kind)`, measured fit first).
    Returns:
        dict: applicable, reason_code, reason; when applicable also c, K, n_steal, the per-layer
        forward times (baseline_ms, weave_ms), step_time_s (with the megakernel), saving_s and
        speedup (fractional throughput gain, >= 0).
    """
    from kernels.weave import LayerShape, load_curves, megakernel_whatif
    model, cl = workload.model, workload.cluster
    if not model.is_moe:
        return _not_applicable(f"{model.name} has no routed experts")
    if not cl.is_gpu:
        return _not_applicable(f"{cl.kind} is not a GPU: the megakernel splits a GPU's SMs")
    ep_span = plan.ep * plan.etp
    if ep_span > cl.scaleup_domain:
        return _not_applicable(f"the EP group ({ep_span} GPUs) spans more than one NVLink domain "
                               f"({cl.scaleup_domain} GPUs): Weave's kernel moves tokens through peer memory")
    base_s = float(pred.extra.get("moe_dispatch_experts_fwd_s", 0.0))
    n_moe = int(pred.extra.get("moe_layers_slowest_stage", 0))
    if base_s <= 0 or n_moe <= 0:
        return _not_applicable("the slowest stage has no MoE layer to replace")
    shape = LayerShape.from_model(model)
    # tokens entering one GPU's MoE layer per microbatch (sequence-parallel TP splits them)
    tokens = plan.mbs * workload.seq / (plan.cp * plan.tp)
    r = megakernel_whatif(shape, tokens, plan.ep, imbalance, base_s * 1e3, curves or load_curves(cl.kind))
    # HBM floor: the local experts the EP group's tokens activate (uniform routing), each read once
    E, k = model.num_experts, model.moe_router_topk
    active = E / plan.ep * (1.0 - (1.0 - k / E) ** (tokens * plan.ep))
    wbytes = 1.0 if plan.fp8 else 2.0
    floor_ms = active * 3 * model.hidden_size * model.moe_ffn_hidden_size / plan.etp * wbytes / (cl.hbm_tbps * 1e12) * 1e3
    weave_ms, saving_frac, floor = _floored(r, base_s * 1e3, floor_ms)
    # the step's calibration multiplies the raw time, the saving is raw time
    scale = pred.step_time_s / pred.extra["raw_step_time_s"] if pred.extra.get("raw_step_time_s") else 1.0
    saving_s = pred.extra["microbatches"] * n_moe * base_s * saving_frac * scale
    step = pred.step_time_s - saving_s
    return {"what_if": "megakernel", "applicable": True, "reason_code": REASON_CODE,
            "reason": "the Weave megakernel is not part of megatron-core 0.16.1: a what-if, not a plan to run",
            "c": int(r["c"]), "K": int(r["K"]), "n_steal": int(r["n_steal"]), "tokens_per_gpu": tokens,
            "baseline_ms": base_s * 1e3, "weave_ms": weave_ms, **floor, "moe_layers": n_moe,
            "step_time_s": step, "saving_s": saving_s,
            "speedup": float(np.float64(pred.step_time_s) / step - 1.0) if step > 0 else 0.0}


def megakernel_serving(model, cluster, plan, workload, pred, *, precision="bf16", tables=None, calibration=None,
                       imbalance: float = 1.0, routing_skew: float = 0.0, curves=None) -> dict:
    """The Weave-megakernel what-if of one serving plan.

    Args:
        model, cluster: the ModelSpec and Cluster. plan: the `ServePlan` the serving cost model
            priced (an `EffectivePlan`, or a `ServePlan` it resolves). workload: its ServeWorkload.
        pred: its `cost_model.serving.ServePrediction` (max batch, replicas).
        precision, tables, calibration, imbalance, routing_skew: as the prediction was made.
    Returns:
        dict: applicable, reason_code, reason; when applicable the per-layer times of a prefill
        step (prefill_baseline_ms, prefill_weave_ms at prefill_tokens_per_gpu) and of a decode step
        (decode_*; absent for phase prefill), (c, K, n_steal) of the prefill layer, and speedup:
        the fractional gain of the workload's objective (steady state), >= 0.

    The serving model's MoE communication per layer is taken as its communication per layer
    averaged over all layers (the step model reports communication of the whole step); a model
    with dense layers (DeepSeek-V3: 3 of 61) is priced with that small bias, stated here.
    """
    from cost_model.serving import load_default
    from cost_model.serving.calibration import phase_factors
    from cost_model.serving.plans import effective_plans, to_cols
    from cost_model.serving.step import StepModel
    from cost_model.tables import load_tables, tables_dir_for
    from kernels.weave import LayerShape, load_curves, megakernel_whatif
    if not model.is_moe:
        return _not_applicable(f"{model.name} has no routed experts")
    if not cluster.is_gpu:
        return _not_applicable(f"{cluster.kind} is not a GPU: the megakernel splits a GPU's SMs")
    eff = effective_plans([plan], model, cluster)[0]
    plan = eff.plan
    if plan.ep > cluster.scaleup_domain:
        return _not_applicable(f"the EP group ({plan.ep} GPUs) spans more than one NVLink domain "
                               f"({cluster.scaleup_domain} GPUs): Weave's kernel moves tokens through peer memory")
    s_pre, s_dec = phase_factors(calibration or load_default())  # step-time factors per phase
    tables = tables if tables is not None else load_tables(tables_dir_for(cluster.kind))
    c = to_cols([eff])
    sm = StepModel.for_precision(model, cluster, tables, c, precision, imbalance=imbalance, routing_skew=routing_skew)
    tp, pp, a = int(c.tp[0]), int(c.pp[0]), int(c.attn_dp[0])
    n_moe = float(np.ravel(sm.L_moe)[0] * pp)
    n_layers = float(np.ravel(sm.L_moe + sm.L_dense)[0] * pp)
    if n_moe <= 0:
        return _not_applicable("the model has no MoE layer to replace")
    shape, cv = LayerShape.from_model(model), curves or load_curves(cluster.kind)
    isl, osl = float(workload.isl), float(workload.osl)
    replicas = max(int(pred.extra.get("replicas", 1)), 1)
    K_req = max(max(workload.concurrency, 1) / replicas / a, 1.0)

    def layer(step_s, parts, tokens_gpu, tokens_inst, f):
        base_ms = (float(parts["experts"][0]) / n_moe + float(parts["communication"][0]) / n_layers) * 1e3
        r = megakernel_whatif(shape, tokens_gpu, plan.ep, imbalance, base_ms, cv)
        floor_ms = float(np.ravel(sm.expert_weight_bytes(tokens_inst))[0]) / (cluster.hbm_tbps * 1e12) * 1e3
        ms, saving, floor = _floored(r, base_ms, floor_ms)
        new_s = float(step_s[0]) - n_moe * base_ms * 1e-3 * saving
        return base_ms, dict(r, weave_ms=ms, **floor), f * float(step_s[0]), f * new_s

    C = float(min(c.chunk[0], isl * K_req)) if workload.phase != "decode" else 0.0
    out = {"what_if": "megakernel", "applicable": True, "reason_code": REASON_CODE,
           "reason": "the Weave megakernel is not part of SGLang 0.5.23: a what-if, not a plan to run",
           "moe_layers": int(round(n_moe))}
    if C > 0:
        t, parts = sm.prefill(C, isl / 2 if workload.phase != "prefill" else 0.0)
        tok = C * a / tp  # tokens of one prefill step entering one GPU's MoE layer
        b_ms, r, pre_old, pre_new = layer(t, parts, tok, C * a, s_pre)
        out.update({"c": int(r["c"]), "K": int(r["K"]), "n_steal": int(r["n_steal"]),
                    "prefill_tokens_per_gpu": tok, "prefill_baseline_ms": b_ms,
                    "prefill_weave_ms": float(r["weave_ms"]), "prefill_hbm_floor_ms": r["hbm_floor_ms"],
                    "baseline_ms": b_ms, "weave_ms": float(r["weave_ms"])})
    if workload.phase != "prefill":
        if workload.phase == "decode":
            B = float(max(workload.concurrency, 1)) * tp * pp / a
        else:
            B = max(min(K_req, pred.max_batch * tp * pp / a), 1.0)
        t, parts = sm.decode(B, isl + osl / 2)
        tok = B * a / tp
        b_ms, r, dec_old, dec_new = layer(t, parts, tok, B * a, s_dec)
        out.update({"decode_batch_tokens_per_gpu": tok, "decode_baseline_ms": b_ms,
                    "decode_weave_ms": float(r["weave_ms"]), "decode_weave_model_ms": r["weave_model_ms"],
                    "decode_hbm_floor_ms": r["hbm_floor_ms"], "floored": r["floored"]})
        if "c" not in out:
            out.update({"c": int(r["c"]), "K": int(r["K"]), "n_steal": int(r["n_steal"]),
                        "baseline_ms": b_ms, "weave_ms": float(r["weave_ms"])})
    # the objective's time per token, as cost_model.serving.rank_arrays composes it
    if workload.phase == "prefill":
        old, new = pre_old / C, pre_new / C
    elif workload.phase == "decode":
        old, new = dec_old / B, dec_new / B
    else:
        old, new = dec_old / B + isl / osl * pre_old / C, dec_new / B + isl / osl * pre_new / C
    out["speedup"] = max(old / new - 1.0, 0.0) if new > 0 else 0.0
    return out


def describe(w: dict) -> str:
    """One line for a report or the CLI."""
    if not w["applicable"]:
        return f"megakernel what-if: not applicable ({w['why']})"
    if "step_time_s" not in w:  # serving
        parts = []
        if "prefill_baseline_ms" in w:
            parts.append(f"prefill MoE layer {w['prefill_baseline_ms']:.3f} -> {w['prefill_weave_ms']:.3f} ms")
        if "decode_baseline_ms" in w:
            parts.append(f"decode MoE layer {w['decode_baseline_ms']:.3f} -> {w['decode_weave_ms']:.3f} ms")
        floor = ""
        if w.get("floored"):
            floor = (f"; floored at the HBM time of the expert weights it reads, "
                     f"{w['decode_hbm_floor_ms']:.3f} ms (the kernel model alone: {w['decode_weave_model_ms']:.3f} ms)")
        return (f"megakernel what-if: {w['speedup']:.1%} more throughput with a Weave-style megakernel "
                f"(c*={w['c']}, K*={w['K']}; {', '.join(parts)} x {w['moe_layers']} layers{floor}); unrealizable "
                f"on the pinned stacks [{w['reason_code']}]")
    return (f"megakernel what-if: this plan would be {w['speedup']:.1%} faster with a Weave-style megakernel "
            f"(c*={w['c']}, K*={w['K']}, n_steal={w['n_steal']}; forward MoE layer {w['baseline_ms']:.3f} -> "
            f"{w['weave_ms']:.3f} ms x {w['moe_layers']} layers); unrealizable on the pinned stacks "
            f"[{w['reason_code']}]")
