"""The cost model's invariants as one set of rules, for the property tests (tests/test_properties.py)
and the wider scan (bench/invariant_scan.py): what "more work" means (KNOBS), the plan variants that
may never need more memory, and the tolerance of a comparison."""
from __future__ import annotations

import dataclasses

import cost_model
from clusters import load_cluster
from specs.stack import GPU_FULL, cpu_profile
from specs.workload import Workload
from tuner.rank.train import _RECOMPUTE_RESET
from tuner.space.megatron_rules import check

REL = 1e-9  # batched table lookups can differ in the last bits


def profile(kind):
    return cpu_profile() if kind == "cpu-local" else GPU_FULL


def realizable(w, plan) -> bool:
    return not check(w, plan, profile(w.cluster.kind))


def step(w, plan, **kw) -> float:
    return float(cost_model.predict_arrays(w, [plan], **kw)["step_time_s"][0])


def mem(w, plan) -> float:
    return float(cost_model.predict_arrays(w, [plan])["peak_memory_gib"][0])


def with_model(w, **kw):
    return Workload(dataclasses.replace(w.model, **kw), w.cluster, w.gbs, w.seq)


def more_layers(w, plan):
    """pp*vpp more MoE layers at the end (every stage gets one more per virtual stage)."""
    k = plan.pp * plan.vpp
    m = w.model
    return Workload(dataclasses.replace(m, num_layers=m.num_layers + k, moe_layers=tuple(m.moe_layers) + (True,) * k),
                    w.cluster, w.gbs, w.seq)


# more work: knob -> (workload, plan) -> (the workload with more work, the plan, predict() options).
# "layers" applies only where the plan names no explicit layout (one names every layer: more layers
# is another plan) and the plan stays realizable (`layers_apply`).
KNOBS = {
    "seq": lambda w, p: (Workload(w.model, w.cluster, w.gbs, 2 * w.seq), p, {}),
    "gbs": lambda w, p: (Workload(w.model, w.cluster, 2 * w.gbs, w.seq), p, {}),
    "imbalance": lambda w, p: (w, p, {"imbalance": 2.0}),
    "topk": lambda w, p: (with_model(w, moe_router_topk=min(w.model.num_experts, w.model.moe_router_topk + 1)), p, {}),
    "layers": lambda w, p: (more_layers(w, p), p, {}),
    "mtp": lambda w, p: (with_model(w, mtp_num_layers=w.model.mtp_num_layers + 1), p, {}),
}


def layers_apply(w, p) -> bool:
    return not p.pp_layout and realizable(more_layers(w, p), p)


def twice_the_gpus(w):
    return Workload(w.model, load_cluster(w.cluster.kind, 2 * w.world), w.gbs, w.seq)


def memory_breaks(w, p, m=None) -> list[str]:
    """The memory invariants plan `p` (peak `m` GiB per GPU, priced if None) breaks on `w`: recompute,
    the distributed optimizer never need more; twice the micro-batch never needs less."""
    m = mem(w, p) if m is None else m
    out = []
    if p.recompute != "none" and m > mem(w, p.replace(**_RECOMPUTE_RESET)) * (1 + REL):
        out.append("recompute")
    if p.dist_opt and m > mem(w, p.replace(dist_opt=False, overlap_param_gather=False)) * (1 + REL):
        out.append("distributed optimizer")
    big = p.replace(mbs=2 * p.mbs)
    if realizable(w, big) and mem(w, big) < m * (1 - REL):
        out.append("2x mbs")
    return out
