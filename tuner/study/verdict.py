"""The noise-aware verdict of a training study (issue 27): the pre-registered protocol, and the
verdict from the interleaved re-measurement of the baseline and the winner.

A single measurement of each plan on a host whose speed moves by +-15% within minutes says more
about the host than the plans. So at the end of a study the baseline (A) and the winner (B) are
measured again, interleaved A B A B ... for `rounds` rounds, each pair close in time. The ratio is
winner throughput / baseline throughput = mean baseline step / mean winner step (the same tokens
per step). Its interval is a bootstrap: `bootstrap` replicates from a generator seeded with `seed`,
each drawing `rounds` rounds with replacement (a round keeps its A and B together: the pairing
cancels slow drifts of the host) and, inside each drawn measurement, its timed steps with
replacement. The verdict at the bar: PASS when the interval's low end is >= the bar, FAIL when its
high end is below it, INCONCLUSIVE when it straddles the bar. All of it is fixed in the
pre-registration (`protocol`) before the first trial, and `verify_protocol` refuses anything else.
"""
from __future__ import annotations

import math

import numpy as np

from tuner.study.prereg import ACCEPTANCE_RATIO

ROUNDS = 3
BOOTSTRAP = 2000
SEED = 0
INTERVAL = 0.90  # two-sided coverage of the bootstrap interval
ORDER = "interleaved: baseline, winner, baseline, winner, ..."
RULE = ("ratio = winner tok/s/GPU / baseline tok/s/GPU over the interleaved re-measurement; PASS if the "
        "bootstrap interval's low end >= bar, FAIL if its high end < bar, INCONCLUSIVE otherwise")


class ProtocolError(ValueError):
    """A pre-registered adjudication protocol that is malformed, or measurements that break it."""


def protocol(rounds: int = ROUNDS, bootstrap: int = BOOTSTRAP, seed: int = SEED, bar: float = ACCEPTANCE_RATIO,
             interval: float = INTERVAL) -> dict:
    """The adjudication protocol as the pre-registration stores it (validated)."""
    p = {"rounds": int(rounds), "bootstrap": int(bootstrap), "seed": int(seed), "bar": float(bar),
         "interval": float(interval), "order": ORDER, "rule": RULE}
    check_protocol(p)
    return p


def check_protocol(p) -> dict:
    """`p` if it is a well-formed protocol; ProtocolError naming the bad field otherwise."""
    if not isinstance(p, dict):
        raise ProtocolError("the adjudication protocol is not an object")
    need = {"rounds": int, "bootstrap": int, "seed": int, "bar": float, "interval": float}
    for k, typ in need.items():
        if k not in p:
            raise ProtocolError(f"the adjudication protocol lacks {k!r}")
        if not isinstance(p[k], (int, float)) or isinstance(p[k], bool) or (typ is int and int(p[k]) != p[k]):
            raise ProtocolError(f"adjudication protocol: {k} {p[k]!r} is not a number of the right kind")
    if p["rounds"] < 2:
        raise ProtocolError(f"adjudication protocol: rounds {p['rounds']} < 2 (a spread needs two)")
    if p["bootstrap"] < 100:
        raise ProtocolError(f"adjudication protocol: bootstrap {p['bootstrap']} < 100 replicates")
    if not 0 < p["bar"] <= 2:
        raise ProtocolError(f"adjudication protocol: bar {p['bar']} is not in (0, 2]")
    if not 0.5 <= p["interval"] < 1:
        raise ProtocolError(f"adjudication protocol: interval {p['interval']} is not in [0.5, 1)")
    if p.get("order") != ORDER:
        raise ProtocolError(f"adjudication protocol: order {p.get('order')!r} is not {ORDER!r}")
    return p


def schedule(p: dict) -> list[tuple[int, str]]:
    """[(round, role)] in the order the protocol runs them: (0, baseline), (0, winner), (1, ...)."""
    return [(r, role) for r in range(p["rounds"]) for role in ("baseline", "winner")]


def verify_measurements(p: dict, measurements: list[dict], baseline: str, winner: str) -> None:
    """ProtocolError unless `measurements` follow the schedule of `p` (the same plans, rounds and
    order; a failed one recorded as such), as far as they go."""
    want = schedule(p)
    if len(measurements) > len(want):
        raise ProtocolError(f"{len(measurements)} re-measurements recorded, the protocol runs {len(want)}")
    for m, (r, role) in zip(measurements, want):
        plan = baseline if role == "baseline" else winner
        if m.get("round") != r or m.get("role") != role or m.get("plan") != plan:
            raise ProtocolError(f"re-measurement {m.get('round')}/{m.get('role')} of {str(m.get('plan'))[:60]} "
                                f"is not the protocol's round {r} {role}")


def _steps(m: dict) -> np.ndarray:
    s = [float(x) for x in (m.get("step_times_s") or ()) if x and math.isfinite(float(x))]
    return np.array(s or [float(m["step_time_s"])])


def bootstrap_ratio(pairs: list[tuple[dict, dict]], p: dict) -> tuple[float, float, float]:
    """(ratio, low, high): the point ratio mean(baseline steps) / mean(winner steps) over the
    rounds, and the protocol's bootstrap interval (rounds resampled in pairs, steps within each)."""
    base = [_steps(a) for a, _ in pairs]
    win = [_steps(b) for _, b in pairs]
    point = float(np.mean([x.mean() for x in base]) / np.mean([x.mean() for x in win]))
    rng = np.random.default_rng(p["seed"])
    n = len(pairs)
    reps = np.empty(p["bootstrap"])
    for i in range(p["bootstrap"]):
        idx = rng.integers(0, n, n)
        b = np.mean([rng.choice(base[j], len(base[j])).mean() for j in idx])
        w = np.mean([rng.choice(win[j], len(win[j])).mean() for j in idx])
        reps[i] = b / w
    a = (1 - p["interval"]) / 2
    lo, hi = np.quantile(reps, [a, 1 - a])
    return point, float(lo), float(hi)


def decide(pairs: list[tuple[dict, dict]], p: dict) -> dict:
    """{'verdict': PASS|FAIL|INCONCLUSIVE|INCOMPLETE, 'ratio', 'low', 'high', 'rounds'} from the
    complete (baseline, winner) pairs of the re-measurement."""
    if len(pairs) < 2:
        return {"verdict": "INCOMPLETE", "ratio": None, "low": None, "high": None, "rounds": len(pairs)}
    ratio, lo, hi = bootstrap_ratio(pairs, p)
    verdict = "PASS" if lo >= p["bar"] else "FAIL" if hi < p["bar"] else "INCONCLUSIVE"
    return {"verdict": verdict, "ratio": ratio, "low": lo, "high": hi, "rounds": len(pairs)}


def complete_pairs(measurements: list[dict]) -> list[tuple[dict, dict]]:
    """The rounds whose baseline and winner both measured."""
    by_round: dict = {}
    for m in measurements:
        if m.get("ok"):
            by_round.setdefault(m["round"], {})[m["role"]] = m
    return [(d["baseline"], d["winner"]) for _, d in sorted(by_round.items()) if len(d) == 2]
