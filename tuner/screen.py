"""Ranking plans by the cost model, and stage 1 of `moetune tune`: screening the realizable plan space
on Ray actors.

`rank_plans` is the one ranking engine (`moetune plans --rank` and the screening actors both use
it): it scores a stream of plans in chunks with the vectorised cost model
(`cost_model.predict_arrays`, no per-plan Prediction objects) and keeps the best `keep` distinct
feasible plans, plus, with `per_layout`, the best plan of every parallel layout (tp, cp, pp, vpp, ep,
etp). Plans that Megatron runs identically (`tuner.complete.effective_plan`) are one row.

For `moetune tune`, the space (`tuner.space.default_space`) is cut into `num_shards` shards
(`iter_realizable`, shard i of n); named actors `moetune-screen-<i>` (fractional CPUs, e.g. 0.25)
each rank the shards handed to them (`score_shard`) and return their pools; the driver merges them
into one ranked pool (`Scored` rows). `select_candidates` then takes the top plans plus a diverse set:
the best plan of distinct layouts, not twenty variants of one.

`score_shard` and `rank_plans` are plain functions: the actors call them, and so can a caller without Ray.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

LAYOUT_FIELDS = ("tp", "cp", "pp", "vpp", "ep", "etp")
CHUNK = 4096


@dataclass(frozen=True)
class Scored:
    plan: str  # canonical
    step_time_s: float  # calibrated prediction
    raw_step_time_s: float  # before the calibration scale (what fit_calibration takes)
    tokens_per_s_per_gpu: float
    peak_memory_gib: float
    layout: tuple
    mfu: float = field(default=float("nan"), compare=False)
    # canonical string of the plan Megatron would run (tuner.complete.effective_plan); "" = not yet
    # worked out. Rows with the same one are one configuration.
    effective: str = field(default="", compare=False, repr=False)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["layout"] = list(self.layout)
        del d["effective"]
        return d


def layout_of(plan) -> tuple:
    return tuple(getattr(plan, f) for f in LAYOUT_FIELDS)


@dataclass
class Ranking:
    """What `rank_plans` saw: `seen` plans scored, `memory_infeasible` of them over the memory
    budget (excluded), `pool` the kept feasible rows ranked by predicted throughput."""
    seen: int = 0
    memory_infeasible: int = 0
    pool: list = field(default_factory=list)


def _select(tps: np.ndarray, ok: np.ndarray, layout_code: np.ndarray | None, keep: int,
            config_of=None) -> np.ndarray:
    """Indices of a chunk that can survive `_prune`: every plan up to the `keep`-th best distinct
    configuration (`config_of(i)`: its effective plan; without it every plan is distinct) and,
    when `layout_code` is given, the best of every layout, ties included on both counts, so that
    the pruned pool is the same as if every feasible plan of the chunk had been added."""
    idx = np.flatnonzero(ok)
    if len(idx) == 0:
        return idx
    t = tps[idx]
    if len(idx) <= keep:
        chosen = np.ones(len(idx), bool)
    elif config_of is None:
        cut = np.partition(t, len(t) - keep)[len(t) - keep]  # the keep-th largest throughput
        chosen = t >= cut
    else:
        chosen = np.zeros(len(idx), bool)
        configs: set = set()
        last = np.inf
        for j in np.argsort(-t, kind="stable"):
            if len(configs) >= keep and t[j] < last:
                break
            configs.add(config_of(int(idx[j])))
            chosen[j], last = True, t[j]
    if layout_code is not None:
        codes = layout_code[idx]
        uniq, inv = np.unique(codes, return_inverse=True)
        best = np.full(len(uniq), -np.inf)
        np.maximum.at(best, inv, t)
        chosen |= t >= best[inv]
    return idx[chosen]


def _layout_codes(pa) -> np.ndarray:
    code = np.zeros(pa.n, dtype=np.int64)
    for f in LAYOUT_FIELDS:
        col = getattr(pa, f)
        code = code * (int(col.max()) + 1) + col
    return code


def _score_chunk(workload, plans, calibration, tables, keep: int = 1 << 62,
                 per_layout: bool = True) -> tuple[list[Scored], int]:
    """(rows that may survive pruning, #plans over the memory budget) for one chunk of plans."""
    import cost_model
    from cost_model.plans import PlanArrays
    from tuner.complete import effective_plan
    pa = PlanArrays.from_plans(plans)
    r = cost_model.predict_arrays(workload, pa, calibration=calibration, tables=tables)
    st = np.asarray(r["step_time_s"], float)
    tps = np.asarray(r["tokens_per_s_per_gpu"], float)
    fits = np.asarray(r["fits"], bool)
    ok = fits & np.isfinite(st) & (st > 0)
    model, effective = workload.model, {}

    def config_of(i: int):
        e = effective.get(i)
        if e is None:
            e = effective[i] = effective_plan(plans[i], model)
        return e

    out = []
    for i in _select(tps, ok, _layout_codes(pa) if per_layout else None, keep, config_of):
        p, e = plans[i], config_of(int(i))
        canonical = p.canonical()
        out.append(Scored(canonical, float(st[i]), float(r["raw_step_time_s"][i]), float(tps[i]),
                          float(r["peak_memory_gib"][i]), layout_of(p), mfu=float(r["mfu"][i]),
                          effective=canonical if e is p else e.canonical()))
    return out, int((~fits).sum())


def rank_plans(workload, plans, *, tables=None, calibration=None, keep: int = 2000, per_layout: bool = True,
               chunk: int = CHUNK, ranking: Ranking | None = None) -> Ranking:
    """Score the iterable `plans` (Plan objects, e.g. `tuner.space.iter_realizable`) with the vectorised
    cost model, `chunk` plans at a time, and keep the best `keep` distinct feasible ones (plus the best
    of every parallel layout when `per_layout`). `tables` / `calibration`: Tables and Calibration
    objects or paths (None: the lookup rules of `cost_model`). Resolved once here, not per chunk.
    Pass `ranking` to continue one."""
    import cost_model
    tables = cost_model.resolve_tables(workload, tables)
    calibration = cost_model.resolve_calibration(workload, calibration, tables)
    out = ranking or Ranking()
    buf: list = []

    def flush():
        rows, unfit = _score_chunk(workload, buf, calibration, tables, keep, per_layout)
        out.seen += len(buf)
        out.memory_infeasible += unfit
        out.pool = _prune(out.pool + rows, keep, workload.model, per_layout=per_layout)
        buf.clear()

    for p in plans:
        buf.append(p)
        if len(buf) >= chunk:
            flush()
    if buf:
        flush()
    return out


def score_shard(workload, profile, precision: str, level: str, shard: int, num_shards: int, *,
                calibration=None, keep: int = 2000, tables=None) -> tuple[int, list[Scored]]:
    """Score shard `shard` of `num_shards`: (#realizable plans seen, kept feasible plans)."""
    from tuner.space import default_space, iter_realizable
    space = default_space(workload, profile, precision, level=level)
    r = rank_plans(workload, iter_realizable(space, workload, profile, shard, num_shards),
                   tables=tables, calibration=calibration, keep=keep)
    return r.seen, r.pool


def _with_effective(s: Scored, model) -> Scored:
    if s.effective:
        return s
    from specs.plan import Plan
    from tuner.complete import effective_plan
    return dataclasses.replace(s, effective=effective_plan(Plan.parse(s.plan), model).canonical())


def _prune(pool: list[Scored], keep: int, model=None, *, per_layout: bool = True) -> list[Scored]:
    """Best `keep` by throughput (one row per configuration when `model` is given: rows whose
    effective plan was already listed are dropped), plus the best of every layout."""
    ranked = sorted(pool, key=lambda s: (-s.tokens_per_s_per_gpu, s.plan))
    if model is None:
        out = ranked[:keep]
    else:
        out, configs = [], {}
        for s in ranked:
            if len(out) >= keep:
                break
            s = _with_effective(s, model)
            j = configs.get(s.effective)
            if j is None:
                configs[s.effective] = len(out)
                out.append(s)
            elif s.plan == s.effective and out[j].plan != out[j].effective and \
                    s.tokens_per_s_per_gpu == out[j].tokens_per_s_per_gpu:
                out[j] = s  # of equals, show the plan without the flags Megatron ignores
    if not per_layout:
        return out
    best_layout: dict = {}
    for s in ranked:
        best_layout.setdefault(s.layout, s)
    have = {s.plan for s in out}
    out += [s for s in best_layout.values() if s.plan not in have]
    return out


def _actor_class():
    import ray

    @ray.remote
    class ScreenActor:
        def __init__(self, workload, profile, precision, level, calibration, keep):
            self.args = (workload, profile, precision, level)
            self.calibration, self.keep = calibration, keep

        def score(self, shard: int, num_shards: int):
            return score_shard(*self.args, shard, num_shards, calibration=self.calibration, keep=self.keep)

    return ScreenActor


def screen(workload, profile, precision: str = "bf16", *, level: str = "core", calibration=None,
           num_actors: int = 4, cpus_per_actor: float = 0.25, shards_per_actor: int = 4,
           keep: int = 2000, progress: bool = True, use_ray: bool = True) -> tuple[int, list[Scored]]:
    """Score the whole space; returns (#realizable plans, merged pool ranked by predicted throughput)."""
    num_shards = max(1, num_actors * shards_per_actor)
    from tqdm import tqdm
    bar = tqdm(total=num_shards, desc="screening shards", unit="shard", disable=not progress)
    total, pool = 0, []
    if not use_ray:
        for i in range(num_shards):
            n, rows = score_shard(workload, profile, precision, level, i, num_shards,
                                  calibration=calibration, keep=keep)
            total += n
            pool = _prune(pool + rows, keep, workload.model)
            bar.update(1)
    else:
        import ray
        cls = _actor_class()
        actors = [cls.options(name=f"moetune-screen-{i}", num_cpus=cpus_per_actor, max_restarts=0,
                              get_if_exists=False).remote(workload, profile, precision, level,
                                                          calibration, keep)
                  for i in range(num_actors)]
        try:
            pending = [actors[i % num_actors].score.remote(i, num_shards) for i in range(num_shards)]
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                n, rows = ray.get(done[0])
                total += n
                pool = _prune(pool + rows, keep, workload.model)
                bar.update(1)
        finally:
            for a in actors:  # free their CPU share before trials ask for whole cores
                ray.kill(a)
    bar.close()
    return total, sorted(pool, key=lambda s: (-s.tokens_per_s_per_gpu, s.plan))


def select_candidates(pool: list[Scored], n: int, *, diverse_frac: float = 0.5,
                      exclude: set | None = None) -> list[Scored]:
    """`n` plans: about (1 - diverse_frac) of them the top predicted, the rest the best of distinct
    layouts not yet represented (then the next-best of layouts, round robin), ranked order kept."""
    exclude = exclude or set()
    rows = [s for s in pool if s.plan not in exclude]
    n_top = max(1, n - int(n * diverse_frac)) if n > 0 else 0
    chosen, seen_layouts = [], set()
    for s in rows[:n_top]:
        chosen.append(s)
        seen_layouts.add(s.layout)
    have = {s.plan for s in chosen}
    rounds = 0
    while len(chosen) < n and rounds < 64:
        added = False
        used = set()
        for s in rows:
            if len(chosen) >= n:
                break
            if s.plan in have or s.layout in used:
                continue
            if rounds == 0 and s.layout in seen_layouts:
                continue
            chosen.append(s)
            have.add(s.plan)
            used.add(s.layout)
            added = True
        rounds += 1
        if not added and rounds > 1:
            break
    return chosen
