"""Serving plans as columns, priced as SGLang 0.5.23 runs them.

The cost model prices `EffectivePlan`s, the output of SGLang's resolution (specs.serve_resolve:
ep forced by an a2a backend, the per-rank chunk, the decode graph batch, the static memory fraction
per server role, ...). It re-applies none of those rules: a plain `ServePlan` handed to the cost
model is resolved once by that same function (`effective_plans`). The realizability rules
(rejections with reason codes) live in the tuner.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specs.serve_resolve import EffectivePlan, resolve


@dataclass
class ServeCols:
    """Effective plan fields as arrays of one length (one entry per plan)."""
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    attn_dp: np.ndarray
    ep: np.ndarray
    dense_tp: np.ndarray  # GPUs a dense (non-MoE) MLP layer is sharded over (ServePlan.dense_mlp_tp: 1 or tp)
    a2a: np.ndarray  # 0 none, 2 deepep-like
    low_latency_decode: np.ndarray  # decode dispatch uses DeepEP low-latency kernels
    low_latency_prefill: np.ndarray  # deepep_mode=low_latency: prefill dispatch too
    tbo: np.ndarray
    redundant: np.ndarray
    chunk: np.ndarray  # per attention-DP rank, after SGLang's division
    max_running: np.ndarray  # 0 = SGLang picks
    graph_bs: np.ndarray  # 0 = no decode CUDA graphs
    mem_frac: np.ndarray  # the resolved static memory fraction of an aggregated server (may be <= 0)
    mem_frac_prefill: np.ndarray  # ... of a pd prefill server
    mem_frac_decode: np.ndarray  # ... of a pd decode server
    overlap_sched: np.ndarray
    deepep: np.ndarray  # moe_a2a_backend == deepep (its own buffers and 2 GiB graph-time reserve)
    pd_p: np.ndarray  # prefill instances of a pd-disaggregated unit (0 = aggregated)
    pd_d: np.ndarray  # decode instances of a pd-disaggregated unit
    kv_bytes: np.ndarray  # bytes of one KV-cache element (--kv-cache-dtype: 2, fp8_e4m3 1)
    ar_fusion: np.ndarray  # FlashInfer all-reduce + residual + RMSNorm fusion on (EffectivePlan.allreduce_fusion)

    def mem_frac_for(self, role: str) -> np.ndarray:
        return {"agg": self.mem_frac, "prefill": self.mem_frac_prefill, "decode": self.mem_frac_decode}[role]

    def __len__(self):
        return len(self.tp)

    @property
    def attn_tp(self):
        return self.tp // self.attn_dp

    @property
    def moe_tp(self):
        return np.maximum(self.tp // self.ep, 1)


def effective_plans(plans, model, cluster) -> list[EffectivePlan]:
    """`plans` as SGLang runs them: an `EffectivePlan` is kept as it is, a `ServePlan` goes through
    SGLang's resolution once (specs.serve_resolve.resolve); nothing else is applied here."""
    return [p if isinstance(p, EffectivePlan) else resolve(p, model, cluster) for p in plans]


def to_cols(effs: list[EffectivePlan]) -> ServeCols:
    """Columns of resolved plans (`effective_plans`), field by field."""
    eff = [e.plan for e in effs]

    def col(f, dtype=np.int64):
        return np.array([f(p) for p in eff], dtype=dtype)

    return ServeCols(
        tp=col(lambda p: p.tp), pp=col(lambda p: p.pp), dp=col(lambda p: p.dp),
        attn_dp=col(lambda p: p.attn_dp), ep=col(lambda p: p.ep), dense_tp=col(lambda p: p.dense_mlp_tp),
        a2a=col(lambda p: 0 if p.a2a == "none" else 2),
        # auto: normal kernels for prefill, low-latency for decode (SGLang's DeepEP auto mode)
        low_latency_decode=col(lambda p: p.a2a != "none" and p.deepep_mode != "normal", bool),
        low_latency_prefill=col(lambda p: p.a2a != "none" and p.deepep_mode == "low_latency", bool),
        tbo=col(lambda p: p.tbo, bool), redundant=col(lambda p: p.eplb_redundant),
        chunk=col(lambda p: max(p.chunked_prefill, 1)),
        max_running=col(lambda p: p.max_running),
        graph_bs=col(lambda p: max(p.cuda_graph_max_bs, 0)),
        mem_frac=np.array([e.mem_frac for e in effs], float),
        mem_frac_prefill=np.array([e.mem_frac_prefill for e in effs], float),
        mem_frac_decode=np.array([e.mem_frac_decode for e in effs], float),
        overlap_sched=np.array([e.overlap_schedule for e in effs], bool),
        deepep=col(lambda p: p.a2a == "deepep", bool),
        pd_p=col(lambda p: p.pd_ratio[0] if p.pd_ratio else 0),
        pd_d=col(lambda p: p.pd_ratio[1] if p.pd_ratio else 0),
        kv_bytes=col(lambda p: p.kv_bytes, float),
        ar_fusion=np.array([e.allreduce_fusion for e in effs], bool),
    )
