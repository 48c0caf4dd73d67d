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

The winner's curse: the study's best single measurement is the plan most likely to have had a lucky
one (the maximum of noisy figures is biased up). So before the verdict the `top_k` best measured
searched plans are measured again in `select_rounds` selection rounds (baseline, then each
candidate, close in time), and the winner is the candidate with the lowest mean step over those
re-measurements, not the lucky single measurement. The verdict's rounds then measure the chosen
winner afresh, so its ratio carries no selection bias either. A protocol without `top_k` (studies
pre-registered before it) re-measures the single-measurement best alone, as it did.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from tuner.study.prereg import ACCEPTANCE_RATIO

logger = logging.getLogger(__name__)

ROUNDS = 3
BOOTSTRAP = 2000
SEED = 0
INTERVAL = 0.90  # two-sided coverage of the bootstrap interval
ORDER = "interleaved: baseline, winner, baseline, winner, ..."
# Three candidates, one selection round: 4 more trial runs than re-measuring the lucky best alone
# (about a minute on the quickstart), enough to catch a plan whose single measurement was a fluke.
TOP_K = 3
SELECT_ROUNDS = 1
SELECT_RULE = ("winner = the lowest mean step time over the selection rounds (baseline, then each of the top_k "
               "searched plans by their single study measurement); the verdict's rounds measure it afresh")
RULE = ("ratio = winner tok/s/GPU / baseline tok/s/GPU over the interleaved re-measurement; PASS if the "
        "bootstrap interval's low end >= bar, FAIL if its high end < bar, INCONCLUSIVE otherwise")


class ProtocolError(ValueError):
    """A pre-registered adjudication protocol that is malformed, or measurements that break it."""


def protocol(rounds: int = ROUNDS, bootstrap: int = BOOTSTRAP, seed: int = SEED, bar: float = ACCEPTANCE_RATIO,
             interval: float = INTERVAL, top_k: int = TOP_K, select_rounds: int = SELECT_ROUNDS) -> dict:
    """The adjudication protocol as the pre-registration stores it (validated)."""
    p = {"rounds": int(rounds), "bootstrap": int(bootstrap), "seed": int(seed), "bar": float(bar),
         "interval": float(interval), "order": ORDER, "rule": RULE, "top_k": int(top_k),
         "select_rounds": int(select_rounds), "select_rule": SELECT_RULE}
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
    if "top_k" in p or "select_rounds" in p:  # absent in protocols pre-registered before the selection
        for k in ("top_k", "select_rounds"):
            v = p.get(k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ProtocolError(f"adjudication protocol: {k} {v!r} is not an integer >= 1")
        if p.get("select_rule") != SELECT_RULE:
            raise ProtocolError(f"adjudication protocol: select_rule {p.get('select_rule')!r} is not {SELECT_RULE!r}")
    return p


def candidates(p: dict, rows: list[dict]) -> list[str]:
    """The protocol's `top_k` distinct searched plans by their best single study measurement, best
    first (ties: the earlier trial); one plan for a protocol without `top_k`."""
    done = [r for r in rows if r["state"] == "COMPLETE" and "searched" in str(r.get("roles", ""))]
    order: dict = {}
    for r in sorted(done, key=lambda r: (-r["measured_tokens_per_s_per_gpu"], r["number"])):
        order.setdefault(r["plan"], r)
    return list(order)[:p.get("top_k", 1)]


def choose_winner(candidates_: list[str], baseline: str, selection: list[dict]) -> str:
    """The candidate with the lowest mean step time over its selection re-measurements (the
    baseline's own count when it is a candidate); ties and candidates never measured keep the study's
    order; the study's best when none measured."""
    def mean_step(plan):
        s = [m["step_time_s"] for m in selection if m.get("ok") and m.get("plan") == plan]
        return sum(s) / len(s) if s else math.inf
    return min(candidates_, key=lambda c: (mean_step(c), candidates_.index(c)))


def selection(p: dict, baseline: str, candidates_: list[str]) -> list[dict]:
    """The selection rounds, {'phase': 'select', 'round', 'role', 'plan'} in order: each the
    baseline, then every candidate other than it; none for fewer than two candidates."""
    if len(candidates_) < 2:
        return []
    others = [c for c in candidates_ if c != baseline]
    return [{"phase": "select", "round": r, "role": role, "plan": plan}
            for r in range(p["select_rounds"])
            for role, plan in [("baseline", baseline)] + [("candidate", c) for c in others]]


def winner(p: dict, baseline: str, candidates_: list[str], measurements: list[dict]) -> str | None:
    """The plan the verdict judges: the selection's choice (None while its rounds are incomplete),
    or the only candidate; None without one."""
    sel = selection(p, baseline, candidates_)
    if not sel:
        return candidates_[0] if candidates_ else None
    if len(measurements) < len(sel):
        return None
    return choose_winner(candidates_, baseline, list(measurements[:len(sel)]))


def schedule(p: dict, baseline: str, candidates_: list[str], measurements: list[dict] = ()) -> list[dict]:
    """Every re-measurement the protocol runs, in order, as far as `measurements` (those done)
    settle it: {'phase', 'round', 'role', 'plan'}. The selection rounds, then, once they are done
    and the chosen winner is not the baseline, the verdict's rounds (phase 'verdict': baseline,
    winner, baseline, winner, ...)."""
    out = selection(p, baseline, candidates_)
    w = winner(p, baseline, candidates_, list(measurements))
    if w is None or w == baseline:
        return out
    return out + [{"phase": "verdict", "round": r, "role": role, "plan": baseline if role == "baseline" else w}
                  for r in range(p["rounds"]) for role in ("baseline", "winner")]


def verify_measurements(p: dict, measurements: list[dict], baseline: str, candidates_: list[str]) -> None:
    """ProtocolError unless `measurements` follow the schedule of `p` (the same phases, plans,
    rounds and order; a failed one recorded as such), as far as they go."""
    want = schedule(p, baseline, candidates_, measurements)
    if len(measurements) > len(want):
        raise ProtocolError(f"{len(measurements)} re-measurements recorded, the protocol runs {len(want)}")
    for m, e in zip(measurements, want):
        if (m.get("phase", "verdict") != e["phase"] or m.get("round") != e["round"] or m.get("role") != e["role"]
                or m.get("plan") != e["plan"]):
            raise ProtocolError(f"re-measurement {m.get('round')}/{m.get('role')} of {str(m.get('plan'))[:60]} "
                                f"is not the protocol's {e['phase']} round {e['round']} {e['role']}")


def run(p: dict, baseline: str, candidates_: list[str], done: list[dict], measure, save) -> list[dict]:
    """Run the protocol's re-measurements that `done` lacks, one at a time: `measure(plan)` gives a
    trial result (trials/base.py), `save(done)` stores the list after each (a resumed study goes on
    where it stopped). Returns every re-measurement."""
    done = list(done)
    while True:
        want = schedule(p, baseline, candidates_, done)
        if len(done) >= len(want):
            return done
        e = want[len(done)]
        res = measure(e["plan"])
        m = dict(e, ok=bool(res.get("ok")), finished_unix=time.time())
        if res.get("ok"):
            m.update(step_time_s=float(res["step_time_s"]), step_times_s=[float(x) for x in res["step_times_s"]],
                     tokens_per_s_per_gpu=float(res["tokens_per_s_per_gpu"]))
        else:
            m.update(kind=res.get("kind", "crash"), message=str(res.get("message", ""))[-500:])
        done.append(m)
        save(done)
        logger.info("adjudication %s round %d %s: %s", e["phase"], e["round"] + 1, e["role"],
                    f"{m['tokens_per_s_per_gpu']:.1f} tok/s/GPU" if m["ok"] else f"FAIL {m['kind']}")


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
    """The verdict rounds whose baseline and winner both measured (selection rounds chose the
    winner; they are not its evidence)."""
    by_round: dict = {}
    for m in measurements:
        if m.get("ok") and m.get("phase", "verdict") == "verdict":
            by_round.setdefault(m["round"], {})[m["role"]] = m
    return [(d["baseline"], d["winner"]) for _, d in sorted(by_round.items()) if len(d) == 2]
