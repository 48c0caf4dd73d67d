"""Parameter counts and model FLOPs of a `ModelSpec`.

`param_counts` counts the weights Megatron-core builds for the spec (embedding, untied output
layer, attention incl. MLA projections and their norms, dense MLPs, routed and shared experts,
routers, layer norms); MTP layers are not part of a spec and are not counted. Total and active
both include the input embedding and the untied output layer, which is how most published
figures count (gpt-oss is the exception; see tests/test_models.py).

`model_flops_per_token` follows Megatron-LM's `num_floating_point_operations`
(megatron/training/training.py, `transformer_flops`, BSHD layout, no MTP): every GEMM is counted
3 times (forward, wgrad, dgrad) with 2 flops per MAC, core attention with the causal halving,
MLA projections incl. Megatron's "+1" norm terms, routed experts x topk plus shared experts,
3 matrices per gated-linear-unit MLP, and the LM head. Megatron multiplies the LM head by the
padded vocabulary; pass `padded_vocab` to reproduce that exactly.
"""
from __future__ import annotations

import numpy as np

from specs.model_spec import ModelSpec


def _mlp_matrices(spec: ModelSpec) -> int:
    return 3 if spec.gated_linear_unit else 2


def attention_params(spec: ModelSpec) -> int:
    """Weights of one self-attention block, incl. its input layer norm (and MLA's inner norms): what
    one rank of attention-TP 1 holds (`attention_params_per_rank`, the one formula)."""
    return int(round(float(attention_params_per_rank(spec, 1))))


def attention_params_per_rank(spec: ModelSpec, tp):
    """Weights of one attention block on one of `tp` attention-TP ranks as SGLang shards it (`tp`:
    int or array; tp = 1 gives `attention_params`). MLA: the down projections and their norms stay
    whole on every rank (sglang models/deepseek_v2.py: fused_qkv_a_proj_with_mqa / kv_a_proj_with_mqa
    are ReplicatedLinear), the query / key-value up and output projections are split over tp. GQA:
    query and output over tp, the K/V heads over tp but never below one head per rank
    (QKVParallelLinear replicates a head when there are fewer heads than ranks)."""
    h, n = spec.hidden_size, spec.num_attention_heads
    tp = np.asarray(tp, float)
    if spec.mla:
        qk = spec.qk_head_dim + spec.qk_pos_emb_head_dim
        # input norm (fused into linear_qkv in Megatron's TE spec), kv down + rope key, kv norm
        whole = h + h * (spec.kv_lora_rank + spec.qk_pos_emb_head_dim) + spec.kv_lora_rank
        split = spec.kv_lora_rank * n * (spec.qk_head_dim + spec.v_head_dim) + n * spec.v_head_dim * h  # kv up, out
        if spec.q_lora_rank:  # q down and norm whole, q up split
            whole = whole + h * spec.q_lora_rank + spec.q_lora_rank
            split = split + spec.q_lora_rank * n * qk
        else:
            split = split + h * n * qk
        bias = (n * qk + n * spec.v_head_dim + h) if spec.attention_bias else 0
        return whole + (split + bias) / tp
    d, g = spec.head_dim, spec.query_groups
    bias = ((n + 2 * g) * d + h) if spec.attention_bias else 0
    return h + (h * n * d + n * d * h + bias) / tp + h * 2 * d * np.maximum(g / tp, 1.0)


def param_counts(spec: ModelSpec) -> dict:
    """Parameter counts. Keys: total, active, embedding (input), output_layer (0 if tied),
    non_expert (everything but routed experts), per_layer (one MoE and one dense layer broken
    down: attention, dense_mlp, moe_experts (all routed experts), moe_expert (one), shared_expert,
    router, norms), and counts per layer kind."""
    h, v = spec.hidden_size, spec.vocab_size
    m = _mlp_matrices(spec)
    attn = attention_params(spec)
    pre_mlp_norm = h
    dense_mlp = m * h * spec.ffn_hidden_size
    one_expert = m * h * spec.moe_ffn_hidden_size if spec.num_experts else 0
    experts = spec.num_experts * one_expert
    shared = m * h * spec.moe_shared_expert_ffn
    router = h * spec.num_experts
    dense_layer = attn + pre_mlp_norm + dense_mlp
    moe_layer = attn + pre_mlp_norm + router + experts + shared
    embedding = v * h
    output_layer = 0 if spec.tie_embeddings else v * h
    final_norm = h
    L_moe, L_dense = spec.num_moe_layers, spec.num_dense_layers
    total = (embedding + output_layer + final_norm
             + L_dense * dense_layer + L_moe * moe_layer)
    inactive = L_moe * (spec.num_experts - spec.moe_router_topk) * one_expert
    return {
        "total": total,
        "active": total - inactive,
        "embedding": embedding,
        "output_layer": output_layer,
        "final_norm": final_norm,
        "non_expert": total - L_moe * experts,
        "routed_experts": L_moe * experts,
        "num_moe_layers": L_moe,
        "num_dense_layers": L_dense,
        "per_layer": {
            "attention": attn,
            "dense_mlp": dense_mlp,
            "moe_experts": experts,
            "moe_expert": one_expert,
            "shared_expert": shared,
            "router": router,
            "norms": 2 * h,  # input + pre-MLP layer norm (MLA inner norms are in attention)
            "dense_layer": dense_layer,
            "moe_layer": moe_layer,
        },
    }


def _attention_flop_terms(spec: ModelSpec) -> tuple[float, float]:
    """Per layer, fwd+bwd: (token-linear flops per token, core-attention flops per token per
    unit of sequence length), exactly as Megatron's transformer_flops."""
    h, n = spec.hidden_size, spec.num_attention_heads
    six = 3 * 2
    if spec.mla:
        qk = spec.qk_head_dim + spec.qk_pos_emb_head_dim
        if spec.q_lora_rank:
            q_term = spec.q_lora_rank * (h + n * qk + 1)
        else:
            q_term = h * n * qk
        linear = six * (q_term
                        + spec.kv_lora_rank * (h + n * (spec.qk_head_dim + spec.v_head_dim) + 1)
                        + h * spec.qk_pos_emb_head_dim
                        + n * spec.v_head_dim * h)
        core = six * (n * qk / 2 + n * spec.v_head_dim / 2)
        return linear, core
    qp = spec.head_dim * n
    kvp = spec.head_dim * spec.query_groups
    linear = six * (h * (qp + 2 * kvp) + qp * h)
    core = six * qp / 2 * 2  # causal half, two batched GEMMs (QK^T and PV)
    return linear, core


def model_flops_per_token(spec: ModelSpec, seq: int | None = None, *,
                          padded_vocab: int | None = None, mtp_num_layers: int = 0) -> float:
    """Training (forward + backward) model FLOPs per token at sequence length `seq`
    (default: spec.seq_length), Megatron's MoE accounting (see module docstring).

    `mtp_num_layers` adds multi-token-prediction layers as Megatron does: each is one more layer
    of the last layer's kind, plus its eh-projection and norms and one more LM head."""
    s = spec.seq_length if seq is None else seq
    if s <= 0:
        raise ValueError(f"sequence length must be > 0, got {s}")
    h = spec.hidden_size
    fx = _mlp_matrices(spec)
    six = 3 * 2
    L_moe, L_dense = spec.num_moe_layers, spec.num_dense_layers
    last_is_moe = bool(spec.moe_layers) and spec.moe_layers[-1] and spec.num_experts > 0
    L_moe += mtp_num_layers if last_is_moe else 0
    L_dense += 0 if last_is_moe else mtp_num_layers
    mlp = six * h * (spec.ffn_hidden_size * fx * L_dense
                     + spec.moe_ffn_hidden_size * spec.moe_router_topk * fx * L_moe
                     + spec.moe_shared_expert_ffn * fx * L_moe)
    linear, core = _attention_flop_terms(spec)
    vocab = padded_vocab or spec.vocab_size
    logits = six * h * vocab * (1 + mtp_num_layers)
    mtp = six * mtp_num_layers * (3 * h + 2 * h * h)
    return float(mlp + (spec.num_layers + mtp_num_layers) * (linear + core * s) + mtp + logits)


def model_flops_per_step(spec: ModelSpec, seq: int, global_batch: int, *,
                         padded_vocab: int | None = None, mtp_num_layers: int = 0) -> float:
    """Training FLOPs of one optimizer step of `global_batch` sequences of `seq` tokens."""
    return (model_flops_per_token(spec, seq, padded_vocab=padded_vocab,
                                  mtp_num_layers=mtp_num_layers) * seq * global_batch)
