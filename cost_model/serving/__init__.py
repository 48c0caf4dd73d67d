"""Serving cost model (SGLang 0.5.23): price an effective plan for a `ServeWorkload`.

Plans are `EffectivePlan`s (specs.serve_resolve: what SGLang runs) or plain `ServePlan`s, which are
resolved once by that same resolver; nothing here re-applies SGLang's rewrites.

- `rank_arrays(...)`: the analytic steady-state estimate over many plans at once (screening).
- `predict_serve(...)`: one plan; memory, then the discrete-event simulation (`sim`) for
  throughput and TTFT / TPOT p90 (phase both or prefill), or the steady decode step (phase decode).

Pieces: `plans` (resolved plans as columns), `memory` (weights, KV, max batch),
`step` (prefill / decode step seconds from the shared tables), `sim`, `calibration` (the one
labelled term, fitted on cost_model/data/published_serving_reference.csv).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from cost_model.serving.calibration import load_default, phase_factors
from cost_model.serving.constants import DEFAULT_MAX_RUNNING
from cost_model.serving.kernel_path import paths as kernel_paths
from cost_model.serving.memory import capacity
from cost_model.serving.pd import pd_arrays
from cost_model.serving.plans import effective_plans, to_cols
from cost_model.serving.sim import request_ttft, simulate
from cost_model.serving.step import StepModel, context_split
from cost_model.tables import load_tables, tables_dir_for


@dataclass
class ServePrediction:
    feasible: bool
    reasons: list
    input_tokens_per_s_per_gpu: float
    output_tokens_per_s_per_gpu: float
    ttft_p90_s: float | None
    tpot_p90_s: float | None
    max_batch: float  # decode requests per GPU the KV pool holds at full context (isl + osl)
    memory_gib: float
    plan: str = ""
    effective_plan: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


_TABLES: dict = {}


def _default_tables(kind: str):
    """The tables of a kind by the shared lookup rule, read once per process (screening calls
    `rank_arrays` many times)."""
    d = tables_dir_for(kind)
    if d not in _TABLES:
        _TABLES[d] = load_tables(d)
    return _TABLES[d]


def _setup(model, cluster, plans, precision, tables, imbalance, routing_skew, deepgemm_jit=True):
    tables = tables if tables is not None else _default_tables(cluster.kind)
    c = to_cols(effective_plans(plans, model, cluster))
    sm = StepModel.for_precision(model, cluster, tables, c, precision, imbalance=imbalance,
                                 routing_skew=routing_skew, deepgemm_jit=deepgemm_jit)
    return c, sm, sm.fp8


def extend_share(attn_dp, batch_rank, isl, osl, chunk):
    """Closed-loop steady state of attention-DP ranks in lock step. SGLang runs every rank's own
    batch in each forward (a rank with requests waiting extends them, the others decode theirs;
    managers/scheduler_components/dp_attn.py gathers the ranks' batches, an idle batch only for a
    rank with none) and the MoE layers take all ranks' tokens, so a step holding an extend lasts
    the extend while the decoding ranks still make their token. A rank completes g = B / osl
    requests per decode step; their prompts are extended after it, packed up to the chunk
    (C = min(chunk, isl max(1, g)) tokens per extend step), e = g isl / C extend steps per decode
    step, i.e. the rank extends in a share q = e / (1 + e) of the steps. Ranks extend
    independently: a step holds an extend with probability p = 1 - (1 - q)^attn_dp, with
    r = attn_dp q / p ranks extending in it. Returns (q, p, r, C), arrays."""
    a = np.asarray(attn_dp, float)
    g = np.asarray(batch_rank, float) / max(float(osl), 1.0)
    C = np.minimum(np.asarray(chunk, float), float(isl) * np.maximum(1.0, g))
    e = g * float(isl) / C
    q = e / (1.0 + e)
    p = 1.0 - (1.0 - q) ** a
    r = np.maximum(a * q / np.maximum(p, 1e-300), 1.0)
    return q, p, r, C


def own_extend(attn_dp: float, q: float, p: float) -> tuple[float, float]:
    """One rank's view of `extend_share`'s steady state (the one-rank simulator's): (ranks its own
    extend shares the step with on average, 1 + (attn_dp - 1) q; steps of its neighbours' extends
    that follow each of its own, (p - q) / q, in which it decodes at their length)."""
    return 1.0 + (attn_dp - 1.0) * q, (p - q) / max(q, 1e-12)


def rank_arrays(model, cluster, plans, workload, *, precision="bf16", tables=None, calibration=None,
                imbalance=1.0, routing_skew=0.0, deepgemm_jit: bool = True) -> dict:
    """Analytic steady state of every plan (arrays). Closed loop at `workload.concurrency`
    requests per instance... per deployment of `cluster.num_devices` GPUs (decode phase: per GPU).

    Steady state of one attention-DP rank with B running requests: each output token costs
    decode_step(B)/B plus its share of prefill, isl/osl tokens at prefill_step(chunk)/chunk;
    TPOT is a decode step plus the prefill steps that interrupt it; TTFT is the prefill of one
    prompt plus the wait for a free slot when concurrency exceeds the batch."""
    cal = calibration or load_default()
    c, sm, fp8 = _setup(model, cluster, plans, precision, tables, imbalance, routing_skew, deepgemm_jit)
    w = workload
    isl, osl = float(w.isl), float(w.osl)
    # phase prefill / decode price one pool of a disaggregated deployment: SGLang sizes such a
    # server's memory by its role (the resolved mem_frac of that role)
    cap = capacity(model, cluster, c, isl, osl, sm.wbytes, role={"prefill": "prefill", "decode": "decode"}.get(w.phase, "agg"))
    gpus_inst = c.tp * c.pp
    replicas = np.maximum(cluster.num_devices // gpus_inst, 1)
    s_pre, s_dec = phase_factors(cal)  # per phase (one-scale: both the scale)
    if w.phase == "decode":
        asked = np.full(len(c), float(max(w.concurrency, 1))) * gpus_inst / c.attn_dp
        # the scheduler admits what its KV pool and max_running hold and queues the rest (as in the
        # aggregated case below): published decode pools are benchmarked past their max_running
        B = np.minimum(asked, np.maximum(cap["max_batch_rank"], 1.0))
        t_dec = s_dec * sm.decode(B, isl + osl / 2)[0]
        out = B * c.attn_dp / gpus_inst / t_dec
        res = {"output_tokens_per_s_per_gpu": out, "input_tokens_per_s_per_gpu": np.zeros(len(c)),
               "tpot_s": t_dec, "ttft_s": np.full(len(c), np.nan), "batch_rank": B, "queued_rank": asked - B}
        reason = cap["reason"]
    else:
        conc = max(w.concurrency, 1)
        K = np.maximum(conc / replicas / c.attn_dp, 1.0)
        C = np.minimum(c.chunk, isl * K).astype(float)
        # a prompt longer than the chunk runs as ceil(isl / C) chunks, chunk i attending to the
        # i C tokens before it: the mean prefix of its chunks is (chunks - 1) C / 2
        # a chunk longer than the prompt packs ~C / isl prompts, each attending only to itself
        t_pre = s_pre * sm.prefill(C, (np.ceil(isl / C) - 1) * C / 2, np.minimum(C, isl))[0]
        per_in = t_pre / C  # seconds per prompt token
        if w.phase == "prefill":
            in_rank = 1.0 / per_in
            ttft = request_ttft(np.ceil(isl / C) * t_pre + np.maximum(K - 1, 0) * isl * per_in)
            res = {"input_tokens_per_s_per_gpu": in_rank * c.attn_dp / gpus_inst,
                   "output_tokens_per_s_per_gpu": np.zeros(len(c)), "ttft_s": ttft,
                   "tpot_s": np.full(len(c), np.nan), "batch_rank": K}
        else:
            B = np.minimum(K, cap["max_batch_rank"])
            B = np.maximum(B, 1.0)
            t_dec = s_dec * sm.decode(B, isl + osl / 2)[0]
            # steady state of the closed loop (`extend_share`): a rank extends in a share q of the
            # steps and decodes in the rest; a step holding any rank's extend (probability p, r
            # ranks extending) lasts that extend for every rank (the MoE layers in lock step), so
            # a rank pays its neighbours' prefills too, while still making its decode tokens
            q, p_ext, r_ext, C_ss = extend_share(c.attn_dp, B, isl, osl, c.chunk)
            t_ext = s_pre * sm.prefill(C_ss, (np.ceil(isl / C_ss) - 1) * C_ss / 2, np.minimum(C_ss, isl), r_ext)[0]
            step = (1.0 - p_ext) * t_dec + p_ext * np.maximum(t_ext, t_dec)
            out_rank = B * (1.0 - q) / step
            tpot = step / (1.0 - q)
            req_rate = out_rank / osl
            ttft = request_ttft(np.ceil(isl / C_ss) * t_ext + np.maximum(K - B, 0) / req_rate)
            res = {"output_tokens_per_s_per_gpu": out_rank * c.attn_dp / gpus_inst,
                   "input_tokens_per_s_per_gpu": out_rank * c.attn_dp / gpus_inst * isl / osl,
                   "ttft_s": ttft, "tpot_s": tpot, "batch_rank": B}
        reason = cap["reason"]
    res.update({"fits": reason == "", "reason": reason, "max_batch_per_gpu": cap["max_batch_instance"] / gpus_inst,
                "memory_gib": cap["memory_gib"], "weights_gib": cap["weights_gib"], "mem_frac": cap["mem_frac"],
                "kv_pool_tokens": cap["kv_pool_tokens"], "replicas": replicas})
    pdm = c.pd_p > 0
    res["pd_bound"] = np.full(len(c), "", dtype=object)
    if w.phase == "both" and pdm.any():  # disaggregated plans: prefill pool + KV transfer + decode pool
        pdr = pd_arrays(model, cluster, c, sm, w, cal)
        for k, v in pdr.items():
            if k in res:
                res[k] = np.where(pdm, v, res[k])
    return res


def _grid_fn(fn, xs, ys):
    """fn evaluated on a (log x, y) grid once, then bilinear interpolation (scalar callable)."""
    X, Y = np.meshgrid(xs, ys, indexing="ij")
    Z = np.asarray(fn(X.ravel(), Y.ravel()), float).reshape(X.shape)
    lx = np.log(xs)

    def f(x, y):
        i = np.clip(np.searchsorted(lx, np.log(max(x, xs[0])), side="right") - 1, 0, len(xs) - 2)
        j = np.clip(np.searchsorted(ys, y, side="right") - 1, 0, len(ys) - 2)
        wx = np.clip((np.log(max(x, xs[0])) - lx[i]) / (lx[i + 1] - lx[i]), 0, 1)
        wy = np.clip((y - ys[j]) / max(ys[j + 1] - ys[j], 1e-9), 0, 1)
        return ((1 - wx) * (1 - wy) * Z[i, j] + wx * (1 - wy) * Z[i + 1, j]
                + (1 - wx) * wy * Z[i, j + 1] + wx * wy * Z[i + 1, j + 1])
    return f


def predict_serve(model, cluster, plan, workload, *, precision="bf16", tables=None, calibration=None,
                  imbalance=1.0, routing_skew=0.0, extra_reasons=(), n_requests: int = 0,
                  burst: bool = False, requests=None, deepgemm_jit: bool = True) -> ServePrediction:
    """One plan: memory, then the simulation (phase both / prefill) or the steady decode step.
    `burst`: all `n_requests` arrive at t=0 and are not replaced (how "N prompts sent at once"
    benchmarks run); otherwise a closed loop at `workload.concurrency` until `n_requests`
    (default 4 x concurrency, at least 64) have been issued, measured after the first concurrency.
    `requests` (burst only): the (isl, osl) of every request (e.g. `lengths.sharegpt_lengths`);
    default `n_requests` of exactly workload.isl / osl. Requests are dealt round robin to the
    replicas and attention-DP ranks (SGLang's DP controller); one rank's share is simulated and
    throughput = all its tokens / its makespan (bench_serving's total throughput).
    `deepgemm_jit`: SGLANG_ENABLE_JIT_DEEPGEMM (default on, as in SGLang); off changes the GEMM
    kernels SGLang runs (`kernel_path`)."""
    cal = calibration or load_default()
    w = workload
    eff = effective_plans([plan], model, cluster)[0]
    est = rank_arrays(model, cluster, [eff], w, precision=precision, tables=tables, calibration=cal,
                      imbalance=imbalance, routing_skew=routing_skew, deepgemm_jit=deepgemm_jit)
    reasons = [r for r in extra_reasons] + ([str(est["reason"][0])] if est["reason"][0] else [])
    c, sm, fp8 = _setup(model, cluster, [eff], precision, tables, imbalance, routing_skew, deepgemm_jit)
    gpus_inst = int(c.tp[0] * c.pp[0])
    a = int(c.attn_dp[0])
    plan = eff.source
    out = ServePrediction(
        feasible=not reasons, reasons=reasons,
        input_tokens_per_s_per_gpu=float(est["input_tokens_per_s_per_gpu"][0]),
        output_tokens_per_s_per_gpu=float(est["output_tokens_per_s_per_gpu"][0]),
        ttft_p90_s=None if np.isnan(est["ttft_s"][0]) else float(est["ttft_s"][0]),
        tpot_p90_s=None if np.isnan(est["tpot_s"][0]) else float(est["tpot_s"][0]),
        max_batch=float(est["max_batch_per_gpu"][0]), memory_gib=float(est["memory_gib"][0]),
        plan=plan.canonical(), effective_plan=eff.plan.canonical(),
        extra={"method": "steady-state", "weights_gib": float(est["weights_gib"][0]),
               "mem_frac": float(est["mem_frac"][0]), "kv_pool_tokens_per_gpu": float(est["kv_pool_tokens"][0]),
               "replicas": int(est["replicas"][0]), "calibration_scale": cal.scale, "calibration_id": cal.id,
               "calibration_factors": dict(zip(("prefill", "decode"), phase_factors(cal))),
               "cuda_graphs_decode": bool(c.graph_bs[0] > 0),
               "gemm_paths": kernel_paths(cluster, fp8, bool(c.a2a[0] > 0), deepgemm_jit, dense_fp8=sm.lin_fp8,
                                          arch=sm.arch)})
    if c.pd_p[0] > 0 and w.phase == "both":
        out.extra.update({"method": "pd-steady-state", "pd_bound": str(est["pd_bound"][0])})
        return out
    if w.phase == "decode":  # the batch each attention-DP rank decodes, and what waits for room
        out.extra.update({"decode_batch_rank": float(est["batch_rank"][0]), "queued_rank": float(est["queued_rank"][0])})
    if w.phase == "decode" or est["reason"][0] in ("weights_exceed_hbm", "weights_exceed_mem_fraction",
                                                     "kv_pool_below_one_request"):
        return out
    s_pre, s_dec = phase_factors(cal)
    max_b = int(max(est["max_batch_per_gpu"][0] * gpus_inst / a, 1))
    if burst and requests is not None:
        # lengths vary: the running cap is SGLang's request limit, the KV pool is enforced per request
        max_b = int(max(c.max_running[0] // a if c.max_running[0] else DEFAULT_MAX_RUNNING, 1))
    chunk = int(c.chunk[0])
    if burst and requests is not None:
        requests = [(int(a_), int(b_)) for a_, b_ in requests]
        isl_max = max(r_[0] for r_ in requests)
        ctx_max = float(max(a_ + b_ for a_, b_ in requests))
    else:
        isl_max = w.isl
        ctx_max = float(w.isl + w.osl)
    bs = np.unique(np.geomspace(1, max(max_b, 2), 24).round())
    dec = _grid_fn(lambda b, x: s_dec * sm.decode(b, x)[0], bs, np.linspace(1, ctx_max, 6))
    cs = np.unique(np.geomspace(1, max(chunk, 2), 16).round())
    replicas = int(est["replicas"][0])
    osl = 1 if w.phase == "prefill" else w.osl
    # a burst starts every rank with a queue (their extends coincide); a closed loop's steady
    # state as one rank sees it (`own_extend`)
    r_ext, stall = None, 0.0
    if not burst and w.phase == "both":
        K_ss = max(int(round(max(w.concurrency, 1) / (replicas * a))), 1)
        q, p_ext, _, _ = (float(v) for v in extend_share(a, min(K_ss, max_b), w.isl, osl, chunk))
        r_ext, stall = own_extend(a, q, p_ext)

    def prefill_grid(ranks):
        """A prefill step of (tokens, mean context a new token attends to), as the simulator
        tracks it, with `ranks` attention-DP ranks extending (None: all)."""
        return _grid_fn(lambda t, x: s_pre * sm.prefill(t, *context_split(t, x), ranks=ranks)[0], cs,
                        np.linspace(0, max(isl_max, 1), 5))
    pre = prefill_grid(r_ext)
    pre_all = prefill_grid(None) if stall > 0 else None  # a queued rank's step: every rank extends (`simulate`)
    if burst:
        # dealt round robin over the ranks (SGLang's DP controller and replicas' router default),
        # each rank's share simulated: the burst lasts until its slowest rank is done, and a rank's
        # share of a length-varied burst may hold more of the tail than another's. Without per-request
        # lengths every rank gets the same share, so one simulation stands for all
        ranks = replicas * a
        if requests is None:
            requests = [(w.isl, osl)] * (max(n_requests // ranks, 1) * ranks)
        done: dict = {}
        runs = []
        for k in range(min(ranks, len(requests))):
            share = tuple((0.0, i_, 1 if w.phase == "prefill" else o_) for i_, o_ in requests[k::ranks])
            if share not in done:
                done[share] = simulate(pre, dec, list(share), chunk=chunk, max_batch=max_b,
                                       kv_tokens=est["kv_pool_tokens"][0])
            runs.append(done[share])
        r = max(runs, key=lambda x: x["makespan_s"])
        r = dict(r, ttft=np.concatenate([x["ttft"] for x in runs]), tpot=np.concatenate([x["tpot"] for x in runs]),
                 in_tokens=sum(x["in_tokens"] for x in runs) / ranks,
                 out_tokens=sum(x["out_tokens"] for x in runs) / ranks, steps=max(x["steps"] for x in runs))
        window, in_t, out_t = r["makespan_s"], r["in_tokens"], r["out_tokens"]
    else:
        K = max(int(round(max(w.concurrency, 1) / (replicas * a))), 1)
        total = n_requests or max(4 * K, 64)
        first = min(chunk, w.isl)
        # a request's life in the desynchronised steady state the stagger starts from: its decode
        # steps, its own prefill and those of the other K - 1 in flight, each replaced once per life
        # (a spacing life / K at least one prefill long, so decode steps run between the arrivals;
        # counting only its own prefill put that spacing at a prefill's length for some workloads,
        # DeepSeek-V3 TP8 2000/200 at 64, and the loop fell into lock-step waves there)
        pre_one = np.ceil(w.isl / chunk) * pre(first, first / 2.0)
        life = (min(K, max_b) * pre_one + (osl - 1) * dec(min(K, max_b), w.isl + osl / 2)) if osl > 1 else pre_one
        r = simulate(pre, dec, [(0.0, w.isl, osl)], chunk=chunk, max_batch=max_b,
                     kv_tokens=est["kv_pool_tokens"][0], closed_loop=K, total=total, stagger_s=float(life),
                     prefill_stall=stall, prefill_aligned_t=pre_all)
        # throughput: tokens made between the first completion (warm-up over) and the last time a
        # request was issued (the loop still at full concurrency)
        tr, done = r["trace"], np.sort(r["done_t"])
        t_a, t_b = (done[0] if len(done) else 0.0), r["last_issue_s"]
        if t_b <= t_a or len(tr) < 2:
            t_a, t_b = 0.0, r["makespan_s"]
        ia, ib = np.searchsorted(tr[:, 0], t_a), min(np.searchsorted(tr[:, 0], t_b), len(tr) - 1)
        window = tr[ib, 0] - tr[ia, 0] if ib > ia else r["makespan_s"]
        in_t, out_t = (tr[ib, 1] - tr[ia, 1], tr[ib, 2] - tr[ia, 2]) if ib > ia else (r["in_tokens"], r["out_tokens"])
    per_gpu = a / gpus_inst / max(window, 1e-12)
    out.input_tokens_per_s_per_gpu = float(in_t * per_gpu)
    out.output_tokens_per_s_per_gpu = float(out_t * per_gpu) if w.phase != "prefill" else 0.0
    # closed loop: the first K requests all arrive at t=0 (a warm-up burst); percentiles are taken
    # over the requests after them (FIFO: the first K prefills and, mostly, the first K completions)
    skip = 0 if burst else min(K, max(len(r["ttft"]) - K, 0))
    ttft = request_ttft(r["ttft"])
    out.ttft_p90_s = float(np.percentile(ttft[skip:], 90))
    # medians beside p90 (published results often quote medians or means), and the closed loop's
    # TTFT including its warm-up burst (the first K requests arrive together, as a benchmark client
    # starts them): what a published mean over all requests contains
    out.extra["ttft_p50_s"] = float(np.percentile(ttft[skip:], 50))
    out.extra["ttft_mean_with_warmup_s"] = float(np.mean(ttft))
    if w.phase != "prefill":
        tp = r["tpot"][skip:]
        tp = tp[tp > 0]
        out.tpot_p90_s = float(np.percentile(tp, 90)) if len(tp) else None
        out.extra["tpot_p50_s"] = float(np.percentile(tp, 50)) if len(tp) else None
    out.extra.update({"method": "simulation", "sim_steps": int(r["steps"]), "sim_requests": len(r["ttft"]),
                      "steady_state_output_tokens_per_s_per_gpu": float(est["output_tokens_per_s_per_gpu"][0])})
    return out


__all__ = ["ServePrediction", "predict_serve", "rank_arrays", "effective_plans"]
