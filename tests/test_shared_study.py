"""Studies shared by several tuners: a real PostgreSQL server (tests/pg.py) and the journal
storage; stale trials found by heartbeat (never by PID) and retried once; no password in anything
shown; concurrent report writers."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from specs.plan import Plan
from tests.polling import poll

REPO = Path(__file__).resolve().parents[1]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def P(text):
    return Plan.parse(text).canonical()


# redaction ------------------------------------------------------------------------------------------



def test_redact_url_hides_passwords_only():
    from tuner.study.storage import redact_url
    assert redact_url("postgresql://moe:hunter2@db.example:5432/s") == "postgresql://moe:***@db.example:5432/s"
    assert redact_url("postgresql+psycopg2://moe:p%40ss@127.0.0.1/s") == "postgresql+psycopg2://moe:***@127.0.0.1/s"
    assert redact_url("mysql://u@h/s") == "mysql://u@h/s"  # no password, nothing to hide
    assert redact_url("sqlite:////tmp/x/study.db") == "sqlite:////tmp/x/study.db"
    assert redact_url("journal:/tmp/x/j.log") == "journal:/tmp/x/j.log"
    assert redact_url(None) == ""
    assert "hunter2" not in redact_url("postgresql://moe:hunter2@[bad")


# stale trials: the same rule on PostgreSQL, SQLite and the journal ------------------------------------

def _stale_failed_and_retried_once(storage):
    """A trial whose tuner stopped beating is failed after the grace period (3 s here), one retry of
    its plan is queued, a live trial is left alone, and the plan is not retried twice."""
    from tuner.study import storage as study_mod
    study = study_mod.open_study("stale", storage)
    plan = P("ep=2,mbs=2")
    dead = study_mod.Heartbeat(study, storage)
    assert dead.enabled and dead.interval == 1
    t = study_mod.claim(study, plan, {"roles": "searched"}, heartbeat=dead)
    dead.stop()  # its tuner dies: no more heartbeats (the trial stays RUNNING, whatever its PID)
    live = study_mod.Heartbeat(study, storage)
    alive = study_mod.claim(study, P("mbs=4"), {"roles": "searched"}, heartbeat=live)
    try:
        assert study_mod.fail_stale(study) == []  # within the grace period
        assert poll(lambda: study_mod.fail_stale(study)) == [t.number]  # once the grace period is over
        assert study_mod.fail_stale(study) == []  # nothing new: no second retry queued
        ft = study.trials[t.number]
        assert ft.state == TrialState.FAIL and study_mod.failure_kind(ft) == "interrupted"
        assert study.trials[alive.number].state == TrialState.RUNNING
        queued = study.get_trials(states=(TrialState.WAITING,))
        assert len(queued) == 1 and queued[0].user_attrs["plan"] == plan
        t2 = study_mod.claim(study, P("mbs=1"), {"roles": "searched"}, heartbeat=live)
        assert t2.user_attrs["plan"] == plan and t2.user_attrs["attempt"] == 2
        assert study_mod.fail_stale(study) == []  # the retry just started is not stale (old heartbeat attr)
        study_mod.mark_interrupted(study, t2)
        assert not study_mod.eligible(study_mod.plan_status(study), plan)
        assert study_mod.claim(study, plan, {}) is None
    finally:
        live.stop()


def test_journal_stale_trial_failed_and_retried_once(tmp_path):
    from tuner.study import storage as study_mod
    from tuner.study.journal import HeartbeatJournalStorage
    storage = study_mod.open_storage(f"journal:{tmp_path / 'j.log'}", tmp_path, heartbeat_interval=1)
    assert isinstance(storage, HeartbeatJournalStorage)
    _stale_failed_and_retried_once(storage)


def test_journal_stale_trial_failed_by_one_tuner_only(tmp_path):
    """Two tuners (two storage objects on one journal file) both see the stale trial: one FAIL,
    one queued retry."""
    from tuner.study import storage as study_mod
    url = f"journal:{tmp_path / 'j.log'}"
    a = study_mod.open_study("s", study_mod.open_storage(url, tmp_path, heartbeat_interval=1))
    b = study_mod.open_study("s", study_mod.open_storage(url, tmp_path, heartbeat_interval=1))
    hb = study_mod.Heartbeat(a, a._storage)
    t = study_mod.claim(a, P("ep=2"), {"roles": "searched"}, heartbeat=hb)
    hb.stop()
    assert poll(lambda: study_mod.fail_stale(b)) == [t.number]
    assert study_mod.fail_stale(a) == []  # already failed by b: nothing queued again
    for s in (a, b):
        assert len(s.get_trials(states=(TrialState.WAITING,))) == 1
    # the race itself: both saw the trial stale; the journal applies the first FAIL only, and the
    # second writer gets UpdateFinishedTrialError (which fail_stale_trials skips: no second retry)
    u = study_mod.claim(a, P("mbs=2"), {"roles": "searched"})
    tid = a._storage.get_trial_id_from_study_id_trial_number(a._study_id, u.number)
    assert b._storage.set_trial_state_values(tid, TrialState.FAIL) is True
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        a._storage.set_trial_state_values(tid, TrialState.FAIL)


@pytest.mark.slow
def test_postgres_stale_trial_failed_and_retried_once(postgres):
    from tuner.study import storage as study_mod
    storage = study_mod.open_storage(postgres.url, ".", heartbeat_interval=1)
    assert storage.engine.dialect.name == "postgresql"
    _stale_failed_and_retried_once(storage)
    optuna.delete_study(study_name="stale", storage=storage)


@pytest.mark.slow
def test_postgres_concurrent_claims_lowest_number_wins(postgres):
    """Two storages (two tuners) on one PostgreSQL study claiming the same plans: each plan owned once."""
    import threading

    from tuner.study import storage as study_mod
    studies = [study_mod.open_study("claims", study_mod.open_storage(postgres.url, ".", heartbeat_interval=None))
               for _ in range(2)]
    plans = [P(f"mbs={m}") for m in (1, 2, 4)] + [P(f"ep=2,mbs={m}") for m in (1, 2, 4)]
    owned = {0: [], 1: []}
    barrier = threading.Barrier(2)

    def tuner(i):
        barrier.wait()
        for p in plans:
            t = study_mod.claim(studies[i], p, {"roles": "searched"})
            if t is not None:
                owned[i].append(p)
                study_mod.record(studies[i], t, {"ok": True, "step_time_s": 1.0, "tokens_per_s_per_gpu": 1.0})

    threads = [threading.Thread(target=tuner, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(owned[0] + owned[1]) == sorted(plans)  # every plan once, none twice
    done = [t.user_attrs["plan"] for t in studies[0].get_trials() if t.state == TrialState.COMPLETE]
    assert sorted(done) == sorted(plans)
    optuna.delete_study(study_name="claims", storage=studies[0]._storage)


# concurrent report writers ------------------------------------------------------------------------

_WRITER = """
import sys
from specs.fileio import write_atomic
path, tag = sys.argv[1], sys.argv[2]
body = (tag * 2000 + "\\n") * 50
for i in range(200):
    write_atomic(path, body)
"""


def test_two_processes_writing_one_report_never_collide(tmp_path):
    """Two tuners finishing at once both write report.md: unique temporary names, so both succeed
    and the file is always one writer's whole text (never a mix, never a stray temporary)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    target = tmp_path / "report.md"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(target), tag], env=env, stderr=subprocess.PIPE)
             for tag in ("a", "b")]
    seen = set()
    while any(p.poll() is None for p in procs):
        if target.exists():
            text = target.read_text()
            seen.add(text[0])
            assert text in ((("a" * 2000) + "\n") * 50, (("b" * 2000) + "\n") * 50)
    for p in procs:
        assert p.wait() == 0, p.stderr.read().decode()[-2000:]
    assert [x.name for x in tmp_path.iterdir()] == ["report.md"]
    # the check runs at least once whatever the polling saw (it may see nothing on a fast host)
    assert target.read_text() in ((("a" * 2000) + "\n") * 50, (("b" * 2000) + "\n") * 50)
    assert seen <= {"a", "b"}


# end to end: two tuners on one study, one killed ------------------------------------------------------

def _tune_cmd(study_dir, storage, study):
    return [sys.executable, "-m", "tuner.cli", "tune", "--model", "tiny-moe", "--cluster", "cpu-local",
            "--gpus", "2", "--gbs", "8", "--seq", "128", "--study", study, "--study-dir", str(study_dir),
            "--storage", storage, "--trials", "3", "--iters", "1", "--warmup", "1", "--trial-timeout", "150",
            "--screen-actors", "1", "--no-progress", "--heartbeat-interval", "1"]


def _load(storage_url, study):
    from tuner.study import storage as study_mod
    return study_mod.load_study(study, study_mod.open_storage(storage_url, ".", heartbeat_interval=None))


def _retried(st, number, plan):
    return [t for t in st.get_trials() if t.number > number and t.user_attrs.get("plan") == plan
            and t.state in (TrialState.COMPLETE, TrialState.FAIL)]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["postgresql", "journal"])
def test_two_tuners_share_a_study_and_survive_a_kill(kind, request, tmp_path):
    """Two `moetune tune` processes on one study at once; one is killed (-9) mid-trial. The other
    (a restarted tuner afterwards, if it already finished) fails the stale trial by heartbeat and
    retries its plan once; every requested trial completes, no plan runs twice, the
    pre-registration is written once, and no file or output shows the database password."""
    from tests import pg
    from tuner.study import storage as study_mod
    if kind == "postgresql":
        storage = request.getfixturevalue("postgres").url
        secret = pg.PASSWORD
    else:
        storage, secret = f"journal:{tmp_path / 'study.journal'}", None
    study = f"shared-{kind}"
    d = tmp_path / "study"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    logs = [tmp_path / f"tuner{i}.log" for i in range(2)]  # files, not pipes: a full pipe would stall a tuner
    procs = [subprocess.Popen(_tune_cmd(d, storage, study), cwd=tmp_path, env=env, stdout=log.open("w"),
                              stderr=subprocess.STDOUT, start_new_session=True) for log in logs]
    victim, survivor = procs
    killed_trial = None
    deadline = time.time() + 400
    try:
        while time.time() < deadline and victim.poll() is None and killed_trial is None:
            time.sleep(1)
            try:
                st = _load(storage, study)
            except KeyError:
                continue
            # the victim's trial: RUNNING with a plan, owned by the victim's PID (for the test only)
            mine = [t for t in st.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                    if t.user_attrs.get("owner", "").endswith(f":{victim.pid}") and "attempt" in t.user_attrs]
            if mine:
                time.sleep(2)  # mid-trial
                killed_trial = mine[0].number
                os.killpg(victim.pid, signal.SIGKILL)
        assert killed_trial is not None, "the victim never ran a trial: " + logs[0].read_text()[-3000:]
        victim.wait()
        assert survivor.wait(timeout=600) == 0, logs[1].read_text()[-3000:]
        outputs = [log.read_text() for log in logs]
        plan = _load(storage, study).trials[killed_trial].user_attrs["plan"]
        if not _retried(_load(storage, study), killed_trial, plan):
            # the survivor finished before the grace period ran out: a restarted tuner retries it
            r = subprocess.run(_tune_cmd(d, storage, study), cwd=tmp_path, env=env, capture_output=True, text=True,
                               timeout=600)
            assert r.returncode == 0, r.stderr[-3000:]
            outputs += [r.stdout, r.stderr]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    st = _load(storage, study)
    trials = st.get_trials()
    killed = trials[killed_trial]
    assert killed.state == TrialState.FAIL and study_mod.failure_kind(killed) == "interrupted"
    retry = _retried(st, killed_trial, plan)
    assert len(retry) == 1 and retry[0].user_attrs["attempt"] == 2, [(t.number, t.state) for t in trials]  # once
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    done = [t.user_attrs["plan"] for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == len(set(done))  # no plan measured twice
    searched = {t.user_attrs["plan"] for t in trials if "searched" in t.user_attrs.get("roles", "")
                and (t.state == TrialState.COMPLETE or (t.state == TrialState.FAIL and study_mod.is_real_failure(t)))}
    assert len(searched) >= 3  # the requested trials
    # the pre-registration: written once, by one of the two tuners, and both ran under it
    import hashlib
    import json
    prereg = (d / "preregistration.json").read_bytes()
    assert hashlib.sha256(prereg).hexdigest() in (d / "preregistration.sha256").read_text()
    sha = json.loads(prereg)["sha256"]
    assert st.user_attrs["preregistration_sha256"] == sha
    assert sum(o.count("pre-registered ") for o in outputs[:2]) == 1, outputs[:2]
    for o in outputs[:2]:
        assert f"pre-registration sha256 {sha}" in o
    assert (d / "report.md").exists() and not [x for x in d.iterdir() if x.name.endswith(".tmp")]
    if secret:
        assert "127.0.0.1" in (d / "report.md").read_text()  # the storage is named, its password not
        for f in d.rglob("*"):
            if f.is_file():
                assert secret.encode() not in f.read_bytes(), f
        for o in outputs:
            assert secret not in o
