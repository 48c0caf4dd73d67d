"""A small discrete-event simulation of SGLang's continuous batching with chunked prefill, for one
attention-DP rank of one instance (the ranks run in lock step; replicas are independent).

Scheduling follows SGLang's default (no mixed chunk): when requests wait and the batch has room,
the next step is a prefill (extend) step packing up to `chunk` new tokens from the head of the
queue (a long prompt spans several steps); otherwise every running request decodes one token.
A request's first token comes at the end of its last prefill chunk. Step times come from
callables (interpolated on a grid of the step model), so a run of thousands of steps is cheap.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from cost_model.serving.constants import REQUEST_FIXED_S


def request_ttft(gpu_ttft):
    """A request's TTFT: what the GPU steps give it (queueing, its prefill chunks) plus the fixed
    per-request cost outside them (constants.REQUEST_FIXED_S: HTTP, tokenize, stream back)."""
    return np.asarray(gpu_ttft, float) + REQUEST_FIXED_S


def _step_seconds(x, what: str) -> float:
    """A step time the clock can advance by: finite and >= 0. A NaN would freeze the clock (arrivals
    compare false against it) and the loop would never end; refuse it instead."""
    dt = float(x)
    if not (math.isfinite(dt) and dt >= 0):
        raise ValueError(f"serving simulator: the {what} step model gave {dt} s (expected a finite time >= 0)")
    return dt


def simulate(prefill_t, decode_t, requests, *, chunk: int, max_batch: int, kv_tokens: float,
             closed_loop: int = 0, total: int = 0, stagger_s: float = 0.0, prefill_stall: float = 0.0,
             prefill_aligned_t=None) -> dict:
    """Run the simulation.

    Args:
        prefill_t(tokens, mean_context) / decode_t(batch, mean_context): step seconds (a prefill
            token's context: its request's prefix plus its position in its own segment).
        requests: (arrival_s, isl, osl) tuples; with `closed_loop` = K, only the first K are
            used at t=0 and each completion starts the next one (isl/osl cycling through the list)
            until `total` requests have been issued.
        chunk: prefill tokens per step; max_batch: running requests at most; kv_tokens: KV pool.
        stagger_s: closed loop only: the first K requests arrive spread evenly over this span
            rather than all at t=0, so that fixed lengths do not lock the loop into waves of
            simultaneous completions (real length spreads break such waves).
        prefill_stall: the extend steps of other attention-DP ranks that follow each prefill
            step of this one (`serving.extend_share`): the MoE layers hold every rank, so that
            many of this rank's next decode steps last as long as this extend (it still makes
            its tokens in them). Not when the rank has a queue (a request not yet started still
            waits after the step): the ranks are alike, so the others have queues too and extend
            in the same step (as a burst's do), priced by `prefill_aligned_t` (every rank's
            tokens through the MoE layers; default `prefill_t`), and none follow. Without this a
            closed loop's fill (K arrivals spread over one request's life) ran every extend one
            rank at a time, and its queue outlived the simulated window (TTFT p90 104 s for
            DeepSeek-V3 attention-DP 8 on 16 H200 at concurrency 384).

    Returns dict: ttft (array, s), tpot (array, s), makespan_s, in_tokens, out_tokens, steps,
    window (s, the span the throughputs are measured over), in_tps, out_tps (per rank).
    """
    reqs = list(requests)
    pending = deque(sorted(reqs, key=lambda r: r[0])) if not closed_loop else deque()
    waiting: deque = deque()
    if closed_loop:
        n0 = min(closed_loop, total)
        for i in range(n0):
            _, a, b = reqs[i % len(reqs)]
            pending.append((stagger_s * i / n0, a, b))  # arrival, isl, osl
        issued = n0
    t = 0.0
    run_ctx: list = []  # running requests: [context, remaining, first_token_t, arrival, kv, decode tokens]
    ttft, tpot = [], []
    in_tok = out_tok = steps = 0
    kv_used = 0.0
    done_t = []
    trace = []  # (time, input tokens so far, output tokens so far) after every step
    last_issue = 0.0
    owed, owed_dt = 0.0, 0.0  # neighbours' extend steps still to hold this rank's decodes, their length
    while pending or waiting or run_ctx:
        while pending and pending[0][0] <= t:
            a, i_, o_ = pending.popleft()
            waiting.append([a, i_, o_, 0])
        room = len(run_ctx) < max_batch
        head_fits = bool(waiting) and (waiting[0][3] > 0 or kv_used + waiting[0][1] + waiting[0][2] <= kv_tokens)
        if waiting and room and (head_fits or not run_ctx):
            budget, batch, ctx_sum, toks = chunk, [], 0.0, 0
            while waiting and budget > 0 and len(run_ctx) + len(batch) < max_batch:
                r = waiting[0]
                if r[3] == 0 and kv_used + r[1] + r[2] > kv_tokens and (run_ctx or batch):
                    break
                take = min(budget, r[1] - r[3])
                if r[3] == 0:  # its first chunk reserves the request's whole KV (isl + osl)
                    kv_used += r[1] + r[2]
                ctx_sum += take * (r[3] + take / 2.0)  # causal inside its own request only
                r[3] += take
                budget -= take
                toks += take
                if r[3] >= r[1]:
                    batch.append(waiting.popleft())
                else:
                    break  # a partially prefilled request stays at the head
            queued = prefill_stall > 0 and any(r[3] == 0 for r in waiting)
            step_t = prefill_aligned_t if (queued and prefill_aligned_t is not None) else prefill_t
            dt = _step_seconds(step_t(toks, ctx_sum / max(toks, 1)), "prefill")
            t += dt
            steps += 1
            in_tok += toks
            trace.append((t, in_tok, out_tok + len(batch)))
            for r in batch:
                ttft.append(t - r[0])
                out_tok += 1
                if r[2] <= 1:
                    kv_used -= r[1] + r[2]
                    done_t.append(t)
                    tpot.append(0.0)
                else:
                    run_ctx.append([r[1] + 1, r[2] - 1, t, r[0], r[1] + r[2], r[2] - 1])
            # the other ranks' extends come after this one's first tokens: its next decode steps
            # run at their length (on average a request's own extend overlaps none of them); with
            # a queue they coincide with this one
            if not queued and prefill_stall > 0:
                owed_dt = max(owed_dt, dt) if owed > 0 else dt  # the longest extend still owed
                owed += prefill_stall
            continue
        if run_ctx:
            ctx = np.array([r[0] for r in run_ctx], float)
            dt = _step_seconds(decode_t(len(run_ctx), float(ctx.mean())), "decode")
            if owed > 0:  # a neighbour's extend holds this step (a fraction of one: its share)
                share = min(owed, 1.0)
                dt += share * max(owed_dt - dt, 0.0)
                owed -= share
            t += dt
            steps += 1
            out_tok += len(run_ctx)
            trace.append((t, in_tok, out_tok))
            keep = []
            for r in run_ctx:
                r[0] += 1
                r[1] -= 1
                if r[1] <= 0:  # r = [context, remaining, first_token_t, arrival, kv, decode tokens]
                    tpot.append((t - r[2]) / r[5])
                    kv_used -= r[4]
                    done_t.append(t)
                else:
                    keep.append(r)
            finished = len(run_ctx) - len(keep)
            run_ctx = keep
            if closed_loop:
                for _ in range(finished):
                    if issued < total:
                        _, a, b = reqs[issued % len(reqs)]
                        waiting.append([t, a, b, 0])
                        issued += 1
                        last_issue = t
            continue
        if pending:
            t = max(t, pending[0][0])
            continue
        break  # waiting requests that can never fit
    return {"ttft": np.array(ttft), "tpot": np.array(tpot), "makespan_s": t, "in_tokens": in_tok,
            "out_tokens": out_tok, "steps": steps, "done_t": np.array(done_t),
            "trace": np.array(trace).reshape(-1, 3), "last_issue_s": last_issue}
