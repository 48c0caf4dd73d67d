"""The Optuna study behind `moetune tune`: storage, plan claims, resumption, recording.

Where a study lives: `studies/<name>` (`default_study_dir`) holds the pre-registration, the report
and, by default, the storage `sqlite:///<study dir>/study.db` (`default_storage_url`). `--storage`
takes any SQLAlchemy URL (PostgreSQL, MySQL) or `journal:<path>` for Optuna's JournalStorage on a
file. The study maximises measured tokens/s/GPU.

A trial's identity is its user attribute `plan` (the canonical plan string). Each plan field is also
recorded as an Optuna parameter with a one-choice categorical distribution (`params_tp`,
`params_ep`, ... in `trials_dataframe()`), so Optuna's plots and optuna-dashboard show the plans;
the choice itself is made by `tuner.study.sampler.GuidedSampler` (`PlanSampler` only hands Optuna the
chosen plan's values). recompute_modules and pp_layout are open-ended and stay in `plan` only.

Claiming a plan (two tuner processes on one storage never run a plan twice):
  1. `study.ask()` creates a RUNNING trial; its number is assigned by the storage, atomically;
  2. the trial's `plan` user attribute is written;
  3. the claimer re-reads the study and waits (bounded, CLAIM_WAIT_S) until every lower-numbered
     RUNNING trial has its `plan` written, then
  4. loses (trial told PRUNED, `claim_lost_to` = the other number) if the plan already has a
     COMPLETE trial, a FAIL with a real failure, or a lower-numbered RUNNING trial; else it owns it.
  Lowest number wins; step 3 closes the window where the winner had not yet written its plan.
  `ask()` hands out a queued retry (below) before creating a trial: the claim is then for the
  retried plan, whatever plan the caller wanted.

Resumption and dead tuners (Optuna heartbeats, on RDB and journal storages): while a tuner runs a trial it
records the trial's heartbeat every `heartbeat_interval` seconds (`Heartbeat`, timed by the
database server's clock, so it works across hosts). `fail_stale` (Optuna's `fail_stale_trials`)
marks RUNNING trials whose heartbeat is older than the grace period FAIL; such a trial has no
`failure_kind` and reads as `interrupted`. Optuna's `RetryHeartbeatStaleTrialCallback(max_retry=1)`
(`RetryFailedTrialCallback` before Optuna 4.9) then
queues one retry of it (a WAITING trial with the same plan and params). A plan interrupted once is
retried once; a plan with a COMPLETE trial or a real failure is never run again.
JournalStorage has no heartbeats in Optuna (checked in 5.1): `journal:` storages open as
`HeartbeatJournalStorage` (tuner/study/journal.py), which records the heartbeat as a trial system
attribute and gives Optuna's `fail_stale_trials` the same grace rule, so the same retry follows.

Storage URLs are shown (report, logs, error lines, calibration sources) only through `redact_url`:
a password in a database URL never reaches a file or the terminal.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import TrialState

from specs.plan import CUDA_GRAPH_IMPLS, DISPATCHERS, FLEX_BACKENDS, PRECISIONS, RECOMPUTE, RECOMPUTE_METHODS, Plan
from specs.serve_plan import A2A_BACKENDS, DEEPEP_MODES, KV_CACHE_DTYPES, ServePlan
from trials.base import FAILURE_KINDS

logger = logging.getLogger(__name__)

CLAIM_WAIT_S = 15.0
STUDIES_DIR = Path("studies")
DEFAULT_HEARTBEAT_S = 10
GRACE_FACTOR = 3  # grace period = GRACE_FACTOR x heartbeat interval
INTERRUPTED = "interrupted"
REMEASURED = "adjudication_measurements"  # study user attribute: the adjudication protocol's re-measurements
# Which tuner ran a trial, for people reading the study (liveness is the heartbeat's business).
OWNER = f"{socket.gethostname()}:{os.getpid()}"


def default_study_dir(name: str) -> Path:
    """Where study `name` lives unless `--study-dir` says otherwise: `studies/<name>`."""
    return STUDIES_DIR / name


def default_storage_url(study_dir: str | Path) -> str:
    """The storage used unless `--storage` says otherwise: SQLite in the study directory."""
    return f"sqlite:///{Path(study_dir).resolve() / 'study.db'}"


def open_storage(url: str | None, study_dir: str | Path, *, heartbeat_interval: int | None = DEFAULT_HEARTBEAT_S):
    """Open the study storage.

    Args:
        url: SQLAlchemy URL, `journal:<path>`, or None for `default_storage_url(study_dir)`.
        study_dir: the study directory (only used for the default URL).
        heartbeat_interval: seconds between heartbeats of running trials (RDB and journal storages; the grace
            period before a silent trial is failed is GRACE_FACTOR times it). None: no heartbeats
            (readers such as `adjudicate` need none).
    """
    url = url or default_storage_url(study_dir)
    if heartbeat_interval is not None and (int(heartbeat_interval) != heartbeat_interval or heartbeat_interval < 1):
        raise ValueError(f"heartbeat_interval must be a whole number of seconds >= 1, got {heartbeat_interval}")
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        from tuner.study.journal import HeartbeatJournalStorage
        path = url[len("journal:"):]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if heartbeat_interval is None:
            return optuna.storages.JournalStorage(JournalFileBackend(path))
        return HeartbeatJournalStorage(JournalFileBackend(path), heartbeat_interval=int(heartbeat_interval),
                                       grace_period=GRACE_FACTOR * int(heartbeat_interval),
                                       heartbeat_stale_trial_callback=_retry_callback())
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    if heartbeat_interval is None:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    with warnings.catch_warnings():
        # heartbeats are marked experimental in Optuna; they are what this module relies on
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        callback = {"heartbeat_stale_trial_callback": _retry_callback()} if retry is not None else \
            {"failed_trial_callback": _retry_callback()}
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=int(heartbeat_interval),
                                          grace_period=GRACE_FACTOR * int(heartbeat_interval), **callback)


def open_storage_readonly(url: str | None, study_dir: str | Path):
    """Open an existing study storage for reading only (`moetune adjudicate`): nothing is created
    or written. A SQLite file opens in SQLite's read-only mode, a PostgreSQL database in read-only
    transactions, a journal file as it is; FileNotFoundError (naming the shown URL) when a SQLite
    or journal file does not exist."""
    url = url or default_storage_url(study_dir)
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend
        path = Path(url[len("journal:"):])
        if not path.is_file():
            raise FileNotFoundError(f"no study journal at {path}")
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    from sqlalchemy.engine import make_url
    u = make_url(url)
    engine_kwargs: dict = {}
    if u.get_backend_name() == "sqlite":
        if not u.database or not Path(u.database).is_file():
            raise FileNotFoundError(f"no study database at {redact_url(url)}")
        # SQLite's URI form opens the file read-only (mode=ro): no empty database appears
        url = f"sqlite:///file:{Path(u.database).resolve()}?mode=ro&uri=true"
        engine_kwargs = {"connect_args": {"timeout": 60}}
    elif u.get_backend_name() == "postgresql":
        engine_kwargs = {"connect_args": {"options": "-c default_transaction_read_only=on"}}
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, skip_table_creation=True)


def _retry_callback():
    """Optuna's one-retry callback for a stale trial (4.9 renamed it; 4.0-4.8 know the old name)."""
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return retry(max_retry=1)


def redact_url(url: str | None) -> str:
    """A storage URL fit to show: the password of a database URL replaced by `***`
    (SQLAlchemy's own rendering); `journal:<path>`, SQLite paths and None ("") unchanged."""
    if not url:
        return ""
    if url.startswith("journal:") or "://" not in url:
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        # not parseable as a URL: keep the scheme only, never echo what may hold a password
        return url.split("://", 1)[0] + "://***"


STORAGE_CONNECT_TIMEOUT_S = 5


def check_storage(url: str | None, study_dir: str | Path) -> None:
    """Refuse a storage that cannot work, before anything starts (Ray, screening, the
    pre-registration) and without creating anything: UsageError (one line, the password never
    shown) for a malformed URL, a missing database driver, a server that does not answer within
    STORAGE_CONNECT_TIMEOUT_S, or a journal / SQLite file whose folder cannot be written.
    None (SQLite in `study_dir`) is checked with the study folder by the caller."""
    from specs.errors import UsageError
    if not url:
        return
    shown = redact_url(url)
    if url.startswith("journal:"):
        _check_storage_file(url[len("journal:"):], shown)
        return
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError
    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        raise UsageError(f"--storage {shown}: not a storage URL (an SQLAlchemy URL such as "
                         "sqlite:///study.db or postgresql+psycopg://user@host/db, or journal:<path>)") from None
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            _check_storage_file(u.database, shown)
        return
    try:
        args = {"connect_timeout": STORAGE_CONNECT_TIMEOUT_S} if u.get_backend_name() in ("postgresql", "mysql") else {}
        engine = create_engine(u, connect_args=args)
    except Exception as e:  # noqa: BLE001 - a missing driver, an unknown dialect: the user's to fix
        raise UsageError(f"--storage {shown}: cannot be used ({type(e).__name__}: {_scrub(e, u)})") from None
    try:
        with engine.connect():
            pass
    except Exception as e:  # noqa: BLE001 - refused, unreachable, bad credentials
        raise UsageError(f"--storage {shown}: cannot connect ({_scrub(getattr(e, 'orig', None) or e, u)})") from None
    finally:
        engine.dispose()


def _scrub(e: BaseException, u) -> str:
    """The first line of an error, with the URL's password (if any) masked."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return line.replace(u.password, "***") if u.password else line


def _check_storage_file(path: str, shown: str) -> None:
    from specs.errors import UsageError
    p = Path(path)
    if not path.strip():
        raise UsageError(f"--storage {shown}: no file named")
    if p.is_dir():
        raise UsageError(f"--storage {shown}: {p} is a folder, expected a file")
    d = p.parent
    while not d.exists() and d != d.parent:
        d = d.parent
    if not d.is_dir():
        raise UsageError(f"--storage {shown}: {d} is a file, not a folder")
    if not os.access(d if not p.exists() else p, os.W_OK):
        raise UsageError(f"--storage {shown}: {p if p.exists() else d} is not writable")


def open_study(name: str, storage):
    """Create the study `name` in `storage`, or load it if it exists (resumption)."""
    return optuna.create_study(study_name=name, storage=storage, direction="maximize",
                               sampler=PlanSampler(), load_if_exists=True)


def load_study(name: str, storage):
    """Load an existing study; KeyError if `storage` has no study `name`."""
    return optuna.load_study(study_name=name, storage=storage)


# plans as Optuna parameters ---------------------------------------------------------------------

# Optuna requires one distribution per parameter name across a study, so a field cannot be a
# one-choice categorical whose choice changes from trial to trial. Integer fields are one-value
# IntDistributions (Optuna compares only their `log` flag); the other fields are categoricals over
# every value the field can take, and `PlanSampler` "samples" the value the plan has.
# recompute_modules, pp_layout and cuda_graph_scope are open-ended, capacity_factor a float: they are in
# the `plan` attribute only.
_CHOICES = {"recompute": RECOMPUTE, "recompute_method": RECOMPUTE_METHODS, "dispatcher": DISPATCHERS,
            "flex_backend": FLEX_BACKENDS, "precision": PRECISIONS, "cuda_graph_impl": CUDA_GRAPH_IMPLS}
_NOT_PARAMS = ("recompute_modules", "pp_layout", "cuda_graph_scope", "capacity_factor")


_SERVE_CHOICES = {"a2a": A2A_BACKENDS, "deepep_mode": DEEPEP_MODES, "kv_cache_dtype": KV_CACHE_DTYPES}
_SERVE_NOT_PARAMS = ("mem_frac", "pd")  # a float and an open-ended ratio: in the `plan` attribute only


def is_serve_plan(plan: str) -> bool:
    """Whether a canonical plan string is a serving plan (only ServePlan has attention-DP)."""
    return "attn_dp=" in plan


def plan_params(plan: str) -> dict:
    """The plan's fields recorded as Optuna parameters (training: all but _NOT_PARAMS; serving: all
    but mem_frac and pd)."""
    if is_serve_plan(plan):
        p, skip = ServePlan.parse(plan), _SERVE_NOT_PARAMS
    else:
        p, skip = Plan.parse(plan), _NOT_PARAMS
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name not in skip}


def _record_params(trial, plan: str) -> None:
    for field, value in plan_params(plan).items():
        if isinstance(value, bool):
            trial.suggest_categorical(field, (False, True))
        elif isinstance(value, int):
            trial.suggest_int(field, value, value)
        else:
            trial.suggest_categorical(field, (_SERVE_CHOICES if is_serve_plan(plan) else _CHOICES)[field])


class PlanSampler(optuna.samplers.BaseSampler):
    """The Optuna sampler of a moetune study: it proposes nothing. Plans are chosen by
    `tuner.study.sampler.GuidedSampler` and claimed before any parameter is suggested; this sampler
    returns, for each parameter, the value of that field in the trial's `plan` attribute."""

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        plan = trial.user_attrs.get("plan")
        if not plan:
            raise RuntimeError(f"trial #{trial.number} has no plan: moetune studies suggest no free parameters")
        return plan_params(plan)[param_name]


# heartbeats --------------------------------------------------------------------------------------

class Heartbeat:
    """Records the heartbeat of the trials this process runs, from a daemon thread.

    Optuna records heartbeats itself only inside `Study.optimize`; `moetune tune` runs trials
    through ask/tell (several at once, on Ray), so it records them here through the storage's
    public `record_heartbeat` (RDBStorage, HeartbeatJournalStorage). A no-op on storages without
    heartbeats.
    """

    def __init__(self, study, storage):
        """study: the Optuna study; storage: the storage object it was opened on."""
        from optuna.storages._heartbeat import BaseHeartbeat
        interval = storage.get_heartbeat_interval() if isinstance(storage, BaseHeartbeat) else None
        self.enabled = interval is not None
        self.interval = interval or 0
        self._storage = storage
        self._study_id = storage.get_study_id_from_name(study.study_name) if self.enabled else None
        self._ids: dict[int, int] = {}  # trial number -> storage trial id
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if self.enabled:
            self._thread = threading.Thread(target=self._beat, name="moetune-heartbeat", daemon=True)
            self._thread.start()

    def add(self, number: int) -> None:
        """Start beating for trial `number` (and record one heartbeat now)."""
        if not self.enabled:
            return
        tid = self._storage.get_trial_id_from_study_id_trial_number(self._study_id, number)
        self._storage.record_heartbeat(tid)
        with self._lock:
            self._ids[number] = tid

    def discard(self, number: int) -> None:
        """Stop beating for trial `number` (it finished or was lost)."""
        with self._lock:
            self._ids.pop(number, None)

    def stop(self) -> None:
        """Stop the thread; trials still listed will go stale after the grace period."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                ids = list(self._ids.values())
            for tid in ids:
                try:
                    self._storage.record_heartbeat(tid)
                except Exception as e:  # noqa: BLE001 - a missed beat must not kill the tuner
                    logger.warning("could not record a heartbeat: %s", e)


def fail_stale(study) -> list[int]:
    """Fail RUNNING trials whose heartbeat is older than the grace period (Optuna's
    `fail_stale_trials`, which also queues their one retry). Returns the numbers of the trials that
    are now FAIL for that reason (by this call or a concurrent tuner's)."""
    before = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    if not before:
        return []
    now = {t.number: t for t in study.get_trials(deepcopy=False)}
    return [n for n in before if now[n].state == TrialState.FAIL and "failure_kind" not in now[n].user_attrs]


# status and claims --------------------------------------------------------------------------------

def failure_kind(trial) -> str:
    """The failure kind of a FAIL trial (FrozenTrial or a `trial_rows` dict): what the backend
    reported, or `interrupted` when the trial was failed without one (heartbeat gone stale)."""
    attrs = trial.user_attrs if hasattr(trial, "user_attrs") else trial
    return attrs.get("failure_kind") or INTERRUPTED


def is_real_failure(trial) -> bool:
    """A FAIL that is a property of the plan (trials.base.FAILURE_KINDS), not an interruption."""
    return failure_kind(trial) in FAILURE_KINDS


def plan_status(study, trials=None) -> dict:
    """plan -> {'complete': n, 'running': n, 'failed': n (real failures), 'interrupted': n}.
    Queued retries (WAITING) are not counted: they run when a tuner next asks for a trial."""
    st: dict = {}
    for t in trials if trials is not None else study.get_trials(deepcopy=False):
        p = t.user_attrs.get("plan")
        if not p or t.state == TrialState.WAITING:
            continue
        s = st.setdefault(p, {"complete": 0, "running": 0, "failed": 0, "interrupted": 0})
        if t.state == TrialState.COMPLETE:
            s["complete"] += 1
        elif t.state == TrialState.RUNNING:
            s["running"] += 1
        elif t.state == TrialState.FAIL:
            s["failed" if is_real_failure(t) else "interrupted"] += 1
    return st


def eligible(status: dict, plan: str) -> bool:
    """Whether `plan` may be claimed: never run, or interrupted once (its one retry)."""
    s = status.get(plan)
    if s is None:
        return True
    return not (s["complete"] or s["running"] or s["failed"]) and s["interrupted"] <= 1


def _ask(study):
    with warnings.catch_warnings():
        # Optuna warns that heartbeats are meant for Study.optimize; `Heartbeat` records them here.
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
        return study.ask()


def claim(study, plan: str, attrs: dict | Callable[[str], dict] | None = None, *, heartbeat: Heartbeat | None = None):
    """Create a trial for `plan` and own it, or return None if another trial has it.

    Args:
        study: the Optuna study.
        plan: canonical plan string wanted. If Optuna hands out a queued retry instead, the claim
            is for the retry's plan: read the owned plan from `trial.user_attrs["plan"]`.
        attrs: user attributes to write once the trial is owned: a dict, or a function of the
            owned plan returning one.
        heartbeat: records the trial's heartbeat from the moment it exists; the caller discards it
            when the trial finishes.

    Returns:
        The owned RUNNING `optuna.Trial` (with the plan's params and `attempt` recorded), or None.
    """
    trial = _ask(study)
    if heartbeat is not None:
        heartbeat.add(trial.number)
    retry_plan = trial.user_attrs.get("plan")  # a queued retry carries its plan
    if retry_plan:
        plan = retry_plan
    else:
        trial.set_user_attr("plan", plan)
    deadline = time.monotonic() + CLAIM_WAIT_S
    while True:
        trials = study.get_trials(deepcopy=False)
        pending = [t for t in trials if t.number < trial.number and t.state == TrialState.RUNNING
                   and "plan" not in t.user_attrs]
        if pending and time.monotonic() < deadline:
            time.sleep(0.2)
            continue
        break
    interrupted = 0
    for t in trials:
        if t.number == trial.number or t.user_attrs.get("plan") != plan:
            continue
        taken = (t.state == TrialState.COMPLETE
                 or (t.state == TrialState.RUNNING and t.number < trial.number)
                 or (t.state == TrialState.FAIL and is_real_failure(t)))
        if taken:
            _lose(study, trial, heartbeat, "claim_lost_to", t.number)
            return None
        interrupted += t.state == TrialState.FAIL
    if interrupted > 1:  # the one retry was spent (e.g. a queued retry of a plan already re-run)
        _lose(study, trial, heartbeat, "claim_refused", f"{plan} was interrupted {interrupted} times")
        return None
    for k, v in (attrs(plan) if callable(attrs) else attrs or {}).items():
        trial.set_user_attr(k, v)
    trial.set_user_attr("owner", OWNER)
    trial.set_user_attr("attempt", 1 + interrupted)
    trial.set_user_attr("started_unix", time.time())
    _record_params(trial, plan)
    return trial


def _lose(study, trial, heartbeat, key, value) -> None:
    trial.set_user_attr(key, value)
    study.tell(trial, state=TrialState.PRUNED)
    if heartbeat is not None:
        heartbeat.discard(trial.number)


def record(study, trial, result: dict) -> None:
    """Store a backend result (Measurement/Failure .to_dict()) and finish the trial."""
    trial.set_user_attr("finished_unix", time.time())
    if result.get("nodes"):  # the Ray node id of each rank, space-separated
        trial.set_user_attr("nodes", " ".join(result["nodes"]))
    if result.get("ok"):
        trial.set_user_attr("measured_step_time_s", float(result["step_time_s"]))
        trial.set_user_attr("measured_tokens_per_s_per_gpu", float(result["tokens_per_s_per_gpu"]))
        trial.set_user_attr("measured_step_time_spread_s", float(result.get("step_time_spread_s", 0.0)))
        trial.set_user_attr("measured_peak_memory_gib", max(result.get("peak_memory_gib") or [0.0]))
        trial.set_user_attr("measured_step_times_s", list(result.get("step_times_s", ())))
        trial.set_user_attr("losses", list(result.get("losses", ())))
        for k, v in result.get("attrs", {}).items():  # mode-specific measurements (serving: TTFT, TPOT)
            trial.set_user_attr(k, v)
        trial.set_user_attr("failure_kind", "")
        study.tell(trial, float(result["tokens_per_s_per_gpu"]))
    else:
        trial.set_user_attr("failure_kind", result.get("kind", "crash"))
        trial.set_user_attr("failure_message", str(result.get("message", ""))[-2000:])
        study.tell(trial, state=TrialState.FAIL)


def mark_interrupted(study, trial, why: str = "tuner interrupted") -> None:
    """Fail a trial this process owns because the tuner stops (its plan stays eligible for one retry)."""
    try:
        trial.set_user_attr("failure_kind", INTERRUPTED)
        trial.set_user_attr("failure_message", why)
        study.tell(trial, state=TrialState.FAIL)
    except Exception as e:  # noqa: BLE001 - best effort on the way out; the heartbeat covers the rest
        logger.warning("could not mark trial #%d interrupted: %s", trial.number, e)


def trial_rows(study) -> list[dict]:
    """One dict per trial that names a plan: number, state, value and every user attribute; a
    FAIL without a failure kind (failed for a stale heartbeat) reads `interrupted`."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        if "plan" not in t.user_attrs:
            continue
        row = {"number": t.number, "state": t.state.name, "value": t.value, **t.user_attrs}
        if t.state == TrialState.FAIL and not row.get("failure_kind"):
            row["failure_kind"] = INTERRUPTED
            row.setdefault("failure_message", "no heartbeat within the grace period: its tuner died")
        rows.append(row)
    return rows
