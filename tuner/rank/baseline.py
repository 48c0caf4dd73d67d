"""The hand-tuned baseline a searched plan must beat (moefs acceptance bar: searched best >= 0.98 x
baseline's measured throughput).

Heuristic (what an engineer sets by hand, MOSAIC App. D.1 rules of thumb):
- TP = 1, CP = 1, no virtual pipeline;
- EP as large as possible inside the scale-up domain (EP divides the expert count, EP <= scale-up
  size, EP <= world); if no such EP is realizable, the next smaller one;
- PP: 1, or a divisor of the world keeping microbatches / PP >= 4 (bubble below ~20%);
- MBS in {1, 2, 4}; recompute none, then selective, then full (uniform, 1 layer) only when memory
  needs it; everything else at the defaults of `tuner.rank.complete.complete_plan`.
Among the heuristic's realizable, memory-feasible plans, the baseline is the best predicted one.
`--baseline "<plan>"` replaces it.
"""
from __future__ import annotations

from specs.errors import InputError, UsageError

RECOMPUTES = ("", "recompute=selective", "recompute=full,recompute_method=uniform,recompute_layers=1")


def heuristic_plans(workload, profile, precision: str = "bf16") -> list:
    from tuner.rank.complete import complete_plan
    from tuner.space.megatron_rules import check
    m, c, world = workload.model, workload.cluster, workload.world
    eps = sorted((e for e in range(1, world + 1) if m.num_experts % e == 0 and e <= c.scaleup_size),
                 reverse=True) if m.is_moe else [1]
    pps = [p for p in range(1, min(world, m.num_layers) + 1) if world % p == 0]
    for ep in eps:
        out = []
        for pp in pps:
            dp = world // pp
            for mbs in (1, 2, 4):
                if workload.gbs % (mbs * dp):
                    continue
                micro = workload.gbs // (mbs * dp)
                if pp > 1 and micro / pp < 4:
                    continue
                for rec in RECOMPUTES:
                    text = ",".join(x for x in (f"tp=1,cp=1,vpp=1,ep={ep},pp={pp},mbs={mbs}", rec) if x)
                    try:
                        plan = complete_plan(text, workload, profile, precision)
                    except InputError:  # a layout that cannot be split (LayoutError) is simply skipped
                        continue
                    if not check(workload, plan, profile):
                        out.append(plan)
        if out:
            return out
    return []


def hand_tuned_baseline(workload, profile, precision: str = "bf16", calibration=None, *, tables=None):
    """(plan, prediction) of the heuristic's best predicted feasible plan, or raises UsageError.

    Args:
        workload, profile, precision: what to plan for, on which stack, at which precision.
        calibration, tables: the cost model's inputs (None: its lookup rules).
    """
    import cost_model
    plans = heuristic_plans(workload, profile, precision)
    if not plans:
        raise UsageError("the hand-tuning heuristic found no realizable plan; give one with --baseline")
    preds = cost_model.predict_many(workload, plans, tables=tables, calibration=calibration)
    ok = [(p, pr) for p, pr in zip(plans, preds) if pr.feasible]
    if not ok:
        raise UsageError("no hand-tuned plan fits in memory by the cost model; give one with --baseline")
    return max(ok, key=lambda t: (t[1].tokens_per_s_per_gpu, -t[0].pp))


def given_baseline(text: str, workload, profile, precision: str = "bf16", calibration=None, *, tables=None,
                   complete: str = "defaults"):
    """(plan, prediction) of the user's `--baseline` plan completed for `profile` as `complete`
    says (`tuner.rank.complete.complete`: best or defaults); UsageError if it is not realizable.
    Arguments as for `hand_tuned_baseline`, plus the plan text."""
    import cost_model
    from tuner.rank.complete import complete as complete_as
    from tuner.space.megatron_rules import check
    plan = complete_as(text, workload, profile, precision, complete, tables=tables, calibration=calibration).plan
    reasons = check(workload, plan, profile)
    if reasons:
        raise UsageError(f"--baseline is not realizable: {'; '.join(str(r) for r in reasons)}")
    return plan, cost_model.predict(workload, plan, tables=tables, calibration=calibration)
