"""Serving memory per GPU: weights, KV cache bytes per token, SGLang's static memory fraction, and
the KV pool -> maximum decode batch.

SGLang sizes the pool as mem_frac * HBM - weights (`--mem-fraction-static` covers weights and KV;
the rest holds activations, CUDA graphs and communication buffers). The fraction itself is
resolved with the plan (specs.serve_resolve.static_mem_frac), per server role."""
from __future__ import annotations

import numpy as np

from cost_model.flops import attention_params_per_rank, param_counts
from cost_model.serving.constants import ACT_HIDDEN_MULT, DEFAULT_MAX_RUNNING

GIB = 1024 ** 3
MIB = 1024 ** 2


def weight_bytes_per_gpu(spec, c, wbytes) -> np.ndarray:
    """Weight bytes on one GPU: attention sharded over attention-TP as SGLang shards it (MLA's down
    projections whole on every rank, GQA's K/V heads never below one per rank:
    `flops.attention_params_per_rank`; replicated across attention-DP ranks), routed experts over EP
    (plus EPLB redundant copies) and expert-TP, dense MLPs over their
    own TP width (`c.dense_tp`: whole on every rank with --moe-dense-tp-size 1), shared experts /
    vocabulary over TP; one pipeline stage's share of the layers. `wbytes`: (routed-expert, other
    linear) bytes per weight (`constants.WEIGHT_FORMAT_BYTES`)."""
    pc = param_counts(spec)
    pl = pc["per_layer"]
    L_moe, L_dense = pc["num_moe_layers"], pc["num_dense_layers"]
    E = max(spec.num_experts, 1)
    attn = attention_params_per_rank(spec, c.attn_tp) * spec.num_layers
    dense = pl["dense_mlp"] * L_dense / c.dense_tp
    experts = pl["moe_expert"] * (E + c.redundant) / c.ep / c.moe_tp * L_moe if spec.num_experts else 0.0
    shared = (pl["shared_expert"] + pl["router"]) * L_moe / c.tp
    vocab = (pc["embedding"] + pc["output_layer"]) / c.tp * 2.0  # embeddings stay bf16
    w_exp, w_lin = wbytes
    return ((attn + dense + shared) * w_lin + experts * w_exp) / c.pp + vocab / c.pp


def kv_bytes_per_token(spec, c) -> np.ndarray:
    """KV cache bytes of one token on one GPU (all layers of its stage) at the plan's KV dtype
    (`c.kv_bytes`). MLA keeps one latent (kv_lora_rank + rope dim) per layer, replicated on every
    attention-TP rank; GQA shards KV heads over attention-TP (replicated when there are fewer heads
    than ranks)."""
    layers = spec.num_layers / c.pp
    kv_bytes = c.kv_bytes
    if spec.mla:
        return (spec.kv_lora_rank + spec.qk_pos_emb_head_dim) * kv_bytes * layers * np.ones(len(c))
    heads = np.maximum(spec.query_groups // c.attn_tp, 1)
    return 2.0 * heads * spec.head_dim * kv_bytes * layers


def deepep_buffer_bytes(spec, c) -> np.ndarray:
    """Bytes of the DeepEP buffer SGLang allocates per GPU (token_dispatcher/deepep.py
    `get_deepep_buffer`): the larger of the normal-mode NVLink buffer and, when low-latency kernels
    are used, the low-latency RDMA buffer. They live outside mem_fraction_static (in the reserve).
    - low latency (DeepEP csrc/config.hpp LowLatencyLayout): two buffers of send + receive, each
      num_experts * tokens_per_rank * message bytes, message = hidden * 2 B (+16 B header), with
      SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK = 128 (SGLang's default).
    - normal (Config.get_nvl_buffer_size_hint): channels (num_sms / 2 = 12 at SGLang's 24 SMs) x
      NVLink ranks (<= 8) x 256 chunked receive tokens x hidden * 2 B."""
    h = spec.hidden_size
    E = max(spec.num_experts, 1)
    ll_tokens = 128
    msg = 16 + h * 2.0
    ll = 2.0 * 2.0 * E * ll_tokens * msg
    normal = 12 * np.minimum(c.ep, 8) * 256 * h * 2.0
    on = c.deepep
    return np.where(on, np.maximum(normal, np.where(c.low_latency_decode, ll, 0.0)), 0.0)


def capacity(spec, cluster, c, isl, osl, wbytes, role: str = "agg") -> dict:
    """Per-GPU memory and the decode batch it allows. Returns arrays: weights_gib, mem_frac,
    kv_pool_tokens (per GPU = per attention-DP rank's pool), act_gib, max_batch_rank (requests per
    attention-DP rank at full context isl+osl), max_batch_instance, memory_gib (weights + KV pool +
    activations), fits and a reason code per plan ('' when it fits)."""
    hbm = cluster.hbm_gib * GIB
    w = weight_bytes_per_gpu(spec, c, wbytes)
    mf = c.mem_frac_for(role)  # resolved by specs.serve_resolve (SGLang's formula when not given)
    pool = mf * hbm - w
    kvt = kv_bytes_per_token(spec, c)
    tokens = np.maximum(pool, 0) / kvt
    ctx = isl + osl
    rank = np.floor(tokens / ctx)
    cap = np.where(c.max_running > 0, c.max_running // c.attn_dp, DEFAULT_MAX_RUNNING)
    rank = np.minimum(rank, np.maximum(cap, 1))
    # without an all-to-all backend attention-DP gathers every rank's chunk onto each GPU for the MoE;
    # with one (DeepEP) a GPU holds its own rank's tokens (routed copies are in ACT_HIDDEN_MULT)
    gathered = np.where(c.a2a > 0, 1, c.attn_dp)
    act = c.chunk * gathered * spec.hidden_size * 2.0 * ACT_HIDDEN_MULT / np.maximum(c.attn_tp, 1)
    # decode CUDA graphs: their captured buffers (SGLang's own estimate, 2 MiB per max_bs) + DeepEP's
    act = act + np.where(c.graph_bs > 0, 2.0 * c.graph_bs * MIB, 0) + deepep_buffer_bytes(spec, c)
    reason = np.full(len(c), "", dtype=object)
    reason = np.where((1 - mf) * hbm < act, "activations_exceed_reserve", reason)
    reason = np.where(rank < 1, "kv_pool_below_one_request", reason)
    reason = np.where(w > hbm, "weights_exceed_hbm", np.where(pool <= 0, "weights_exceed_mem_fraction", reason))
    return {
        "weights_gib": w / GIB, "mem_frac": mf, "kv_pool_tokens": tokens, "act_gib": act / GIB,
        "max_batch_rank": rank, "max_batch_instance": rank * c.attn_dp,
        "memory_gib": (w + np.maximum(pool, 0) + act) / GIB,
        "fits": reason == "", "reason": reason,
    }
