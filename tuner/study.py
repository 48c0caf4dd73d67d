"""The Optuna study behind `moetune tune`: storage, plan claims, resumption, recording.

Storage: default `sqlite:///<study dir>/study.db`; any SQLAlchemy URL (PostgreSQL, MySQL) via
`--storage`; `journal:<path>` for Optuna's JournalStorage on a file. The study maximises measured
tokens/s/GPU. A trial's identity is its user attribute `plan` (canonical string).

Claiming a plan (two tuner processes on one storage never run a plan twice):
  1. `study.ask()` creates a RUNNING trial; its number is assigned by the storage, atomically;
  2. the trial's `plan` user attribute is written;
  3. the claimer re-reads the study and waits (bounded, CLAIM_WAIT_S) until every lower-numbered
     RUNNING trial has its `plan` written, then
  4. loses (trial told PRUNED, `claim_lost_to` = the other number) if the plan already has a
     COMPLETE trial, a FAIL with a real failure, or a lower-numbered RUNNING trial; else it owns it.
  Lowest number wins; step 3 closes the window where the winner had not yet written its plan.

Resumption: RUNNING trials whose owner (`owner` = host:pid) is on this host and no longer alive
are marked FAIL with failure_kind `interrupted`; a plan interrupted once is retried once; a plan
with a COMPLETE trial is never run again. (Owners on other hosts are left alone.)
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

CLAIM_WAIT_S = 15.0
REAL_FAILURES = ("oom", "stack-rejected", "unrealizable", "crash", "timeout")
OWNER = f"{socket.gethostname()}:{os.getpid()}"


def default_storage_url(study_dir: str | Path) -> str:
    return f"sqlite:///{Path(study_dir).resolve() / 'study.db'}"


def open_storage(url: str | None, study_dir: str | Path):
    url = url or default_storage_url(study_dir)
    if url.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend
        path = url[len("journal:"):]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(path))
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)


def open_study(name: str, storage):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name=name, storage=storage, direction="maximize",
                               load_if_exists=True)


def _alive(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname():
        return True  # cannot tell: leave it
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return _not_zombie(int(pid))


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def fail_stale(study, mine=()) -> list[int]:
    """Mark RUNNING trials of dead owners FAIL (interrupted). Returns their numbers."""
    out = []
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("owner", "")
        if t.number in mine or not owner or _alive(owner):
            continue
        storage.set_trial_user_attr(t._trial_id, "failure_kind", "interrupted")
        storage.set_trial_user_attr(t._trial_id, "failure_message",
                                    f"owner {owner} died while the trial was running")
        try:
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except RuntimeError:  # finished meanwhile
            continue
        out.append(t.number)
    return out


def plan_status(study) -> dict:
    """plan -> {'complete': n, 'running': n, 'failed': n (real failures), 'interrupted': n}."""
    st: dict = {}
    for t in study.get_trials(deepcopy=False):
        p = t.user_attrs.get("plan")
        if not p:
            continue
        s = st.setdefault(p, {"complete": 0, "running": 0, "failed": 0, "interrupted": 0})
        if t.state == TrialState.COMPLETE:
            s["complete"] += 1
        elif t.state == TrialState.RUNNING:
            s["running"] += 1
        elif t.state == TrialState.FAIL:
            if t.user_attrs.get("failure_kind") in REAL_FAILURES:
                s["failed"] += 1
            else:
                s["interrupted"] += 1
    return st


def eligible(status: dict, plan: str) -> bool:
    s = status.get(plan)
    if s is None:
        return True
    return not (s["complete"] or s["running"] or s["failed"]) and s["interrupted"] <= 1


def claim(study, plan: str, attrs: dict):
    """Create a trial for `plan` and own it, or return None if another trial has it."""
    trial = study.ask()
    trial.set_user_attr("plan", plan)
    trial.set_user_attr("owner", OWNER)
    deadline = time.monotonic() + CLAIM_WAIT_S
    while True:
        trials = study.get_trials(deepcopy=False)
        pending = [t for t in trials if t.number < trial.number and t.state == TrialState.RUNNING
                   and "plan" not in t.user_attrs]
        if pending and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        break
    for t in trials:
        if t.number == trial.number or t.user_attrs.get("plan") != plan:
            continue
        taken = (t.state == TrialState.COMPLETE
                 or (t.state == TrialState.RUNNING and t.number < trial.number)
                 or (t.state == TrialState.FAIL and t.user_attrs.get("failure_kind") in REAL_FAILURES))
        if taken:
            trial.set_user_attr("claim_lost_to", t.number)
            study.tell(trial, state=TrialState.PRUNED)
            return None
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    trial.set_user_attr("started_unix", time.time())
    return trial


def record(study, trial, result: dict) -> None:
    """Store a backend result (Measurement/Failure .to_dict()) and finish the trial."""
    trial.set_user_attr("finished_unix", time.time())
    if result.get("ok"):
        trial.set_user_attr("measured_step_time_s", float(result["step_time_s"]))
        trial.set_user_attr("measured_tokens_per_s_per_gpu", float(result["tokens_per_s_per_gpu"]))
        trial.set_user_attr("measured_step_time_spread_s", float(result.get("step_time_spread_s", 0.0)))
        trial.set_user_attr("measured_peak_memory_gib", max(result.get("peak_memory_gib") or [0.0]))
        trial.set_user_attr("measured_step_times_s", list(result.get("step_times_s", ())))
        trial.set_user_attr("losses", list(result.get("losses", ())))
        trial.set_user_attr("failure_kind", "")
        study.tell(trial, float(result["tokens_per_s_per_gpu"]))
    else:
        trial.set_user_attr("failure_kind", result.get("kind", "crash"))
        trial.set_user_attr("failure_message", str(result.get("message", ""))[-2000:])
        study.tell(trial, state=TrialState.FAIL)


def mark_interrupted(study, trial, why: str = "tuner interrupted") -> None:
    try:
        trial.set_user_attr("failure_kind", "interrupted")
        trial.set_user_attr("failure_message", why)
        study.tell(trial, state=TrialState.FAIL)
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def trial_rows(study) -> list[dict]:
    """One dict per trial that names a plan: number, state, and every user attribute."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        if "plan" not in t.user_attrs:
            continue
        rows.append({"number": t.number, "state": t.state.name, "value": t.value, **t.user_attrs})
    return rows
