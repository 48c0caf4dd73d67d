"""Serving plans as columns, priced as SGLang 0.5.23 runs them.

`effective` applies SGLang's silent rewrites that change cost (any all-to-all backend forces
ep = tp; deepep_mode normal turns CUDA graphs off; attention-DP divides the chunked-prefill size;
pp > 1 turns the overlap scheduler off) and fills SGLang's memory-tier defaults
(memory_hook.py: chunk and decode graph max batch by GPU memory). The realizability rules
(rejections with reason codes) live in the tuner; this module only decides what is priced.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specs.serve_plan import ServePlan, sglang_memory_tier_defaults

A2A_CODE = {"none": 0, "deepep": 2, "mooncake": 2, "nixl": 2, "mori": 2, "flashinfer": 2, "pplx": 2}


@dataclass
class ServeCols:
    """Effective plan fields as arrays of one length (one entry per plan)."""
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    attn_dp: np.ndarray
    ep: np.ndarray
    a2a: np.ndarray  # 0 none, 2 deepep-like
    low_latency_decode: np.ndarray  # decode dispatch uses DeepEP low-latency kernels
    low_latency_prefill: np.ndarray  # deepep_mode=low_latency: prefill dispatch too
    tbo: np.ndarray
    redundant: np.ndarray
    chunk: np.ndarray  # per attention-DP rank, after SGLang's division
    max_running: np.ndarray  # 0 = SGLang picks
    graph_bs: np.ndarray  # 0 = no decode CUDA graphs
    mem_frac: np.ndarray  # 0 = SGLang's formula
    overlap_sched: np.ndarray
    graph_bs_mem: np.ndarray  # decode graph max_bs SGLang's memory formula sees (before deepep normal drops graphs)
    deepep: np.ndarray  # moe_a2a_backend == deepep (its own buffers and 2 GiB graph-time reserve)
    pd_p: np.ndarray  # prefill instances of a pd-disaggregated unit (0 = aggregated)
    pd_d: np.ndarray  # decode instances of a pd-disaggregated unit

    def __len__(self):
        return len(self.tp)

    @property
    def attn_tp(self):
        return self.tp // self.attn_dp

    @property
    def moe_tp(self):
        return np.maximum(self.tp // self.ep, 1)


def _rewrites(plan: ServePlan, gpu_gib: float) -> tuple[dict, int]:
    """(field changes SGLang makes, decode-graph max_bs its memory formula sees)."""
    p, kw = plan, {}
    if p.a2a != "none" and p.ep != p.tp:
        kw["ep"] = p.tp
    chunk, gbs = sglang_memory_tier_defaults(gpu_gib, p.tp)
    if p.chunked_prefill == 0:
        kw["chunked_prefill"] = chunk
    bs = p.cuda_graph_max_bs
    if bs == 0:
        bs = min(gbs, p.max_running) if p.max_running else gbs  # memory_hook clamps a default max_bs
        kw["cuda_graph_max_bs"] = bs
    mem_bs = max(bs, 0)
    if p.a2a == "deepep" and p.deepep_mode == "normal":
        kw["cuda_graph_max_bs"] = -1  # moe_hook.py: normal mode disables CUDA graphs
    return kw, mem_bs


def effective(plan: ServePlan, gpu_gib: float) -> ServePlan:
    """The plan SGLang actually runs (the rewrites that change cost)."""
    kw, _ = _rewrites(plan, gpu_gib)
    return plan.replace(**kw) if kw else plan


def to_cols(plans: list[ServePlan], gpu_gib: float) -> ServeCols:
    # memory_hook sizes memory before moe_hook drops CUDA graphs for deepep normal (resolver: tp8
    # attn-dp8 deepep normal and auto both resolve mem_frac 0.755 on H200): graph_bs_mem keeps it
    rw = [_rewrites(p, gpu_gib) for p in plans]
    eff = [p.replace(**kw) if kw else p for p, (kw, _) in zip(plans, rw)]
    mem = [m for _, m in rw]

    def col(f, dtype=np.int64):
        return np.array([f(p) for p in eff], dtype=dtype)

    return ServeCols(
        tp=col(lambda p: p.tp), pp=col(lambda p: p.pp), dp=col(lambda p: p.dp),
        attn_dp=col(lambda p: p.attn_dp), ep=col(lambda p: p.ep),
        a2a=col(lambda p: A2A_CODE.get(p.a2a, 2)),
        # auto: normal kernels for prefill, low-latency for decode (SGLang's DeepEP auto mode)
        low_latency_decode=col(lambda p: p.a2a != "none" and p.deepep_mode != "normal", bool),
        low_latency_prefill=col(lambda p: p.a2a != "none" and p.deepep_mode == "low_latency", bool),
        tbo=col(lambda p: p.tbo, bool), redundant=col(lambda p: p.eplb_redundant),
        chunk=col(lambda p: max(p.chunked_prefill // p.attn_dp, 1)),
        max_running=col(lambda p: p.max_running),
        graph_bs=col(lambda p: max(p.cuda_graph_max_bs, 0)),
        mem_frac=col(lambda p: p.mem_frac, float),
        overlap_sched=col(lambda p: p.pp == 1, bool),
        graph_bs_mem=np.array(mem, dtype=np.int64),
        deepep=col(lambda p: p.a2a == "deepep", bool),
        pd_p=col(lambda p: p.pd_ratio[0] if p.pd_ratio else 0),
        pd_d=col(lambda p: p.pd_ratio[1] if p.pd_ratio else 0),
    )
