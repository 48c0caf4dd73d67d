"""The cost-model-guided sampler of `moetune tune` (an ask/tell proposer over the screened pool).

For every untried plan of the pool it estimates the step time as

    mean = scale * raw_predicted * exp(local)        (log space: log mean = log(scale*raw) + local)

- `scale`: the single calibration term refitted on every measured (raw prediction, measurement)
  pair (`cost_model.calibration.fit_calibration`, robust LSQ on log step time);
- `local`: what the global scale cannot see: the log residuals of measured plans, averaged with
  weights exp(-d / length) where d is a weighted count of differing plan fields (layout fields
  count 1, mbs and recompute 1, the rest 0.5), shrunk toward 0 by a prior weight;
- uncertainty sigma (log space): the calibration's leave-one-out RMS error (0.3 until two pairs
  exist), shrunk where measured neighbours are close.

It proposes the plan with the highest UCB on throughput, tokens/s ∝ 1/mean x exp(beta x sigma),
so near-ties are broken toward plans unlike those already measured. Failed plans (OOM, crash, ...)
are excluded; nothing tried is proposed again.

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


class GuidedSampler:
    def __init__(self, pool, *, beta: float = 1.0, length: float = 1.5, parse=Plan.parse, fit=None,
                 scale: float = 1.0):
        """pool: Scored rows (tuner.screen) or dicts with plan/raw_step_time_s. parse: the plan
        class's parser (serving plans: ServePlan.parse). fit: pairs [(raw, measured, plan)] ->
        (calibration, report with rows[].loo_rel_err); default the training model's
        `cost_model.calibration.fit_calibration`. scale: the calibration term before the first
        refit (the serving study starts from the shipped serving fit)."""
        self.parse, self.fit = parse, fit
        self.rows = {}
        for s in pool:
            d = s if isinstance(s, dict) else s.to_dict()
            self.rows[d["plan"]] = float(d["raw_step_time_s"])
        self.fields = {p: plan_fields(p, parse) for p in self.rows}
        self.beta, self.length = beta, length
        self.measured: dict[str, float] = {}  # plan -> measured step time
        self.raw_measured: dict[str, float] = {}  # plan -> raw prediction for the pair
        self.failed: set[str] = set()
        self.scale, self.sigma0, self.cal, self.cal_report = scale, DEFAULT_SIGMA, None, None

    def add(self, plan: str, raw_pred_s: float) -> None:
        """Add a plan (e.g. the baseline) to the pool if it is not there."""
        self.rows.setdefault(plan, float(raw_pred_s))
        if plan not in self.fields:
            self.fields[plan] = plan_fields(plan, self.parse)

    # feedback -------------------------------------------------------------------------------
    def observe(self, plan: str, measured_step_time_s: float | None, raw_pred_s: float | None = None):
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

    def refit(self):
        """Refit the calibration on all measured pairs; returns (Calibration, report) or None."""
        if not self.measured:
            return None
        pairs = [(self.raw_measured[p], self.measured[p], p) for p in self.measured]
        if self.fit is None:
            from cost_model.calibration import fit_calibration
            self.cal, self.cal_report = fit_calibration(pairs, provenance={"source": "moetune tune trials"})
        else:
            self.cal, self.cal_report = self.fit(pairs)
        self.scale = self.cal.scale
        loo = [r["loo_rel_err"] for r in self.cal_report["rows"] if not math.isnan(r["loo_rel_err"])]
        if len(loo) >= 2:
            self.sigma0 = max(0.02, math.sqrt(sum(math.log1p(e) ** 2 for e in loo) / len(loo)))
        return self.cal, self.cal_report

    # ranking --------------------------------------------------------------------------------
    def estimate(self, plan: str) -> tuple[float, float]:
        """(mean step time s, sigma in log space) for a plan of the pool."""
        base = self.scale * self.rows[plan]
        f = self.fields[plan]
        wsum, rsum, wmax = 0.0, 0.0, 0.0
        for q, m in self.measured.items():
            w = math.exp(-distance(f, self.fields[q]) / self.length)
            r = math.log(m / (self.scale * self.raw_measured[q]))
            wsum += w
            rsum += w * r
            wmax = max(wmax, w)
        local = rsum / (wsum + PRIOR_W)
        sigma = self.sigma0 * math.sqrt(PRIOR_W / (wsum + PRIOR_W)) if self.measured else self.sigma0
        return base * math.exp(local), sigma

    def rank(self, exclude=()) -> list[tuple[str, float, float, float]]:
        """[(plan, ucb_score, mean_step_s, sigma)] best first over untried plans."""
        skip = set(exclude) | set(self.measured) | self.failed
        out = []
        for p in self.rows:
            if p in skip:
                continue
            mean, sigma = self.estimate(p)
            out.append((p, math.exp(self.beta * sigma) / mean, mean, sigma))
        out.sort(key=lambda t: (-t[1], t[0]))
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
