"""Kernels outside the GEMM and attention tables, one kernel at a time (issue 22 item 4).

How many kernels each op of megatron-core 0.16.1's TransformerEngine layer launches (one function
per op; the counts and their sources are in `cost_model.constants`), what they cost on the GPU
beyond their bytes (a fixed slot per kernel, `KERNEL_LATENCY_S`), and three costs the byte terms of
`cost_model.blocks` leave out: the MoE dispatcher's metadata preprocess, the weight gradient's
accumulation into the main grads, and the HBM bandwidth overlapped communication takes.

The bytes / bandwidth part of each op stays in its block (`blocks.attention` norms and RoPE,
`blocks.router_permutation`, `blocks.routed_experts` activation, `blocks.fp8_quantize`); the counts
here are also the host's launch counts on GPUs (`cost_model.model`, the host timeline).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cost_model.constants import (
    COMM_HBM_BYTES_PER_PAYLOAD,
    KERNEL_LATENCY_S,
    KERNEL_PASSES,
    KERNELS_ACTIVATION,
    KERNELS_AUX_LOSS,
    KERNELS_AUX_LOSS_FUSED,
    KERNELS_CORE_ATTENTION,
    KERNELS_CP_PER_STEP,
    KERNELS_EP_COMM,
    KERNELS_EXPERT_BIAS_CAT,
    KERNELS_EXPERT_BIAS_PER_EXPERT,
    KERNELS_FP8_PER_OPERAND,
    KERNELS_GEMM_ATTENTION,
    KERNELS_GEMM_ATTENTION_MLA,
    KERNELS_GEMM_ROUTER,
    KERNELS_NORM,
    KERNELS_PERMUTE,
    KERNELS_PERMUTE_UNFUSED,
    KERNELS_PREPROCESS,
    KERNELS_PREPROCESS_DROP_PAD,
    KERNELS_RESIDUAL,
    KERNELS_ROPE,
    KERNELS_ROPE_EAGER,
    KERNELS_ROUTER_FUSED,
    KERNELS_ROUTER_GROUP,
    KERNELS_ROUTER_SCORE,
    KERNELS_TOKEN_DROP,
    KERNELS_TP_ATTENTION,
    KERNELS_TP_DENSE_MLP,
    LAUNCH_API_S,
    PERMUTE_UNFUSED_SYNCS,
    TE_GEMM_STREAMS,
    WGRAD_OUTPUT_BYTES,
)
from cost_model.plans import DISPATCH_CODES
from specs.plan import DROP_PAD_HOST_SIZED
from specs.plan import drop_and_pad as plan_drop_and_pad
from specs.ranks import group_size_stride

ALLGATHER, HYBRIDEP = 1, 3  # cost_model.plans.DISPATCH_CODES: alltoall 0, allgather 1, deepep 2, hybridep 3
DROP_PAD_HOST_SIZED_CODES = [DISPATCH_CODES.index(x) for x in DROP_PAD_HOST_SIZED]


# ---- kernels per op (forward; the backward launches KERNEL_PASSES - 1 times as many) ------------
def norm_kernels(n=1):
    """`n` RMSNorm / LayerNorm calls (TE rmsnorm_fwd; bwd: the dx kernel and the dgamma finalize)."""
    return KERNELS_NORM * n


def qk_norm_kernels(spec):
    """Qwen3 / OLMoE q and k norms (megatron-core attention.py q_layernorm / k_layernorm; MLA: the
    q and kv latent norms)."""
    return 2 * KERNELS_NORM if getattr(spec, "qk_layernorm", False) else 0


def qk_norm(x):
    """Forward seconds per layer and microbatch of the q/k norms' bytes (read + write bf16 of the
    normed tensors: q and k per rank, or MLA's q and kv latents), memory-bound; the backward moves
    twice that (the `blocks.attention` norms' convention). 0 without qk_layernorm."""
    spec = x.spec
    if not getattr(spec, "qk_layernorm", False):
        return x.zero
    if spec.mla:
        width = (spec.q_lora_rank or 0) + spec.kv_lora_rank + x.zero
    else:
        width = (spec.num_attention_heads + spec.query_groups) * spec.head_dim / x.tp
    return 2 * 2.0 * x.tokens * width / x.bw_elementwise


def rope_kernels(spec):
    """RoPE on q and k (megatron-core rope_utils apply_rotary_pos_emb): TE's fused kernel, or the
    eager ops where the YaRN concentration factor keeps it out of TE (`rope_eager`)."""
    return 2 * KERNELS_ROPE_EAGER if rope_eager(spec) else KERNELS_ROPE


def yarn_concentration(spec) -> float:
    """The YaRN concentration factor ("mscale") megatron-core multiplies cos and sin by:
    yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim), with
    yarn_get_mscale(s, m) = 0.1 m ln(s) + 1 (1 for s <= 1); 1 without YaRN
    (models/common/embeddings/yarn_rotary_pos_embedding.py:252-271)."""
    s = spec.rope_scaling_factor
    if not spec.yarn_original_max_position or s <= 1.0:
        return 1.0
    return (0.1 * spec.yarn_mscale * math.log(s) + 1.0) / (0.1 * spec.yarn_mscale_all_dim * math.log(s) + 1.0)


def rope_eager(spec) -> bool:
    """Whether megatron-core 0.16.1 applies RoPE in eager PyTorch although apply_rope_fusion is set:
    a concentration factor other than 1 (`constants`, "RoPE outside TE's fused kernel"). MLA
    applies its RoPE in its own fused kernels and is left out."""
    return not spec.mla and abs(yarn_concentration(spec) - 1.0) > 1e-9


def residual_kernels():
    """The bias-dropout-add after one block (transformer_layer.py self_attn_bda / mlp_bda)."""
    return KERNELS_RESIDUAL


def activation_kernels(calls):
    """Fused (Sw)iGLU, once per activation call (one per grouped GEMM, else one per expert)."""
    return KERNELS_ACTIVATION * np.asarray(calls, float)


def expert_bias_kernels(spec, local_experts):
    """The routed experts' fc2 bias (moe_expert_bias), added per local expert in Python after the
    grouped fc2 (`constants` KERNELS_EXPERT_BIAS_PER_EXPERT); 0 without expert biases."""
    if not getattr(spec, "moe_expert_bias", False):
        return 0.0
    return KERNELS_EXPERT_BIAS_PER_EXPERT * np.asarray(local_experts, float) + KERNELS_EXPERT_BIAS_CAT


def router_kernels(spec, fused=False):
    """Router non-GEMM kernels: score, top-k and the routing map (moe/router.py TopKRouter.routing),
    group-limited routing's extra selection, and the load-balancing loss when it is on; under
    router_fusion TE's fused kernels (`constants` KERNELS_ROUTER_FUSED, KERNELS_AUX_LOSS_FUSED)."""
    aux = float(getattr(spec, "moe_aux_loss_coeff", 0.0) or 0.0) > 0
    k = KERNELS_ROUTER_SCORE
    if int(getattr(spec, "moe_router_num_groups", 0) or 0):
        k += KERNELS_ROUTER_GROUP
    k += KERNELS_AUX_LOSS if aux else 0
    kf = KERNELS_ROUTER_FUSED + (KERNELS_AUX_LOSS_FUSED if aux else 0)
    return np.where(np.asarray(fused, bool), float(kf), float(k))


def preprocess_kernels(dispatch, drop_pad=False):
    """The dispatcher's metadata preprocess (token_dispatcher.py dispatch_preprocess / the flex
    dispatcher's setup_metadata) per dispatcher code; under drop-and-pad (`drop_and_pad`) what is
    left of it (`constants` KERNELS_PREPROCESS_DROP_PAD)."""
    d = np.asarray(dispatch)
    return np.where(np.asarray(drop_pad, bool), np.asarray(KERNELS_PREPROCESS_DROP_PAD, float)[d],
                    np.asarray(KERNELS_PREPROCESS, float)[d])


def drop_and_pad(pa) -> np.ndarray:
    """[P] bool: Megatron's drop-and-pad MoE per plan (`specs.plan.drop_and_pad` over the columns),
    what the load, kernels, syncs and preprocess read."""
    return plan_drop_and_pad(np.asarray(pa.capacity_factor, float), np.asarray(pa.pad_to_capacity))


def routed_load(pa, imbalance) -> np.ndarray:
    """[P] routed tokens of the busiest expert over the mean, as each plan's routing leaves it:
    `imbalance` dropless; token drop caps every expert at its capacity (capacity_factor x the mean,
    moe_utils.get_capacity), min(imbalance, factor); drop-and-pad fills every expert to exactly its
    capacity (padding rows are computed, and the alltoall dispatcher sends them: its input splits
    are capacity rows per expert)."""
    cf = np.asarray(pa.capacity_factor, float)
    imb = np.asarray(imbalance, float)
    return np.where(cf > 0, np.where(drop_and_pad(pa), cf, np.minimum(imb, cf)), imb)


def token_drop_kernels(capacity_factor):
    """Router kernels token drop adds (`constants` KERNELS_TOKEN_DROP) where a capacity factor is set."""
    return np.where(np.asarray(capacity_factor, float) > 0, float(KERNELS_TOKEN_DROP), 0.0)


def permute_kernels(dispatch, fused=True):
    """Token permute + unpermute (moe_utils.permute / unpermute): TE's fused kernels, or the
    PyTorch ops without permute_fusion (`constants` KERNELS_PERMUTE_UNFUSED); HybridEP permutes
    inside its dispatch and combine kernels either way."""
    per = np.where(permute_unfused(dispatch, fused), float(KERNELS_PERMUTE_UNFUSED), float(KERNELS_PERMUTE))
    return np.where(np.asarray(dispatch) == HYBRIDEP, 0.0, per)


def permute_unfused(dispatch, fused):
    """Whether the dispatcher permutes tokens with PyTorch ops (moe_utils.permute / unpermute):
    permute_fusion off, and a dispatcher that calls them (all but HybridEP, which permutes inside
    its own kernels). The one rule the bytes, kernels, syncs and overlap pairing read."""
    return ~np.asarray(fused, bool) & (np.asarray(dispatch) != HYBRIDEP)


def dispatcher_syncs(dispatch, drop_pad=False):
    """Device-to-host syncs per MoE layer forward of the dispatcher's token counts: one, but none
    under allgather, which keeps the counts on the device, and none under drop-and-pad on the
    alltoall or HybridEP dispatcher, whose sizes are the capacities (token_dispatcher.py: the
    alltoall `_maybe_dtoh_and_synchronize` skips drop_and_pad; HybridEP is given
    num_permuted_tokens; `specs.plan.DROP_PAD_HOST_SIZED`) (`blocks.moe_host_sync`)."""
    d = np.asarray(dispatch)
    host_sized = np.isin(d, DROP_PAD_HOST_SIZED_CODES)
    none = (d == ALLGATHER) | (np.asarray(drop_pad, bool) & host_sized)
    return np.where(none, 0.0, 1.0)


def permute_syncs(dispatch, fused):
    """Device-to-host syncs per MoE layer forward of the unfused permutation (its masked_selects;
    `constants` PERMUTE_UNFUSED_SYNCS); none fused or under HybridEP."""
    return np.where(permute_unfused(dispatch, fused), float(PERMUTE_UNFUSED_SYNCS), 0.0)


def fp8_kernels(precision, operands):
    """fp8 quantisation kernels (amax, cast-transpose, scale swizzle per recipe) of `operands`
    quantised GEMM inputs."""
    return np.asarray(KERNELS_FP8_PER_OPERAND, float)[np.asarray(precision)] * np.asarray(operands, float)


def expert_gemm_launches(blackwell, precision, grouped, local_experts):
    """GEMM kernels per expert linear (fc1 or fc2): one grouped kernel on Blackwell bf16, one
    cuBLAS GEMM per local expert on Hopper and for fp8 (`constants`, TE GroupedLinear), one per
    expert without grouped GEMM."""
    one_kernel = np.asarray(grouped, bool) & bool(blackwell) & (np.asarray(precision) == 0)
    return np.where(one_kernel, 1.0, np.maximum(np.asarray(local_experts, float), 1.0))


# ---- one layer --------------------------------------------------------------------------------------
@dataclass
class LayerKernels:
    """Forward kernels per layer and microbatch, [P] arrays: all launches per block (attention,
    dense MLP, MoE MLP: the host's count, each charged KERNEL_LATENCY_S on the device) and the fp8
    quantisation ones among them; `router` / `preprocess`: the launches the moe_router /
    moe_preprocess graph scopes cover."""
    attn: np.ndarray
    dense: np.ndarray
    moe: np.ndarray
    attn_fp8: np.ndarray
    dense_fp8: np.ndarray
    moe_fp8: np.ndarray
    router: np.ndarray
    preprocess: np.ndarray
    moe_streamed: np.ndarray  # per-expert GEMM launches spread over TE's compute streams
    looped: np.ndarray = None  # launches TE issues from a C++ loop (per-expert GEMMs and quantizers)

    def device_slots(self):
        """(attention, dense MLP, MoE MLP) forward kernels that each take a fixed device slot, the
        fp8 quantisation kernels left out (`fp8_quantize` charges theirs); per-expert GEMMs on TE's
        parallel streams count 1 / TE_GEMM_STREAMS each."""
        streamed = self.moe_streamed * (1.0 - 1.0 / TE_GEMM_STREAMS)
        return self.attn - self.attn_fp8, self.dense - self.dense_fp8, self.moe - self.moe_fp8 - streamed


def layer_kernels(spec, *, tp, cp, grouped, local_experts, precision, dispatch, blackwell=False,
                  permute_fused=True, router_fused=False, capacity_factor=0.0, drop_pad=False) -> LayerKernels:
    """Kernel counts of one layer of the TE spec, per block, by op (functions above); token drop
    and drop-and-pad as the plan's `capacity_factor` and `drop_pad` ([P] or scalars) set them."""
    tp, cp = np.asarray(tp, float), np.asarray(cp, float)
    one = np.ones(np.broadcast(tp, cp, np.asarray(precision), np.asarray(dispatch)).shape)
    # attention: input norm (in LayerNormLinear), q/k norms, RoPE, projections, core, residual
    attn_ng = (norm_kernels() + qk_norm_kernels(spec) + rope_kernels(spec) + residual_kernels()) * one
    attn_gemm = KERNELS_GEMM_ATTENTION_MLA if spec.mla else KERNELS_GEMM_ATTENTION
    attn_comm = KERNELS_TP_ATTENTION * (tp > 1) + KERNELS_CP_PER_STEP * (cp > 1) * (cp - 1)
    attn_fp8 = fp8_kernels(precision, 5 if spec.mla else 2) * one
    attn = attn_ng + attn_gemm + KERNELS_CORE_ATTENTION + attn_comm + attn_fp8
    # dense MLP: pre-MLP norm, fc1, activation, fc2, residual
    dense_ng = (norm_kernels() + activation_kernels(1) + residual_kernels()) * one
    dense_fp8 = fp8_kernels(precision, 2) * one
    dense = dense_ng + 2 + KERNELS_TP_DENSE_MLP * (tp > 1) + dense_fp8
    # MoE: pre-MLP norm, router (GEMM + score/top-k/aux), preprocess, permute, dispatch/combine,
    # expert GEMMs (fc1, activation, fc2), shared expert (fc1, activation, fc2, add), residual
    launches = expert_gemm_launches(blackwell, precision, grouped, local_experts)
    act_calls = np.where(np.asarray(grouped, bool), 1.0, np.maximum(np.asarray(local_experts, float), 1.0))
    shared = bool(spec.moe_shared_expert_ffn)
    router = (norm_kernels() + router_kernels(spec, router_fused) + token_drop_kernels(capacity_factor)) * one
    pre = preprocess_kernels(dispatch, drop_pad) * one
    moe_ng = (router + pre + permute_kernels(dispatch, permute_fused) + activation_kernels(act_calls) + residual_kernels()
              + (activation_kernels(1) + residual_kernels() if shared else 0.0)
              + expert_bias_kernels(spec, local_experts))
    # fp8: fc1 and fc2 inputs of every expert GEMM kernel (each local expert has its own quantizer in
    # TE GroupedLinear), and the shared expert's two
    moe_fp8 = fp8_kernels(precision, 2 * launches + (2 if shared else 0))
    moe = (moe_ng + KERNELS_GEMM_ROUTER + KERNELS_EP_COMM + 2 * launches + (2 if shared else 0) + moe_fp8)
    # TE GroupedLinear issues its per-expert GEMMs (general_grouped_gemm) and per-expert quantizers
    # (split_quantize) from one C++ call each: those launches cost the host the launch API alone
    looped = np.where(launches > 1, 2 * launches + fp8_kernels(precision, 2 * launches), 0.0) * one
    return LayerKernels(attn, dense, moe, attn_fp8, dense_fp8, moe_fp8,
                        router + KERNELS_GEMM_ROUTER, pre, np.where(launches > 1, 2 * launches, 0.0) * one, looped)


def host_moe_launches(lk: LayerKernels, gap_s: float) -> np.ndarray:
    """Forward MoE-block kernels in units of the host's per-launch time `gap_s` (a PyTorch-level op):
    the launches TE loops over in C++ cost the launch API alone (`constants` LAUNCH_API_S), so each
    counts LAUNCH_API_S / gap_s of one (at most one)."""
    return lk.moe - lk.looped * max(0.0, 1.0 - LAUNCH_API_S / max(gap_s, 1e-12))


def latency(fwd_kernels):
    """(fwd, bwd) device seconds of the fixed per-kernel slot of `fwd_kernels` forward kernels."""
    f = np.asarray(fwd_kernels, float) * KERNEL_LATENCY_S
    return f, (KERNEL_PASSES - 1) * f


# ---- costs the byte terms leave out ------------------------------------------------------------------
def dispatcher_preprocess(x) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds per MoE layer and microbatch of what the dispatcher exchanges
    beside the token payload (megatron-core 0.16.1 token_dispatcher.py):
    - flex (DeepEP / HybridEP): every rank's routing map ([tokens, experts] bool) all-gathered over
      the EP group to size the buffers (HybridEP metadata preprocessing; DeepEP get_dispatch_layout
      + notify), forward only;
    - alltoall: the per-expert token counts gathered over TP x EP (`preprocess`:
      gather_from_sequence_parallel_region of num_local_tokens_per_expert, int64), and the routed
      rows' probabilities sent by an all-to-all of their own next to the tokens (`token_dispatch`:
      all_to_all of permuted_probs, fp32), whose gradient comes back by the reverse all-to-all;
    - allgather: the routing map (bool) and the probabilities ([tokens, experts] fp32) all-gathered
      over TP x EP (`token_dispatch`) before the tokens, the probabilities' gradient reduce-scattered
      back. Small messages: on a CPU host's gloo each costs a collective's latency (0.3-0.6 ms per
      1 KiB all-gather in a cpu-local profile), and the CPU trials run them as the GPU ones do.
    The kernels' fixed slots and the D2H sync are charged in `latency` and `blocks.moe_host_sync`."""
    ops, pa = x.ops, x.pa
    E, K = max(x.spec.num_experts, 1), max(x.spec.moe_router_topk, 1)
    ep_size, ep_stride = group_size_stride("ep", *x.ranks, x.world)
    T = x.tokens_sp
    zero = 0.0 * T
    routing_map = ops.collective("all_gather", T * E * x.ep, ep_size, ep_stride)
    # drop-and-pad: the counts are the capacities, nothing to gather (token_dispatcher.py preprocess)
    counts = np.where(drop_and_pad(pa), 0.0, ops.collective("all_gather", 8.0 * E * x.ep + zero, ep_size, ep_stride))
    probs_a2a = ops.collective("all_to_all", 4.0 * T * K * x.imbalance, ep_size, ep_stride)
    probs_ag = ops.collective("all_gather", 4.0 * T * E * x.ep, ep_size, ep_stride)
    probs_rs = ops.collective("reduce_scatter", 4.0 * T * E * x.ep, ep_size, ep_stride)
    d = pa.dispatch
    f = np.where(d >= 2, routing_map, np.where(d == 0, counts + probs_a2a, routing_map + probs_ag))
    b = np.where(d >= 2, zero, np.where(d == 0, probs_a2a, probs_rs))
    on = x.ep > 1
    return np.where(on, f, 0.0), np.where(on, b, 0.0)


@dataclass
class LayerWeights:
    """Weight elements per GPU of one layer's blocks: attention, dense MLP, MoE (router, local
    experts, shared expert), [P] arrays."""
    attn: np.ndarray
    dense: np.ndarray
    moe: np.ndarray


def layer_weights(x) -> LayerWeights:
    spec, h, tp = x.spec, x.hidden, x.tp
    nh = spec.num_attention_heads
    if spec.mla:
        dq, dv = spec.qk_head_dim + spec.qk_pos_emb_head_dim, spec.v_head_dim
        ql, kvl, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.qk_pos_emb_head_dim
        q = (ql * h + nh * dq * ql / tp) if ql else nh * dq * h / tp
        attn = q + (kvl + rope) * h + nh * (spec.qk_head_dim + dv) * kvl / tp + h * nh * dv / tp
    else:
        attn = (nh + 2 * spec.query_groups) * spec.head_dim * h / tp + h * nh * spec.head_dim / tp
    nmat = x.mlp_matrices
    dense = (nmat + 1) * spec.ffn_hidden_size * h / tp
    E = max(spec.num_experts, 1)
    fs = spec.moe_shared_expert_ffn or 0
    moe = E * h + E / x.ep * (nmat + 1) * spec.moe_ffn_hidden_size * h / x.etp + (nmat + 1) * fs * h / tp
    return LayerWeights(attn + x.zero, dense + x.zero, moe + x.zero)


def wgrad_main_grad(x, weights: LayerWeights):
    """Backward seconds per layer and microbatch (attention, dense MLP, MoE) of the weight-gradient
    GEMMs accumulating into the main grads: read + write of the main grad in place of the GEMM's
    own output write (`constants` WGRAD_OUTPUT_BYTES), memory-bound."""
    extra = main_grad_seconds_per_weight(x)
    return weights.attn * extra, weights.dense * extra, weights.moe * extra


def lm_head_wgrad_main_grad(x):
    """Backward seconds per microbatch of the LM head's weight gradient accumulating into its main
    grad, as `wgrad_main_grad` prices a layer's: megatron-core's output_layer is a
    ColumnParallelLinear built with gradient_accumulation_fusion (models/gpt/gpt_model.py), its
    vocab x hidden / tp weights per GPU (the last stage)."""
    return x.spec.vocab_size * x.hidden / x.tp * main_grad_seconds_per_weight(x)


def main_grad_seconds_per_weight(x):
    """HBM seconds per weight element a fused wgrad accumulation adds per microbatch beyond the
    GEMM's own output write."""
    return (2.0 * x.grad_bytes - WGRAD_OUTPUT_BYTES) / x.bw_elementwise


def comm_hbm_share(payload_bytes, comm_s, hbm_bytes_per_s):
    """Share of HBM bandwidth a communication kernel takes while it runs: it reads what it sends and
    writes what it receives (`constants` COMM_HBM_BYTES_PER_PAYLOAD) over its own duration; capped
    at one half."""
    rate = COMM_HBM_BYTES_PER_PAYLOAD * np.asarray(payload_bytes, float) / np.maximum(np.asarray(comm_s, float), 1e-12)
    return np.clip(rate / hbm_bytes_per_s, 0.0, 0.5)


def hidden_comm_hbm(payload_bytes, comm_s, hidden_s, membound_s, hbm_bytes_per_s):
    """Seconds the compute under a hidden communication loses to the HBM bandwidth it takes: a
    communication moving `payload_bytes` in `comm_s` takes its `comm_hbm_share` while it runs, and
    the memory-bound compute under its `hidden_s`, at most `membound_s` (the memory-bound GPU seconds
    of the compute it hides under), waits that share of its time: to first order in the share (the
    exact slowdown, `hbm_contention`, is share / (1 - share)), which keeps the loss growing with the
    bytes hidden, never shrinking when the same bytes move more slowly. An upper bound where the
    communication also overlaps compute-bound kernels."""
    hidden_s = np.asarray(hidden_s, float)
    share = comm_hbm_share(payload_bytes, comm_s, hbm_bytes_per_s)
    return np.where(hidden_s > 0, np.minimum(np.asarray(membound_s, float), hidden_s) * share, 0.0)


def hbm_contention(membound_s, comm_s, share):
    """Seconds memory-bound compute gains while a communication holding `share` of HBM runs beside
    it: the part of it under the communication (at most `comm_s`) runs at 1 - share of its rate."""
    under = np.minimum(np.asarray(membound_s, float), np.asarray(comm_s, float))
    return under * share / (1.0 - share)
