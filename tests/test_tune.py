"""moetune tune: guided sampler, failure recording, plan claims, pre-registration/adjudication, and
one end-to-end kill -9 + resume study on CPU (slow)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from clusters import load_cluster
from specs.models import load_model
from specs.plan import Plan
from specs.stack import profile_for
from specs.workload import Workload
from tests.polling import poll

REPO = Path(__file__).resolve().parents[1]
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def workload():
    return Workload(model=load_model("tiny-moe"), cluster=load_cluster("cpu-local", 2), gbs=8, seq=128)


def P(text):
    return Plan.parse(text).canonical()


# sampler ------------------------------------------------------------------------------------------

def _pool():
    # raw predicted step times: A fastest by the model, D slowest
    return [{"plan": P("mbs=4"), "raw_step_time_s": 1.0}, {"plan": P("mbs=2"), "raw_step_time_s": 1.1},
            {"plan": P("ep=2,mbs=4"), "raw_step_time_s": 1.2}, {"plan": P("pp=2,mbs=1"), "raw_step_time_s": 1.3}]


def test_sampler_follows_model_first_then_measurements():
    from tuner.study.sampler import GuidedSampler
    s = GuidedSampler(_pool())
    assert s.propose() == P("mbs=4")
    # mbs=4 turns out 3x slower than predicted, mbs=2 as predicted: the global scale rises, and the
    # neighbour of mbs=4 that differs only in ep is pulled down by the local residual.
    s.observe(P("mbs=4"), 3.0)
    s.observe(P("mbs=2"), 1.1)
    cal, rep = s.refit()
    assert 1.0 < cal.scale < 3.0 and len(rep["rows"]) == 2
    ranked = [r[0] for r in s.rank()]
    assert P("mbs=4") not in ranked and P("mbs=2") not in ranked  # nothing tried is proposed again
    assert ranked == [P("pp=2,mbs=1"), P("ep=2,mbs=4")]  # ep=2,mbs=4 shares mbs=4's slowness


def test_sampler_skips_failed_and_excluded():
    from tuner.study.sampler import GuidedSampler
    s = GuidedSampler(_pool())
    s.observe(P("mbs=4"), None)  # OOM / crash
    assert s.propose() == P("mbs=2")
    assert s.propose(exclude={P("mbs=2")}) == P("ep=2,mbs=4")
    mean, sigma = s.estimate(P("ep=2,mbs=4"))
    assert mean == pytest.approx(1.2) and sigma == pytest.approx(0.3)


def test_tpe_proposer_covers_space():
    from tuner.study.sampler import TPEProposer
    plans = [r["plan"] for r in _pool()]
    vals = {p: float(i) for i, p in enumerate(plans)}
    got = list(TPEProposer(plans, seed=1, n_startup_trials=2).run(vals.get, max_asks=300))
    assert len(got) == len(set(got)) >= 2 and set(got) <= set(plans)  # real trials only, none twice


# study: claims, failures, stale trials -------------------------------------------------------------

@pytest.fixture()
def study(tmp_path):
    from tuner.study import storage as study_mod
    return study_mod.open_study("t", study_mod.open_storage(None, tmp_path))


def test_failure_recorded_as_fail_with_reason(study):
    from trials.base import Failure
    from tuner.study import storage as study_mod
    plan = P("pp=2")
    t = study_mod.claim(study, plan, {"roles": "searched", "predicted_step_time_s": 1.0})
    study_mod.record(study, t, Failure(plan=plan, kind="oom", message="rank 1 RSS 3.1 GiB > cap 2 GiB").to_dict())
    ft = study.trials[0]
    assert ft.state == TrialState.FAIL
    assert ft.user_attrs["failure_kind"] == "oom" and "RSS" in ft.user_attrs["failure_message"]
    st = study_mod.plan_status(study)
    assert st[plan]["failed"] == 1 and not study_mod.eligible(st, plan)
    assert study_mod.claim(study, plan, {}) is None  # a really failed plan is not run again


def test_measurement_recorded_and_never_rerun(study):
    from tuner.study import storage as study_mod
    plan = P("mbs=2")
    t = study_mod.claim(study, plan, {"predicted_step_time_s": 0.5})
    study_mod.record(study, t, {"ok": True, "step_time_s": 1.0, "tokens_per_s_per_gpu": 512.0,
                        "step_time_spread_s": 0.1, "peak_memory_gib": [0.3, 0.4], "step_times_s": [1.0]})
    ft = study.trials[0]
    assert ft.state == TrialState.COMPLETE and ft.value == 512.0
    assert ft.user_attrs["measured_step_time_s"] == 1.0 and ft.user_attrs["predicted_step_time_s"] == 0.5
    assert study_mod.claim(study, plan, {}) is None
    assert study.trials[-1].state == TrialState.PRUNED and study.trials[-1].user_attrs["claim_lost_to"] == 0


def test_concurrent_claim_lowest_number_wins(study):
    from tuner.study import storage as study_mod
    plan = P("ep=2")
    first = study_mod.claim(study, plan, {})
    assert first is not None
    assert study_mod.claim(study, plan, {}) is None  # RUNNING lower-numbered trial holds it




def test_stale_running_trial_failed_and_retried_once(tmp_path):
    """A trial whose tuner stopped beating is failed after the grace period (Optuna heartbeats, timed
    by the database), Optuna queues one retry of its plan, and the plan is not retried twice."""
    from tuner.study import storage as study_mod
    storage = study_mod.open_storage(None, tmp_path, heartbeat_interval=1)  # grace period 3 s
    study = study_mod.open_study("t", storage)
    plan = P("ep=2,mbs=2")
    dead = study_mod.Heartbeat(study, storage)
    t = study_mod.claim(study, plan, {"roles": "searched"}, heartbeat=dead)
    dead.stop()  # its tuner dies: no more heartbeats
    live = study_mod.Heartbeat(study, storage)
    alive = study_mod.claim(study, P("mbs=4"), {"roles": "searched"}, heartbeat=live)
    try:
        assert study_mod.fail_stale(study) == []  # within the grace period
        assert poll(lambda: study_mod.fail_stale(study)) == [t.number]  # once the grace period is over
        ft = study.trials[t.number]
        assert ft.state == TrialState.FAIL and study_mod.failure_kind(ft) == "interrupted"
        assert study.trials[alive.number].state == TrialState.RUNNING  # its heartbeat kept it alive
        row = next(r for r in study_mod.trial_rows(study) if r["number"] == t.number)
        assert row["failure_kind"] == "interrupted"
        queued = study.get_trials(states=(TrialState.WAITING,))
        assert len(queued) == 1 and queued[0].user_attrs["plan"] == plan and queued[0].params["ep"] == 2
        assert study_mod.eligible(study_mod.plan_status(study), plan)  # retried once ...
        # asking for another plan, the tuner is handed the queued retry first
        t2 = study_mod.claim(study, P("mbs=1"), {"roles": "searched"}, heartbeat=live)
        assert t2.user_attrs["plan"] == plan and t2.user_attrs["attempt"] == 2
        study_mod.mark_interrupted(study, t2)
        assert not study_mod.eligible(study_mod.plan_status(study), plan)  # ... but not twice
        assert study_mod.claim(study, plan, {}) is None
    finally:
        live.stop()


def test_journal_storage_claims_and_params(tmp_path):
    """journal:<path> storages work the same way (heartbeats: tuner/study/journal.py, tests/test_shared_study.py)."""
    from tuner.study import storage as study_mod
    storage = study_mod.open_storage(f"journal:{tmp_path / 'j.log'}", tmp_path)
    study = study_mod.open_study("j", storage)
    hb = study_mod.Heartbeat(study, storage)
    assert hb.enabled
    t = study_mod.claim(study, P("ep=2"), {"roles": "searched"}, heartbeat=hb)
    assert study_mod.claim(study, P("ep=2"), {}) is None  # lowest number wins here too
    study_mod.record(study, t, {"ok": True, "step_time_s": 1.0, "tokens_per_s_per_gpu": 10.0})
    assert study.trials[0].params["ep"] == 2 and study_mod.fail_stale(study) == []
    hb.stop()


def test_plan_fields_are_optuna_params(study):
    """Optuna's own tools see the plans: each field is a one-choice categorical parameter."""
    from tuner.study import storage as study_mod
    plans = [P("ep=2,mbs=4"), P("pp=2,recompute=selective")]
    for i, plan in enumerate(plans):
        t = study_mod.claim(study, plan, {"roles": "searched"})
        study_mod.record(study, t, {"ok": True, "step_time_s": 1.0 + i, "tokens_per_s_per_gpu": 100.0 - i})
    for t, plan in zip(study.trials, plans):  # the params spell the plan
        assert Plan.parse(",".join(f"{k}={v}" for k, v in t.params.items())).canonical() == plan
    pytest.importorskip("pandas", reason="Study.trials_dataframe needs pandas")
    df = study.trials_dataframe()
    assert {"params_tp", "params_ep", "params_pp", "params_mbs", "params_recompute", "params_dist_opt"} <= set(df.columns)
    assert list(df["params_ep"]) == [2, 1] and list(df["params_pp"]) == [1, 2]
    assert list(df["params_recompute"]) == ["none", "selective"]


def test_a_token_drop_plan_records_and_reads_back(study):
    """capacity_factor is a float: kept in the trial's plan attribute (Optuna needs one distribution
    per name across a study), so a token-drop plan records, and its plan reads back exactly."""
    from tuner.study import storage as study_mod
    plan = P("ep=2,capacity_factor=1.25,pad_to_capacity=1")
    t = study_mod.claim(study, plan, {"roles": "searched"})
    study_mod.record(study, t, {"ok": True, "step_time_s": 1.0, "tokens_per_s_per_gpu": 100.0})
    (done,) = study.trials
    assert done.user_attrs["plan"] == plan and "capacity_factor=1.25" in plan
    assert "capacity_factor" not in done.params and done.params["pad_to_capacity"] is True


# command-line checks, before Ray starts ------------------------------------------------------------

TUNE = ["tune", "--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2", "--gbs", "8", "--seq", "128",
        "--study", "bad", "--no-progress"]


@pytest.mark.parametrize("flags,word", [(["--screen-actors", "0"], "--screen-actors"),
                                        (["--trials", "0"], "--trials"),
                                        (["--memory-cap-gib", "0"], "--memory-cap-gib"),
                                        (["--iters", "-1"], "--iters"),
                                        (["--trial-timeout", "0"], "--trial-timeout"),
                                        (["--heartbeat-interval", "0"], "--heartbeat-interval"),
                                        (["--stack", "bogus"], "stack profile"),
                                        (["--calibration", "/nonexistent.json"], "--calibration"),
                                        (["--tables", "/nonexistent"], "--tables")])
def test_tune_refuses_bad_flags_before_ray(tmp_path, capsys, flags, word):
    import ray

    from tuner.cli import main
    assert main([*TUNE, "--study-dir", str(tmp_path / "s"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0], err
    assert not ray.is_initialized()
    assert not (tmp_path / "s").exists()  # nothing started, nothing written


def test_library_leaves_optuna_verbosity_alone(tmp_path):
    from tuner.study import storage as study_mod
    optuna.logging.set_verbosity(optuna.logging.INFO)
    try:
        study_mod.open_study("v", study_mod.open_storage(None, tmp_path))
        assert optuna.logging.get_verbosity() == optuna.logging.INFO
    finally:
        optuna.logging.set_verbosity(optuna.logging.WARNING)


# pre-registration and adjudication --------------------------------------------------------------------

def _prereg(tmp_path, workload, base_plan):
    from cost_model.calibration import IDENTITY
    from tuner.study import prereg as prereg
    doc = prereg.build(study="adj", workload=workload, precision="bf16",
                   plans=[{"plan": P("mbs=4"), "predicted_step_time_s": 1.0}],
                   baseline={"plan": base_plan, "predicted_step_time_s": 1.0,
                             "predicted_tokens_per_s_per_gpu": 100.0},
                   baseline_source="test", tables_digest="x", calibration=IDENTITY, trials_budget=1,
                   sampler="guided-ucb", space={})
    prereg.write(tmp_path, doc)
    with pytest.raises(prereg.PreregistrationError):
        prereg.write(tmp_path, doc)  # never rewritten
    return doc


@pytest.mark.parametrize("searched_tps,verdict,rc", [(99.0, "PASS", 0), (90.0, "FAIL", 1)])
def test_adjudicate_verdicts(tmp_path, workload, capsys, searched_tps, verdict, rc):
    from tuner.cli import main
    from tuner.study import storage as study_mod
    base = P("ep=2")
    _prereg(tmp_path, workload, base)
    st = study_mod.open_study("adj", study_mod.open_storage(None, tmp_path))
    for plan, roles, tps in ((base, "baseline", 100.0), (P("mbs=4"), "searched", searched_tps)):
        t = study_mod.claim(st, plan, {"roles": roles})
        study_mod.record(st, t, {"ok": True, "step_time_s": 1.0, "tokens_per_s_per_gpu": tps})
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path)]) == rc
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith(verdict)
    assert f"{searched_tps / 100.0:.3f}" in out


def test_adjudicate_refuses_tampered_file(tmp_path, workload, capsys):
    from tuner.cli import main
    from tuner.study import prereg as prereg
    _prereg(tmp_path, workload, P("ep=2"))
    path = tmp_path / prereg.NAME
    path.write_text(path.read_text().replace('"ratio": 0.98', '"ratio": 0.5'))
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "modified" in err[0]
    # consistent re-hash of the body but stale sidecar: still refused
    doc = json.loads(path.read_text())
    doc["sha256"] = prereg.canonical_hash(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(prereg.PreregistrationError):
        prereg.load(tmp_path)


def test_baseline_heuristic_keeps_ep_in_domain_and_tp1(workload):
    from tuner.rank.baseline import hand_tuned_baseline
    plan, pred = hand_tuned_baseline(workload, profile_for(workload.cluster))
    assert plan.tp == 1 and plan.ep == 2 and plan.cp == 1 and pred.feasible


def test_select_candidates_diverse_layouts():
    from tuner.rank.candidates import select_candidates
    from tuner.rank.train import Scored
    pool = [Scored(f"p{i}", 1.0 + i, 1.0 + i, 100.0 - i, 0.1, (1, 1, 1, 1, 1, 1)) for i in range(10)]
    pool += [Scored("q", 20.0, 20.0, 50.0, 0.1, (1, 1, 2, 1, 1, 1)),
             Scored("r", 30.0, 30.0, 40.0, 0.1, (1, 1, 1, 1, 2, 1))]
    got = [s.plan for s in select_candidates(pool, 4)]
    assert got[:2] == ["p0", "p1"] and {"q", "r"} <= set(got)


# end to end: kill -9 and resume --------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(420)
def test_tune_end_to_end_kill_and_resume(tmp_path):
    import hashlib

    from tuner.study import storage as study_mod
    d = tmp_path / "study"
    cmd = [sys.executable, "-m", "tuner.cli", "tune", "--model", "tiny-moe", "--cluster", "cpu-local",
           "--gpus", "2", "--gbs", "8", "--seq", "128", "--study", "e2e", "--study-dir", str(d),
           "--trials", "4", "--iters", "2", "--warmup", "1", "--trial-timeout", "120", "--no-progress",
           "--heartbeat-interval", "1"]  # a killed tuner's trial is stale after 3 s
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    url = f"sqlite:///{d / 'study.db'}"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and p.poll() is None:
            time.sleep(1)
            try:
                st = optuna.load_study(study_name="e2e", storage=url)
            except Exception:  # noqa: BLE001 - not created yet
                continue
            trials = st.get_trials(deepcopy=False)
            # kill during a running trial (after one measured): the kill must interrupt one
            # a trial runs once its claim finished ("started_unix" is the claim's last attribute but the
            # params): a kill between the claim's writes leaves a trial whose plan never started
            claimed = [t for t in trials if t.state == TrialState.RUNNING]
            running = [t.user_attrs.get("plan") for t in claimed]
            if (any(t.state == TrialState.COMPLETE for t in trials) and claimed
                    and all("started_unix" in t.user_attrs for t in claimed)):
                break
        assert p.poll() is None, p.stdout.read().decode()[-3000:]
        assert running, "no trial was running at the kill"
        prereg_bytes = (d / "preregistration.json").read_bytes()
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        time.sleep(1)
        try:
            os.killpg(p.pid, signal.SIGKILL)  # Ray processes of the killed tuner
        except ProcessLookupError:
            pass
    assert not (d / "report.md").exists()
    # the resumed run ends with the adjudication: the top 3 measured plans re-measured, then 3 rounds
    # of baseline and winner (up to 10 trial runs after the budget)
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=480)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    report = Path(r.stdout.strip().splitlines()[-1])
    assert report == (d / "report.md").resolve() and report.exists()
    text = report.read_text()
    assert "## Trials" in text and "pretrain_gpt.py" in text and "moetune adjudicate" in text
    assert (d / "trials.csv").exists() and (d / "measured_vs_predicted.png").exists()
    assert (d / "preregistration.json").read_bytes() == prereg_bytes
    assert "resuming: pre-registration" in r.stdout
    st = optuna.load_study(study_name="e2e", storage=url)
    done = [t for t in st.get_trials() if t.state == TrialState.COMPLETE]
    plans = [t.user_attrs["plan"] for t in done]
    assert len(plans) == len(set(plans))  # none measured twice
    # the budget exactly: 4 distinct searched plans measured or really failed (the baseline on top)
    searched = {t.user_attrs["plan"] for t in st.get_trials() if "searched" in t.user_attrs.get("roles", "")
                and (t.state == TrialState.COMPLETE
                     or (t.state == TrialState.FAIL and study_mod.is_real_failure(t)))}
    assert len(searched) == 4, searched
    for t in st.get_trials():
        assert t.state != TrialState.RUNNING
        if t.state == TrialState.FAIL:
            assert study_mod.failure_kind(t) in ("interrupted", "oom", "crash", "timeout", "stack-rejected")
    assert all(t.params["ep"] == Plan.parse(t.user_attrs["plan"]).ep for t in done)  # plans as Optuna params
    # the trial running when the tuner was killed went stale, was failed, and its plan retried exactly once
    for plan in running:
        of_plan = [t for t in st.get_trials() if t.user_attrs.get("plan") == plan]
        assert [study_mod.failure_kind(t) for t in of_plan if t.state == TrialState.FAIL][:1] == ["interrupted"], plan
        assert [t.user_attrs.get("attempt") for t in of_plan] == [1, 2], (plan, [t.number for t in of_plan])
    adj = subprocess.run([sys.executable, "-m", "tuner.cli", "adjudicate", "e2e", "--study-dir", str(d)],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert adj.returncode in (0, 1) and adj.stdout.strip().splitlines()[-1].split(":")[0] in ("PASS", "FAIL", "INCONCLUSIVE")
    assert hashlib.sha256(prereg_bytes).hexdigest() in (d / "preregistration.sha256").read_text()


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_adjudicate_opens_storage_read_only(tmp_path, workload, capsys, kind):
    """`adjudicate` writes nothing: its storage's bytes are unchanged (SQLite opened with mode=ro,
    even when the file is read-only), and a --storage naming no database creates none: one line, exit 2."""
    import os
    import stat

    from tuner.cli import main
    from tuner.study import storage as study_mod
    base = P("ep=2")
    _prereg(tmp_path, workload, base)
    url = f"sqlite:///{tmp_path / 'other.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'j.log'}"
    st = study_mod.open_study("adj", study_mod.open_storage(url, tmp_path, heartbeat_interval=None))
    for plan, roles, tps in ((base, "baseline", 100.0), (P("mbs=4"), "searched", 120.0)):
        t = study_mod.claim(st, plan, {"roles": roles})
        study_mod.record(st, t, {"ok": True, "step_time_s": 1.0, "tokens_per_s_per_gpu": tps})
    f = tmp_path / ("other.db" if kind == "sqlite" else "j.log")
    os.chmod(f, stat.S_IRUSR)  # read-only: a writer would fail (root ignores modes; the bytes check below does not)
    before = f.read_bytes()
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path), "--storage", url]) == 0
    assert f.read_bytes() == before
    # the default storage (SQLite in the study folder) does not exist: refused, nothing created
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no study database" in err[0] and "--storage" in err[0]
    assert not (tmp_path / "study.db").exists()
    missing = f"journal:{tmp_path / 'nope.log'}"
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path), "--storage", missing]) == 2
    assert not (tmp_path / "nope.log").exists()


def test_adjudicate_hint_works_for_every_storage(tmp_path):
    """The report's hint names --study-dir unless it is the default, and --storage unless it is the
    default SQLite in that folder; a database URL shows its password as ***."""
    from tuner.study.report import adjudicate_hint
    from tuner.study.storage import default_storage_url, default_study_dir
    assert adjudicate_hint("q", default_study_dir("q"), default_storage_url(default_study_dir("q"))) == "moetune adjudicate q"
    assert adjudicate_hint("q", tmp_path, default_storage_url(tmp_path)) == f"moetune adjudicate q --study-dir {tmp_path}"
    assert adjudicate_hint("q", tmp_path, f"journal:{tmp_path}/j.log").endswith(f"--storage journal:{tmp_path}/j.log")
    pg = adjudicate_hint("q", tmp_path, "postgresql://me:hunter2@db:5432/s")
    assert "hunter2" not in pg and "--storage 'postgresql://me:***@db:5432/s'" in pg
