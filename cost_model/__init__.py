"""Training cost model: `predict(workload, plan) -> Prediction`, `predict_many`, and the vectorised
core `predict_arrays(workload, PlanArrays) -> dict of arrays`. See `cost_model.model` for what is
modelled, `cost_model.tables` for the table format and `cost_model.calibration` for the single
labelled correction term."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from cost_model.calibration import Calibration, calibration_for
from cost_model.constants import HBM_RESERVE_FRACTION
from cost_model.model import evaluate
from cost_model.plans import PlanArrays
from cost_model.tables import Tables, load_tables, tables_dir_for


@dataclass
class Prediction:
    """What the cost model says about one plan. `breakdown_s` components sum to `step_time_s`;
    `reasons` say why it does not fit (and any pipeline layout it was costed with instead)."""
    feasible: bool
    reasons: list
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    peak_memory_gib: float
    memory_by_stage_gib: list
    breakdown_s: dict
    tables_digest: str
    calibration_id: str
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_tables(workload, tables=None):
    """Explicit tables (Tables or a directory) or, by the lookup rule of
    `cost_model.tables.tables_dir_for`, measured tables ($MOETUNE_HOME/tables/<kind>/) before the
    shipped defaults (clusters/tables/<kind>/)."""
    if isinstance(tables, Tables):
        return tables
    return load_tables(tables or tables_dir_for(workload.cluster.kind))


def resolve_calibration(workload, calibration=None, tables=None):
    """Explicit calibration (Calibration or a JSON path) or, by the lookup rule of
    `cost_model.calibration.calibration_for`, the fitted $MOETUNE_HOME/calibration/<kind>.json when
    it was fitted on the tables in use (same digest), else the shipped default."""
    if calibration is None:
        return calibration_for(workload.cluster, resolve_tables(workload, tables))
    if isinstance(calibration, Calibration):
        return calibration
    return Calibration.load(calibration)


def predict_arrays(workload, plans, *, tables=None, calibration=None, hbm_reserve=HBM_RESERVE_FRACTION, imbalance=1.0,
                   detail=False, offload_modules=()) -> dict:
    """Vectorised core: the model over many plans at once.

    Args:
        workload: The `specs.workload.Workload`: model, cluster (with its GPU count), global batch
            and sequence length.
        plans: A `PlanArrays` (columns; what screening uses) or an iterable of `Plan`s.
        tables: Hardware tables: a `cost_model.tables.Tables`, a directory holding them, or None
            for the lookup rule of `resolve_tables` (measured tables before the shipped ones).
        calibration: The calibration term: a `cost_model.calibration.Calibration`, a JSON path,
            or None for the lookup rule of `resolve_calibration`.
        hbm_reserve: Share of each GPU's HBM kept free (allocator fragmentation, CUDA context);
            a plan fits when its peak stage memory is within the rest.
        imbalance: Routed tokens of the busiest expert over the mean (1.0 = uniform routing);
            scales expert GEMM rows, permutation and dispatch bytes.
        detail: Also return breakdown_s (seconds per component; they sum to step_time_s),
            memory_by_stage_gib, stage_mask, slowest_stage, m_expert, moe_block_fwd_s/bwd_s, notes.
        offload_modules: megatron-core's fine-grained activation offloading of these modules'
            inputs (`cost_model.memory.OFFLOAD_MODULES`): less activation memory, PCIe copies
            priced as `activation_offload` where they outlast the layer's compute.

    Returns:
        dict of [P] arrays: step_time_s, tokens_per_s_per_gpu, microbatches, dp, raw_step_time_s
        (before calibration), model_tflops_per_gpu, mfu, peak_memory_gib, fits; the float
        usable_gib; tables_digest and calibration_id strings; and the `detail` entries.
    """
    pa = plans if isinstance(plans, PlanArrays) else PlanArrays.from_plans(list(plans))
    t = resolve_tables(workload, tables)
    cal = resolve_calibration(workload, calibration, t)
    per_class = bool(cal.factors)  # the factors weigh the breakdown's classes: it is needed
    out = evaluate(workload, pa, t, imbalance=imbalance, hbm_reserve=hbm_reserve,
                   calibration_scale=cal.scale, detail=detail or per_class,
                   offload_modules=offload_modules)
    if per_class:
        _apply_per_class(out, cal)
    out["tables_digest"] = t.digest
    out["calibration_id"] = cal.id
    return out


def _apply_per_class(out: dict, cal: Calibration) -> None:
    """Rescale `evaluate`'s outputs (run at the one-scale `cal.scale`) to the per-component
    calibration: step = sum over classes of factor x raw class time; what scales as 1/step
    (throughput, model TFLOPS, MFU) follows, and the breakdown's `calibration` term is step - raw."""
    from cost_model.calibration import class_parts
    step = cal.apply(class_parts(out["breakdown_s"]))
    ratio = step / out["step_time_s"]
    out["step_time_s"] = step
    for k in ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu"):
        out[k] = out[k] / ratio
    out["breakdown_s"]["calibration"] = step - out["raw_step_time_s"]


def raw_class_parts(workload, plans, *, tables=None, **options) -> list[dict]:
    """Per plan, the uncalibrated step time split into the calibration classes
    (`cost_model.calibration.TRAIN_CLASSES`): what a per-component fit weighs. `options` as for
    `predict_arrays`."""
    from cost_model.calibration import IDENTITY, class_parts
    out = predict_arrays(workload, plans, tables=tables, calibration=IDENTITY, detail=True, **options)
    parts = class_parts(out["breakdown_s"])
    return [{c: float(v[i]) for c, v in parts.items()} for i in range(len(out["step_time_s"]))]


def predict_many(workload, plans, *, tables=None, calibration=None, hbm_reserve=HBM_RESERVE_FRACTION,
                 imbalance=1.0, offload_modules=()) -> list[Prediction]:
    """One `Prediction` per plan (feasibility with reasons, step time, throughput, MFU, memory per
    stage, breakdown), computed in one vectorised pass.

    Args:
        workload: The `specs.workload.Workload`: model, cluster (with its GPU count), global batch
            and sequence length.
        plans: An iterable of `specs.plan.Plan`s (completed plans; see `tuner.rank.complete`).
        tables: Hardware tables: a `cost_model.tables.Tables`, a directory holding them, or None
            for the lookup rule of `resolve_tables` (measured tables before the shipped ones).
        calibration: The calibration term: a `cost_model.calibration.Calibration`, a JSON path,
            or None for the lookup rule of `resolve_calibration`.
        hbm_reserve: Share of each GPU's HBM kept free (allocator fragmentation, CUDA context);
            a plan fits when its peak stage memory is within the rest.
        imbalance: Routed tokens of the busiest expert over the mean (1.0 = uniform routing);
            scales expert GEMM rows, permutation and dispatch bytes.
        offload_modules: fine-grained activation offloading (see `predict_arrays`).

    Returns:
        A list of `Prediction`s in the order of `plans`.
    """
    plans = list(plans)
    if not plans:
        return []
    r = predict_arrays(workload, plans, tables=tables, calibration=calibration, hbm_reserve=hbm_reserve,
                       imbalance=imbalance, detail=True, offload_modules=offload_modules)
    preds = []
    for i, p in enumerate(plans):
        mask = r["stage_mask"][i] > 0
        stages = [round(float(x), 3) for x in r["memory_by_stage_gib"][i][mask]]
        reasons = []
        if not r["fits"][i]:
            s = int(np.argmax(r["memory_by_stage_gib"][i]))
            reasons.append(f"memory: stage {s} needs {stages[s]:.1f} GiB > {r['usable_gib']:.1f} GiB usable "
                           f"({workload.cluster.hbm_gib:g} GiB HBM, {hbm_reserve:.0%} reserve)")
        if r["notes"] and r["notes"][i]:
            reasons.append(r["notes"][i])
        preds.append(Prediction(
            feasible=bool(r["fits"][i]), reasons=reasons,
            step_time_s=float(r["step_time_s"][i]), tokens_per_s_per_gpu=float(r["tokens_per_s_per_gpu"][i]),
            model_tflops_per_gpu=float(r["model_tflops_per_gpu"][i]), mfu=float(r["mfu"][i]),
            peak_memory_gib=float(r["peak_memory_gib"][i]), memory_by_stage_gib=stages,
            breakdown_s={k: float(v[i]) for k, v in r["breakdown_s"].items()},
            tables_digest=r["tables_digest"], calibration_id=r["calibration_id"],
            extra={"microbatches": int(r["microbatches"][i]), "dp": int(r["dp"][i]),
                   "raw_step_time_s": float(r["raw_step_time_s"][i]),
                   "slowest_stage": int(r["slowest_stage"][i]), "m_expert": float(r["m_expert"][i]),
                   "moe_dispatch_experts_fwd_s": float(r["moe_dispatch_experts_fwd_s"][i]),
                   "moe_layers_slowest_stage": int(r["moe_layers_slowest_stage"][i]),
                   "plan": p.canonical()}))
    return preds


def predict(workload, plan, *, tables=None, calibration=None, hbm_reserve=HBM_RESERVE_FRACTION, imbalance=1.0,
            offload_modules=()) -> Prediction:
    """The `Prediction` of one plan; see `predict_many`.

    Args:
        workload: The `specs.workload.Workload`: model, cluster (with its GPU count), global batch
            and sequence length.
        plan: A `specs.plan.Plan`.
        tables: Hardware tables: a `cost_model.tables.Tables`, a directory holding them, or None
            for the lookup rule of `resolve_tables` (measured tables before the shipped ones).
        calibration: The calibration term: a `cost_model.calibration.Calibration`, a JSON path,
            or None for the lookup rule of `resolve_calibration`.
        hbm_reserve: Share of each GPU's HBM kept free (allocator fragmentation, CUDA context);
            a plan fits when its peak stage memory is within the rest.
        imbalance: Routed tokens of the busiest expert over the mean (1.0 = uniform routing);
            scales expert GEMM rows, permutation and dispatch bytes.
        offload_modules: fine-grained activation offloading (see `predict_arrays`).
    """
    return predict_many(workload, [plan], tables=tables, calibration=calibration,
                        hbm_reserve=hbm_reserve, imbalance=imbalance, offload_modules=offload_modules)[0]


__all__ = ["Prediction", "PlanArrays", "predict", "predict_many", "predict_arrays"]
