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

This module composes two sibling engines (cost_model and kernels), which is why it lives in tuner/.
"""
from __future__ import annotations

import numpy as np

REASON_CODE = "megakernel-not-in-stack"
WHAT_IFS = ("megakernel",)


def _not_applicable(why: str) -> dict:
    return {"what_if": "megakernel", "applicable": False, "why": why, "reason_code": REASON_CODE}


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
    weave_ms, saving_frac = float(r["weave_ms"]), float(r["saving"])
    # the step's calibration multiplies the raw time, the saving is raw time
    scale = pred.step_time_s / pred.extra["raw_step_time_s"] if pred.extra.get("raw_step_time_s") else 1.0
    saving_s = pred.extra["microbatches"] * n_moe * base_s * saving_frac * scale
    step = pred.step_time_s - saving_s
    return {"what_if": "megakernel", "applicable": True, "reason_code": REASON_CODE,
            "reason": "the Weave megakernel is not part of megatron-core 0.16.1: a what-if, not a plan to run",
            "c": int(r["c"]), "K": int(r["K"]), "n_steal": int(r["n_steal"]), "tokens_per_gpu": tokens,
            "baseline_ms": base_s * 1e3, "weave_ms": weave_ms, "moe_layers": n_moe,
            "step_time_s": step, "saving_s": saving_s,
            "speedup": float(np.float64(pred.step_time_s) / step - 1.0) if step > 0 else 0.0}


def describe(w: dict) -> str:
    """One line for a report or the CLI."""
    if not w["applicable"]:
        return f"megakernel what-if: not applicable ({w['why']})"
    return (f"megakernel what-if: this plan would be {w['speedup']:.1%} faster with a Weave-style megakernel "
            f"(c*={w['c']}, K*={w['K']}, n_steal={w['n_steal']}; forward MoE layer {w['baseline_ms']:.3f} -> "
            f"{w['weave_ms']:.3f} ms x {w['moe_layers']} layers); unrealizable on the pinned stacks "
            f"[{w['reason_code']}]")
