"""Rank what SGLang runs: `EffectivePlan`s (specs.serve_resolve, kept by tuner/serve_realize) through
the serving cost model (cost_model/serving, which prices them as they are), for
`plans --mode serve --rank` and the serving study's screening.

`score_plans(...)`: plans priced in one vectorised pass (`rank_arrays`), with the workload's
objective (output tokens/s/GPU; input tokens/s/GPU for a prefill pool) and why a plan is excluded
(memory, or a steady-state TTFT / TPOT p90 estimate above its SLO); `goodput(...)`: each distinct
plan at the concurrency of its highest objective within the SLOs.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np


def score_plans(plans: list, model, cluster, workload, *, precision="bf16", tables=None, calibration=None,
                imbalance=1.0, routing_skew=0.0) -> dict:
    """`rank_arrays` of the `ServePlan`s (resolved once by the cost model) or `EffectivePlan`s (arrays,
    one entry per plan) plus `objective` and `excluded` ("" when the plan is kept; else the memory
    reason or the SLO it misses)."""
    from cost_model.serving import rank_arrays
    r = rank_arrays(model, cluster, list(plans), workload, precision=precision,
                    tables=tables, calibration=calibration, imbalance=imbalance, routing_skew=routing_skew)
    obj = np.asarray(r[workload.objective], float)
    why = np.where(r["fits"], "", r["reason"]).astype(object)
    if workload.ttft_p90_s > 0:
        miss = np.nan_to_num(r["ttft_s"], nan=0.0) > workload.ttft_p90_s
        why = np.where((why == "") & miss, f"ttft_p90_above_{workload.ttft_p90_s:g}s", why)
    if workload.tpot_p90_s > 0:
        miss = np.nan_to_num(r["tpot_s"], nan=0.0) > workload.tpot_p90_s
        why = np.where((why == "") & miss, f"tpot_p90_above_{workload.tpot_p90_s:g}s", why)
    r["objective"] = obj
    r["excluded"] = why
    return r


# Goodput under the SLOs ----------------------------------------------------------------------------
# A serving plan's throughput grows with the requests in flight until its latency breaks the SLOs, so
# one fixed concurrency ranks plans at an arbitrary point of their curves. `goodput` prices every plan
# at each concurrency of a sweep and keeps, per plan, the concurrency of highest throughput whose
# TTFT / TPOT estimates meet the SLOs (as aiconfigurator's "max throughput under SLA" does).

# requests in flight per GPU (phase both / prefill) swept by default: 1 .. 128, doubling
SWEEP_PER_GPU = (1, 2, 4, 8, 16, 32, 64, 128)
# the decode batch per GPU swept for --phase decode (the cost model reads concurrency so there)
SWEEP_DECODE = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# the fields of a serving plan that make its parallel layout (rows that differ only elsewhere and are
# predicted equal are one row)
LAYOUT = ("tp", "pp", "dp", "attn_dp", "ep", "pd")


def concurrency_sweep(phase: str, devices: int) -> list[int]:
    """The concurrencies `goodput` tries by default for a deployment of `devices` GPUs."""
    return list(SWEEP_DECODE) if phase == "decode" else [m * devices for m in SWEEP_PER_GPU]


@dataclass
class Goodput:
    rows: list  # dicts, best first, predicted-equal variants merged (`variants`, `varies`)
    scored: int  # distinct effective plans priced
    excluded: Counter  # reason -> count of plans that meet the SLOs at no swept concurrency
    concurrencies: list
    frontier: dict  # "aggregated" / "disaggregated" -> [(tok/s/user, tok/s/GPU)], the Pareto frontier
    points: dict  # same keys -> (tok/s/user array, tok/s/GPU array): every (plan, concurrency) within the SLOs


def per_user_rate(r: dict, workload) -> np.ndarray:
    """Tokens per second one request sees: 1 / TPOT (output tokens), or for a prefill pool the
    prompt's tokens over its TTFT."""
    if workload.phase == "prefill":
        return workload.isl / np.where(r["ttft_s"] > 0, r["ttft_s"], np.nan)
    return 1.0 / np.where(r["tpot_s"] > 0, r["tpot_s"], np.nan)


def requests_per_s(obj_per_gpu, workload, devices: int):
    """Requests per second of the deployment from its objective (tokens/s/GPU)."""
    per_req = workload.isl if workload.phase == "prefill" else workload.osl
    return obj_per_gpu * devices / per_req


def goodput(effs: list, model, cluster, workload, *, concurrencies: list[int] | None = None, **kw) -> Goodput:
    """Every distinct EffectivePlan at the concurrency of `concurrencies` (default `concurrency_sweep`)
    where its objective is highest with the TTFT / TPOT estimates within the workload's SLOs; one
    vectorised `score_plans` pass per concurrency. Plans not fitting memory at the lowest concurrency
    are priced once."""
    from dataclasses import replace
    conc = sorted(set(concurrencies or concurrency_sweep(workload.phase, cluster.num_devices)))
    uniq = list({e.plan.canonical(): e for e in effs}.values())
    empty = {"aggregated": [], "disaggregated": []}
    if not uniq:
        return Goodput([], 0, Counter(), conc, empty, {})
    first = score_plans(uniq, model, cluster, replace(workload, concurrency=conc[0]), **kw)
    fit = np.flatnonzero(first["fits"])
    excluded = Counter(str(x) for x in first["reason"][~first["fits"]])
    n = len(uniq)
    best = {"objective": np.zeros(n), "concurrency": np.zeros(n, int)}  # a plan must predict > 0 tok/s
    keys = ("output_tokens_per_s_per_gpu", "input_tokens_per_s_per_gpu", "ttft_s", "tpot_s", "batch_rank")
    for k in keys:
        best[k] = np.full(n, np.nan)
    slo_miss = first["excluded"].copy()  # why a fitting plan missed at the lowest concurrency
    pd_of = np.array([e.plan.pd not in ("", "-") for e in uniq])
    pts = {"aggregated": ([], []), "disaggregated": ([], [])}
    # In the steady state TTFT and TPOT grow with the requests in flight, and throughput stops growing
    # once the running batch is capped: a plan that misses an SLO, or whose batch no longer grows and
    # gains nothing, at one concurrency is not priced at the higher ones (the sweep then costs far
    # less than len(conc) full passes). A batch that still grows is followed through a dip: past the
    # CUDA-graph batch the step runs eager, and throughput can fall and then recover.
    active, prev = fit, np.full(n, -np.inf)
    prev_b = np.full(n, -np.inf)
    for c in conc:
        if not len(active):
            break
        r = first if c == conc[0] else score_plans([uniq[i] for i in active], model, cluster,
                                                   replace(workload, concurrency=c), **kw)
        sel = fit if c == conc[0] else np.arange(len(active))
        ok = r["excluded"][sel] == ""
        obj = r["objective"][sel]
        user = per_user_rate({k: r[k][sel] for k in ("ttft_s", "tpot_s")}, workload)
        for kind, mask in (("aggregated", ~pd_of[active]), ("disaggregated", pd_of[active])):
            m = ok & mask & np.isfinite(user)
            pts[kind][0].append(user[m])
            pts[kind][1].append(obj[m])
        better = ok & (obj > best["objective"][active])
        idx = active[better]
        best["objective"][idx] = obj[better]
        best["concurrency"][idx] = c
        for k in keys:
            best[k][idx] = np.asarray(r[k][sel], float)[better]
        b = np.asarray(r["batch_rank"][sel], float)
        gains = ok & ((obj > prev[active] * (1 + 1e-6)) | (b > prev_b[active] * (1 + 1e-6)))
        prev[active], prev_b[active] = obj, b
        active = active[gains]
    never = fit[~(best["objective"][fit] > 0)]
    excluded.update(str(slo_miss[i]) or "no_throughput_predicted" for i in never)
    kept = fit[best["objective"][fit] > 0]
    order = kept[np.argsort(-best["objective"][kept], kind="stable")]

    def val(k, i):
        x = float(best[k][i])
        return None if np.isnan(x) else x
    rows = []
    for i in order:
        e = uniq[i]
        rows.append({"plan": e.pinned().canonical(), "effective_plan": e.plan.canonical(),
                     "kind": "disaggregated" if pd_of[i] else "aggregated", "rewrites": list(e.rewrites),
                     "concurrency": int(best["concurrency"][i]), "objective": float(best["objective"][i]),
                     "output_tokens_per_s_per_gpu": val("output_tokens_per_s_per_gpu", i),
                     "input_tokens_per_s_per_gpu": val("input_tokens_per_s_per_gpu", i),
                     "ttft_p90_s": val("ttft_s", i), "tpot_p90_s": val("tpot_s", i),
                     "batch_per_rank": val("batch_rank", i),
                     "requests_per_s": float(requests_per_s(best["objective"][i], workload, cluster.num_devices)),
                     "max_batch": float(first["max_batch_per_gpu"][i]), "memory_gib": float(first["memory_gib"][i])})
    for row in rows:
        u = per_user_rate({"ttft_s": np.array([row["ttft_p90_s"] or np.nan]),
                           "tpot_s": np.array([row["tpot_p90_s"] or np.nan])}, workload)[0]
        row["tokens_per_s_per_user"] = None if np.isnan(u) else float(u)
    points = {k: (np.concatenate(u) if u else np.zeros(0), np.concatenate(g) if g else np.zeros(0))
              for k, (u, g) in pts.items()}
    return Goodput(merge_equal(rows), len(uniq), excluded, conc,
                   {k: _frontier(*points[k]) for k in points}, points)


def _key(r: dict) -> tuple:
    """What makes two rows one: the parallel layout, the chosen concurrency and the predictions there
    (to 9 significant digits, so rounding noise does not split them)."""
    p = dict(f.split("=", 1) for f in r["effective_plan"].split(","))
    return (tuple(p[k] for k in LAYOUT), r["concurrency"],
            *(None if r[k] is None else float(f"{r[k]:.9g}") for k in ("objective", "ttft_p90_s", "tpot_p90_s")))


def merge_equal(rows: list[dict]) -> list[dict]:
    """Rows (best first) with predicted-equal variants of one layout merged into the first of them:
    `variants` counts them, `varies` names the flags they differ in."""
    out: dict = {}
    for r in rows:
        k = _key(r)
        if k in out:
            out[k]["variants"] += 1
            out[k]["_all"].append(r["plan"])
        else:
            out[k] = {**r, "variants": 1, "_all": [r["plan"]]}
    for r in out.values():
        fields = [dict(f.split("=", 1) for f in p.split(",")) for p in r.pop("_all")]
        r["varies"] = ",".join(k for k in fields[0] if len({f[k] for f in fields}) > 1)
    return list(out.values())


def best_per_layout(rows: list[dict]) -> list[dict]:
    """The first (best) row of each parallel layout (LAYOUT), in order: `--distinct parallel`."""
    seen, out = set(), []
    for r in rows:
        key = _key(r)[0]
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def refine_by_simulation(rows: list[dict], model, cluster, workload, concurrencies: list[int], **kw) -> list[dict]:
    """The listed rows re-checked by the discrete-event simulation (cost_model.serving.predict_serve):
    each at the highest swept concurrency, up to the one the steady state chose, whose simulated TTFT
    / TPOT p90 meet the SLOs; its numbers then are the simulation's (throughput, p50 and p90), and
    the rows are re-sorted by them. `slo_met_simulated` is False where none did (the lowest is kept).
    Rows the model does not simulate (disaggregated plans, the decode phase) keep the steady state's
    numbers, with no p50."""
    from dataclasses import replace

    from cost_model.serving import predict_serve
    from specs.serve_plan import ServePlan
    for r in rows:
        r.update(ttft_p50_s=None, tpot_p50_s=None, slo_met_simulated=True, simulated=False)
        tried = [c for c in sorted(concurrencies, reverse=True) if c <= r["concurrency"]] or [r["concurrency"]]
        for c in tried:
            w = replace(workload, concurrency=c)
            pr = predict_serve(model, cluster, ServePlan.parse(r["plan"]), w, **kw)
            if pr.extra.get("method") != "simulation":
                break
            met = all(not slo or (v is not None and v <= slo) for v, slo in
                      ((pr.ttft_p90_s, workload.ttft_p90_s), (pr.tpot_p90_s if workload.phase != "prefill" else None, workload.tpot_p90_s)))
            obj = pr.input_tokens_per_s_per_gpu if workload.phase == "prefill" else pr.output_tokens_per_s_per_gpu
            r.update(simulated=True, concurrency=c, objective=obj, ttft_p90_s=pr.ttft_p90_s, tpot_p90_s=pr.tpot_p90_s,
                     ttft_p50_s=pr.extra.get("ttft_p50_s"), tpot_p50_s=pr.extra.get("tpot_p50_s"),
                     output_tokens_per_s_per_gpu=pr.output_tokens_per_s_per_gpu,
                     input_tokens_per_s_per_gpu=pr.input_tokens_per_s_per_gpu,
                     requests_per_s=float(requests_per_s(obj, workload, cluster.num_devices)), slo_met_simulated=met)
            u = per_user_rate({"ttft_s": np.array([pr.ttft_p90_s or np.nan]),
                               "tpot_s": np.array([pr.extra.get("tpot_p50_s") or np.nan])}, workload)[0]
            r["tokens_per_s_per_user"] = None if np.isnan(u) else float(u)
            r["batch_per_rank"] = float(score_plans([ServePlan.parse(r["plan"])], model, cluster, w, **kw)["batch_rank"][0])
            if met:
                break
    out: dict = {}  # rows that the re-check made equal are one row again
    for r in sorted(rows, key=lambda r: (not r["slo_met_simulated"], -r["objective"])):
        k = _key(r)
        if k in out:
            out[k]["variants"] += r["variants"]
            out[k]["varies"] = ",".join(sorted(set(filter(None, (out[k]["varies"] + "," + r["varies"]).split(",")))))
        else:
            out[k] = r
    return list(out.values())


def _frontier(user: np.ndarray, gpu: np.ndarray) -> list[tuple[float, float]]:
    """The Pareto frontier of (tokens/s/user, tokens/s/GPU) points: no other point is better in both,
    sorted by tokens/s/user."""
    if not len(user):
        return []
    o = np.lexsort((-gpu, -user))  # fastest per user first; ties: most per GPU first
    front, top = [], -np.inf
    for i in o:
        if gpu[i] > top:
            front.append((float(user[i]), float(gpu[i])))
            top = gpu[i]
    return sorted(front)


def short_plan(plan: str) -> str:
    """A serving plan's fields that differ from ServePlan's defaults, for tables ("defaults" when none)."""
    from specs.serve_plan import ServePlan
    p, base = ServePlan.parse(plan), ServePlan()
    diff = [kv for kv, dv in zip(p.canonical().split(","), base.canonical().split(",")) if kv != dv]
    return ",".join(diff) or "defaults"
