"""How to run a study (`TuneOptions`, the `moetune tune` flags) and what a run leaves (`TuneResult`).
One set of options for both modes (tuner/study/modes.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specs.errors import UsageError
from tuner.study.storage import DEFAULT_HEARTBEAT_S


@dataclass(frozen=True)
class TuneOptions:
    """How to run a study (the `moetune tune` flags); what is tuned is the mode's (tuner/study/modes.py).

    Attributes:
        study: study name. study_dir: its folder (pre-registration, report, default storage).
        storage: Optuna storage URL or `journal:<path>`; None: SQLite in the study folder.
        trials: searched trials to run (the baseline comes on top).
        baseline: baseline plan text; None: the mode's hand-tuned baseline (`StudyMode.baseline`).
        backend: a trial backend name (`trials.get_backend`) or "predict-only" (no trials).
        ray_address: an existing Ray cluster to join; None: start an embedded one.
        dashboard: start the Ray dashboard and log its address.
        ray_no_auth: start / join Ray without token authentication (explicit opt-out, logged as a
            warning; trials/ray_runtime.py).
        trial_timeout_s: seconds after which the backend kills a trial.
        memory_cap_gib: per-rank memory cap (OOM beyond it); None: the device's.
        iters, warmup: timed and warm-up iterations per trial.
        level: plan-space level to screen, "core" or "full" (training).
        screen_actors: Ray actors scoring the space (training).
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
    complete: str = "best"  # how a partial training `baseline` is completed (tuner.rank.complete.complete)
    backend: str = "megatron"
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
    heartbeat_interval_s: int = DEFAULT_HEARTBEAT_S
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
