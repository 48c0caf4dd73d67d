"""Memory of the cost model: static bytes per parameter, activation bytes per layer (Korthikanti
et al. 2022, generalised), and the per-stage peak (`memory_by_stage`).

`korthikanti_layer_bytes` is the paper's closed form, kept as a test oracle for
`activation_terms`; `optimizer_bytes_per_param` is the formula the model itself uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model.constants import (
    ADAM_STATE_BYTES,
    CE_TRANSIENT_BYTES_PER_LOGIT,
    FP8_WEIGHT_COPY_BYTES,
    GRAPH_STATIC_BUFFERS_PER_REGION,
    MAIN_GRAD_BYTES,
    WEIGHT_BYTES,
)
from cost_model.flops import param_counts

GIB = 1024.0 ** 3


def korthikanti_layer_bytes(s, b, h, a, t=1, *, sequence_parallel=True) -> float:
    """Korthikanti et al. (2022) activation bytes of one GPT layer, no recompute:
    s*b*h*(34 + 5*a*s/h), divided by t with tensor + sequence parallelism. Test oracle only."""
    total = s * b * h * (34.0 + 5.0 * a * s / h)
    return total / t if sequence_parallel else s * b * h * (10.0 + 24.0 / t + 5.0 * a * s / (h * t))


def optimizer_bytes_per_param(dist_opt, dp_shard=1, *, fp8=False, grad_bytes=MAIN_GRAD_BYTES, fp8_param=False,
                              fsdp=False):
    """Static bytes per parameter: bf16 weight 2 + fp32 main grad 4 (+1 for an fp8 weight copy)
    + Adam (fp32 master, m, v) 12, the 12 sharded over `dp_shard` ranks by the distributed
    optimizer; with `fp8_param` (--fp8-param-gather) the fp8 weight is the only model copy (no
    bf16 one); with `fsdp` (Megatron FSDP, optim_grads_params) all of it sharded over `dp_shard`
    (the gathered working copies are `fsdp_working_bytes`). Arguments broadcast (numpy arrays over
    plans/stages); a float for scalars.

    Args:
        dist_opt: The distributed optimizer is on (bool or bool array).
        dp_shard: Ranks the optimizer state is sharded over (DP x CP for dense parameters,
            expert-DP for experts).
        fp8: An fp8 recipe (bool or bool array): adds the quantised weight copy.
        grad_bytes: Main-gradient bytes (fp32 4; 2 when gradients are reduced in bf16).
    """
    weights = weight_bytes_per_param(fp8, fp8_param)
    out = (weights + grad_bytes
           + np.where(dist_opt, ADAM_STATE_BYTES / dp_shard, ADAM_STATE_BYTES))
    out = np.where(np.asarray(fsdp, bool), (weights + grad_bytes + ADAM_STATE_BYTES) / dp_shard, out)
    return float(out) if np.ndim(out) == 0 else out


def fsdp_working_bytes(layer_params, *, fp8=False, grad_bytes=MAIN_GRAD_BYTES, fp8_param=False):
    """Bytes Megatron FSDP (optim_grads_params) holds unsharded on top of the shards: the gathered
    weights of the layer that computes and of the next one it prefetches (bf16, and the fp8 copy
    of an fp8 recipe; the fp8 one alone with fp8_param), and that layer's unsharded gradients before
    their reduce-scatter (megatron_fsdp.py: one module's parameters gathered ahead of use, released
    after; gradients reduce-scattered per module). `layer_params`: one layer's parameters per GPU."""
    return layer_params * (2.0 * weight_bytes_per_param(fp8, fp8_param) + grad_bytes)


def weight_bytes_per_param(fp8=False, fp8_param=False):
    """Bytes of the model's weight copies per parameter: bf16 2, plus the fp8 copy 1 of an fp8 recipe;
    the fp8 one alone with fp8_param (--fp8-param-gather)."""
    return np.where(np.asarray(fp8_param, bool), 0.0, WEIGHT_BYTES) + np.asarray(fp8) * FP8_WEIGHT_COPY_BYTES


def activation_terms(spec, T, tp, mbs_seq, *, flash=True, dropout=False):
    """Per-layer activation bytes of one microbatch, by saved tensor, on one GPU.
    T: tokens of the microbatch on this CP rank (seq*mbs/cp); tp: TP size (sequence parallel:
    every term is divided by tp). Returns dict of arrays: the attention block's terms."""
    h = spec.hidden_size
    nh = spec.num_attention_heads
    d = {}
    d["ln1_in"] = 2.0 * T * h
    if spec.mla:
        dq = spec.qk_head_dim + spec.qk_pos_emb_head_dim
        dv = spec.v_head_dim
        ql, kvl = spec.q_lora_rank, spec.kv_lora_rank
        d["qkv_in"] = 2.0 * T * h
        d["mla_latent"] = 2.0 * T * (2 * ql + 2 * kvl + spec.qk_pos_emb_head_dim)
        d["mla_up"] = 2.0 * T * nh * (2 * dq + dv)  # Q, K, V after the up projections
        d["attn_out"] = 2.0 * T * nh * dv
    else:
        hd, ng = spec.head_dim, spec.query_groups
        d["qkv_in"] = 2.0 * T * h
        d["qkv"] = 2.0 * T * (nh + 2 * ng) * hd
        d["attn_out"] = 2.0 * T * nh * hd
    if flash:
        d["core_attn"] = 4.0 * T * nh  # fp32 log-sum-exp per head
    else:
        d["core_attn"] = 5.0 * nh * T * mbs_seq  # softmax 2 + dropout mask 1 + dropout out 2
    if dropout:
        d["dropout"] = 1.0 * T * h * 2  # attention-output and MLP-output dropout masks
    return {k: v / tp for k, v in d.items()}


def mlp_terms(T, h, f, glu, tp, *, ln=True):
    """Per-layer activation bytes of one dense MLP (fc1 input, activation input, fc2 input, and
    the pre-MLP norm's input when `ln`), sequence parallel (divided by tp)."""
    d = {"fc1_in": 2.0 * T * h, "act_in": 2.0 * T * f * (2 if glu else 1), "fc2_in": 2.0 * T * f}
    if ln:
        d["ln2_in"] = 2.0 * T * h
    return {k: v / tp for k, v in d.items()}


@dataclass
class StageParams:
    """[P, S] parameters held per pipeline stage (dense: sharded by TP; experts: by EP x ETP)."""
    dense: np.ndarray
    expert: np.ndarray


def memory_by_stage(x, st, params: StageParams, experts, *, flash=True, dropout=False, graphs=None) -> np.ndarray:
    """[P, S] peak GiB per stage: static (weights, main grads, optimizer state), activations of
    the microbatches in flight, dispatch buffers and the loss stage's logits.

    Args:
        x: The evaluation's `cost_model.blocks.Inputs`.
        st: The stage structure (`cost_model.model.Stages`: layer counts, recompute fraction).
        params: Parameters per stage.
        experts: The `RoutedExperts` block (routed rows), or None for a dense model.
        flash: Flash attention (saves the log-sum-exp, no s^2 term).
        dropout: Count dropout masks (MoE recipes train without dropout).
        graphs: The plans' CUDA graphs (`cost_model.blocks.Graphs`): their static buffers per
            graphed region and microbatch in flight (`constants` GRAPH_STATIC_BUFFERS_PER_REGION).
    """
    spec, pa = x.spec, x.pa
    T, Tsp, tp, h, seq = x.tokens, x.tokens_sp, x.tp, x.hidden, x.seq
    V, glu, nmat, z = spec.vocab_size, spec.gated_linear_unit, x.mlp_matrices, x.zero
    has = x.recomputes
    fp8 = x.fp8
    nd, nm, em, lo, smask = st.dense, st.moe, st.embedding, st.loss, st.mask
    dist = pa.dist_opt.astype(bool)
    gb = col(x.grad_bytes)
    f8p = col(pa.fp8_param.astype(bool))
    fsdp = col(pa.fsdp.astype(bool))
    static = (params.dense * optimizer_bytes_per_param(col(dist), col(x.dp * x.cp), fp8=fp8[:, None], grad_bytes=gb,
                                                       fp8_param=f8p, fsdp=fsdp)
              + params.expert * optimizer_bytes_per_param(col(dist), col(x.edp), fp8=fp8[:, None], grad_bytes=gb,
                                                          fp8_param=f8p, fsdp=fsdp))
    # FSDP: one layer's unsharded weights (two: computing and prefetched) and gradients
    layers = np.maximum(st.layers, 1.0)
    static = static + fsdp * fsdp_working_bytes((params.dense + params.expert) / layers, fp8=fp8[:, None],
                                                grad_bytes=gb, fp8_param=f8p)
    a = activation_terms(spec, T, tp, seq, flash=flash, dropout=dropout)
    dense_mlp_terms = mlp_terms(T, h, spec.ffn_hidden_size, glu, tp)
    # fp8 linears save their quantised (1-byte) inputs for the weight gradient
    lin8 = np.where(fp8, 0.5, 1.0)
    for key in ("qkv_in", "mla_latent", "attn_out"):
        if key in a:
            a[key] = a[key] * lin8
    for key in ("fc1_in", "fc2_in"):
        dense_mlp_terms[key] = dense_mlp_terms[key] * lin8
    # selective recompute drops what the module recomputes
    full_attn = sum(a.values())
    drop_attn = (has("core_attn") * a["core_attn"] + has("mla_up_proj") * a.get("mla_up", 0.0)
                 + has("layernorm") * a["qkv_in"])
    attn_mem = full_attn - drop_attn
    # fine-grained activation offloading (megatron-core 0.16.1 `offload_modules`): the module's
    # input leaves HBM for the host; only what recompute has not already dropped counts
    off = offload_bytes(x, a, experts)
    attn_mem = attn_mem - off.attn_kept_off
    dense_mlp_mem = sum(dense_mlp_terms.values()) - has("mlp") * (sum(dense_mlp_terms.values())
                                                                   - dense_mlp_terms["ln2_in"]) \
        - (has("layernorm") & ~has("mlp")) * dense_mlp_terms["fc1_in"]
    dense_mlp_mem = dense_mlp_mem - off.dense_mlp
    if spec.is_moe:
        E, fe, etp, R = max(spec.num_experts, 1), spec.moe_ffn_hidden_size, x.etp, experts.rows
        router_in = 2.0 * Tsp * h
        logits = 2 * 4.0 * Tsp * E
        # routed experts: probs are applied inside the activation and the fused unpermute needs
        # only the routing map, so the expert output is not saved (Megatron >= 0.13)
        routed = {"fc1_in": 2.0 * R * h * lin8, "act_in": 2.0 * R * nmat * fe / etp,
                  "fc2_in": 2.0 * R * fe / etp * lin8}
        routed_sum = sum(routed.values())
        fs = spec.moe_shared_expert_ffn
        sh = mlp_terms(T, h, fs, glu, tp, ln=False) if fs else {"x": z}
        for key in ("fc1_in", "fc2_in"):
            if key in sh:
                sh[key] = sh[key] * lin8
        sh_sum = sum(sh.values())
        moe_mem = (2.0 * Tsp * h + router_in + logits + routed_sum + sh_sum
                   - has("moe") * (router_in + logits + routed_sum + sh_sum)
                   - (has("moe_act") & ~has("moe")) * routed["fc2_in"]
                   - (has("shared_experts") & ~has("moe")) * sh_sum
                   - (has("layernorm") & ~has("moe")) * router_in)
        moe_mem = moe_mem - off.moe
        dispatch_buf = 2 * 2.0 * R * h
    else:
        moe_mem = z
        dispatch_buf = z
    layer_in = 2.0 * Tsp * h
    rc_full = pa.recompute == 2
    dense_act = np.where(rc_full, layer_in, attn_mem + dense_mlp_mem)
    moe_act = np.where(rc_full, layer_in, attn_mem + moe_mem)
    dense_act_nr = attn_mem + dense_mlp_mem
    moe_act_nr = attn_mem + moe_mem
    # per-stage activation of one microbatch (block recompute: only part of the layers)
    rc_frac = st.recompute_fraction
    # MTP layers (Megatron-core multi_token_prediction.py) sit on the loss stage: one layer of the
    # last layer's kind each, plus the eh-projection input (2h) and their own logits
    n_mtp = float(getattr(spec, "mtp_num_layers", 0) or 0)
    mtp_act = (col(moe_act if spec.moe_layers[-1] else dense_act) + col(2.0 * 2.0 * Tsp * h)) * n_mtp
    per_mb = (rc_frac * (nd * col(dense_act) + nm * col(moe_act))
              + (1 - rc_frac) * (nd * col(dense_act_nr) + nm * col(moe_act_nr))
              + em * col(2.0 * Tsp * h) + lo * mtp_act) * smask
    pp, vpp, m = x.pp, x.vpp, x.microbatches
    s_idx = np.arange(smask.shape[1])[None, :]
    inflight_1f1b = np.minimum(col(pp) - s_idx, col(m))
    inflight_chunks = np.minimum(col(m * vpp), 2 * (col(pp) - s_idx - 1) + (col(vpp) - 1) * col(pp) + 1)
    inflight = np.where(col(vpp) > 1, inflight_chunks / col(vpp), inflight_1f1b)
    if graphs is not None:
        regions = nd * col(graphs.regions_dense) + nm * col(graphs.regions_moe)
        per_mb = per_mb + regions * GRAPH_STATIC_BUFFERS_PER_REGION * col(2.0 * Tsp * h) * smask
    acts = per_mb * np.maximum(inflight, 0)
    transient = (nm > 0) * col(dispatch_buf) + lo * col(T * V / tp * CE_TRANSIENT_BYTES_PER_LOGIT) * (1.0 + n_mtp)
    return (static + acts + transient) * smask / GIB


# megatron-core 0.16.1 transformer_config.py `offload_modules` choices
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")


@dataclass
class Offload:
    """Per layer and microbatch, bytes fine-grained activation offloading moves to the host:
    of the attention block (`attn`, and the part recompute had not already dropped,
    `attn_kept_off`), of a dense MLP and of a MoE block."""
    attn: np.ndarray
    attn_kept_off: np.ndarray
    dense_mlp: np.ndarray
    moe: np.ndarray


def offload_bytes(x, a=None, experts=None) -> Offload:
    """What `x.offload_modules` moves to the host (megatron-core 0.16.1 fine-grained activation
    offloading: each listed module's saved input). `a`: the attention terms (`activation_terms`)."""
    spec, z, mods = x.spec, x.zero, set(getattr(x, "offload_modules", ()) or ())
    if not mods:
        return Offload(z, z, z, z)
    has = x.recomputes
    if a is None:
        a = activation_terms(spec, x.tokens, x.tp, x.seq)
        lin8 = np.where(x.fp8, 0.5, 1.0)
        for key in ("qkv_in", "mla_latent", "attn_out"):
            if key in a:
                a[key] = a[key] * lin8
    Tsp, h = x.tokens_sp, x.hidden
    lin8 = np.where(x.fp8, 0.5, 1.0)
    attn = z + ("attn_norm" in mods) * a["ln1_in"] + ("qkv_linear" in mods) * a["qkv_in"] \
        + ("core_attn" in mods) * (a.get("qkv", 0.0) + a.get("mla_up", 0.0)) + ("attn_proj" in mods) * a["attn_out"]
    kept = attn - ("qkv_linear" in mods) * has("layernorm") * a["qkv_in"] \
        - ("core_attn" in mods) * has("mla_up_proj") * a.get("mla_up", 0.0)
    dense = z + ("mlp_norm" in mods) * 2.0 * Tsp * h
    moe = z + ("mlp_norm" in mods) * 2.0 * Tsp * h
    if experts is not None and spec.is_moe:
        R, fe = experts.rows, spec.moe_ffn_hidden_size
        moe = moe + ("expert_fc1" in mods) * 2.0 * R * h * lin8 * (1 - has("moe")) \
            + ("moe_act" in mods) * 2.0 * R * x.mlp_matrices * fe / x.etp * (1 - has("moe"))
    return Offload(attn, kept, dense, moe)


def col(a) -> np.ndarray:
    """A [P] vector as a [P, 1] column, to broadcast over pipeline stages."""
    return np.asarray(a, float)[:, None]


def stage_params(x, st) -> StageParams:
    """Parameters per stage on one GPU: the stage's layers (attention, dense MLP or router and
    shared expert, norms; TP-sharded), the embedding on the first stage and the LM head + final
    norm on the last (the head tied to the embedding when pp == 1), routed experts (EP x ETP)."""
    spec = x.spec
    h, V, tp, pp = spec.hidden_size, spec.vocab_size, x.tp, x.pp
    nd, nm, em, lo, smask = st.dense, st.moe, st.embedding, st.loss, st.mask
    pl = param_counts(spec)["per_layer"]
    dense_layer_p = pl["attention"] + pl["dense_mlp"] + pl["norms"]
    moe_layer_p = pl["attention"] + pl["shared_expert"] + pl["router"] + pl["norms"]
    expert_layer_p = pl["moe_experts"]
    out_layer = V * h if (not spec.tie_embeddings or pp.max() > 1) else 0
    # MTP layers on the loss stage: the eh-projection (2h x h), two norms and one layer of the last
    # layer's kind (Megatron-core multi_token_prediction.py)
    n_mtp = float(getattr(spec, "mtp_num_layers", 0) or 0)
    last_moe = bool(spec.moe_layers[-1])
    mtp_p = n_mtp * (2 * h * h + 2 * h + (moe_layer_p if last_moe else dense_layer_p))
    dense_p = (nd * dense_layer_p + nm * moe_layer_p + em * V * h + lo * mtp_p) / col(tp) \
        + lo * (np.where(col(pp) > 1, V * h, out_layer) / col(tp) + h)
    if spec.tie_embeddings:
        dense_p = dense_p - np.where(col(pp) == 1, lo * V * h / col(tp), 0.0)
    expert_p = (nm + lo * n_mtp * last_moe) * expert_layer_p / col(x.ep * x.etp)
    return StageParams(dense_p * smask, expert_p * smask)
