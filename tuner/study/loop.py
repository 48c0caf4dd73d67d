"""The run behind `moetune tune`: screening -> pre-registration -> trials -> report.

`tune(options, workload, profile, tables=..., calibration=...)` runs one tuner process of a study:
1. screening (`tuner.rank.train`): Ray actors score the realizable space with the vectorised cost model;
2. pre-registration (`tuner.study.prereg`): the candidates and the baseline with their predictions,
   written once, exclusively and self-hashed, before the first trial; a rerun verifies it instead;
3. trials (`TrialLoop`): the baseline, the pre-registered plans, then the guided sampler's
   proposals, each a Ray task holding the plan's devices (num_cpus = world on cpu-local, num_gpus =
   world on GPUs) running a trial backend, or, when the world is wider than any Ray node, a task
   driving one placement group with a launcher actor per node (trials/placement.py); results go to the Optuna study (`tuner.study.storage`), and after
   every measured trial the calibration is refitted and the rest re-ranked;
4. the report (`tuner.study.report`) and the pre-registered verdict.
Ray is started or joined with token authentication (trials/ray_runtime.py); the study's figures go
to Ray's metrics (tuner/study/metrics.py).

Several tuner processes (on several hosts, with a shared RDB or journal storage) may run one study: plans are
claimed through the study (lowest trial number wins) and a tuner that dies is noticed by its
trials' heartbeats going stale (see tuner/study/storage.py). Progress goes to this module's logger.
"""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from specs.errors import UsageError
from tuner.study import prereg as prereg_mod
from tuner.study import storage as study_mod

logger = logging.getLogger(__name__)

REMEASURED = "adjudication_measurements"  # study user attribute: the protocol's re-measurements
MAX_CLAIMS_PER_ROUND = 50  # claims lost in a row before waiting for a running trial instead
WAIT_S = 10.0  # longest wait for a trial result before re-checking timeouts and stale trials


@dataclass(frozen=True)
class TuneOptions:
    """How to run a study (the `moetune tune` flags).

    Attributes:
        study: study name. study_dir: its folder (pre-registration, report, default storage).
        storage: Optuna storage URL or `journal:<path>`; None: SQLite in the study folder.
        trials: searched trials to run (the baseline comes on top).
        baseline: baseline plan text; None: the hand-tuning heuristic (tuner/rank/baseline.py).
        backend: a trial backend name (`trials.get_backend`) or "predict-only" (no trials).
        precision: bf16 or an fp8 recipe name (see tuner.rank.complete).
        ray_address: an existing Ray cluster to join; None: start an embedded one.
        dashboard: start the Ray dashboard and log its address.
        ray_no_auth: start / join Ray without token authentication (explicit opt-out, logged as a
            warning; trials/ray_runtime.py).
        trial_timeout_s: seconds after which the backend kills a trial.
        memory_cap_gib: per-rank memory cap (OOM beyond it); None: the device's.
        iters, warmup: timed and warm-up iterations per trial.
        level: plan-space level to screen, "core" or "full".
        screen_actors: Ray actors scoring the space.
        preregister: plans to pre-register; None: min(trials, max(4, trials // 2 + 1)).
        progress: show progress bars.
        heartbeat_interval_s: seconds between heartbeats of running trials; a trial silent for
            3 x that is failed and retried once (tuner/study/storage.py).
        adjudicate_rounds: rounds of the final A B A B ... re-measurement of the baseline and the
            winner, fixed in the pre-registration's adjudication protocol (tuner/study/verdict.py).
    """
    study: str
    study_dir: Path
    storage: str | None = None
    trials: int = 8
    baseline: str | None = None
    complete: str = "best"  # how a partial `baseline` is completed (tuner.rank.complete.complete)
    backend: str = "megatron"
    precision: str = "bf16"
    ray_address: str | None = None
    dashboard: bool = False
    ray_no_auth: bool = False
    trial_timeout_s: float = 300.0
    memory_cap_gib: float | None = None
    iters: int = 3
    warmup: int = 1
    level: str = "core"
    screen_actors: int = 4
    preregister: int | None = None
    progress: bool = True
    heartbeat_interval_s: int = study_mod.DEFAULT_HEARTBEAT_S
    adjudicate_rounds: int = 3  # rounds of the final interleaved re-measurement (tuner/study/verdict.py)

    def __post_init__(self) -> None:
        checks = (
            (self.trials >= 1, f"--trials must be >= 1, got {self.trials}"),
            (self.iters >= 1, f"--iters must be >= 1, got {self.iters}"),
            (self.warmup >= 0, f"--warmup must be >= 0, got {self.warmup}"),
            (self.trial_timeout_s > 0, f"--trial-timeout must be positive, got {self.trial_timeout_s:g}"),
            (self.memory_cap_gib is None or self.memory_cap_gib > 0,
             f"--memory-cap-gib must be positive, got {self.memory_cap_gib}"),
            (self.screen_actors >= 1, f"--screen-actors must be >= 1, got {self.screen_actors}"),
            (self.preregister is None or self.preregister >= 1,
             f"--preregister must be >= 1, got {self.preregister}"),
            (self.heartbeat_interval_s >= 1, f"--heartbeat-interval must be >= 1 s, got {self.heartbeat_interval_s}"),
            (self.adjudicate_rounds >= 2, f"--adjudicate-rounds must be >= 2, got {self.adjudicate_rounds}"),
        )
        for ok, message in checks:
            if not ok:
                raise UsageError(message)

    @property
    def n_preregister(self) -> int:
        return self.preregister or min(self.trials, max(4, self.trials // 2 + 1))


@dataclass(frozen=True)
class TuneResult:
    """What a run leaves: the report's path and the adjudication line (None for predict-only)."""
    report: Path
    verdict_line: str | None


# Ray --------------------------------------------------------------------------------------------

def start_ray(workload, ray_address: str | None = None, dashboard: bool = False, no_auth: bool = False) -> bool:
    """Join `ray_address` or start an embedded Ray with enough CPUs for one trial, token
    authentication on unless `no_auth`, workers at this process's priority (trials/ray_runtime.py);
    returns whether this call started Ray (and so must shut it down). A Ray already initialised is
    left as it is."""
    import ray

    from trials.ray_runtime import init_ray
    if ray.is_initialized():
        return False
    ncpu = os.cpu_count() or 1
    if not workload.cluster.is_gpu:
        ncpu = max(ncpu, workload.world)  # a trial holds `world` cores
    ctx = init_ray(ray_address, num_cpus=ncpu, dashboard=dashboard, no_auth=no_auth)
    if dashboard or ray_address:
        url = getattr(ctx, "dashboard_url", None)
        logger.info("Ray dashboard: %s", f"http://{url}" if url else "not available")
    return True


def trial_layout(workload) -> tuple[int, ...] | None:
    """Ranks per Ray node when a trial's world does not fit on one node (trials/placement.py)."""
    from trials.placement import alive_capacity, spread_layout
    try:
        layout = spread_layout(workload.world, alive_capacity(workload.cluster.is_gpu))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return tuple(layout) if layout else None


def trial_slots(workload) -> int:
    """How many trials of `workload` the Ray cluster can hold at once (each holds `world` devices)."""
    import ray
    res = ray.cluster_resources()
    key = "GPU" if workload.cluster.is_gpu else "CPU"
    return max(1, int(res.get(key, 1) // max(1, workload.world)))


def _run_trial(backend: str, plan_text: str, workload, iters: int, warmup: int, timeout_s: float,
               memory_cap_gib: float | None, layout: tuple[int, ...] | None = None) -> dict:
    """Body of a trial's Ray task: run the plan on the backend, return its result as a dict with
    `nodes`, the Ray node of every rank (this task's node unless the trial spans nodes)."""
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


# the trial loop -----------------------------------------------------------------------------------

@dataclass
class _Running:
    trial: object  # optuna.Trial
    plan: str
    roles: str
    started: float  # time.monotonic()


class TrialLoop:
    """Runs a study's trials to its budget: claim the next plan, launch it on Ray, record results.

    Order of plans: the baseline, then the pre-registered plans in rank order, then the guided
    sampler's proposals; a queued retry of an interrupted trial is taken whenever Optuna hands one
    out. The budget counts distinct searched plans measured or really failed, across all tuners of
    the study; the baseline comes on top (unless it is itself a searched plan).

    Use: `TrialLoop(...).run()`; afterwards `calibration` / `cal_report` hold the last refit.
    """

    def __init__(self, study, storage, *, workload, prereg: dict, sampler, options: TuneOptions,
                 tables=None, calibration=None, mode=None):
        """
        Args:
            study, storage: the Optuna study and the storage it was opened on (for heartbeats).
            workload: the Workload tuned. prereg: the verified pre-registration document.
            sampler: a `tuner.study.sampler.GuidedSampler` over the screened pool.
            options: run options (budget, backend, per-trial limits, progress).
            tables, calibration: the cost model's inputs for plans outside the screened pool.
            mode: what the plans are (`TrainMode`, the default, or tuner.study.serve.ServeMode):
                the Ray task body of a trial and the cost model's raw prediction of a plan. The
                workload needs `world` (devices a trial holds) and `cluster`.
        """
        self.study, self.storage = study, storage
        self.workload, self.prereg, self.sampler, self.options = workload, prereg, sampler, options
        self.tables = tables
        self.mode = mode or TrainMode(workload, tables, calibration)
        self.calibration, self.cal_report = calibration, None
        self.base_plan = prereg["baseline"]["plan"]
        self.pre_plans = [p["plan"] for p in prereg["plans"]]
        self.hard_timeout_s = options.trial_timeout_s * 1.5 + 120  # the backend's own timeout failed
        self.in_flight: dict = {}  # Ray object ref -> _Running
        self.heartbeat = None
        self._remote = None
        self._layout = None
        self._slots = 1
        self.metrics = None
        self.screen_rate: tuple[int, float] | None = None  # (plans, seconds) of this run's screening
        self._bar = None

    # stages -----------------------------------------------------------------------------------
    def run(self) -> None:
        """setup, then launch / observe until the budget is met; on any exception (Ctrl-C
        included) the running trials are marked interrupted and their tasks cancelled."""
        try:
            self.setup()
            while True:
                self.launch_ready()
                if not self.in_flight:
                    break
                self.observe_ready()
        except BaseException:
            self.abandon()
            raise
        finally:
            self.finish()

    def setup(self) -> None:
        """Ray task options, the heartbeat, and what the study already knows (resumption)."""
        import ray
        from tqdm import tqdm

        from tuner.study.metrics import study_metrics
        wl = self.workload
        self._layout = trial_layout(wl) if self.mode.multi_node else None
        if self._layout:  # the task only drives: the placement group's launchers hold the devices
            self._remote = ray.remote(self.mode.run_trial).options(num_gpus=0, num_cpus=0, max_retries=0)
            logger.info("trials span %d Ray nodes (%s ranks per node)", len(self._layout),
                        "+".join(map(str, self._layout)))
        else:
            self._remote = ray.remote(self.mode.run_trial).options(
                num_gpus=wl.world if wl.cluster.is_gpu else 0,
                num_cpus=0 if wl.cluster.is_gpu else wl.world, max_retries=0)
        self.metrics = study_metrics(self.options.study)
        if self.metrics is not None and self.screen_rate:
            self.metrics.screened(*self.screen_rate)
        self._slots = trial_slots(wl)
        raw_of = {p["plan"]: p["predicted_raw_step_time_s"] for p in self.prereg["plans"]}
        raw_of[self.base_plan] = self.prereg["baseline"]["predicted_raw_step_time_s"]
        for p, raw in raw_of.items():
            self.sampler.add(p, raw)
        self.heartbeat = study_mod.Heartbeat(self.study, self.storage)
        self.fail_stale()
        for r in study_mod.trial_rows(self.study):
            raw = r.get("predicted_raw_step_time_s")
            if r["state"] == "COMPLETE":
                self.sampler.observe(r["plan"], r["measured_step_time_s"], raw, r.get("measured_parts_s"))
            elif r["state"] == "FAIL" and study_mod.is_real_failure(r):
                self.sampler.observe(r["plan"], None, raw)
        if self.sampler.measured:
            self.calibration, self.cal_report = self.sampler.refit()
        self._bar = tqdm(total=self.options.trials + 1, desc="trials", unit="trial",
                         disable=not self.options.progress,
                         initial=min(self.options.trials + 1, self.searched_done()))

    def fail_stale(self) -> None:
        """Fail trials of dead tuners (stale heartbeats); Optuna queues their one retry."""
        stale = study_mod.fail_stale(self.study)
        if stale:
            logger.info("marked %d interrupted trial(s) FAIL (no heartbeat): %s", len(stale), stale)

    def roles_of(self, plan: str) -> str:
        """`baseline`, `searched` and/or `preregistered`, comma-separated."""
        if plan == self.base_plan:
            return "baseline,searched" if plan in self.pre_plans else "baseline"
        return "searched,preregistered" if plan in self.pre_plans else "searched"

    def searched_done(self) -> int:
        """Distinct searched plans measured or really failed, by any tuner of the study."""
        plans = set()
        for r in study_mod.trial_rows(self.study):
            if "searched" not in str(r.get("roles", "")):
                continue
            if r["state"] == "COMPLETE" or (r["state"] == "FAIL" and study_mod.is_real_failure(r)):
                plans.add(r["plan"])
        return len(plans)

    def need_more(self, status: dict, busy: set) -> bool:
        """Whether another trial should start: the baseline is not settled, or searched plans
        done plus searched plans running are below the budget."""
        base = status.get(self.base_plan, {})
        base_done = (base.get("complete") or base.get("failed")
                     or not study_mod.eligible(status, self.base_plan) or self.base_plan in busy)
        searched_busy = sum(1 for r in self.in_flight.values() if "searched" in r.roles)
        return (not base_done) or self.searched_done() + searched_busy < self.options.trials

    def next_plan(self, status: dict, busy: set) -> str | None:
        """The baseline, else the first eligible pre-registered plan, else the sampler's proposal."""
        if study_mod.eligible(status, self.base_plan) and self.base_plan not in busy:
            return self.base_plan
        for p in self.pre_plans:
            if p not in busy and study_mod.eligible(status, p):
                return p
        skip = {p for p in status if not study_mod.eligible(status, p)} | busy
        return self.sampler.propose(exclude=skip)

    def launch_ready(self) -> None:
        """Claim and launch plans while slots are free and the budget wants more."""
        self.fail_stale()
        status = study_mod.plan_status(self.study)
        claims = 0
        while len(self.in_flight) < self._slots and claims < MAX_CLAIMS_PER_ROUND:
            busy = {r.plan for r in self.in_flight.values()}
            if not self.need_more(status, busy):
                break
            plan = self.next_plan(status, busy)
            if plan is None:
                break
            claims += 1
            self.launch(plan)
            status = study_mod.plan_status(self.study)

    def launch(self, plan: str):
        """Claim `plan` (or the queued retry Optuna hands out) and start its Ray task; returns the
        owned trial, or None when another trial has the plan."""
        trial = study_mod.claim(self.study, plan, self._attrs_for, heartbeat=self.heartbeat)
        if trial is None:
            return None
        owned = trial.user_attrs["plan"]
        o = self.options
        ref = self._remote.remote(o.backend, owned, self.workload, o.iters, o.warmup, o.trial_timeout_s,
                                  o.memory_cap_gib, self._layout)
        run = _Running(trial, owned, self.roles_of(owned), time.monotonic())
        self.in_flight[ref] = run
        self._bar.set_postfix_str(f"#{trial.number} {run.roles.split(',')[0]}")
        return trial

    def observe_ready(self, timeout_s: float = WAIT_S) -> None:
        """Wait up to `timeout_s` for a result; record every finished or timed-out trial."""
        import ray
        ready, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=timeout_s)
        if self.metrics is not None:
            self.metrics.refresh()
        now = time.monotonic()
        for ref in list(self.in_flight):
            run = self.in_flight[ref]
            if ref in ready:
                try:
                    result = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a dead task is a crashed trial
                    result = {"ok": False, "kind": "crash", "message": f"ray task failed: {e}"}
            elif now - run.started > self.hard_timeout_s:
                ray.cancel(ref, force=True)
                result = {"ok": False, "kind": "timeout", "message": f"no answer after {self.hard_timeout_s:.0f} s"}
            else:
                continue
            del self.in_flight[ref]
            self.observe(run, result)

    def observe(self, run: _Running, result: dict) -> None:
        """Record a trial's result, feed it to the sampler and refit the calibration."""
        import optuna
        self.heartbeat.discard(run.trial.number)
        parts = result.get("component_times_s") if result.get("ok") else None
        try:
            if parts:  # the trial's own split of its step by calibration class (trials/base.py)
                run.trial.set_user_attr("measured_parts_s", parts)
            study_mod.record(self.study, run.trial, result)
        except optuna.exceptions.UpdateFinishedTrialError:
            # Its heartbeat went stale while it ran (the database was unreachable for longer than
            # the grace period) and a tuner failed it; the queued retry will measure it again.
            logger.warning("trial #%d was failed as stale while it ran; its result is dropped", run.trial.number)
            return
        if self.metrics is not None:
            self.metrics.trial(result, run.trial.user_attrs.get("predicted_step_time_s"))
        self.sampler.observe(run.plan, result["step_time_s"] if result.get("ok") else None,
                             self.sampler.rows.get(run.plan), parts)
        if self.sampler.measured:
            self.calibration, self.cal_report = self.sampler.refit()
        if self.sampler.cal_report is not None:
            self.study.set_user_attr("calibration", prereg_mod.calibration_dict(self.sampler.cal) | {"provenance": {}})
        what = (f"{result['tokens_per_s_per_gpu']:.1f} tok/s/GPU" if result.get("ok")
                else f"FAIL {result.get('kind')}")
        self._bar.update(1)
        cal = self.sampler.cal
        logger.info("trial #%d [%s] %s  (calibration %s)", run.trial.number, run.roles, what,
                    " ".join(f"{c} {f:.3g}" for c, f in cal.factors.items()) if cal.factors else f"scale {cal.scale:.3g}")

    def remeasure(self) -> list[dict]:
        """The end-of-study re-measurement of the pre-registered protocol (tuner/study/verdict.py): the
        top measured plans and the baseline (the winner chosen by it), then the baseline and that
        winner interleaved round by round, one at a time; each measurement is stored in the study
        (user attribute REMEASURED) as it finishes, so a resumed study goes on where it stopped.
        Returns every re-measurement; [] when the protocol has nothing to run (no protocol, no
        baseline or winner measured, or the winner is the baseline)."""
        from tuner.study import verdict as verdict_mod
        from tuner.study.report import contenders
        proto = self.prereg.get("adjudication")
        rows = study_mod.trial_rows(self.study)
        base, best = contenders(rows, self.prereg)
        if not proto or base is None or best is None:
            return []
        cands = verdict_mod.candidates(proto, rows)
        done = list(self.study.user_attrs.get(REMEASURED, []))
        try:
            verdict_mod.verify_measurements(proto, done, base["plan"], cands)
        except verdict_mod.ProtocolError as e:  # e.g. a later trial of another tuner changed the winner
            raise UsageError(f"adjudication: the study's re-measurements break its protocol: {e}") from None
        return verdict_mod.run(proto, base["plan"], cands, done, self.measure_once,
                               lambda ms: self.study.set_user_attr(REMEASURED, ms))

    def measure_once(self, plan: str) -> dict:
        """One trial run of `plan` outside the study's trials (a re-measurement): its result dict."""
        import ray
        o = self.options
        ref = self._remote.remote(o.backend, plan, self.workload, o.iters, o.warmup, o.trial_timeout_s,
                                  o.memory_cap_gib, self._layout)
        try:
            return ray.get(ref, timeout=self.hard_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            return {"ok": False, "kind": "timeout", "message": f"no answer after {self.hard_timeout_s:.0f} s"}
        except Exception as e:  # noqa: BLE001 - a dead task is a crashed measurement
            return {"ok": False, "kind": "crash", "message": f"ray task failed: {e}"}

    def abandon(self) -> None:
        """Mark running trials interrupted (their plans stay eligible once) and cancel their tasks."""
        import ray
        for run in self.in_flight.values():
            study_mod.mark_interrupted(self.study, run.trial)
        for ref in self.in_flight:
            try:
                ray.cancel(ref, force=True)
            except Exception as e:  # noqa: BLE001 - best effort on the way out
                logger.warning("could not cancel a trial task: %s", e)
        self.in_flight.clear()

    def finish(self) -> None:
        """Stop the heartbeat and close the progress bar."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self._bar is not None:
            self._bar.close()

    # helpers ----------------------------------------------------------------------------------
    def _attrs_for(self, plan: str) -> dict:
        """User attributes of a trial of `plan`, written once it is owned: roles and predictions
        at the calibration of this moment (the mode prices the plan; the sampler holds the scale)."""
        raw, extra = self.mode.predict(plan)
        raw = self.sampler.rows.get(plan, raw)
        self.sampler.add(plan, raw)
        mean, sigma = self.sampler.estimate(plan)
        pred_step = self.sampler.predicted(plan)
        lo, hi = self.sampler.interval(plan)
        cal = self.sampler.cal
        return {"roles": self.roles_of(plan), "predicted_step_time_s": pred_step,
                "predicted_raw_step_time_s": raw,
                "predicted_tokens_per_s_per_gpu": self.mode.tokens_per_s_per_gpu(pred_step),
                **extra,
                "calibration_scale": cal.scale, "calibration_factors": dict(cal.factors),
                "predicted_step_time_low_s": lo if math.isfinite(lo) else None,
                "predicted_step_time_high_s": hi if math.isfinite(hi) else None,
                "calibration_id": cal.id if self.sampler.cal_report is not None else self.prereg["hashes"]["calibration_id"],
                "sampler_mean_step_time_s": mean, "sampler_sigma": sigma}


class TrainMode:
    """What `TrialLoop` needs to know about training plans: the Ray task body that runs one, and
    the cost model's raw step time of one (`predict` -> (raw step seconds, extra trial attributes)).
    tuner/study/serve.py's `ServeMode` is the serving counterpart."""

    run_trial = staticmethod(_run_trial)
    multi_node = True  # a trial wider than one Ray node runs through a placement group

    def __init__(self, workload, tables=None, calibration=None):
        self.workload, self.tables, self.calibration = workload, tables, calibration

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


# the run --------------------------------------------------------------------------------------------

def existing_preregistration(study_dir: Path, study: str, workload) -> dict | None:
    """The verified pre-registration in `study_dir`, None if there is none; UsageError if it does
    not verify or belongs to another study or workload."""
    if not (study_dir / prereg_mod.NAME).exists():
        return None
    try:
        doc = prereg_mod.load(study_dir)
    except prereg_mod.PreregistrationError as e:
        raise UsageError(str(e)) from None
    if doc["study"] != study or doc["hashes"]["model_spec_sha256"] != workload.model.digest() \
            or doc["hashes"]["cluster_sha256"] != workload.cluster.digest():
        raise UsageError(f"{study_dir} holds a different study/workload; use another --study-dir")
    return doc


def preregister(options: TuneOptions, workload, profile, pool: list, total: int, *, tables, calibration) -> dict:
    """Choose the baseline and the candidates, and register them; returns the registered document
    (another tuner's, if it registered first)."""
    from tuner.rank.baseline import given_baseline, hand_tuned_baseline
    from tuner.rank.train import select_candidates
    from tuner.study.verdict import protocol as verdict_protocol
    if options.baseline:
        bplan, bpred = given_baseline(options.baseline, workload, profile, options.precision, calibration,
                                      tables=tables, complete=options.complete)
        bsrc = f"--baseline (--complete {options.complete})"
    else:
        bplan, bpred = hand_tuned_baseline(workload, profile, options.precision, calibration, tables=tables)
        bsrc = "hand-tuning heuristic (tuner/rank/baseline.py)"
    cands = select_candidates(pool, options.n_preregister)
    doc = prereg_mod.build(
        study=options.study, workload=workload, precision=options.precision,
        plans=[{"rank": i + 1, "plan": s.plan, "predicted_step_time_s": s.step_time_s,
                "predicted_raw_step_time_s": s.raw_step_time_s,
                "predicted_tokens_per_s_per_gpu": s.tokens_per_s_per_gpu,
                "predicted_peak_memory_gib": s.peak_memory_gib} for i, s in enumerate(cands)],
        baseline={"plan": bplan.canonical(), "predicted_step_time_s": bpred.step_time_s,
                  "predicted_raw_step_time_s": bpred.extra["raw_step_time_s"],
                  "predicted_tokens_per_s_per_gpu": bpred.tokens_per_s_per_gpu,
                  "predicted_peak_memory_gib": bpred.peak_memory_gib},
        baseline_source=bsrc, tables_digest=tables.digest, calibration=calibration,
        trials_budget=options.trials, sampler="guided-ei",
        adjudication=verdict_protocol(rounds=options.adjudicate_rounds),
        space={"level": options.level, "realizable_plans": total, "screened_kept": len(pool)})
    try:
        prereg_mod.write(options.study_dir, doc)
    except prereg_mod.PreregistrationError:  # another tuner process registered first
        return prereg_mod.load(options.study_dir)
    logger.info("pre-registered %d plans + baseline: %s (sha256 %s...)", len(cands),
                options.study_dir / prereg_mod.NAME, doc["sha256"][:16])
    return doc


def _screen(options: TuneOptions, workload, profile, *, tables, calibration):
    from tuner.rank.train import screen
    t0 = time.monotonic()
    total, pool = screen(workload, profile, options.precision, level=options.level, calibration=calibration,
                         num_actors=options.screen_actors, progress=options.progress, tables=tables)
    return total, pool, time.monotonic() - t0


def tune(options: TuneOptions, workload, profile, *, tables, calibration) -> TuneResult:
    """Run (or resume) the study of `options` for `workload` on the stack `profile`.

    Args:
        options: the run options (TuneOptions, validated when built).
        workload: the Workload (model, cluster, batch, sequence).
        profile: the StackProfile plans are completed and checked against.
        tables: the cost model's performance tables (`cost_model.resolve_tables`).
        calibration: the calibration to start from (`cost_model.resolve_calibration`); refitted on
            every measured trial.

    Returns:
        TuneResult with the report's path and the verdict line. Raises UsageError (an InputError)
        for a study folder holding another study, or when no plan fits.
    """
    from tuner.study.report import adjudicate, write_report
    from tuner.study.sampler import GuidedSampler
    t0 = time.monotonic()
    study_dir = Path(options.study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    storage_url = options.storage or study_mod.default_storage_url(study_dir)
    existing = existing_preregistration(study_dir, options.study, workload)

    import ray
    started = start_ray(workload, options.ray_address, options.dashboard, options.ray_no_auth)
    try:
        total, pool, screen_s = _screen(options, workload, profile, tables=tables, calibration=calibration)
        if not pool:
            raise UsageError("no realizable plan fits in memory by the cost model")
        logger.info("screened %d realizable plans; %d kept (%d parallel layouts)", total, len(pool),
                    len({s.layout for s in pool}))
        if existing is None:
            prereg = preregister(options, workload, profile, pool, total, tables=tables, calibration=calibration)
        else:
            prereg = existing
            logger.info("resuming: pre-registration %s verified (sha256 %s...)", study_dir / prereg_mod.NAME,
                        prereg["sha256"][:16])

        # every tuner of a shared study names the registration it runs under (one, whoever wrote it)
        logger.info("study %s: pre-registration sha256 %s", options.study, prereg["sha256"])
        storage = study_mod.open_storage(options.storage, study_dir, heartbeat_interval=options.heartbeat_interval_s)
        study = study_mod.open_study(options.study, storage)
        study.set_user_attr("preregistration_sha256", prereg["sha256"])
        report_args = dict(workload=workload, profile=profile, prereg=prereg, tables=tables,
                           storage_url=study_mod.redact_url(storage_url))
        if options.backend == "predict-only":
            path = write_report(study_dir, rows=study_mod.trial_rows(study), backend="predict-only",
                                calibration=calibration, predict_only_pool=pool,
                                wall_s=time.monotonic() - t0, **report_args)
            return TuneResult(path, None)

        mode = TrainMode(workload, tables, calibration)
        sampler = GuidedSampler(pool, parts=mode.class_parts, calibration=calibration)
        loop = TrialLoop(study, storage, workload=workload, prereg=prereg, sampler=sampler,
                         options=options, tables=tables, calibration=calibration, mode=mode)
        loop.screen_rate = (total, screen_s)
        loop.run()
        remeasured = loop.remeasure()
        rows = study_mod.trial_rows(study)
        path = write_report(study_dir, rows=rows, backend=options.backend, calibration=loop.calibration,
                            cal_report=loop.cal_report, wall_s=time.monotonic() - t0, remeasured=remeasured,
                            **report_args)
        return TuneResult(path, adjudicate(rows, prereg, remeasured)["line"])
    finally:
        if started:
            ray.shutdown()
