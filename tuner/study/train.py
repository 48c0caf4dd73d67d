"""The training mode of a study (tuner/study/modes.py): Megatron training plans of one `Workload`
on one stack profile, screened on Ray actors with the vectorised cost model (tuner.rank.train),
the hand-tuned baseline of tuner/rank/baseline.py, trials on a training backend (Megatron-core),
the per-component calibration, and the interleaved re-measurement of the winner and the baseline
(tuner/study/verdict.py)."""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from specs.errors import UsageError
from tuner.study.modes import Screening, StudyMode

logger = logging.getLogger(__name__)


def run_train_trial(backend: str, plan_text: str, workload, iters: int, warmup: int, timeout_s: float,
                    memory_cap_gib: float | None, layout: tuple[int, ...] | None = None) -> dict:
    """Body of a training trial's Ray task: run the plan on the backend, return its result as a dict
    with `nodes`, the Ray node of every rank (this task's node unless the trial spans nodes)."""
    import ray

    from specs.plan import Plan
    from trials import get_backend
    from trials.base import Resources
    res = get_backend(backend).run(Plan.parse(plan_text), workload,
                                   Resources(devices=workload.world, timeout_s=timeout_s,
                                             memory_cap_gib=memory_cap_gib, layout=layout),
                                   iters=iters, warmup=warmup).to_dict()
    if not res.get("nodes") and not layout:
        res["nodes"] = [ray.get_runtime_context().get_node_id()] * workload.world
    return res


class TrainMode(StudyMode):
    """Training plans of `workload` on the stack `profile` at `precision`; `tables` / `calibration`
    the cost model's inputs (None: its lookup rules)."""

    name = "train"
    run_trial = staticmethod(run_train_trial)
    multi_node = True  # a trial wider than one Ray node runs through a placement group

    def __init__(self, workload, profile=None, precision: str = "bf16", *, tables=None, calibration=None):
        self.workload, self.profile, self.precision = workload, profile, precision
        self.tables, self.calibration = tables, calibration

    def screen(self, options) -> Screening:
        from tuner.rank.train import screen
        t0 = time.monotonic()
        total, pool = screen(self.workload, self.profile, self.precision, level=options.level,
                             calibration=self.calibration, num_actors=options.screen_actors,
                             progress=options.progress, tables=self.tables)
        if not pool:
            raise UsageError("no realizable plan fits in memory by the cost model")
        logger.info("screened %d realizable plans; %d kept (%d parallel layouts)", total, len(pool),
                    len({s.layout for s in pool}))
        return Screening(total, pool, {"level": options.level, "realizable_plans": total, "screened_kept": len(pool)},
                         time.monotonic() - t0)

    def baseline(self, options) -> tuple[dict, str]:
        from tuner.rank.baseline import given_baseline, hand_tuned_baseline
        args = (self.workload, self.profile, self.precision, self.calibration)
        if options.baseline:
            plan, pred = given_baseline(options.baseline, *args, tables=self.tables, complete=options.complete)
            src = f"--baseline (--complete {options.complete})"
        else:
            plan, pred = hand_tuned_baseline(*args, tables=self.tables)
            src = "hand-tuning heuristic (tuner/rank/baseline.py)"
        return {"plan": plan.canonical(), "predicted_step_time_s": pred.step_time_s,
                "predicted_raw_step_time_s": pred.extra["raw_step_time_s"],
                "predicted_tokens_per_s_per_gpu": pred.tokens_per_s_per_gpu,
                "predicted_peak_memory_gib": pred.peak_memory_gib}, src

    def entry(self, row) -> dict:
        return {"plan": row.plan, "predicted_step_time_s": row.step_time_s,
                "predicted_raw_step_time_s": row.raw_step_time_s,
                "predicted_tokens_per_s_per_gpu": row.tokens_per_s_per_gpu,
                "predicted_peak_memory_gib": row.peak_memory_gib}

    def layout(self, row) -> tuple:
        return row.layout

    def adjudication(self, options) -> dict:
        from tuner.study.verdict import protocol
        return protocol(rounds=options.adjudicate_rounds)

    def predict(self, plan: str) -> tuple[float, dict]:
        import cost_model
        from specs.plan import Plan
        pred = cost_model.predict(self.workload, Plan.parse(plan), tables=self.tables, calibration=self.calibration)
        peak = float(pred.peak_memory_gib)
        return pred.extra["raw_step_time_s"], {"predicted_peak_memory_gib": peak if math.isfinite(peak) else -1.0}

    def class_parts(self, plans: list[str]) -> list[dict]:
        """Each plan's raw step time per calibration class (what the per-component fit weighs)."""
        import cost_model
        from specs.plan import Plan
        return cost_model.raw_class_parts(self.workload, [Plan.parse(p) for p in plans], tables=self.tables)

    def tokens_per_s_per_gpu(self, step_s: float) -> float:
        return self.workload.tokens_per_step / (step_s * self.workload.world)

    def sampler(self, pool):
        from tuner.study.sampler import GuidedSampler
        return GuidedSampler(pool, parts=self.class_parts, calibration=self.calibration)

    def write_report(self, study_dir: Path, *, prereg: dict, rows: list[dict], backend: str, calibration,
                     cal_report, wall_s: float, storage_url: str, remeasured: list[dict],
                     pool: list | None) -> Path:
        from tuner.study.report import write_report
        return write_report(study_dir, workload=self.workload, profile=self.profile, prereg=prereg, rows=rows,
                            backend=backend, tables=self.tables, calibration=calibration, cal_report=cal_report,
                            predict_only_pool=pool, wall_s=wall_s, storage_url=storage_url, remeasured=remeasured)
