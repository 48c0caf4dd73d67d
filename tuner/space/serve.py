"""The serving plan space: a discrete grid of SGLang 0.5.23 serving plans for N GPUs, streamed.

Layouts use all N GPUs: aggregated plans have dp * tp * pp == N; disaggregated plans have
(prefill + decode instances) * tp * pp == N with dp = 1. Widths (tp, attn_dp) are powers of two and
the whole group. Knob values are the settings people
actually try (powers of two, SGLang's defaults as 0); nothing is filtered here: realizability is
tuner/space/sglang_rules.py's job, so `moetune plans --mode serve` can say why plans fail. The dense
MLP's TP width (`moe_dense_tp`) is tried with attention DP only: the layout it goes with (dense
layers data-parallel like attention, LMSYS's large-scale EP); without attention DP it would shard
each rank's attention-TP slice of tokens, which nobody runs.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

from specs.serve_plan import ServePlan


@dataclass(frozen=True)
class ServeSpace:
    gpus: int
    pp: tuple[int, ...] = (1, 2)
    moe_dense_tp: tuple[int, ...] = (0, 1)  # with attn_dp > 1 (0 = SGLang's default: TP over tp)
    a2a_modes: tuple[tuple[str, str], ...] = (("none", "auto"), ("deepep", "auto"), ("deepep", "normal"),
                                              ("deepep", "low_latency"))
    tbo: tuple[bool, ...] = (False, True)
    eplb_redundant: tuple[int, ...] = (0, 32)
    chunked_prefill: tuple[int, ...] = (0, 4096, 16384)
    max_running: tuple[int, ...] = (0, 128)
    cuda_graph_max_bs: tuple[int, ...] = (0, 64, 256)
    mem_frac: tuple[float, ...] = (0.0, 0.85)
    page_size: tuple[int, ...] = (1, 64)
    pd_ratios: tuple[str, ...] = ("", "1:1", "1:2", "1:3", "2:1")

    def layouts(self) -> Iterator[tuple[int, int, int, int, int, str]]:
        """(tp, pp, dp, attn_dp, ep, pd) points whose GPU count is exactly `gpus`."""
        n = self.gpus
        for pd in self.pd_ratios:
            groups = 1
            if pd:
                a, b = (int(x) for x in pd.split(":"))
                groups = a + b
            if n % groups:
                continue
            per = n // groups
            for pp in self.pp:
                for tp in _widths(per // pp if per % pp == 0 else 0):
                    dp = 1 if pd else per // (tp * pp)
                    if tp * pp * (dp if not pd else 1) != per:
                        continue
                    for attn_dp in _widths(tp):
                        for ep in sorted({1, tp}):
                            yield tp, pp, dp, attn_dp, ep, pd

    def knob_product(self):
        return itertools.product(self.a2a_modes, self.tbo, self.eplb_redundant, self.chunked_prefill,
                                 self.max_running, self.cuda_graph_max_bs, self.mem_frac, self.page_size)

    def knob_count(self) -> int:
        k = 1
        for xs in (self.a2a_modes, self.tbo, self.eplb_redundant, self.chunked_prefill, self.max_running,
                   self.cuda_graph_max_bs, self.mem_frac, self.page_size):
            k *= len(xs)
        return k

    def dense_tps(self, attn_dp: int) -> tuple[int, ...]:
        """The moe_dense_tp values tried with this attention-DP size."""
        return self.moe_dense_tp if attn_dp > 1 else (0,)

    def size(self) -> int:
        return sum(len(self.dense_tps(layout[3])) for layout in self.layouts()) * self.knob_count()

    def __iter__(self) -> Iterator[ServePlan]:
        for tp, pp, dp, attn_dp, ep, pd in self.layouts():
            for dense_tp in self.dense_tps(attn_dp):
                for (a2a, mode), tbo, r, chunk, run, bs, mf, page in self.knob_product():
                    yield ServePlan(tp=tp, pp=pp, dp=dp, attn_dp=attn_dp, ep=ep, moe_dense_tp=dense_tp, a2a=a2a,
                                    deepep_mode=mode, tbo=tbo, eplb_redundant=r, chunked_prefill=chunk,
                                    max_running=run, cuda_graph_max_bs=bs, mem_frac=mf, page_size=page, pd=pd)


def _pow2_upto(n: int) -> list[int]:
    out, k = [], 1
    while 0 < k <= n:
        if n % k == 0:
            out.append(k)
        k *= 2
    return out


def _widths(n: int) -> list[int]:
    """Power-of-two divisors of n, and n itself (a whole-group width such as tp = attn_dp = ep = 72
    over 9 nodes of 8, the layout of large-scale EP deployments)."""
    return sorted(set(_pow2_upto(n)) | ({n} if n > 0 else set()))


def default_serve_space(gpus: int) -> ServeSpace:
    return ServeSpace(gpus=gpus)


def sample(space: ServeSpace, k: int, seed: int = 0) -> list[ServePlan]:
    """k plans spread over the space (a seeded random pick over its index range, streamed)."""
    import random
    n = space.size()
    want = set(random.Random(seed).sample(range(n), min(k, n)))
    return [p for i, p in enumerate(space) if i in want]


@dataclass
class ServeSummary:
    total: int = 0
    realizable: int = 0
    rejections: Counter = field(default_factory=Counter)
    rejected_examples: dict = field(default_factory=dict)  # code -> (canonical plan, sentence)
    examples: list = field(default_factory=list)
    effective: list = field(default_factory=list)  # EffectivePlans kept for ranking (see rank_hook)


def summarize(space: ServeSpace, model, cluster, *, max_examples: int = 5, keep_effective: bool = False,
              stride: int = 997) -> ServeSummary:
    from tuner.space.sglang_rules import realize
    s = ServeSummary()
    for _i, p in enumerate(space):
        s.total += 1
        v = realize(p, model, cluster, gpus=space.gpus)
        if v.ok:
            s.realizable += 1
            if keep_effective:
                s.effective.append(v.effective)
            if len(s.examples) < max_examples and s.realizable % stride == 1:
                s.examples.append(p)
        else:
            for r in v.reasons:
                s.rejections[r.code] += 1
                s.rejected_examples.setdefault(r.code, (p.canonical(), r.sentence))
    return s
