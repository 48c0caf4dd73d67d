"""Heartbeats for Optuna's JournalStorage, which has none of its own (checked in Optuna 5.1).

`HeartbeatJournalStorage` is a JournalStorage that also implements Optuna's heartbeat interface
(`optuna.storages._heartbeat.BaseHeartbeat`, the one RDBStorage implements), so Optuna's own
`fail_stale_trials` and its one-retry callback work on a journal file as they do on a database:

- `record_heartbeat(trial_id)` appends the writer's wall-clock time as the trial's system attribute
  `moetune:heartbeat` (one journal line per beat);
- a RUNNING trial whose last heartbeat is older than the grace period is stale. A trial that never
  recorded a heartbeat is never stale (RDBStorage's rule too), nor one started within the grace
  period (a queued retry inherits its failed trial's old heartbeat attribute).

Liveness is the heartbeat alone, never a PID, so tuners on several hosts sharing the journal file
(a shared file system) see each other's dead trials. The journal has no server clock to time the
beats by (RDBStorage uses the database's): hosts sharing a journal need synchronised clocks (NTP);
a skew below the grace period is harmless.

Failing a stale trial is exactly-once: the journal's replay applies the first FAIL and raises
`UpdateFinishedTrialError` for a later writer's, which `fail_stale_trials` skips, so only one tuner
queues the retry.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from optuna.storages import JournalStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import TrialState

HEARTBEAT_ATTR = "moetune:heartbeat"


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """JournalStorage with heartbeats (see the module docstring)."""

    def __init__(self, backend, *, heartbeat_interval: int, grace_period: int,
                 heartbeat_stale_trial_callback: Callable | None = None):
        """backend: a journal backend (JournalFileBackend); heartbeat_interval, grace_period:
        seconds; heartbeat_stale_trial_callback: run on each trial this process failed as stale."""
        super().__init__(backend)
        if heartbeat_interval < 1 or grace_period < heartbeat_interval:
            raise ValueError(f"need heartbeat_interval >= 1 and grace_period >= it, got {heartbeat_interval}, {grace_period}")
        self._heartbeat_interval = heartbeat_interval
        self._grace_period = grace_period
        self._stale_callback = heartbeat_stale_trial_callback


    def record_heartbeat(self, trial_id: int) -> None:
        self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        stale = []
        for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = t.system_attrs.get(HEARTBEAT_ATTR)
            if beat is None:
                continue
            # A queued retry inherits the failed trial's system attributes, old heartbeat
            # included: a trial is never older than its own start.
            started = t.datetime_start.timestamp() if t.datetime_start else 0.0
            if now - max(float(beat), started) > self._grace_period:
                stale.append(t._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self._heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable | None:
        return self._stale_callback
