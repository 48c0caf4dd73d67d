"""Prefill/decode-disaggregated plans (`pd=P:D`): steady state of one xPyD unit, vectorised.

A unit is P prefill instances and D decode instances of the plan (each tp*pp GPUs); the
deployment holds `num_devices // ((P + D) * tp * pp)` units. Per unit:
- prefill pool: every attention-DP rank runs chunked-prefill steps back to back (no decode steps
  between them); its memory is sized as SGLang sizes a prefill server (no decode-graph, attention-DP
  padding or DeepEP reserve: the resolved `mem_frac_prefill`).
- KV transfer: a request's KV (isl tokens x KV bytes per token per GPU) leaves each prefill GPU
  over its own scale-out NIC (Mooncake / NIXL RDMA, `cluster.scaleout_gbps`); it adds to TTFT and
  bounds the unit's rate, it does not stall the prefill GPU (transfer runs beside the next chunk).
- decode pool: steady decode steps at the batch the unit's concurrency puts on each decode rank
  (capped by the decode server's KV pool, `role="decode"`); TPOT is one decode step, with no
  prefill interruptions (the point of disaggregation).
- rate: the slowest of the three; tokens per GPU count all (P + D) * tp * pp GPUs of the unit.
"""
from __future__ import annotations

import numpy as np

from cost_model.serving.calibration import phase_factors
from cost_model.serving.memory import capacity
from cost_model.serving.sim import request_ttft


def pd_arrays(model, cluster, c, sm, w, cal) -> dict:
    """Per plan (as if every plan were pd; callers select the rows with c.pd_p > 0)."""
    isl, osl = float(w.isl), float(max(w.osl, 1))
    P = np.maximum(c.pd_p, 1).astype(float)
    D = np.maximum(c.pd_d, 1).astype(float)
    g = (c.tp * c.pp).astype(float)
    unit_gpus = (P + D) * g
    units = np.maximum(cluster.num_devices // unit_gpus, 1)
    cap_p = capacity(model, cluster, c, isl, 1.0, sm.wbytes, role="prefill")
    cap_d = capacity(model, cluster, c, isl, osl, sm.wbytes, role="decode")
    # prefill pool: tokens/s of the unit
    s_pre, s_dec = phase_factors(cal)
    C = np.minimum(c.chunk, isl).astype(float)
    t_pre = s_pre * sm.prefill(C, (np.ceil(isl / C) - 1) * C / 2)[0]
    pre_tok_s = P * c.attn_dp * C / t_pre
    # KV transfer: bytes of one request's KV leaving its prefill GPUs, each over its own NIC
    nic = cluster.scaleout_gbps / 8 * 1e9
    kv_req_gpu = isl * sm.kvt  # per GPU of the prefill rank's attention-TP group
    t_xfer = kv_req_gpu / nic
    xfer_req_s = P * c.attn_dp / t_xfer  # requests/s: every prefill rank's GPUs send in parallel
    # decode pool
    conc_unit = max(w.concurrency, 1) / units
    B = np.clip(conc_unit / (D * c.attn_dp), 1.0, np.maximum(cap_d["max_batch_rank"], 1.0))
    t_dec = s_dec * sm.decode(B, isl + osl / 2)[0]
    dec_req_s = D * c.attn_dp * B / t_dec / osl
    req_s = np.minimum(np.minimum(pre_tok_s / isl, xfer_req_s), dec_req_s)
    out_gpu = req_s * osl / unit_gpus
    # TTFT: one prompt's prefill chunks + its transfer + waiting for a decode slot when the unit
    # holds more requests than its decode ranks can run
    waiting = np.maximum(conc_unit - D * c.attn_dp * B, 0.0)
    ttft = request_ttft(np.ceil(isl / C) * t_pre + t_xfer + waiting / req_s)
    fits = cap_p["fits"] & cap_d["fits"]
    reason = np.where(cap_p["reason"] != "", cap_p["reason"], cap_d["reason"])
    return {"output_tokens_per_s_per_gpu": out_gpu, "input_tokens_per_s_per_gpu": out_gpu * isl / osl,
            "ttft_s": ttft, "tpot_s": t_dec, "batch_rank": B, "fits": fits, "reason": reason,
            "max_batch_per_gpu": cap_d["max_batch_instance"] / g, "memory_gib": np.maximum(cap_p["memory_gib"], cap_d["memory_gib"]),
            "weights_gib": cap_d["weights_gib"], "mem_frac": cap_d["mem_frac"], "kv_pool_tokens": cap_d["kv_pool_tokens"],
            "replicas": units, "pd_bound": np.where(req_s == dec_req_s, "decode", np.where(req_s == xfer_req_s, "kv_transfer", "prefill")),
            "prefill_mem_frac": cap_p["mem_frac"], "kv_transfer_s": t_xfer}
