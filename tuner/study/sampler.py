"""The cost-model-guided sampler of `moetune tune` (an ask/tell proposer over the screened pool).

For every untried plan of the pool it estimates the step time as

    mean = cal(parts) * exp(local)        (log space: log mean = log cal(parts) + local)

- `cal(parts)`: the calibration refitted on every measured trial
  (`cost_model.calibration.fit_calibration`): per component when the sampler knows each plan's
  predicted time per class (`parts`: the training model's breakdown classes), so an error of one
  class (EP communication, say) moves the plans that spend time in it and reorders them; one-scale
  otherwise (serving). A trial that recorded its own per-class split is fitted per class, else on
  its step total;
- `local`: what the calibration cannot see: the log residuals of measured plans, averaged with
  weights exp(-d / length) where d is a weighted count of differing plan fields (layout fields
  count 1, mbs and recompute 1, the rest 0.5), shrunk toward 0 by a prior weight;
- sigma (log space): the calibrated prediction's own sd (`Calibration.log_sd`: the factors'
  covariance and the fit's leave-one-out error; DEFAULT_SIGMA until two trials exist), shrunk where
  measured neighbours are close.

It proposes the plan with the largest expected improvement of throughput (1 / step time, log-normal
under the mean and sigma above) over the best measured plan; before any measurement, the largest
expected throughput. Failed plans (OOM, crash, ...) are excluded; nothing tried is proposed again.

`TPEProposer` wraps Optuna's TPESampler over the same tiers (one categorical per plan field) for the
comparison in `bench/bench_tune.py`.
"""
from __future__ import annotations

import math

from specs.plan import Plan

LAYOUT = ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "recompute")
PRIOR_W = 0.5
DEFAULT_SIGMA = 0.3


def plan_fields(plan: str, parse=Plan.parse) -> dict:
    p = parse(plan)
    return {f: getattr(p, f) for f in p.__dataclass_fields__}


def distance(a: dict, b: dict) -> float:
    d = 0.0
    for k, v in a.items():
        if b.get(k) != v:
            d += 1.0 if k in LAYOUT else 0.5
    return d


def _phi(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _Phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def expected_improvement(mean_s: float, sigma: float, best_s: float | None) -> float:
    """E[max(0, 1/T - 1/best_s)] for log T ~ N(log mean_s, sigma^2) (a log-normal rate 1/T); with
    no measured best, E[1/T]."""
    mu = -math.log(mean_s)  # log-mean of the rate
    if best_s is None:
        return math.exp(mu + sigma * sigma / 2)
    r = 1.0 / best_s
    if sigma <= 0:
        return max(0.0, math.exp(mu) - r)
    d2 = (mu - math.log(r)) / sigma
    return math.exp(mu + sigma * sigma / 2) * _Phi(d2 + sigma) - r * _Phi(d2)


class GuidedSampler:
    def __init__(self, pool, *, length: float = 1.5, parse=Plan.parse, fit=None, calibration=None,
                 scale: float = 1.0, parts=None, classes=None):
        """pool: Scored rows (tuner.rank.train) or dicts with plan/raw_step_time_s. parse: the plan
        class's parser (serving plans: ServePlan.parse). fit: pairs [(raw, measured, plan)] ->
        (calibration, report with rows[].loo_rel_err), a one-scale fit (the serving study's); default
        `cost_model.calibration.fit_calibration`. calibration: the calibration before the first
        refit (default: one-scale `scale`). parts: plans -> [{class: raw seconds}] (the training
        mode's `class_parts`); with it the default fit is per component over `classes`
        (default cost_model.calibration.TRAIN_CLASSES)."""
        from cost_model.calibration import TRAIN_CLASSES, Calibration
        self.parse, self.fit, self._parts_fn = parse, fit, parts
        self.classes = (classes or TRAIN_CLASSES) if parts is not None and fit is None else None
        self.rows = {}
        for s in pool:
            d = s if isinstance(s, dict) else s.to_dict()
            self.rows[d["plan"]] = float(d["raw_step_time_s"])
        self.fields = {p: plan_fields(p, parse) for p in self.rows}
        self.length = length
        self.measured: dict[str, float] = {}  # plan -> measured step time
        self.raw_measured: dict[str, float] = {}  # plan -> raw prediction for the pair
        self.measured_parts: dict[str, dict] = {}  # plan -> the trial's own per-class split
        self.failed: set[str] = set()
        self.parts: dict[str, dict] = {}  # plan -> predicted raw seconds per class
        self.cal = calibration if calibration is not None else Calibration(scale=scale)
        self.cal_report = None

    @property
    def scale(self) -> float:
        return self.cal.scale

    def add(self, plan: str, raw_pred_s: float) -> None:
        """Add a plan (e.g. the baseline) to the pool if it is not there."""
        self.rows.setdefault(plan, float(raw_pred_s))
        if plan not in self.fields:
            self.fields[plan] = plan_fields(plan, self.parse)

    def parts_of(self, plan: str):
        """The plan's predicted raw seconds per class, or its raw total when the sampler is
        one-scale. Computed for every pool plan at once on first use (one vectorised pass)."""
        if self._parts_fn is None:
            return self.rows[plan]
        if plan not in self.parts:
            todo = [p for p in self.rows if p not in self.parts]
            if plan not in todo:
                todo.append(plan)
            self.parts.update(zip(todo, self._parts_fn(todo)))
        return self.parts[plan]

    def predicted(self, plan: str) -> float:
        """The calibrated step time of `plan` (no local correction)."""
        return float(self.cal.apply(self.parts_of(plan)))

    def interval(self, plan: str) -> tuple[float, float]:
        """The calibrated prediction's 90% interval (nan, nan before two trials were fitted)."""
        return self.cal.interval(self.parts_of(plan))

    # feedback -------------------------------------------------------------------------------
    def observe(self, plan: str, measured_step_time_s: float | None, raw_pred_s: float | None = None,
                measured_parts: dict | None = None):
        """A trial's result: its step time (None: the plan failed) and, when the trial recorded it,
        its measured seconds per class."""
        if plan not in self.fields:
            self.fields[plan] = plan_fields(plan, self.parse)
        if raw_pred_s is not None:
            self.rows.setdefault(plan, float(raw_pred_s))
        if measured_step_time_s is None:
            self.failed.add(plan)
            return
        raw = raw_pred_s if raw_pred_s is not None else self.rows.get(plan)
        if raw is None or not raw > 0:
            return
        self.measured[plan] = float(measured_step_time_s)
        self.raw_measured[plan] = float(raw)
        if measured_parts:
            self.measured_parts[plan] = dict(measured_parts)

    def refit(self):
        """Refit the calibration on all measured trials; returns (Calibration, report) or None."""
        if not self.measured:
            return None
        if self.fit is not None:
            pairs = [(self.raw_measured[p], self.measured[p], p) for p in self.measured]
            self.cal, self.cal_report = self.fit(pairs)
            return self.cal, self.cal_report
        from cost_model.calibration import fit_calibration
        pairs = [(self.parts_of(p) if self._parts_fn else self.raw_measured[p], self.measured[p], p,
                  self.measured_parts.get(p)) for p in self.measured]
        self.cal, self.cal_report = fit_calibration(pairs, classes=self.classes,
                                                    provenance={"source": "moetune tune trials"})
        return self.cal, self.cal_report

    # ranking --------------------------------------------------------------------------------
    def sigma0(self, plan: str) -> float:
        sd = self.cal.log_sd(self.parts_of(plan)) if self.cal_report is not None else float("nan")
        return max(0.02, sd) if math.isfinite(sd) else DEFAULT_SIGMA

    def estimate(self, plan: str) -> tuple[float, float]:
        """(mean step time s, sigma in log space) for a plan of the pool."""
        cal_t = self.predicted(plan)
        f = self.fields[plan]
        wsum, rsum = 0.0, 0.0
        for q, m in self.measured.items():
            w = math.exp(-distance(f, self.fields[q]) / self.length)
            r = math.log(m / self.predicted(q))
            wsum += w
            rsum += w * r
        local = rsum / (wsum + PRIOR_W)
        s0 = self.sigma0(plan)
        sigma = s0 * math.sqrt(PRIOR_W / (wsum + PRIOR_W)) if self.measured else s0
        return cal_t * math.exp(local), sigma

    def best_measured(self) -> float | None:
        return min(self.measured.values()) if self.measured else None

    def rank(self, exclude=()) -> list[tuple[str, float, float, float]]:
        """[(plan, expected improvement, mean_step_s, sigma)] best first over untried plans."""
        skip = set(exclude) | set(self.measured) | self.failed
        best = self.best_measured()
        out = []
        for p in self.rows:
            if p in skip:
                continue
            mean, sigma = self.estimate(p)
            out.append((p, expected_improvement(mean, sigma, best), mean, sigma))
        out.sort(key=lambda t: (-t[1], t[2], t[0]))
        return out

    def propose(self, exclude=()) -> str | None:
        r = self.rank(exclude)
        return r[0][0] if r else None


class TPEProposer:
    """Optuna TPE over the plan tiers: one categorical per plan field, choices = the values the
    candidate plans take. A proposal that is not one of the candidates (not realizable / not in the
    space) costs no real trial and is told the worst value (0), as is a failed plan; one already
    measured is told its known value again."""

    def __init__(self, plans, seed: int = 0, n_startup_trials: int = 5):
        import optuna
        self.plans = list(plans)
        self.by_key = {}
        fields = [plan_fields(p) for p in self.plans]
        self.keys = [k for k in fields[0] if len({repr(f[k]) for f in fields}) > 1]
        self.choices = {k: sorted({repr(f[k]) for f in fields}) for k in self.keys}
        for p, f in zip(self.plans, fields):
            self.by_key[tuple(repr(f[k]) for k in self.keys)] = p
        self.study = optuna.create_study(direction="maximize",
                                         sampler=optuna.samplers.TPESampler(seed=seed,
                                                                            n_startup_trials=n_startup_trials))

    def run(self, evaluate, max_asks: int = 2000):
        """Drive TPE with evaluate(plan) -> throughput or None (failed); yields each distinct plan
        evaluated for real, in order."""
        seen: dict[str, float | None] = {}
        for _ in range(max_asks):
            if len(seen) == len(self.plans):
                return
            t = self.study.ask()
            key = tuple(t.suggest_categorical(k, self.choices[k]) for k in self.keys)
            plan = self.by_key.get(key)
            if plan is None:  # not realizable: the worst value, so TPE learns to avoid the region
                self.study.tell(t, 0.0)
                continue
            if plan not in seen:
                seen[plan] = evaluate(plan)
                yield plan
            v = seen[plan]
            self.study.tell(t, 0.0 if v is None else v)
