"""`tuner.study.loop.TrialLoop` tested directly: a real SQLite Optuna study, a real Ray (one node of two
CPUs: one trial slot), the loop's real Ray task body, and a scripted trial backend registered
through the real backend registry (tests/trial_double.py) in place of Megatron.

Checked: the order (baseline, pre-registered in rank order, then the sampler); the budget exactly
(`==`), also across a resume; a trial interrupted while running (Ctrl-C in the tuner) is retried
exactly once; a Ray task whose worker dies is a `crash` failure, counted and never retried; the
hard timeout cancels a hung task as `timeout`; a trial failed as stale while it runs (its heartbeat
stopped, another tuner's `fail_stale`) has its late result dropped and its retry measured once."""
from __future__ import annotations

import _thread
import functools
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("optuna")

from clusters import load_cluster  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.stack import cpu_profile  # noqa: E402
from specs.workload import Workload  # noqa: E402
from tests import trial_double  # noqa: E402
from trials.ray_runtime import init_ray  # noqa: E402
from tuner.space.train import default_space, iter_realizable  # noqa: E402
from tuner.study import TrainMode, TuneOptions  # noqa: E402
from tuner.study import storage as study_mod  # noqa: E402
from tuner.study.loop import TrialLoop  # noqa: E402
from tuner.study.sampler import GuidedSampler  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group("heavy")  # with the slow tests (tests/conftest.py)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One Ray for the module: every worker registers the scripted backend and reads its script."""
    d = tmp_path_factory.mktemp("loop")
    script = d / "script.json"
    script.write_text("{}")
    trial_double.register()
    init_ray(None, num_cpus=2, runtime_env={  # the tuner's own way: local, loopback, token auth
        "worker_process_setup_hook": "tests.trial_double.register",
        "env_vars": {trial_double.SCRIPT_ENV: str(script),
                     "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}})
    yield d, script
    ray.shutdown()


@pytest.fixture(scope="module")
def setting():
    wl = Workload(load_model("tiny-moe"), load_cluster("cpu-local", 2), 16, 256)
    space = default_space(wl, cpu_profile(), "bf16", level="core")
    plans = []
    for p in iter_realizable(space, wl, cpu_profile()):
        if p.canonical() not in plans:
            plans.append(p.canonical())
        if len(plans) == 10:
            break
    mode = TrainMode(wl, cpu_profile())
    raw = {p: mode.predict(p)[0] for p in plans}
    return mode, plans, raw


def _prereg(plans, raw, base, pre):
    return {"baseline": {"plan": base, "predicted_raw_step_time_s": raw[base]},
            "plans": [{"plan": p, "predicted_raw_step_time_s": raw[p]} for p in pre],
            "hashes": {"calibration_id": "identity"}}


def _loop(tmp_path, setting, *, trials, base_i=0, pre_i=(1, 2), hard_timeout_s=None):
    mode, plans, raw = setting
    opts = TuneOptions(study="loop", study_dir=tmp_path, trials=trials, backend=trial_double.NAME,
                       progress=False, heartbeat_interval_s=1, trial_timeout_s=60)
    storage = study_mod.open_storage(None, tmp_path, heartbeat_interval=1)
    study = study_mod.open_study("loop", storage)
    pool = [{"plan": p, "raw_step_time_s": raw[p]} for p in plans]
    loop = TrialLoop(study, storage, mode=mode, prereg=_prereg(plans, raw, plans[base_i], [plans[i] for i in pre_i]),
                     sampler=GuidedSampler(pool), options=opts)
    loop.observe_ready = functools.partial(loop.observe_ready, timeout_s=0.2)  # poll the state often
    if hard_timeout_s is not None:
        loop.hard_timeout_s = hard_timeout_s
    return loop, study


def _script(env, actions: dict):
    d, script = env
    for f in (d / "runs").glob("*"):
        f.unlink()
    (d / "release").unlink(missing_ok=True)
    script.write_text(json.dumps(actions))


def _rows(study):
    return sorted(study_mod.trial_rows(study), key=lambda r: r["number"])


def _searched(rows):
    return {r["plan"] for r in rows if "searched" in str(r.get("roles", ""))
            and (r["state"] == "COMPLETE" or (r["state"] == "FAIL" and study_mod.is_real_failure(r)))}


def test_order_and_exact_budget(env, setting, tmp_path):
    _, plans, _ = setting
    _script(env, {})
    loop, study = _loop(tmp_path, setting, trials=4)
    loop.run()
    rows = _rows(study)
    assert [r["plan"] for r in rows[:3]] == plans[:3]  # baseline, then the pre-registered in order
    assert rows[0]["roles"] == "baseline" and "preregistered" in rows[1]["roles"]
    assert len(_searched(rows)) == 4 and len(rows) == 5  # the budget exactly, the baseline on top
    assert all(r["state"] == "COMPLETE" for r in rows)
    assert all(trial_double.runs_of(env[0], r["plan"]) == 1 for r in rows)


def test_resume_runs_exactly_the_rest_of_the_budget(env, setting, tmp_path):
    _script(env, {})
    loop, study = _loop(tmp_path, setting, trials=2)
    loop.run()
    assert len(_searched(_rows(study))) == 2
    loop, study = _loop(tmp_path, setting, trials=5)
    loop.run()
    rows = _rows(study)
    assert len(_searched(rows)) == 5 and len(rows) == 6
    assert len({r["plan"] for r in rows}) == 6  # no plan measured twice
    # and a third run with the budget met runs nothing
    loop, study = _loop(tmp_path, setting, trials=5)
    loop.run()
    assert len(_rows(study)) == 6


def _when(pred, timeout_s=120.0):
    t = time.monotonic()
    while not pred():
        if time.monotonic() - t > timeout_s:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


def test_a_trial_interrupted_while_running_is_retried_exactly_once(env, setting, tmp_path):
    d, _ = env
    _, plans, _ = setting
    victim = plans[1]  # the first pre-registered plan: it runs until the tuner is interrupted
    _script(env, {victim: ["hang", "ok"]})
    loop, study = _loop(tmp_path, setting, trials=3)
    abandoned = threading.Event()
    abandon = loop.abandon

    def abandon_and_say():
        abandoned.set()
        abandon()

    loop.abandon = abandon_and_say

    def interrupt():
        _when(lambda: trial_double.runs_of(d, victim) == 1, timeout_s=900.0)
        # Ctrl-C again, as a user would, until the tuner takes it: one whole-suite run (2026-12-05)
        # saw a single interrupt go unanswered and the hung victim end by the hard timeout instead
        # (Ray defers a SIGINT that lands inside its own calls, and drops it when that call raises)
        while not abandoned.is_set():
            _thread.interrupt_main()
            abandoned.wait(2.0)

    # Python's own Ctrl-C handler, whatever an earlier test in this worker process installed
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            loop.run()
    finally:
        signal.signal(signal.SIGINT, old_handler)
    rows = _rows(study)
    assert [(r["plan"], r["state"]) for r in rows if r["plan"] == victim] == [(victim, "FAIL")]
    assert not study_mod.is_real_failure([r for r in rows if r["plan"] == victim][0])
    loop, study = _loop(tmp_path, setting, trials=3)
    loop.run()
    rows = _rows(study)
    assert [r["state"] for r in rows if r["plan"] == victim] == ["FAIL", "COMPLETE"]
    assert trial_double.runs_of(d, victim) == 2
    assert len(_searched(rows)) == 3


def test_a_crashed_ray_task_is_a_crash_counted_and_not_retried(env, setting, tmp_path):
    _, plans, _ = setting
    _script(env, {plans[1]: ["crash"]})
    loop, study = _loop(tmp_path, setting, trials=3)
    loop.run()
    rows = _rows(study)
    crashed = [r for r in rows if r["plan"] == plans[1]]
    assert len(crashed) == 1 and crashed[0]["state"] == "FAIL" and crashed[0]["failure_kind"] == "crash"
    assert study_mod.is_real_failure(crashed[0])
    assert len(_searched(rows)) == 3 and trial_double.runs_of(env[0], plans[1]) == 1


def test_the_hard_timeout_cancels_a_hung_task(env, setting, tmp_path):
    _, plans, _ = setting
    _script(env, {plans[1]: ["hang"]})
    loop, study = _loop(tmp_path, setting, trials=2, hard_timeout_s=1.0)
    loop.run()
    rows = _rows(study)
    hung = [r for r in rows if r["plan"] == plans[1]]
    assert len(hung) == 1 and hung[0]["failure_kind"] == "timeout"
    assert len(_searched(rows)) == 2


def test_a_trial_failed_as_stale_while_running_is_dropped_and_retried_once(env, setting, tmp_path):
    d, _ = env
    _, plans, _ = setting
    victim = plans[1]
    _script(env, {victim: ["wait", "ok"]})
    loop, study = _loop(tmp_path, setting, trials=2)
    stale = []

    def go_stale():
        _when(lambda: trial_double.runs_of(d, victim) == 1, timeout_s=900.0)  # as above: a loaded host
        running = [r for r in _rows(study) if r["plan"] == victim and r["state"] == "RUNNING"]
        loop.heartbeat.discard(running[0]["number"])  # its tuner stops beating for it ...
        def failed():  # ... and a stale sweep fails it: this thread's or the loop's own, whichever runs first
            stale.extend(study_mod.fail_stale(study))
            return [r for r in _rows(study) if r["plan"] == victim and r["state"] == "FAIL"]
        _when(failed)
        (d / "release").touch()  # the trial then finishes and reports

    t = threading.Thread(target=go_stale, daemon=True)
    t.start()
    loop.run()
    t.join()
    rows = _rows(study)
    first = [r for r in rows if r["plan"] == victim][0]
    assert set(stale) <= {first["number"]}
    assert study_mod.failure_kind(first) == study_mod.INTERRUPTED  # failed as stale, not by the backend
    # a later claim of the plan (after its retry ran) loses to the retry and is pruned, never run:
    # not a trial of the plan (full suite, 2026-12-05: FAIL, COMPLETE, PRUNED)
    ran = [r for r in rows if r["plan"] == victim and r["state"] != "PRUNED"]
    assert [r["state"] for r in ran] == ["FAIL", "COMPLETE"]
    assert all("claim_lost_to" in r or "claim_refused" in r for r in rows if r["plan"] == victim and r["state"] == "PRUNED")
    assert trial_double.runs_of(d, victim) == 2
    assert len(_searched(rows)) == 2


def test_serving_runs_through_the_one_study_skeleton(env, tmp_path):
    """Training and serving studies were two copies of one run (`tune`, `tune_serve`); now one
    `tuner.study.run` over a mode: a serving study (its Ray task body scripted, no server) is
    screened, pre-registered with the serving workload, run to its budget, adjudicated and reported
    by the same code as a training one."""
    from cost_model.serving.calibration import load_default
    from cost_model.tables import load_tables, tables_dir_for
    from specs.serve_plan import ServeWorkload
    from tuner.study import prereg, run
    from tuner.study.serve import ServeMode, make_task

    class ScriptedServe(ServeMode):
        run_trial = staticmethod(trial_double.serve_trial)
    cluster = load_cluster("cpu-local", 2)
    task = make_task(load_model("tiny-moe"), cluster, ServeWorkload(isl=128, osl=32, concurrency=16), "vllm")
    mode = ScriptedServe(task, tables=load_tables(tables_dir_for(cluster.kind)), calibration=load_default())
    opts = TuneOptions(study="serve", study_dir=tmp_path, trials=2, backend="vllm", progress=False,
                       heartbeat_interval_s=1, trial_timeout_s=60)
    result = run(opts, mode)
    doc = prereg.load(tmp_path)
    assert doc["workload"]["mode"] == "serve" and doc["hashes"]["tables_digest"] == mode.tables.digest
    study = study_mod.load_study("serve", study_mod.open_storage(None, tmp_path))
    assert study.user_attrs["mode"] == "serve"
    done = [r for r in study_mod.trial_rows(study) if r["state"] == "COMPLETE"]
    assert sum("baseline" in r["roles"] for r in done) == 1 and sum("searched" in r["roles"] for r in done) == 2
    assert all(r["measured_ttft_p90_s"] == 0.2 and r["predicted_raw_ttft_p90_s"] > 0 for r in done)
    assert result.verdict_line.startswith(("PASS:", "FAIL:")) and "## Verdict" in result.report.read_text()


def test_a_second_ctrl_c_while_abandoning_leaves_no_trial_running(monkeypatch):
    """A user's second Ctrl-C lands while the loop marks its running trials interrupted: every
    trial is still marked and the in-flight set emptied (before, the second KeyboardInterrupt broke
    off between the storage writes and a trial stayed RUNNING until its heartbeat went stale)."""
    from types import SimpleNamespace
    marked = []

    def mark(study, trial, why="tuner interrupted"):
        _thread.interrupt_main()  # the second Ctrl-C, mid-write
        time.sleep(0.05)
        marked.append(trial)

    monkeypatch.setattr(study_mod, "mark_interrupted", mark)
    loop = object.__new__(TrialLoop)  # abandon reads only the study and the in-flight trials
    loop.study = None
    loop.in_flight = {"ref-a": SimpleNamespace(trial="a"), "ref-b": SimpleNamespace(trial="b")}
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        loop.abandon()
        time.sleep(0.05)  # a dropped interrupt stays dropped after the block
    finally:
        signal.signal(signal.SIGINT, old_handler)
    assert marked == ["a", "b"] and loop.in_flight == {}
