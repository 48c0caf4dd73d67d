"""Stage 1 of `moetune tune`: score the realizable plan space with the cost model on Ray actors.

The space (`tuner.space.default_space`) is cut into `num_shards` shards (`iter_realizable`, shard i of
n); named actors `moetune-screen-<i>` (fractional CPUs, e.g. 0.25) each score the shards handed to
them with the vectorised cost model (`cost_model.predict_arrays`) and return, per shard, the best
`keep` feasible plans plus the best plan of every parallel layout (tp, cp, pp, vpp, ep, etp). The driver
merges them into one ranked pool (`Scored` rows). `select_candidates` then takes the top plans plus a
diverse set: the best plan of distinct layouts, not twenty variants of one.

`score_shard` is a plain function: the actors call it, and so can a caller without Ray.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

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

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layout"] = list(self.layout)
        return d


def layout_of(plan) -> tuple:
    return tuple(getattr(plan, f) for f in LAYOUT_FIELDS)


def _score_chunk(workload, plans, calibration, tables) -> list[Scored]:
    import cost_model
    r = cost_model.predict_arrays(workload, plans, calibration=calibration, tables=tables)
    out = []
    for i, p in enumerate(plans):
        if not bool(r["fits"][i]):
            continue
        st = float(r["step_time_s"][i])
        if not math.isfinite(st) or st <= 0:
            continue
        out.append(Scored(p.canonical(), st, float(r["raw_step_time_s"][i]),
                          float(r["tokens_per_s_per_gpu"][i]), float(r["peak_memory_gib"][i]),
                          layout_of(p)))
    return out


def score_shard(workload, profile, precision: str, level: str, shard: int, num_shards: int, *,
                calibration=None, keep: int = 2000) -> tuple[int, list[Scored]]:
    """Score shard `shard` of `num_shards`: (#realizable plans seen, kept feasible plans)."""
    from cost_model import resolve_tables
    from tuner.space import default_space, iter_realizable
    tables = resolve_tables(workload)
    space = default_space(workload, profile, precision, level=level)
    seen, pool, buf = 0, [], []

    def flush():
        nonlocal pool
        pool.extend(_score_chunk(workload, buf, calibration, tables))
        pool = _prune(pool, keep)
        buf.clear()

    for p in iter_realizable(space, workload, profile, shard, num_shards):
        seen += 1
        buf.append(p)
        if len(buf) >= CHUNK:
            flush()
    if buf:
        flush()
    return seen, pool


def _prune(pool: list[Scored], keep: int) -> list[Scored]:
    """Best `keep` by throughput plus the best of every layout."""
    ranked = sorted(pool, key=lambda s: (-s.tokens_per_s_per_gpu, s.plan))
    out, best_layout = ranked[:keep], {}
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
            pool = _prune(pool + rows, keep)
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
                pool = _prune(pool + rows, keep)
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
