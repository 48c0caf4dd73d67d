"""`moetune plans`: the size of a workload's plan space, how much of it is realizable, why the rest
is not, and examples; `--rank` ranks realizable plans by the cost model's predicted throughput."""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from specs.errors import UsageError
from tuner.commands.common import (
    MAX_COUNT,
    add_canonical_arg,
    add_cost_model_args,
    add_stack_arg,
    add_workload_args,
    cost_model_inputs,
    count,
    fmt_gib,
    fmt_seconds,
    plan_text,
    positive_int,
    workload_from_args,
)

SUMMARY = "Count a workload's plan space, how much of it is realizable and why the rest is not."
DESCRIPTION = ("Enumerate the plan space of a workload (parallelism x schedule x kernels), count the "
               "plans the target stack can run, show the rejections by reason with an example each, and "
               "with --rank list the realizable plans the cost model predicts fastest.")


def add_parser(subparsers):
    p = subparsers.add_parser("plans", help=SUMMARY, description=DESCRIPTION)
    p.add_argument("--mode", choices=["train", "serve"], default="train",
                   help="Which plans: train (Megatron training plans, the default) or serve (SGLang serving plans; --gbs not used).")
    add_workload_args(p)
    for a in p._actions:  # serving plans have no global batch; train mode checks it itself
        if a.dest == "gbs":
            a.required = False
            a.help = "Train: global batch size in sequences (required). Serve: not used."
        elif a.dest == "model":
            a.help = "Model to train or serve: a preset name (`moetune list models`), a model YAML file or a Hugging Face config.json."
        elif a.dest == "seq":
            a.help = "Train: sequence length in tokens (default: the model preset's). Serve: not used (--isl / --osl)."
    add_stack_arg(p)
    add_cost_model_args(p)
    p.add_argument("--level", choices=["full", "core"], default="full",
                   help="Train: which space, full (default: every option of every tier) or core (schedule flags at their "
                        "best values; `moetune tune`'s default).")
    p.add_argument("--shard", default="0/1", help="Enumerate only shard i of n, written i/n (default 0/1: all of it).")
    p.add_argument("--examples", type=count(0, MAX_COUNT), default=5,
                   help="How many realizable plans to show as examples (default 5; 0 for none).")
    p.add_argument("--rank", action="store_true",
                   help="Also rank the realizable plans. Train: by predicted tokens/s/GPU, with step time and its 90%% "
                        "interval, MFU and peak memory (memory-infeasible plans excluded). Serve: by goodput, each plan at "
                        "the swept concurrency (or --concurrency) with the most tokens/s/GPU within --ttft-slo/--tpot-slo.")
    p.add_argument("--top", type=positive_int, default=20,
                   help="How many ranked rows to list with --rank (default 20; serve: that many aggregated and that many "
                        "disaggregated).")
    p.add_argument("--distinct", choices=["plan", "parallel"], default="plan",
                   help="With --rank, one row per: plan (default; predicted-equal variants merged, xN) or parallel "
                        "layout (the best plan of each: train tp,cp,pp,ep,etp,mbs; serve tp,pp,dp,attn_dp,ep,pd).")
    p.add_argument("--exhaustive", action="store_true",
                   help="Train, with --rank: score every realizable plan instead of skipping the parallel points whose "
                        "optimistic bound cannot reach the top (the same ranking, slower; for checking).")
    p.add_argument("--json", action="store_true", help="Print the counts, examples and ranking as one JSON object.")
    p.add_argument("--plot", default=None, metavar="DIR",
                   help="With --mode serve --rank: write the Pareto plot (tok/s/GPU against tok/s/user, every plan at "
                        "every swept concurrency within the SLOs) to DIR/pareto.png; nothing is written without it.")
    add_canonical_arg(p)
    from tuner.commands._serving import add_serve_args, add_weight_dtype_arg
    add_serve_args(p)
    add_weight_dtype_arg(p)
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
    if args.mode == "serve":
        return _run_serve(args)
    if args.gbs is None:
        raise UsageError("plans --mode train: --gbs is required")
    if args.plot:
        raise UsageError("--plot is for --mode serve --rank (the serving Pareto plot)")
    from clusters import precision_recipe
    from specs.plan import Plan
    from specs.stack import profile_for
    from tuner.space.train import count_parallel_points, default_space, summarize
    if args.examples < 0:
        raise UsageError(f"--examples must be 0 or more, got {args.examples}")
    w = workload_from_args(args)
    precision_recipe(args.precision, w.cluster)  # bad name, or fp8 on hardware without it: exit 2
    profile = profile_for(w.cluster, args.stack)
    shard, nshards = _shard(args.shard)
    # load (and so check) the tables and calibration before the walk, not after it
    tables, calibration = cost_model_inputs(args, w) if args.rank else (None, None)
    space = default_space(w, profile, args.precision, level=args.level)
    t0 = time.time()
    points = count_parallel_points(space)
    prog = _Progress(points, enabled=not args.json and sys.stderr.isatty())
    s = summarize(space, w, profile, shard, nshards, max_examples=args.examples, progress=prog,
                  example_stride=max(1, points // max(1, 8 * args.examples)))
    prog.close()
    elapsed = time.time() - t0
    ranked = _rank(w, space, profile, shard, nshards, args.top, tables, calibration, not args.exhaustive,
                   distinct=args.distinct) \
        if args.rank else None
    if args.json:
        from tuner.conventions import SCHEMA_VERSION
        print(json.dumps({
            "schema_version": SCHEMA_VERSION, "mode": "train",
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
    _print_rejections(s, count_width=15)
    if s.examples:
        print("realizable examples" + ("" if args.canonical else " (short form: fields other than the completion defaults)") + ":")
        for p in s.examples:
            print(f"  {plan_text(p, w, profile, args.canonical)}")
    if ranked is not None:
        how = ("every one scored" if ranked["exhaustive"] else
               f"{ranked['scored']:,} scored, {ranked['pruned']:,} skipped ({ranked['pruned_points']:,} parallel points "
               "entirely): their optimistic bound, recompute reset, is below the list")
        print(f"top {len(ranked['plans'])} by predicted tokens/s/GPU ({ranked['realizable']:,} realizable plans, {how}; "
              f"{ranked['memory_infeasible']:,} scored plans memory-infeasible, excluded"
              + ("; xN: N plans of one parallel point predicted equal, one row" if any(
                  r["variants"] > 1 for r in ranked["plans"]) else "") + "):")
        if ranked["bound_violated"]:
            print("  note: a scored plan beat its point's bound, so every plan was scored")
        if ranked["plans"] and ranked["plans"][0].get("step_time_interval_s"):
            print("  ~: its 90% interval of step time overlaps the leader's (the calibration's residuals "
                  "cannot tell the two apart)")
        # columns: rank (~: the model cannot tell it from #1, when the calibration gives intervals),
        # predicted tokens/s/GPU, step time (and its 90% interval), MFU, peak memory, predicted-equal variants
        with_iv = any(r.get("step_time_interval_s") for r in ranked["plans"])
        if ranked["plans"]:
            print(f"  {'#':>3} {'tok/s/GPU':>10} {'step':>11}" + (f" {'90% interval s':>15}" if with_iv else "") +
                  f" {'MFU':>6} {'peak mem':>10} {'same':>4}  plan")
        for i, r in enumerate(ranked["plans"], 1):
            same = f"x{r['variants']}" if r["variants"] > 1 else ""
            iv = r.get("step_time_interval_s")
            span = (f" {f'[{iv[0]:.3g}..{iv[1]:.3g}]' if iv else '':>15}") if with_iv else ""
            mark = "~" if r.get("indistinguishable") else " "
            print(f" {mark}{i:>3} {r['tokens_per_s_per_gpu']:>10,.0f} {fmt_seconds(r['step_time_s'], 8)}{span} "
                  f"{r['mfu']:>6.1%} {fmt_gib(r['peak_memory_gib'], 6)} {same:>4}  "
                  f"{plan_text(Plan.parse(r['plan']), w, profile, args.canonical)}")
        if ranked["plans"]:
            best = plan_text(Plan.parse(ranked["plans"][0]["plan"]), w, profile, args.canonical)
            print(f"next: moetune predict {_workload_flags(args)} --plan {shlex.quote(best)} --complete defaults   "
                  f"(then `moetune emit megatron` with the same flags)")
    return 0


def _workload_flags(args) -> str:
    """The workload flags of this `plans` call, for the "next:" line."""
    a = ["--model", args.model, "--cluster", args.cluster] + (["--gpus", str(args.gpus)] if args.gpus else [])
    a += ["--gbs", str(args.gbs)] + (["--seq", str(args.seq)] if args.seq else [])
    a += ["--precision", args.precision] if args.precision != "bf16" else []
    return " ".join(shlex.quote(x) for x in a)



def _rank(w, space, profile, shard, nshards, top, tables, calibration, prune: bool = True, distinct: str = "plan") -> dict:
    """The `top` distinct realizable plans by predicted throughput (`tuner.rank.train.rank_space_top`:
    the vectorised cost model over chunks of plans, parallel points whose optimistic bound cannot
    reach the list skipped, exactly as exhaustive scoring ranks). Plans of one parallel point that
    the model predicts equal (same step time and memory) are one row, `variants` of them."""
    from specs.plan import Plan
    from tuner.rank.complete import short_form
    from tuner.rank.train import rank_space_top
    # too many predicted-equal variants to fill the list: the ranker ranks deeper (keep doubles)
    rows_of = (lambda pool: _best_per_layout(_merge_equal(pool))) if distinct == "parallel" else _merge_equal
    r = rank_space_top(w, space, profile, shard, nshards, tables=tables, calibration=calibration,
                       keep=top * _OVERSAMPLE, prune=prune, enough=lambda pool: len(rows_of(pool)) >= top)
    rows = rows_of(r.pool)[:top]
    for row in rows:
        plans = row.pop("_all")
        # of predicted-equal variants, show the one nearest the completion defaults
        row["plan"] = min(plans, key=lambda p: (len(short_form(Plan.parse(p), w, profile)), p))
        fields = [dict(f.split("=", 1) for f in p.split(",")) for p in plans]
        row["varies"] = ",".join(k for k in fields[0] if len({f[k] for f in fields}) > 1)
    _mark_indistinguishable(w, rows, tables, calibration)
    return {"plans": rows, "realizable": r.seen, "scored": r.seen - r.pruned, "pruned": r.pruned,
            "pruned_points": r.pruned_points, "parallel_points": r.points, "bound_scored": r.bound_scored,
            "exhaustive": r.exhaustive, "bound_violated": r.bound_violated,
            "memory_infeasible": r.memory_infeasible,
            "infeasible_reasons": {"memory": r.memory_infeasible} if r.memory_infeasible else {}}


# a training plan's parallel layout, what `--distinct parallel` keeps one row of
PARALLEL = ("tp", "cp", "pp", "ep", "etp", "mbs")


def _best_per_layout(rows: list[dict]) -> list[dict]:
    """The first (best) row of each parallel layout (PARALLEL), in order."""
    seen, out = set(), []
    for r in rows:
        f = dict(x.split("=", 1) for x in r["plan"].split(","))
        key = tuple(f[k] for k in PARALLEL)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _mark_indistinguishable(w, rows: list[dict], tables, calibration) -> None:
    """Each row's 90% interval of the calibrated step time (`Calibration.interval`: the fit's
    factor covariance and leave-one-out error), and whether it overlaps the leader's (then the
    model cannot tell the plan from the leader). No interval (None) when the calibration has no
    fitted residuals (the CPU identity)."""
    import math

    import cost_model
    from specs.plan import Plan
    if not rows:
        return
    cal = cost_model.resolve_calibration(w, calibration, tables)
    plans = [Plan.parse(r["plan"]) for r in rows]
    parts = (cost_model.raw_class_parts(w, plans, tables=tables) if cal.factors else
             [float(x) for x in cost_model.predict_arrays(w, plans, tables=tables, calibration=cal)["raw_step_time_s"]])
    for r, p in zip(rows, parts):
        lo, hi = cal.interval(p)
        r["step_time_interval_s"] = [lo, hi] if math.isfinite(lo) else None
    lead = rows[0]["step_time_interval_s"]
    for r in rows:
        iv = r["step_time_interval_s"]
        r["indistinguishable"] = bool(lead and iv and iv[0] <= lead[1])


def rank_serve_plans(effective_plans: list, model, cluster, workload, top: int, concurrencies=None,
                     distinct: str = "plan", **kw) -> dict:
    """`plans --mode serve --rank`: the EffectivePlans (what SGLang runs), each at the concurrency of
    the sweep where its throughput is highest within the SLOs (tuner.rank.serve_price.goodput: one
    vectorised pass per concurrency), predicted-equal variants merged; the `top` aggregated and the
    `top` disaggregated (prefill/decode) rows, with the simulation's p50 / p90 latencies."""
    from tuner.rank.serve_price import best_per_layout, goodput, refine_by_simulation
    t0 = time.time()
    g = goodput(effective_plans, model, cluster, workload, concurrencies=concurrencies, **kw)
    rows = best_per_layout(g.rows) if distinct == "parallel" else g.rows
    agg = [r for r in rows if r["kind"] == "aggregated"][:top]
    pd = [r for r in rows if r["kind"] == "disaggregated"][:top]
    agg = refine_by_simulation(agg, model, cluster, workload, g.concurrencies, **kw)
    pd = refine_by_simulation(pd, model, cluster, workload, g.concurrencies, **kw)
    return {"objective": workload.objective,
            "plans": sorted(agg + pd, key=lambda r: (not r["slo_met_simulated"], -r["objective"]))[:top],
            "aggregated": agg, "disaggregated": pd, "concurrencies": g.concurrencies, "scored": g.scored,
            "excluded": dict(g.excluded.most_common()), "frontier": g.frontier,
            "elapsed_s": round(time.time() - t0, 3), "_points": g.points}


def _run_serve(args) -> int:
    from clusters import load_cluster
    from specs.models import load_model
    from tuner.space.serve import default_serve_space, summarize
    if args.examples < 0:
        raise UsageError(f"--examples must be 0 or more, got {args.examples}")
    if args.plot:
        args.plot = Path(args.plot)
        _plot_dir(args)
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpus)
    space = default_serve_space(cluster.num_devices)
    from tuner.space.serve_precision import resolve as resolve_weights
    weights = resolve_weights(args, model, cluster)
    workload, kw = _serve_rank_inputs(args, model, cluster, weights["precision"]) if args.rank else (None, {})
    t0 = time.time()
    s = summarize(space, model, cluster, max_examples=args.examples, keep_effective=args.rank)
    elapsed = time.time() - t0
    ranked = rank_serve_plans(s.effective, model, cluster, workload, args.top,
                              concurrencies=[args.concurrency] if args.concurrency else None,
                              distinct=args.distinct, **kw) if args.rank else None
    points = ranked.pop("_points") if ranked else None
    if args.json:
        from tuner.conventions import SCHEMA_VERSION
        print(json.dumps({
            "schema_version": SCHEMA_VERSION, "mode": "serve", "model": model.name, "cluster": cluster.kind, "gpus": cluster.num_devices,
            "precision": weights["precision"], "weight_dtype": weights["dtype"], "weight_source": weights["source"],
            "space_size": s.total, "realizable": s.realizable,
            "rejections": dict(s.rejections.most_common()),
            "rejection_examples": {k: {"plan": p, "reason": r} for k, (p, r) in s.rejected_examples.items()},
            "examples": [p.canonical() for p in s.examples], "ranked": ranked,
            "elapsed_s": round(elapsed, 3)}, indent=1))
        return 0
    print(f"{model.name} served on {cluster.num_devices} x {cluster.kind} (SGLang 0.5.23 rules); "
          f"weights {weights['dtype']} ({weights['source']})")
    pct = 100.0 * s.realizable / s.total if s.total else 0.0
    print(f"serving plan space: {s.total:,} plans; realizable: {s.realizable:,} ({pct:.2f}%)   [{elapsed:.1f} s]")
    _print_rejections(s, count_width=10)
    if s.examples:
        print("realizable examples:")
        for p in s.examples:
            print(f"  {p.canonical()}")
    if ranked is not None:
        _print_serve_ranking(args, ranked, points, workload, model, cluster, weights)
    return 0


def _print_serve_ranking(args, ranked: dict, points: dict, workload, model, cluster, weights) -> None:
    """The goodput tables (aggregated, then disaggregated prefill/decode), the ratio of their bests,
    the Pareto plot when --plot names a folder, and the next commands."""
    from tuner.rank.serve_price import short_plan
    unit = "input" if workload.phase == "prefill" else "output"
    slo = [f"TTFT p90 <= {fmt_seconds(workload.ttft_p90_s)}"] * (workload.ttft_p90_s > 0) + \
          [f"TPOT p90 <= {fmt_seconds(workload.tpot_p90_s)}"] * (workload.tpot_p90_s > 0)
    sweep = ranked["concurrencies"]
    how = (f"at concurrency {sweep[0]} (--concurrency)" if len(sweep) == 1 else
           f"each at the concurrency of {{{', '.join(str(c) for c in sweep)}}} with the most {unit} tok/s/GPU "
           f"within the SLOs")
    print(f"goodput under {' and '.join(slo) if slo else 'no SLO (--ttft-slo / --tpot-slo)'}: {how}; "
          f"{ranked['scored']:,} distinct effective plans scored in {ranked['elapsed_s']:.2f} s "
          f"(phase {workload.phase}, isl {workload.isl}, osl {workload.osl})")
    for code, n in ranked["excluded"].items():
        print(f"  excluded: {n:,} x {code}")
    if not ranked["plans"] and any(c.startswith("weights_exceed") for c in ranked["excluded"]):
        print(f"  nothing fits: {_what_would_fit(model, cluster, weights)}")
    per_user = "in tok/s/user" if workload.phase == "prefill" else "tok/s/user"
    for kind, title in (("aggregated", "aggregated"), ("disaggregated", "disaggregated (prefill/decode pools)")):
        rows = ranked[kind]
        if not rows:
            print(f"{title}: none (every plan excluded above, or none in the space)")
            continue
        print(f"{title}, top {len(rows)}" + (" (each re-checked by the simulation at the highest swept concurrency whose "
              "simulated p90 meets the SLOs; its numbers; !: none did" if any(r["simulated"] for r in rows) else
              " (steady-state estimates: no simulation of these plans, so no p50") + "; xN: N variants predicted equal, one row):")
        print(f"  {'#':>3} {unit[:3] + ' tok/s/GPU':>14} {per_user:>12} {'req/s':>8} {'conc':>5} "
              f"{'TTFT p50':>9} {'p90':>9} {'TPOT p50':>9} {'p90':>9} {'batch':>6} {'GiB':>6} {'same':>4}  plan")
        for i, r in enumerate(rows, 1):
            ms = lambda x: "-" if x is None else (f"{x * 1e3:.0f}ms" if x >= 0.1 else f"{x * 1e3:.1f}ms")
            flag = " " if r.get("slo_met_simulated", True) else "!"
            same = f"x{r['variants']}" if r["variants"] > 1 else ""
            user = "-" if r["tokens_per_s_per_user"] is None else f"{r['tokens_per_s_per_user']:,.1f}"
            batch = "-" if r["batch_per_rank"] is None else f"{r['batch_per_rank']:.0f}"
            print(f" {flag}{i:>3} {r['objective']:>14,.1f} {user:>12} {r['requests_per_s']:>8.2f} {r['concurrency']:>5} "
                  f"{ms(r.get('ttft_p50_s')):>9} {ms(r['ttft_p90_s']):>9} "
                  f"{ms(r.get('tpot_p50_s')):>9} {ms(r['tpot_p90_s']):>9} "
                  f"{batch:>6} {r['memory_gib']:>6.1f} {same:>4}  {short_plan(r['plan'])}")
    if ranked["aggregated"] and ranked["disaggregated"]:
        a, d = ranked["aggregated"][0]["objective"], ranked["disaggregated"][0]["objective"]
        print(f"best disaggregated / best aggregated: {d / a:.2f}x {unit} tok/s/GPU")
    if args.plot:
        from tuner.study.plots import pareto
        path = args.plot / "pareto.png"
        pareto(path, points, ranked["frontier"],
               title=f"{model.name} on {cluster.num_devices} x {cluster.kind}, isl {workload.isl} osl {workload.osl}; "
                     f"within {' and '.join(slo) if slo else 'no SLO'} (cost model, steady state)",
               x_label=f"{per_user} (" + ("isl / TTFT" if workload.phase == "prefill" else "1 / TPOT") + ")",
               y_label=f"{unit} tok/s/GPU")
        print(f"pareto plot: {path}")
    best = ranked["plans"][0] if ranked["plans"] else None
    if best:
        flags = _serve_flags(args) + f" --concurrency {best['concurrency']}"
        print(f"next: moetune predict --mode serve {flags} --plan {shlex.quote(short_plan(best['plan']))}   "
              f"(then `moetune emit sglang` with the same flags)")


def _plot_dir(args) -> None:
    """--plot DIR: needs --rank; DIR is made if missing (the one place this command writes)."""
    if not args.rank:
        raise UsageError("--plot needs --rank (it plots the ranked plans)")
    if args.plot.exists() and not args.plot.is_dir():
        raise UsageError(f"--plot {args.plot}: is a file, expected a folder")
    try:
        args.plot.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--plot {args.plot}: cannot be created ({e.strerror})") from None


def _serve_flags(args) -> str:
    """The workload flags of this `plans --mode serve` call, for the "next:" line."""
    a = ["--model", args.model, "--cluster", args.cluster] + (["--gpus", str(args.gpus)] if args.gpus else [])
    a += ["--isl", str(args.isl), "--osl", str(args.osl)] + (["--phase", args.phase] if args.phase != "both" else [])
    a += (["--ttft-slo", f"{args.ttft_slo:g}"] if args.ttft_slo else []) + (["--tpot-slo", f"{args.tpot_slo:g}"] if args.tpot_slo else [])
    a += ["--weight-dtype", args.weight_dtype] if args.weight_dtype != "auto" else []
    a += ["--precision", args.precision] if args.precision != "bf16" else []
    return " ".join(shlex.quote(x) for x in a)


def _merge_equal(pool) -> list[dict]:
    """Rows of the ranked pool, plans of one parallel point predicted equal merged into one."""
    rows: list = []
    for s in pool:
        row = {"plan": s.plan, "tokens_per_s_per_gpu": s.tokens_per_s_per_gpu, "step_time_s": s.step_time_s,
               "peak_memory_gib": s.peak_memory_gib, "mfu": s.mfu}
        twin = next((x for x in rows if _equal(x, row)), None)
        if twin is None:
            rows.append({**row, "variants": 1, "_all": [s.plan]})
        else:
            twin["variants"] += 1
            twin["_all"].append(s.plan)
    return rows


# rows kept before predicted-equal variants merge, per row listed
_OVERSAMPLE = 4
_POINT = ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "pp_first", "pp_last", "pp_layout", "pp_embedding", "pp_loss")


def _equal(a: dict, b: dict) -> bool:
    """Two ranked plans of one parallel point with the same predicted step time and memory."""
    pa, pb = (dict(f.split("=", 1) for f in x["plan"].split(",")) for x in (a, b))
    return all(pa[k] == pb[k] for k in _POINT) and \
        abs(a["step_time_s"] - b["step_time_s"]) <= 1e-9 * b["step_time_s"] and \
        abs(a["peak_memory_gib"] - b["peak_memory_gib"]) <= 1e-9 * max(b["peak_memory_gib"], 1e-12)


def _what_would_fit(model, cluster, weights) -> str:
    """When no serving plan's weights fit: the model's weight bytes against the deployment's HBM, and
    what would change that (fp8 weights, more GPUs); a first-order estimate, said so."""
    import math

    from cost_model.flops import param_counts
    gib = param_counts(model)["total"] * (1.0 if weights["precision"] == "fp8" else 2.0) / 2**30
    need = 2 ** math.ceil(math.log2(max(gib / (0.8 * cluster.hbm_gib), 1.0)))  # ~80% of HBM for weights
    alt = [] if weights["precision"] == "fp8" else [f"--weight-dtype fp8 ({gib / 2:,.0f} GiB)"]
    return (f"{gib:,.0f} GiB of {weights['dtype']} weights; about {need} x {cluster.kind} at this weight format"
            + (" or " + " ".join(alt) if alt else "") + " (weights only, to first order)")


def _serve_rank_inputs(args, model, cluster, precision: str):
    """The serving workload and cost-model inputs of `plans --mode serve --rank` (checked before
    the walk, so a bad flag costs one line)."""
    from tuner.rank.serve_predict import serve_workload_from_args
    w = serve_workload_from_args(args, cluster.num_devices, what="plans --mode serve --rank", model=model)
    if args.routing_skew < 0:
        raise UsageError(f"--routing-skew must be >= 0, got {args.routing_skew}")
    kw = {"precision": precision, "routing_skew": args.routing_skew}
    if args.tables:
        from cost_model.tables import load_tables
        try:
            kw["tables"] = load_tables(args.tables)
        except (OSError, ValueError, KeyError) as e:
            raise UsageError(f"--tables {args.tables}: cannot be read: {e}") from None
    if args.calibration:
        from cost_model.calibration import Calibration, CalibrationError
        try:
            kw["calibration"] = Calibration.load(args.calibration)
        except CalibrationError as e:
            raise UsageError(f"--calibration {args.calibration}: not a serving calibration file ({e})") from None
    return w, kw


def _print_rejections(s, count_width: int) -> None:
    """The rejection histogram of a plan-space summary (training's or serving's): each reason code,
    how many plans it rejected, a bar, and one example sentence."""
    if not s.rejections:
        return
    print("rejections by reason (a plan may have several):")
    width = max(s.rejections.values())
    for code, n in s.rejections.most_common():
        print(f"  {code:26s} {n:>{count_width},}  {'#' * max(1, round(30 * n / width))}")
        print(f"  {'':26s} e.g. {s.rejected_examples[code][1]}")
