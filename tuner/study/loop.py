"""The trial loop of a study (`TrialLoop`), training and serving alike: claim the next plan, run it
as a Ray task, record its result in the Optuna study, refit the calibration, re-rank the rest; and
the end-of-study re-measurement of the pre-registered adjudication protocol. What a plan is (its
Ray task body, its prediction) is the mode's (tuner/study/modes.py); the run around the loop is
tuner/study/skeleton.py.

Each trial is a Ray task holding the plan's devices (num_cpus = world on cpu-local, num_gpus =
world on GPUs), or, when the world is wider than any Ray node and the mode allows it, a task
driving one placement group with a launcher actor per node (trials/placement.py). Ray is started
or joined with token authentication (`start_ray`, trials/ray_runtime.py); the study's figures go to
Ray's metrics (tuner/study/metrics.py).

Several tuner processes (on several hosts, with a shared RDB or journal storage) may run one study: plans are
claimed through the study (lowest trial number wins) and a tuner that dies is noticed by its
trials' heartbeats going stale (see tuner/study/storage.py). Progress goes to this module's logger.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass

from specs.errors import UsageError
from tuner.study import prereg as prereg_mod
from tuner.study import storage as study_mod

logger = logging.getLogger(__name__)

MAX_CLAIMS_PER_ROUND = 50  # claims lost in a row before waiting for a running trial instead
WAIT_S = 10.0  # longest wait for a trial result before re-checking timeouts and stale trials


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

    def __init__(self, study, storage, *, mode, prereg: dict, sampler, options):
        """
        Args:
            study, storage: the Optuna study and the storage it was opened on (for heartbeats).
            mode: what the plans are (tuner/study/modes.py: `TrainMode` or `ServeMode`): its
                workload (`world`, the devices a trial holds, and `cluster`), the Ray task body
                of a trial, the cost model's raw prediction of a plan, and the calibration the
                study starts from.
            prereg: the verified pre-registration document.
            sampler: a `tuner.study.sampler.GuidedSampler` over the screened pool.
            options: run options (budget, backend, per-trial limits, progress).
        """
        self.study, self.storage = study, storage
        self.mode, self.workload = mode, mode.workload
        self.prereg, self.sampler, self.options = prereg, sampler, options
        self.calibration, self.cal_report = mode.calibration, None
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
        done = list(self.study.user_attrs.get(study_mod.REMEASURED, []))
        try:
            verdict_mod.verify_measurements(proto, done, base["plan"], cands)
        except verdict_mod.ProtocolError as e:  # e.g. a later trial of another tuner changed the winner
            raise UsageError(f"adjudication: the study's re-measurements break its protocol: {e}") from None
        return verdict_mod.run(proto, base["plan"], cands, done, self.measure_once,
                               lambda ms: self.study.set_user_attr(study_mod.REMEASURED, ms))

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
        """Mark running trials interrupted (their plans stay eligible once) and cancel their tasks.
        A second Ctrl-C while it runs is dropped: the first is being honoured, and one landing
        between the storage writes left a trial RUNNING until its heartbeat went stale (a
        whole-suite run under load, 2026-12-06)."""
        import ray
        with _sigint_ignored():
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


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored for the block (main thread only: signal handlers can be set only there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
