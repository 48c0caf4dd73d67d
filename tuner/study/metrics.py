"""A study's live figures as Ray custom metrics (ray.util.metrics), seen in Ray's dashboard and
its Prometheus export (`ray_<name>{study=...}` on each node's metrics port).

- moetune_trials_completed (counter): measured trials;
- moetune_trials_failed{kind} (counter): failed trials by failure kind (oom, crash, ...);
- moetune_best_tokens_per_s_per_gpu (gauge): best measured throughput so far;
- moetune_last_prediction_error (gauge): (predicted - measured) / measured step time of the last
  measured trial, at the calibration it was predicted with;
- moetune_plans_screened_per_s (gauge): realizable plans the screening actors scored per second.
Recorded by the tuner process (the Ray driver); they are absent when Ray is not initialised.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class StudyMetrics:
    def __init__(self, study: str):
        from ray.util.metrics import Counter, Gauge
        self.tags = {"study": study}
        self.completed = Counter("moetune_trials_completed", description="Measured trials.", tag_keys=("study",))
        self.failed = Counter("moetune_trials_failed", description="Failed trials by kind.",
                              tag_keys=("study", "kind"))
        self.best = Gauge("moetune_best_tokens_per_s_per_gpu", description="Best measured tokens/s/GPU.",
                          tag_keys=("study",))
        self.pred_err = Gauge("moetune_last_prediction_error",
                              description="(predicted - measured) / measured step time of the last measured trial.",
                              tag_keys=("study",))
        self.screen_rate = Gauge("moetune_plans_screened_per_s", description="Plans screened per second.",
                                 tag_keys=("study",))
        self._best = 0.0
        self._last: dict = {}  # gauge -> last value, re-set by refresh()

    def trial(self, result: dict, predicted_step_time_s: float | None) -> None:
        if result.get("ok"):
            self.completed.inc(1, tags=self.tags)
            self._best = max(self._best, float(result["tokens_per_s_per_gpu"]))
            self._set(self.best, self._best)
            measured = float(result["step_time_s"])
            if predicted_step_time_s and measured > 0:
                self._set(self.pred_err, (predicted_step_time_s - measured) / measured)
        else:
            self.failed.inc(1, tags=dict(self.tags, kind=str(result.get("kind", "crash"))))

    def screened(self, plans: int, seconds: float) -> None:
        if seconds > 0:
            self._set(self.screen_rate, plans / seconds)

    def _set(self, gauge, value: float) -> None:
        self._last[gauge] = value
        gauge.set(value, tags=self.tags)

    def refresh(self) -> None:
        """Re-set every gauge: Ray exports a gauge only for the interval it was set in, and the
        dashboard should show the study's figures for as long as it runs."""
        for gauge, value in self._last.items():
            gauge.set(value, tags=self.tags)


def study_metrics(study: str) -> StudyMetrics | None:
    """The study's metrics, or None when Ray's metrics are not available (Ray not initialised)."""
    import ray
    if not ray.is_initialized():
        return None
    try:
        return StudyMetrics(study)
    except (ImportError, ValueError, RuntimeError) as e:
        logger.warning("Ray metrics unavailable: %s", e)
        return None
