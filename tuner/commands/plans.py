"""`moetune plans`: the size of a workload's plan space, how much of it is realizable, why the rest
is not, and examples; `--rank` ranks realizable plans by the cost model's predicted throughput."""
from __future__ import annotations

import json
import sys
import time

from specs.errors import UsageError
from tuner.commands.common import add_stack_arg, add_workload_args, workload_from_args


def add_parser(subparsers):
    p = subparsers.add_parser("plans", help="enumerate the realizable plan space of a workload")
    add_workload_args(p)
    add_stack_arg(p)
    p.add_argument("--level", choices=["full", "core"], default="full",
                   help="full: every option of every tier; core: schedule flags at their best values")
    p.add_argument("--shard", default="0/1", help="enumerate shard i of n, written i/n (default 0/1)")
    p.add_argument("--examples", type=int, default=5)
    p.add_argument("--rank", action="store_true", help="rank realizable plans by predicted throughput")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--json", action="store_true")
    return p


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard must look like i/n, got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise UsageError(f"--shard {text}: need 0 <= i < n")
    return i, n


class _Progress:
    """A tqdm bar that appears only once the walk has taken over a second."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.bar, self.t0, self.last = total, enabled, None, time.time(), 0

    def __call__(self, i: int) -> None:
        if not self.enabled:
            return
        if self.bar is None and time.time() - self.t0 > 1.0:
            from tqdm import tqdm
            self.bar = tqdm(total=self.total, unit="pt", desc="parallel points", file=sys.stderr)
        if self.bar is not None:
            self.bar.update(i - self.last)
        self.last = i

    def close(self):
        if self.bar is not None:
            self.bar.update(self.total - self.last)
            self.bar.close()


def run(args) -> int:
    from clusters import precision_recipe
    from specs.stack import profile_for
    from tuner.space import count_parallel_points, default_space, summarize
    w = workload_from_args(args)
    precision_recipe(args.precision, w.cluster)  # bad name, or fp8 on hardware without it: exit 2
    profile = profile_for(w.cluster, args.stack)
    shard, nshards = _shard(args.shard)
    space = default_space(w, profile, args.precision, level=args.level)
    t0 = time.time()
    points = count_parallel_points(space)
    prog = _Progress(points, enabled=not args.json and sys.stderr.isatty())
    s = summarize(space, w, profile, shard, nshards, max_examples=args.examples, progress=prog,
                  example_stride=max(1, points // max(1, 8 * args.examples)))
    prog.close()
    elapsed = time.time() - t0
    ranked = _rank(w, space, profile, shard, nshards, args.top) if args.rank else None
    if args.json:
        print(json.dumps({
            "model": w.model.name, "cluster": w.cluster.kind, "gpus": w.world, "gbs": w.gbs,
            "seq": w.seq, "precision": args.precision, "stack": profile.name, "level": args.level,
            "shard": [shard, nshards], "space_size": s.total, "realizable": s.realizable,
            "parallel_points": s.parallel_points,
            "rejections": dict(s.rejections.most_common()),
            "rejection_examples": {k: {"plan": p, "reason": r} for k, (p, r) in s.rejected_examples.items()},
            "examples": [p.canonical() for p in s.examples],
            "ranked": ranked, "elapsed_s": round(elapsed, 3)}, indent=1))
        return 0
    print(f"{w.model.name} on {w.world} x {w.cluster.kind}, gbs {w.gbs}, seq {w.seq}, "
          f"precision {args.precision}, stack {profile.describe()}")
    print(f"plan space ({args.level}, shard {shard}/{nshards}): {s.total:,} plans "
          f"({s.parallel_points:,} parallel points x {space.options_per_point:,} schedule/kernel options)")
    pct = 100.0 * s.realizable / s.total if s.total else 0.0
    print(f"realizable: {s.realizable:,} ({pct:.2f}%)   [{elapsed:.1f} s]")
    if s.rejections:
        print("rejections by reason (a plan may have several):")
        width = max(s.rejections.values())
        for code, n in s.rejections.most_common():
            bar = "#" * max(1, round(30 * n / width))
            print(f"  {code:26s} {n:>15,}  {bar}")
            plan, sentence = s.rejected_examples[code]
            print(f"  {'':26s} e.g. {sentence}")
    if s.examples:
        print("realizable examples:")
        for p in s.examples:
            print(f"  {p.canonical()}")
    if ranked is not None:
        print(f"top {len(ranked['plans'])} by predicted tokens/s/GPU "
              f"({ranked['scored']:,} realizable plans scored, {ranked['memory_infeasible']:,} memory-infeasible excluded):")
        for code, n in ranked["infeasible_reasons"].items():
            print(f"  excluded: {n:,} x {code}")
        for r in ranked["plans"]:
            print(f"  {r['tokens_per_s_per_gpu']:>10,.0f} tok/s/GPU  {r['step_time_s']:8.3f} s  "
                  f"{r['peak_memory_gib']:6.1f} GiB  {r['plan']}")
    return 0


def _rank(w, space, profile, shard, nshards, top, chunk=20000):
    """Score realizable plans in chunks with the vectorised cost model; keep the top ones."""
    import heapq
    from collections import Counter

    import cost_model
    from tuner.space import iter_realizable
    best: list = []
    scored = infeasible = 0
    reasons: Counter = Counter()
    batch = []

    def flush():
        nonlocal scored, infeasible
        if not batch:
            return
        for plan, pred in zip(batch, cost_model.predict_many(w, batch)):
            scored += 1
            if not pred.feasible:
                infeasible += 1
                for r in pred.reasons:
                    reasons[r.split(":")[0]] += 1
                continue
            item = (pred.tokens_per_s_per_gpu, plan.canonical(), pred)
            if len(best) < top:
                heapq.heappush(best, item)
            elif item[0] > best[0][0]:
                heapq.heapreplace(best, item)
        batch.clear()

    for plan in iter_realizable(space, w, profile, shard, nshards):
        batch.append(plan)
        if len(batch) >= chunk:
            flush()
    flush()
    rows = [{"plan": p, "tokens_per_s_per_gpu": t, "step_time_s": pred.step_time_s,
             "peak_memory_gib": pred.peak_memory_gib, "mfu": pred.mfu}
            for t, p, pred in sorted(best, reverse=True)]
    return {"plans": rows, "scored": scored, "memory_infeasible": infeasible,
            "infeasible_reasons": dict(reasons.most_common())}
