"""Ranking plans by the cost model, and stage 1 of `moetune tune`: screening the realizable plan space
on Ray actors.

`rank_plans` (any stream of plans) and `rank_space` (the realizable plans of a space, fed as
columns without building a Plan per plan) are the one ranking engine: `moetune plans --rank` and the
screening actors both use `rank_space`. It scores plans in chunks with the vectorised cost model
(`cost_model.predict_arrays`, no per-plan Prediction objects) and keeps the best `keep` distinct
feasible plans, plus, with `per_layout`, the best plan of every parallel layout (tp, cp, pp, vpp, ep,
etp). Plans that Megatron runs identically (`tuner.rank.complete.effective_plan`) are one row.

For `moetune tune`, the space (`tuner.space.train.default_space`) is cut into `num_shards` shards
(`iter_realizable`, shard i of n); named actors `moetune-screen-<i>` (fractional CPUs, e.g. 0.25)
each rank the shards handed to them (`score_shard`) and return their pools; the driver merges them
into one ranked pool (`Scored` rows). `tuner.rank.candidates.select_candidates` then takes the top
plans plus a diverse set: the best plan of distinct layouts, not twenty variants of one.

`score_shard`, `rank_space` and `rank_plans` are plain functions: the actors call them, and so can a
caller without Ray.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import numpy as np

LAYOUT_FIELDS = ("tp", "cp", "pp", "vpp", "ep", "etp")
CHUNK = 32768  # big chunks: the table lookups run once per distinct row key per chunk


@dataclass(frozen=True)
class Scored:
    plan: str  # canonical
    step_time_s: float  # calibrated prediction
    raw_step_time_s: float  # before the calibration scale (what fit_calibration takes)
    tokens_per_s_per_gpu: float
    peak_memory_gib: float
    layout: tuple
    mfu: float = field(default=float("nan"), compare=False)
    # canonical string of the plan Megatron would run (tuner.rank.complete.effective_plan); "" = not yet
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


def _score_chunk(workload, pa, plan_at, calibration, tables, keep: int = 1 << 62,
                 per_layout: bool = True, tps_out: list | None = None) -> tuple[list[Scored], int]:
    """(rows that may survive pruning, #plans over the memory budget) for one chunk: `pa` the
    chunk's PlanArrays, `plan_at(i)` its i-th Plan (built only for the rows looked at).
    `tps_out`, when given, receives the chunk's predicted throughputs (every row)."""
    import cost_model
    from tuner.rank.complete import effective_plan
    r = cost_model.predict_arrays(workload, pa, calibration=calibration, tables=tables)
    st = np.asarray(r["step_time_s"], float)
    tps = np.asarray(r["tokens_per_s_per_gpu"], float)
    fits = np.asarray(r["fits"], bool)
    ok = fits & np.isfinite(st) & (st > 0)
    if tps_out is not None:
        tps_out.append(tps)
    model, plans, effective = workload.model, {}, {}

    def config_of(i: int):
        e = effective.get(i)
        if e is None:
            plans[i] = plan_at(i)
            e = effective[i] = effective_plan(plans[i], model)
        return e

    out = []
    for i in _select(tps, ok, _layout_codes(pa) if per_layout else None, keep, config_of):
        e = config_of(int(i))
        p = plans[int(i)]
        canonical = p.canonical()
        out.append(Scored(canonical, float(st[i]), float(r["raw_step_time_s"][i]), float(tps[i]),
                          float(r["peak_memory_gib"][i]), layout_of(p), mfu=float(r["mfu"][i]),
                          effective=canonical if e is p else e.canonical()))
    return out, int((~fits).sum())


def _plan_chunks(plans, chunk: int):
    """(PlanArrays, plan_at) chunks of an iterable of Plans."""
    from cost_model.plans import PlanArrays
    buf: list = []
    for p in plans:
        buf.append(p)
        if len(buf) >= chunk:
            yield PlanArrays.from_plans(buf), buf.__getitem__
            buf = []
    if buf:
        yield PlanArrays.from_plans(buf), buf.__getitem__


# PlanArrays columns a parallel point fixes (tuner.space.train.parallel_points); the rest come from the
# schedule/kernel option.
_POINT_COLS = ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "pp_first", "pp_last", "pp_embedding", "pp_loss")


def _space_chunks(points, chunk: int):
    """(PlanArrays, plan_at) chunks of the realizable plans of a space, straight from its parallel
    points and option columns (`tuner.space.train.iter_realizable_points`): no Plan per plan, only for
    the rows a ranking looks at."""
    from cost_model.plans import PlanArrays
    option_cols, blocks, n = None, [], 0

    def assemble():
        counts = np.array([len(ok) for _, ok, _ in blocks])
        J = np.concatenate([ok for _, ok, _ in blocks])
        layouts: dict = {"": 0}
        cols = {f: np.repeat(np.array([getattr(b, f) for b, _, _ in blocks], np.int64), counts) for f in _POINT_COLS}
        cols["layout"] = np.repeat(np.array([layouts.setdefault(b.pp_layout, len(layouts)) for b, _, _ in blocks],
                                            np.int64), counts)
        cols.update({f: v[J] for f, v in option_cols.items()})
        which = np.repeat(np.arange(len(blocks)), counts)
        taken = list(blocks)

        def plan_at(i: int):
            base, _, options = taken[which[i]]
            sched, kern = options[J[i]]
            return base.replace(**sched, **kern)

        return PlanArrays(int(counts.sum()), cols, list(layouts)), plan_at

    for base, ok, options in points:
        if option_cols is None:  # the same option list for every point of a space
            option_cols = _option_cols(options)
        blocks.append((base, np.asarray(ok, np.int64), options))
        n += len(ok)
        if n >= chunk:
            yield assemble()
            blocks, n = [], 0
    if blocks:
        yield assemble()


def _by_row_key(points) -> list:
    """The parallel points in an order that puts points with the same pp, then the same tp, cp, ep,
    etp and mbs next to each other: the cost model's per-stage arrays are as wide as the largest pp
    of a chunk, and its table lookups run once per distinct row key of a chunk
    (`cost_model.model._row_key`), so grouped points cost far less (DeepSeek-V3: a chunk of one pp
    about half the CPU of a mixed one). The ranking does not depend on the order."""
    return sorted(points, key=lambda pt: (pt[0].pp, pt[0].tp, pt[0].cp, pt[0].ep, pt[0].etp, pt[0].mbs))


def _rank_chunks(workload, chunks, *, tables, calibration, keep: int, per_layout: bool) -> Ranking:
    import cost_model
    tables = cost_model.resolve_tables(workload, tables)
    calibration = cost_model.resolve_calibration(workload, calibration, tables)
    out = Ranking()
    for pa, plan_at in chunks:
        rows, unfit = _score_chunk(workload, pa, plan_at, calibration, tables, keep, per_layout)
        out.seen += pa.n
        out.memory_infeasible += unfit
        out.pool = _prune(out.pool + rows, keep, workload.model, per_layout=per_layout)
    return out


def rank_plans(workload, plans, *, tables=None, calibration=None, keep: int = 2000, per_layout: bool = True,
               chunk: int = CHUNK) -> Ranking:
    """Score the iterable `plans` (Plan objects) with the vectorised cost model, `chunk` plans at a
    time, and keep the best `keep` distinct feasible ones (plus the best of every parallel layout
    when `per_layout`). `tables` / `calibration`: Tables and Calibration objects or paths (None:
    the lookup rules of `cost_model`), resolved once."""
    return _rank_chunks(workload, _plan_chunks(plans, chunk), tables=tables, calibration=calibration,
                        keep=keep, per_layout=per_layout)


def rank_space(workload, space, profile, shard: int = 0, num_shards: int = 1, *, tables=None, calibration=None,
               keep: int = 2000, per_layout: bool = True, chunk: int = CHUNK) -> Ranking:
    """`rank_plans` over the realizable plans of shard `shard` of `num_shards` of `space`
    (`tuner.space.train.default_space`), fed as columns: the same ranking as
    `rank_plans(workload, iter_realizable(space, workload, profile, shard, num_shards))`, faster."""
    from tuner.space.train import iter_realizable_points
    points = _by_row_key(iter_realizable_points(space, workload, profile, shard, num_shards))
    return _rank_chunks(workload, _space_chunks(points, chunk), tables=tables, calibration=calibration,
                        keep=keep, per_layout=per_layout)


# ---- the exact top of a space, by per-point bounds ---------------------------------------------------
# Plan fields that only add work to a step (recompute re-runs forward passes); a plan with them
# reset is the optimistic plan a parallel point's bound is evaluated on.
_RECOMPUTE_RESET = dict(recompute="none", recompute_modules=(), recompute_method="", recompute_layers=0)
# Relative slack for comparing a bound with a score computed in another chunk (table lookups batch
# per chunk, so the same plan can differ in the last bits).
_SLACK = 1e-9
# plans in the first best-first batch of `rank_space_top` (each next one twice as many, up to CHUNK)
_FIRST_BATCH = 512


@dataclass
class TopRanking(Ranking):
    """`Ranking` of `rank_space_top`: `pruned` realizable plans were not scored because the bound of
    their parallel point could not reach the kept pool; `bound_scored` optimistic plans were scored
    for the bounds; `exhaustive` is True when every plan was scored (no pruning, or the fallback
    after a bound was found violated: `bound_violated`)."""
    pruned: int = 0
    pruned_points: int = 0
    points: int = 0
    bound_scored: int = 0
    exhaustive: bool = False
    bound_violated: bool = False


def _optimistic_options(options) -> tuple[list, np.ndarray]:
    """(distinct optimistic options, class of every option): an option's optimistic version has its
    recompute fields reset (`_RECOMPUTE_RESET`)."""
    classes, index = [], {}
    cls = np.empty(len(options), np.int64)
    for j, (sched, kern) in enumerate(options):
        s = {**sched, **_RECOMPUTE_RESET}
        key = (tuple(sorted(s.items())), tuple(sorted(kern.items())))
        if key not in index:
            index[key] = len(classes)
            classes.append((s, kern))
        cls[j] = index[key]
    return classes, cls


def _option_cols(options) -> dict:
    """PlanArrays columns of (schedule, kernel) options, the parallel point's columns left out."""
    from cost_model.plans import PlanArrays
    from specs.plan import Plan
    pa = PlanArrays.from_plans([Plan(**sched, **kern) for sched, kern in options])
    return {f: v for f, v in pa.cols.items() if f not in _POINT_COLS + ("layout",)}


class _Columns:
    """The parallel points of a space as columns, so that any set of (point, option) rows becomes a
    PlanArrays by indexing (no Plan per plan; `plan_at` builds one for the rows a ranking keeps)."""

    def __init__(self, points):
        self.points = points
        layouts: dict = {"": 0}
        self.point_cols = {f: np.array([getattr(b, f) for b, _, _ in points], np.int64) for f in _POINT_COLS}
        self.point_cols["layout"] = np.array([layouts.setdefault(b.pp_layout, len(layouts)) for b, _, _ in points],
                                             np.int64)
        self.layouts = list(layouts)

    def arrays(self, pt: np.ndarray, opt: np.ndarray, option_cols: dict, options: list):
        from cost_model.plans import PlanArrays
        cols = {f: v[pt] for f, v in self.point_cols.items()}
        cols.update({f: v[opt] for f, v in option_cols.items()})

        def plan_at(i: int):
            sched, kern = options[opt[i]]
            return self.points[pt[i]][0].replace(**sched, **kern)

        return PlanArrays(len(pt), cols, self.layouts), plan_at


def rank_space_top(workload, space, profile, shard: int = 0, num_shards: int = 1, *, tables=None,
                   calibration=None, keep: int = 20, chunk: int = CHUNK, prune: bool = True,
                   enough=None) -> TopRanking:
    """The best `keep` distinct feasible plans of the realizable space (shard `shard` of
    `num_shards`), the same pool as `rank_space(..., keep=keep, per_layout=False)` (exhaustive
    scoring), found by branch and bound over (parallel point, optimistic class) groups:

    1. optimistic plans: for every parallel point, one plan per distinct realizable option with
       the recompute fields reset (its class), scored with the real cost model (`predict_arrays`);
       its throughput bounds every realizable plan of that point and class, whether or not the
       optimistic plan fits in memory (recompute only makes the step longer);
    2. the realizable plans are scored in order of their bound, best first, in growing batches,
       and scoring stops at the first plan whose bound is below the `keep`-th best distinct plan
       found so far (every later plan's bound is lower still).

    The bound rests on one property of the model: recompute never makes a predicted step shorter
    (it only adds work: `cost_model.model` hides DP communication under the backward's wall time,
    which grows no more than the step; tests/test_rank_top.py checks it on every preset). It is not
    assumed silently: every plan scored in 2 is checked against its bound, and if any beats it, the
    whole space is scored exhaustively instead (`bound_violated`). `prune=False` scores
    exhaustively from the start.

    `enough(pool)`: when given and False for the pool of `keep` rows, `keep` doubles and step 2
    runs again (the enumeration and the bounds are reused): what `moetune plans` asks for when
    too many rows are predicted-equal variants of one point."""
    import cost_model
    from tuner.space.train import iter_realizable_points
    tables = cost_model.resolve_tables(workload, tables)
    calibration = cost_model.resolve_calibration(workload, calibration, tables)
    points = _by_row_key(iter_realizable_points(space, workload, profile, shard, num_shards))
    if not prune or not points:
        while True:
            r = _rank_chunks(workload, _space_chunks(iter(points), chunk), tables=tables, calibration=calibration,
                             keep=keep, per_layout=False)
            if enough is None or len(r.pool) < keep or enough(r.pool):
                return TopRanking(r.seen, r.memory_infeasible, r.pool, points=len(points), exhaustive=True)
            keep *= 2

    options = points[0][2]  # the same option list for every point of a space
    opt_options, opt_class = _optimistic_options(options)
    cols = _Columns(points)
    # groups: one point's realizable options of one optimistic class. The ok lists are shared by
    # points with one schedule context, so a list's classes and their members are worked out once.
    per_ok: dict = {}
    contexts: list = []  # per ok list: (its classes, the option numbers of each class)
    g_ctx, g_counts = [], []
    for _, ok, _ in points:
        c = per_ok.get(id(ok))
        if c is None:
            oka = np.asarray(ok, np.int64)
            uniq, pos = np.unique(opt_class[oka], return_inverse=True)
            members = np.split(oka[np.argsort(pos.reshape(-1), kind="stable")],
                               np.cumsum(np.bincount(pos.reshape(-1)))[:-1])
            c = per_ok[id(ok)] = len(contexts)
            contexts.append((uniq, members))
        g_ctx.append(c)
        g_counts.append(len(contexts[c][0]))
    g_pt = np.repeat(np.arange(len(points), dtype=np.int32), g_counts)
    g_pos = np.concatenate([np.arange(n, dtype=np.int32) for n in g_counts])
    g_cls = np.concatenate([contexts[c][0] for c in g_ctx])
    ctx_sizes = [np.array([len(m) for m in members], np.int64) for _, members in contexts]
    g_size = np.concatenate([ctx_sizes[c] for c in g_ctx])
    g_ctx = np.repeat(np.asarray(g_ctx, np.int32), g_counts)  # per group from here on
    ngroups, total = len(g_pt), int(g_size.sum())
    out = TopRanking(points=len(points), bound_scored=ngroups)

    # 1. optimistic plans, in point order (few pipeline stages and table lookups per chunk)
    opt_cols = _option_cols(opt_options)
    # Chunks of few stages are made longer (up to 4x): the table lookups, once per distinct row key
    # of a chunk, are most of a chunk's cost there (DeepSeek-V3, pp=4: ~11 us a plan at 64K rows,
    # ~15 at 32K), while the per-stage arrays (rows x pp) stay within what one 32K x 16 chunk holds.
    g_bound = np.empty(ngroups)
    g_pp = cols.point_cols["pp"][g_pt]
    s = 0
    while s < ngroups:
        e = s + chunk * max(1, min(4, 16 // int(g_pp[s])))
        pa, _ = cols.arrays(g_pt[s:e], g_cls[s:e], opt_cols, opt_options)
        tps = np.asarray(cost_model.predict_arrays(workload, pa, tables=tables, calibration=calibration)
                         ["tokens_per_s_per_gpu"], float)
        # a degenerate optimistic plan bounds nothing: its group is scored first
        g_bound[s:e] = np.where(np.isfinite(tps), tps, np.inf)
        s = e

    # 2. groups best first, stop below the keep-th best
    order = np.argsort(-g_bound, kind="stable")
    ends = np.cumsum(g_size[order])  # plans in the first i+1 groups of the order
    option_cols = _option_cols(options)

    def rows_of(groups):
        groups = np.sort(groups)  # point order again: few stages and table lookups per chunk
        opt = np.concatenate([contexts[g_ctx[g]][1][g_pos[g]] for g in groups])
        return np.repeat(g_pt[groups], g_size[groups]), opt, np.repeat(g_bound[groups], g_size[groups])

    while True:
        out.pool, out.memory_infeasible = [], 0
        j, size = 0, min(chunk, _FIRST_BATCH)
        while j < ngroups:
            if len(out.pool) >= keep and g_bound[order[j]] * (1 + _SLACK) < out.pool[keep - 1].tokens_per_s_per_gpu:
                break
            done = ends[j - 1] if j else 0
            j1 = max(j + 1, int(np.searchsorted(ends, done + size, side="right")))
            pt, opt, bound = rows_of(order[j:j1])
            j, size = j1, min(chunk, 2 * size)
            pa, plan_at = cols.arrays(pt, opt, option_cols, options)
            tps: list = []
            scored, unfit = _score_chunk(workload, pa, plan_at, calibration, tables, keep, False, tps)
            if np.any(np.isfinite(tps[0]) & (tps[0] > bound * (1 + _SLACK))):
                r = rank_space_top(workload, space, profile, shard, num_shards, tables=tables,
                                   calibration=calibration, keep=keep, chunk=chunk, prune=False, enough=enough)
                r.bound_violated = True
                return r
            out.memory_infeasible += unfit
            out.pool = _prune(out.pool + scored, keep, workload.model, per_layout=False)
        if enough is None or len(out.pool) < keep or enough(out.pool):
            break
        keep *= 2  # rank deeper: the plans scored so far are scored again, the bounds are kept
    out.seen = total
    out.pruned = total - (int(ends[j - 1]) if j else 0)
    out.pruned_points = len(points) - len(np.unique(g_pt[order[:j]]))
    return out


def score_shard(workload, profile, precision: str, level: str, shard: int, num_shards: int, *,
                calibration=None, keep: int = 2000, tables=None) -> tuple[int, list[Scored]]:
    """Score shard `shard` of `num_shards`: (#realizable plans seen, kept feasible plans)."""
    from tuner.space.train import default_space
    space = default_space(workload, profile, precision, level=level)
    r = rank_space(workload, space, profile, shard, num_shards, tables=tables, calibration=calibration, keep=keep)
    return r.seen, r.pool


def _with_effective(s: Scored, model) -> Scored:
    if s.effective:
        return s
    from specs.plan import Plan
    from tuner.rank.complete import effective_plan
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
    # a layout whose best plan is already listed, or is a configuration already listed (then of the
    # same layout), is represented
    have = {s.plan for s in out} | {s.effective for s in out if s.effective}
    out += [s for s in best_layout.values() if s.plan not in have and (not s.effective or s.effective not in have)]
    return out


def _actor_class():
    import ray

    @ray.remote
    class ScreenActor:
        def __init__(self, workload, profile, precision, level, calibration, keep, tables=None):
            self.args = (workload, profile, precision, level)
            self.calibration, self.keep, self.tables = calibration, keep, tables

        def score(self, shard: int, num_shards: int):
            return score_shard(*self.args, shard, num_shards, calibration=self.calibration, keep=self.keep,
                               tables=self.tables)

    return ScreenActor


def screen(workload, profile, precision: str = "bf16", *, level: str = "core", calibration=None,
           num_actors: int = 4, cpus_per_actor: float = 0.25, shards_per_actor: int = 4,
           keep: int = 2000, progress: bool = True, use_ray: bool = True, tables=None) -> tuple[int, list[Scored]]:
    """Score the whole space; returns (#realizable plans, merged pool ranked by predicted throughput).
    `tables` / `calibration`: the cost model's inputs (objects or paths; None: the lookup rules)."""
    num_shards = max(1, num_actors * shards_per_actor)
    from tqdm import tqdm
    bar = tqdm(total=num_shards, desc="screening shards", unit="shard", disable=not progress)
    total, pool = 0, []
    if not use_ray:
        for i in range(num_shards):
            n, rows = score_shard(workload, profile, precision, level, i, num_shards,
                                  calibration=calibration, keep=keep, tables=tables)
            total += n
            pool = _prune(pool + rows, keep, workload.model)
            bar.update(1)
    else:
        import ray
        cls = _actor_class()
        # named for the dashboard (pid: several tuners may share a cluster); SPREAD: over all nodes
        actors = [cls.options(name=f"moetune-screen-{os.getpid()}-{i}", num_cpus=cpus_per_actor, max_restarts=0,
                              get_if_exists=False, scheduling_strategy="SPREAD").remote(workload, profile, precision, level,
                                                          calibration, keep, tables)
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

