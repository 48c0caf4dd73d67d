"""Rank what SGLang runs: `EffectivePlan`s (specs.serve_resolve, kept by tuner/serve_realize) through
the serving cost model (cost_model/serving, which prices them as they are), for
`plans --mode serve --rank` and the serving study's screening.

`rank(...)`: realizable plans, vectorised (`rank_arrays` over all of them at once), sorted by the
workload's objective (output tokens/s/GPU; input tokens/s/GPU for a prefill pool), memory-infeasible
plans and plans missing the SLOs (steady-state TTFT / TPOT p90 estimates) excluded.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np


@dataclass
class Ranked:
    plans: list  # dicts, best first
    scored: int
    excluded: Counter  # reason -> count


def score(effs: list, model, cluster, workload, **kw) -> dict:
    """`rank_arrays` of the EffectivePlans `effs` (arrays, one entry per plan) plus `objective`
    and `excluded` ("" when the plan is kept; else the memory reason or the SLO it misses)."""
    return score_plans(effs, model, cluster, workload, **kw)


def score_plans(plans: list, model, cluster, workload, *, precision="bf16", tables=None, calibration=None,
                imbalance=1.0, routing_skew=0.0) -> dict:
    """`score` of `ServePlan`s (resolved once by the cost model) or `EffectivePlan`s."""
    from cost_model.serving import rank_arrays
    r = rank_arrays(model, cluster, list(plans), workload, precision=precision,
                    tables=tables, calibration=calibration, imbalance=imbalance, routing_skew=routing_skew)
    obj = np.asarray(r[workload.objective], float)
    why = np.where(r["fits"], "", r["reason"]).astype(object)
    if workload.ttft_p90_s > 0:
        miss = np.nan_to_num(r["ttft_s"], nan=0.0) > workload.ttft_p90_s
        why = np.where((why == "") & miss, f"ttft_p90_above_{workload.ttft_p90_s:g}s", why)
    if workload.tpot_p90_s > 0:
        miss = np.nan_to_num(r["tpot_s"], nan=0.0) > workload.tpot_p90_s
        why = np.where((why == "") & miss, f"tpot_p90_above_{workload.tpot_p90_s:g}s", why)
    r["objective"] = obj
    r["excluded"] = why
    return r


def rank(effs: list, model, cluster, workload, *, top: int = 20, **kw) -> Ranked:
    """The `top` EffectivePlans by the workload's objective (distinct effective plans only)."""
    # distinct effective plans: many plan-space points resolve to the same plan SGLang runs
    uniq = list({e.plan.canonical(): e for e in effs}.values())
    if not uniq:
        return Ranked([], 0, Counter())
    r = score(uniq, model, cluster, workload, **kw)
    keep = np.flatnonzero(r["excluded"] == "")
    order = keep[np.argsort(-r["objective"][keep], kind="stable")][:top]

    def val(k, i):
        x = float(r[k][i])
        return None if np.isnan(x) else x
    rows = [{"plan": uniq[i].pinned().canonical(), "effective_plan": uniq[i].plan.canonical(),
             "rewrites": list(uniq[i].rewrites), "mem_frac": float(r["mem_frac"][i]),
             "objective": float(r["objective"][i]),
             "output_tokens_per_s_per_gpu": float(r["output_tokens_per_s_per_gpu"][i]),
             "input_tokens_per_s_per_gpu": float(r["input_tokens_per_s_per_gpu"][i]),
             "ttft_p90_s": val("ttft_s", i), "tpot_p90_s": val("tpot_s", i),
             "max_batch": float(r["max_batch_per_gpu"][i]), "memory_gib": float(r["memory_gib"][i])}
            for i in order]
    return Ranked(rows, len(uniq), Counter(str(x) for x in r["excluded"] if x))
