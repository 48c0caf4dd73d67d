"""Serving-plan completion (`--complete best|defaults`, as training plans have it).

A `--plan` string names some fields of a `ServePlan`; the serving knobs it leaves out
(`KNOBS`: memory fraction, decode CUDA-graph max batch, chunked prefill, max running requests,
page size, KV cache dtype) are completed:
- defaults: SGLang's own values (the fields stay 0 / "auto", and SGLang's resolver fills them:
  specs/serve_resolve.py).
- best: the realizable choice (tuner/serve_realize) with the best objective of the workload
  (output tokens/s/GPU; input tokens/s/GPU for a prefill pool) under its SLOs, over the grid
  `CHOICES`, priced in one vectorised pass of the serving cost model (tuner/rank/serve_price.score_plans).
  Ties keep the earlier value of each list, SGLang's default first, so a knob that does not change
  the price stays at SGLang's value. When no choice is feasible the defaults are kept and the
  completion says why.
The layout (tp, pp, dp, attn_dp, ep, moe_dense_tp, a2a, deepep mode, TBO, EPLB, pd) is the user's: a ranking of
layouts is `plans --mode serve --rank`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from specs.serve_plan import ServePlan, parse_serve_fields

KNOBS = ("mem_frac", "cuda_graph_max_bs", "chunked_prefill", "max_running", "page_size", "kv_cache_dtype")

# the values `best` tries, SGLang's default (0 / 1 / auto) first. Memory fractions are the settings
# published deployments use (0.7-0.88); graph batches and chunks the powers of two SGLang's own tiers
# use; page size only its default (it changes no price here: a backend that forces one, trtllm_mla,
# is the resolver's business).
CHOICES: dict[str, tuple] = {
    "mem_frac": (0.0, 0.70, 0.75, 0.80, 0.83, 0.85, 0.88),
    "cuda_graph_max_bs": (0, 16, 32, 64, 128, 256, 512),
    "chunked_prefill": (0, 2048, 4096, 8192, 16384),
    "max_running": (0, 128, 512, 2048),
    "page_size": (1,),
    "kv_cache_dtype": ("auto", "fp8_e4m3"),
}


@dataclass
class ServeCompletion:
    plan: ServePlan
    how: str  # "best" | "defaults"
    given: tuple[str, ...]  # the knobs the user set
    completed: dict = field(default_factory=dict)  # knob -> value chosen (best) or left to SGLang (defaults)
    candidates: int = 0
    note: str = ""

    def to_dict(self) -> dict:
        return {"how": self.how, "given": list(self.given), "completed": dict(self.completed),
                "candidates": self.candidates, "note": self.note, "plan": self.plan.canonical()}

    def describe(self) -> str:
        if not self.completed:
            return f"{self.how}: every knob given"
        vals = ", ".join(f"{k}={v}" for k, v in self.completed.items())
        tail = f" ({self.note})" if self.note else ""
        if self.how == "defaults":
            return f"defaults: SGLang picks {', '.join(self.completed)}{tail}"
        return f"best of {self.candidates} realizable choices: {vals}{tail}"


def complete_serve(text: str, model, cluster, workload, how: str = "best", **price) -> ServeCompletion:
    """The user's `text` completed as `how` says; `price`: keyword arguments of
    tuner.rank.serve_price.score_plans (precision, tables, calibration, imbalance, routing_skew)."""
    given_fields = parse_serve_fields(text or "")
    base = ServePlan(**given_fields)
    open_knobs = [k for k in KNOBS if k not in given_fields]
    given = tuple(k for k in KNOBS if k in given_fields)
    if how == "defaults" or not open_knobs:
        return ServeCompletion(base, "defaults" if how == "defaults" else how, given,
                               {k: getattr(base, k) for k in open_knobs})
    from tuner.rank.serve_price import score_plans
    from tuner.space.sglang_rules import realize
    choices = dict(CHOICES)
    # the running requests the workload keeps in flight on one instance (decode: a batch per GPU)
    inst = base.instance_gpus
    running = workload.concurrency * inst if workload.phase == "decode" else workload.concurrency
    choices["max_running"] = tuple(dict.fromkeys((*CHOICES["max_running"], int(running))))
    effs, plans = [], []
    for values in itertools.product(*(choices[k] for k in open_knobs)):
        p = base.replace(**dict(zip(open_knobs, values)))
        v = realize(p, model, cluster)
        if v.ok:
            effs.append(v.effective)
            plans.append(p)
    if not effs:
        return ServeCompletion(base, "defaults", given, {k: getattr(base, k) for k in open_knobs},
                               note="no realizable choice: SGLang's defaults kept")
    r = score_plans(effs, model, cluster, workload, **price)
    obj = np.where(r["excluded"] == "", r["objective"], -np.inf)
    i = int(np.argmax(obj))  # the first of equals: defaults first in every CHOICES list
    if not np.isfinite(obj[i]):
        why = sorted({str(x) for x in r["excluded"] if x})
        return ServeCompletion(base, "defaults", given, {k: getattr(base, k) for k in open_knobs},
                               candidates=len(effs),
                               note=f"no feasible choice under the SLOs ({', '.join(why[:3])}): SGLang's defaults kept")
    # the chosen knobs written out as SGLang resolves them (a default it picks becomes its value, so
    # the emitted command carries every completed flag)
    e = effs[i]
    pinned = e.pinned()
    resolved = {"chunked_prefill": pinned.chunked_prefill, "cuda_graph_max_bs": pinned.cuda_graph_max_bs,
                "page_size": pinned.page_size, "mem_frac": e.mem_frac_for(_role(workload)) if 0 < e.mem_frac_for(_role(workload)) < 1 else 0.0}
    best = plans[i].replace(**{k: resolved.get(k, getattr(plans[i], k)) for k in open_knobs})
    return ServeCompletion(best, "best", given, {k: getattr(best, k) for k in open_knobs}, candidates=len(effs))


def _role(workload) -> str:
    return {"prefill": "prefill", "decode": "decode"}.get(workload.phase, "agg")
