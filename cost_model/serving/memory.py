"""Serving memory per GPU: weights, KV cache bytes per token, SGLang's static memory fraction, and
the KV pool -> maximum decode batch.

SGLang sizes the pool as mem_frac * HBM - weights (`--mem-fraction-static` covers weights and KV;
the rest holds activations, CUDA graphs and communication buffers)."""
from __future__ import annotations

import numpy as np

from cost_model.flops import param_counts
from cost_model.serving.constants import (
    ACT_HIDDEN_MULT,
    DEEPEP_RESERVE_MIB,
    DEFAULT_MAX_RUNNING,
    GRAPH_RESERVE_MIB,
)

GIB = 1024 ** 3
MIB = 1024 ** 2


def weight_bytes_per_gpu(spec, c, wbytes: float) -> np.ndarray:
    """Weight bytes on one GPU: attention sharded over attention-TP (replicated across attention-DP
    ranks), routed experts over EP (plus EPLB redundant copies) and expert-TP, dense MLPs / shared
    experts / vocabulary over TP; one pipeline stage's share of the layers."""
    pc = param_counts(spec)
    pl = pc["per_layer"]
    L_moe, L_dense = pc["num_moe_layers"], pc["num_dense_layers"]
    E = max(spec.num_experts, 1)
    attn = pl["attention"] * spec.num_layers / c.attn_tp
    dense = pl["dense_mlp"] * L_dense / c.tp
    experts = pl["moe_expert"] * (E + c.redundant) / c.ep / c.moe_tp * L_moe if spec.num_experts else 0.0
    shared = (pl["shared_expert"] + pl["router"]) * L_moe / c.tp
    vocab = (pc["embedding"] + pc["output_layer"]) / c.tp * 2.0  # embeddings stay bf16
    return (attn + dense + experts + shared) * wbytes / c.pp + vocab / c.pp


def kv_bytes_per_token(spec, c, kv_bytes: float = 2.0) -> np.ndarray:
    """KV cache bytes of one token on one GPU (all layers of its stage). MLA keeps one latent
    (kv_lora_rank + rope dim) per layer, replicated on every attention-TP rank; GQA shards KV heads
    over attention-TP (replicated when there are fewer heads than ranks)."""
    layers = spec.num_layers / c.pp
    if spec.mla:
        return (spec.kv_lora_rank + spec.qk_pos_emb_head_dim) * kv_bytes * layers * np.ones(len(c))
    heads = np.maximum(spec.query_groups // c.attn_tp, 1)
    return 2.0 * heads * spec.head_dim * kv_bytes * layers


def default_mem_frac(c, gpu_mib: float) -> np.ndarray:
    """SGLang's --mem-fraction-static when not given (memory_hook.py: reserve = 512 + 1.5 *
    max(chunk, 2048) + tp*pp/8 * 1024 + graph reserve MiB, floored at 10 GiB on GPUs above 60 GB,
    plus DeepEP buffers)."""
    chunk_total = c.chunk * c.attn_dp
    reserve = 512 + 1.5 * np.maximum(chunk_total, 2048) + c.tp * c.pp / 8 * 1024 + np.where(c.graph_bs > 0, GRAPH_RESERVE_MIB, 0)
    if gpu_mib > 60 * 1000 / 1.048576:
        reserve = np.maximum(reserve, 10240)
    reserve = reserve + np.where(c.a2a > 0, DEEPEP_RESERVE_MIB, 0)
    return np.clip((gpu_mib - reserve) / gpu_mib, 0.05, 0.95)


def capacity(spec, cluster, c, isl, osl, wbytes: float, kv_bytes: float = 2.0) -> dict:
    """Per-GPU memory and the decode batch it allows. Returns arrays: weights_gib, mem_frac,
    kv_pool_tokens (per GPU = per attention-DP rank's pool), act_gib, max_batch_rank (requests per
    attention-DP rank at full context isl+osl), max_batch_instance, memory_gib (weights + KV pool +
    activations), fits and a reason code per plan ('' when it fits)."""
    hbm = cluster.hbm_gib * GIB
    w = weight_bytes_per_gpu(spec, c, wbytes)
    mf = np.where(c.mem_frac > 0, c.mem_frac, default_mem_frac(c, cluster.hbm_gib * 1024))
    pool = mf * hbm - w
    kvt = kv_bytes_per_token(spec, c, kv_bytes)
    tokens = np.maximum(pool, 0) / kvt
    ctx = isl + osl
    rank = np.floor(tokens / ctx)
    cap = np.where(c.max_running > 0, c.max_running, DEFAULT_MAX_RUNNING) // c.attn_dp
    rank = np.minimum(rank, np.maximum(cap, 1))
    act = c.chunk * c.attn_dp * spec.hidden_size * 2.0 * ACT_HIDDEN_MULT / np.maximum(c.attn_tp, 1)
    act = act + np.where(c.graph_bs > 0, GRAPH_RESERVE_MIB * MIB, 0)
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
