"""Seconds of one SGLang forward step, vectorised over plans: a prefill (extend) step of a chunk
and a decode step of a batch. Every rate comes from the shared tables through `TableOps`
(GEMM, grouped GEMM, attention, collectives, EP dispatch, memory bandwidth, launch gap).

Conventions: `c` is a `ServeCols`; per-plan arrays broadcast with it. Tokens "per rank" belong to
one attention-DP rank; an instance runs all of its attention-DP ranks in lock step (MoE layers
synchronise them), so a step's tokens per instance are rank tokens x attn_dp.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from clusters import is_blackwell
from cost_model.blocks import ep_wire_seconds
from cost_model.flops import param_counts
from cost_model.ops import TableOps
from cost_model.serving.constants import GPU_KERNEL_GAP_S, KERNEL_MIN_S, KERNELS_PER_LAYER, PRICED_KERNELS, SCHED_OVERHEAD_S, SMALL_KERNELS_PER_LAYER
from cost_model.serving.fused_moe import expert_bandwidth_efficiency
from cost_model.serving.kernel_path import step_efficiencies
from cost_model.serving.memory import kv_bytes_per_token
from specs.errors import InputError

DATA = Path(__file__).resolve().parent.parent / "data" / "ep_dispatch_combine_bandwidth.csv"


def _low_latency_rates() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DeepEP low-latency kernel rates by EP size (ep, dispatch GB/s, combine GB/s): the DeepEP
    README rows (H800, 128 tokens per rank, 7168 hidden, top-8, FP8 dispatch / BF16 combine) in
    cost_model/data/ep_dispatch_combine_bandwidth.csv. Used as is on Hopper (same ConnectX-7 NICs
    that bound the low-latency kernels); no other source exists for H200."""
    rows = [r for r in csv.DictReader(DATA.open()) if r["kernel"] == "low_latency" and r["library"] == "deepep-v1"]
    rows.sort(key=lambda r: int(r["ep"]))
    return (np.array([float(r["ep"]) for r in rows]), np.array([float(r["dispatch_gbps"]) for r in rows]),
            np.array([float(r["combine_gbps"]) for r in rows]))


_LL = None
CUSTOM_AR = Path(__file__).resolve().parent.parent / "data" / "custom_allreduce_latency.csv"
_CAR: dict = {}


def _custom_ar_rows(hw: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tp sizes, log message bytes, latency seconds [tp, bytes]) of SGLang's custom all-reduce on
    `hw` (cost_model/data/custom_allreduce_latency.csv: h100 from sglang PR #2904; b200 derived
    from it by Blackwell's own small-message latency and NVLink bandwidth, sources in the rows)."""
    if hw not in _CAR:
        rows = [r for r in csv.DictReader(CUSTOM_AR.open()) if r["hw"] == hw]
        tps = np.array(sorted({int(r["tp"]) for r in rows}), float)
        sizes = np.array(sorted({int(r["bytes"]) for r in rows}), float)
        lat = np.zeros((len(tps), len(sizes)))
        for r in rows:
            lat[list(tps).index(float(r["tp"])), list(sizes).index(float(r["bytes"]))] = float(r["latency_us"]) * 1e-6
        _CAR[hw] = (tps, np.log(sizes), lat)
    return _CAR[hw]


class StepModel:
    """Step-time functions of one model on one cluster (fixed precision) for plan columns `c`."""

    def __init__(self, spec, cluster, tables, c, *, fp8: bool, imbalance: float = 1.0, routing_skew: float = 0.0,
                 deepgemm_jit: bool = True):
        # the boundary of the serving model: a NaN here would become a NaN clock in the simulator
        if not (math.isfinite(routing_skew) and routing_skew >= 0):
            raise InputError(f"routing skew must be a finite number >= 0, got {routing_skew}")
        if not (math.isfinite(imbalance) and imbalance >= 1):
            raise InputError(f"routing imbalance must be a finite number >= 1, got {imbalance}")
        self.s, self.cl, self.c = spec, cluster, c
        self.fp8 = fp8
        self.ops = TableOps(tables, cluster, np.full(len(c), fp8))
        self.wbytes = 1.0 if fp8 else 2.0
        # the GEMM kernels SGLang runs (DeepGEMM, CUTLASS, Triton fused_moe, ...) next to the
        # tables' kernel: dense linears, and routed experts per plan (`kernel_path`)
        self.dense_eff, self.moe_eff = step_efficiencies(cluster, fp8, c.a2a, deepgemm_jit)
        # a GPU kernel's minimum duration (constants.KERNEL_MIN_S); on CPU only the launch gap
        self.kmin = KERNEL_MIN_S if cluster.is_gpu else GPU_KERNEL_GAP_S
        self.imb = imbalance
        self.pc = param_counts(spec)
        self.hbm_bw = self.ops.bw["elementwise"]  # achieved bytes/s of a memory-bound kernel
        # achieved bytes/s of the routed-expert kernel (GPU: measured fused-MoE timings by shard row bytes)
        self.expert_bw = (cluster.hbm_tbps * 1e12 * expert_bandwidth_efficiency(spec.moe_ffn_hidden_size / c.moe_tp,
                                                                               self.wbytes)
                          if cluster.is_gpu and spec.num_experts else self.hbm_bw)
        self.kvt = kv_bytes_per_token(spec, c)  # per GPU, per token, one stage
        self.layers = spec.num_layers / c.pp
        self.L_moe = self.pc["num_moe_layers"] / c.pp
        self.L_dense = self.pc["num_dense_layers"] / c.pp
        E = max(spec.num_experts, 1)
        # routing popularity of the experts (Zipf exponent `routing_skew`; 0 = uniform), with EPLB's
        # redundant copies spreading the hottest ones: what "distinct experts activated" is taken over
        rank = np.arange(1, E + 1, dtype=float)
        pop = rank ** -routing_skew
        self.pop = pop / pop.sum()

    # ---- pieces ---------------------------------------------------------------------------
    def all_reduce(self, nbytes, n):
        """Seconds of one all-reduce of `nbytes` over `n` GPUs as SGLang runs it: its custom
        all-reduce inside one NVLink node (n in 2..8) at the latencies measured for it (table up to
        1 MiB, interpolated in log bytes and in n; larger messages: the collectives table, never
        below the table's 1 MiB latency); NCCL (the collectives table) across nodes. The custom
        kernel's figures are H100's, measured without CUDA graphs (an upper bound inside a decode
        graph), used for every Hopper/Ampere node; Blackwell nodes use their own rows."""
        tps, lsz, lat = _custom_ar_rows("b200" if is_blackwell(self.cl) else "h100")
        nccl = self.ops.collective("all_reduce", nbytes, n, 1)
        nb = np.maximum(np.asarray(nbytes, float), 1.0)
        n = np.asarray(n, float) * np.ones_like(nb)
        lb = np.clip(np.log(nb), lsz[0], lsz[-1])
        by_tp = np.array([np.interp(lb, lsz, row) for row in lat])  # [tp, ...]
        nn = np.clip(n, tps[0], tps[-1])
        i = np.clip(np.searchsorted(tps, nn, side="right") - 1, 0, len(tps) - 2)
        w = (nn - tps[i]) / (tps[i + 1] - tps[i])
        flat = by_tp.reshape(len(tps), -1)
        ii = i.reshape(-1)
        k = np.arange(flat.shape[1])
        custom = ((1 - w.reshape(-1)) * flat[ii, k] + w.reshape(-1) * flat[ii + 1, k]).reshape(nb.shape)
        # (log bytes are clipped to the table: above 1 MiB `custom` is the 1 MiB latency, the floor)
        big = np.maximum(nccl, custom)
        intra = (n >= 2) & (n <= min(self.cl.devices_per_node, 8)) & self.cl.is_gpu
        small = nb <= np.exp(lsz[-1])
        return np.where(n < 2, 0.0, np.where(intra, np.where(small, custom, big), nccl))

    def _gemm(self, m, params_per_gpu):
        """Seconds of the dense GEMMs holding `params_per_gpu` weights at m rows: the slower of
        the table's compute rate (as one [m, h] x [h, n] GEMM) and reading the weights once."""
        h = self.s.hidden_size
        n = np.maximum(params_per_gpu / h, 1.0)
        f, _ = self.ops.gemm(m, n, h)
        f = f / self.dense_eff + self.ops.fp8_cast(np.maximum(np.asarray(m, float), 1.0) * h)  # w8a8: the input cast
        return np.maximum(f, params_per_gpu * self.wbytes / self.hbm_bw)

    def _shared(self, tokens_inst):
        """Seconds of the shared expert (and router) on one GPU for `tokens_inst` tokens of the
        instance. Under a DeepEP all-to-all SGLang keeps the shared expert whole on every rank
        (sglang models/deepseek_v2.py: "disable tp for shared experts when enable deepep moe",
        tp_size=1), each rank running its own tokens; otherwise it is TP-sharded over the
        gathered tokens. Same FLOPs, different shapes: T x (params / tp) is a thin GEMM."""
        c, pl = self.c, self.pc["per_layer"]
        params = pl["shared_expert"] + pl["router"]
        a2a = c.a2a > 0
        return np.where(a2a, self._gemm(tokens_inst / c.tp, params), self._gemm(tokens_inst, params / c.tp))

    def _dense_mlp(self, tokens_inst):
        """Seconds of one dense (non-MoE) MLP layer on one GPU for `tokens_inst` tokens of the
        instance. SGLang's default shards it over the whole TP group, which runs every token of the
        instance (attention-DP ranks gather theirs first); with --moe-dense-tp-size 1 (`c.dense_tp`
        = 1) every rank holds it whole and runs only its own tokens (its attention-TP slice of its
        attention-DP rank's tokens: tokens_inst / tp). Same FLOPs, tp x the weights read."""
        c, params = self.c, self.pc["per_layer"]["dense_mlp"]
        return np.where(c.dense_tp == 1, self._gemm(tokens_inst / c.tp, params), self._gemm(tokens_inst, params / c.tp))

    def distinct_experts(self, tokens):
        """Expected distinct routed experts that `tokens` tokens activate (each picks top-k of E
        without replacement; the probability that one token picks expert e is k * p_e, capped at 1)."""
        k = self.s.moe_router_topk
        q = np.minimum(k * self.pop, 1.0)  # [E]
        t = np.asarray(tokens, float)[..., None]
        return np.sum(1.0 - (1.0 - q) ** t, axis=-1)

    def active_local_experts(self, tokens_inst):
        """Distinct routed experts (EPLB copies included) on one GPU that `tokens_inst` tokens of the
        instance activate in one MoE layer."""
        s, c = self.s, self.c
        E = s.num_experts
        e_loc = (E + c.redundant) / c.ep
        return np.minimum(self.distinct_experts(tokens_inst) / c.ep * (1 + c.redundant / E), e_loc)

    def expert_weight_bytes(self, tokens_inst):
        """Bytes of routed-expert weights one GPU reads in one MoE layer for `tokens_inst` tokens of
        the instance (gate, up and down of each activated local expert): the HBM floor of the layer."""
        s, c = self.s, self.c
        if not s.num_experts:
            return np.zeros(len(c))
        f_loc = s.moe_ffn_hidden_size / c.moe_tp
        return self.active_local_experts(tokens_inst) * 3 * s.hidden_size * f_loc * self.wbytes

    def _experts(self, tokens_inst):
        """Routed-expert seconds per MoE layer on one GPU for `tokens_inst` tokens of the instance."""
        s, c = self.s, self.c
        if not s.num_experts:
            return 0.0
        k, h = s.moe_router_topk, s.hidden_size
        f_loc = s.moe_ffn_hidden_size / c.moe_tp
        rows = tokens_inst * k / c.ep * self.imb  # routed rows landing on this GPU
        active = np.maximum(self.active_local_experts(tokens_inst), 1e-9)
        m = np.maximum(rows / active, 1.0)
        up, _ = self.ops.grouped(active, m, 2 * f_loc, h, True)
        down, _ = self.ops.grouped(active, m, h, f_loc, True)
        up, down = up / self.moe_eff, down / self.moe_eff  # the kernel SGLang runs (`kernel_path`)
        g = np.maximum(active, 1.0)  # as `grouped` clamps it
        up = up + self.ops.fp8_cast(g * m * h)  # w8a8: each expert GEMM's input cast
        down = down + self.ops.fp8_cast(g * m * f_loc)
        # decode: the weights the batch activates, read at the bandwidth the fused-MoE kernel
        # reaches at this shard width (thin expert-TP shards far below the HBM peak; `fused_moe`)
        gemms = np.maximum(up + down, self.expert_weight_bytes(tokens_inst) / self.expert_bw)
        # without an all-to-all the fused_moe runner writes every routed copy's output
        # ([tokens, topk, hidden] bf16) and a separate kernel sums the top-k copies of each token
        # (sglang fused_moe.py moe_sum_reduce_triton: reads them, writes [tokens, hidden]); under
        # DeepEP the combine does that sum (priced in `_comm`)
        topk_sum = tokens_inst * (k + 1) * h * 2.0 / self.hbm_bw
        return gemms + np.where(c.a2a > 0, 0.0, topk_sum)

    def _comm(self, tokens_inst, decode: bool = False):
        """Communication seconds on one GPU per (MoE layer, dense layer).

        A dense layer under SGLang's default TP pays the MoE layer's plain collectives (all-reduces,
        or attention DP's gather and reduce-scatter over the whole TP group); with
        --moe-dense-tp-size 1 its MLP runs on each rank's own tokens and only attention's
        attention-TP collective remains (a reduce-scatter after attention and an all-gather before
        the next, one all-reduce's bytes; nothing at attention-TP 1).

        DeepEP runs two kernel families that are priced apart: normal (prefill; decode with
        deepep_mode=normal) at the table's NVLink/RDMA rates plus its latency, with a host sync
        that keeps it out of CUDA graphs; low latency (decode in auto / low_latency mode, and
        prefill in low_latency mode) at the DeepEP README low-latency rates, graph-capturable."""
        global _LL
        s, c, o = self.s, self.c, self.ops
        h = s.hidden_size
        act = tokens_inst * h * 2.0  # bf16 hidden states of the instance
        # no all-to-all: attention-TP all-reduce, or with attention-DP a gather before the MoE and a
        # reduce-scatter after it over the whole TP group
        ar_attn = self.all_reduce(act / c.attn_dp, c.attn_tp)
        gather = o.collective("all_gather", act, c.tp, 1) + o.collective("reduce_scatter", act, c.tp, 1)
        ar_moe = self.all_reduce(act, c.tp)
        plain = np.where(c.attn_dp > 1, ar_attn + gather, 2 * ar_moe)
        # DeepEP: tokens of this GPU go to top-k experts (fp8 dispatch, bf16 combine)
        mine = tokens_inst / c.tp * s.moe_router_topk * self.imb
        bd, bc = mine * h * 1.0, mine * h * 2.0
        # normal kernels: each token crosses RDMA once per node it reaches and fans out over
        # NVLink there, the bytes the DeepEP README's rates count (`blocks.ep_wire_seconds`, the
        # rule the training model uses); charging every top-k copy on RDMA overprices them ~2x
        d, cb, _, _ = ep_wire_seconds(s, o, np.where(c.a2a > 0, 2, 0), tokens_inst / c.tp, h, np.full(len(c), self.fp8),
                                      c.ep, 1, self.imb)
        if _LL is None:
            _LL = _low_latency_rates()
        eps, dg, cg = _LL
        lep = np.log(np.maximum(c.ep, 1.0))
        ll_d = bd / (np.interp(lep, np.log(eps), dg) * 1e9)
        ll_c = bc / (np.interp(lep, np.log(eps), cg) * 1e9)
        lat = np.asarray(o.ep_dispatch(np.full(len(c), 2), 0.0 * bd, 0.0 * bc, c.ep, 1)[0])  # the table's latency
        ll = (c.low_latency_decode if decode else c.low_latency_prefill)
        d = np.where(ll, ll_d + lat, d)
        cb = np.where(ll, ll_c + lat, cb)
        a2a = ar_attn + d + cb
        dense = np.where(c.dense_tp == 1, ar_attn, plain)
        return np.where(c.a2a > 0, a2a, plain), dense

    def _two_batch(self, whole, half):
        """GPU seconds of a step: (compute, communication) of the whole batch `whole`, and of one half
        batch `half` for two-batch-overlap plans. TBO runs the step as two half-batch sub-steps, each
        with all of its kernels (each half re-reads the expert weights it activates, and launches
        its own kernels); layer by layer one half's communication runs while the other half
        computes, so communication hides only behind the other half's compute:
            TBO = 2 max(comp_h, comm_h)        otherwise comp + comm.
        At small decode batches comp_h is ~ comp (the expert weights dominate), so TBO costs about a
        second step; it pays only where communication is a large share of the step."""
        comp, comm = whole
        comp_h, comm_h = half
        tbo = 2.0 * np.maximum(comp_h, comm_h)
        return np.where(self.c.tbo, tbo, comp + comm)

    def _floor(self, t, group: str):
        """The priced kernels of `group` (constants.PRICED_KERNELS) each last at least a kernel's
        minimum duration: small batches are floor-bound, not bandwidth-bound."""
        return np.maximum(t, PRICED_KERNELS[group] * self.kmin)

    def _launch(self, gpu_s, graphs):
        """Launch cost and the kernels the step does not price by work. `gpu_s` holds the priced
        kernels (each already floored); the small kernels of every layer (norms, rope, router,
        activation, ...) add a kernel's minimum duration each, and the priced ones the GPU gap
        between kernels. Eager steps are floored by the CPU enqueueing every kernel, and each of
        their kernels also waits a launch gap (a graph replays them back to back, as the kernel
        minimum was measured). A TBO step launches every kernel twice (once per half batch)."""
        c = self.c
        per_layer = self.layers * np.where(c.tbo, 2, 1)
        kernels = KERNELS_PER_LAYER * per_layer
        gpu = (gpu_s + SMALL_KERNELS_PER_LAYER * per_layer * self.kmin
               + (KERNELS_PER_LAYER - SMALL_KERNELS_PER_LAYER) * per_layer * GPU_KERNEL_GAP_S)
        t = np.where(graphs, gpu, np.maximum(gpu, kernels * self.ops.gap) + kernels * GPU_KERNEL_GAP_S)
        return t + np.where(c.overlap_sched, 0.0, SCHED_OVERHEAD_S)

    # ---- steps ----------------------------------------------------------------------------
    def _decode_gpu(self, B, ctx):
        """(compute, communication, parts) seconds of one decode step at `B` requests per rank."""
        s, c, pl = self.s, self.c, self.pc["per_layer"]
        T = B * c.attn_dp
        proj = self._floor(self._gemm(B, pl["attention"] / c.attn_tp), "attention_proj")
        kv_read = B * ctx * self.kvt / self.layers
        heads = s.num_attention_heads / c.attn_tp
        if s.mla:  # absorbed MLA: scores and values against the latent
            fl = 2.0 * heads * (2 * s.kv_lora_rank + s.qk_pos_emb_head_dim) * ctx * B
            hd = s.kv_lora_rank + s.qk_pos_emb_head_dim
        else:
            fl = 4.0 * heads * s.head_dim * ctx * B
            hd = s.head_dim
        # one call over the rank's B requests x its heads (the table's bh axis)
        core_f, _ = self.ops.attention(fl, np.maximum(ctx, 16), min(hd, 256), B * heads)
        core = self._floor(np.maximum(kv_read / self.hbm_bw, core_f), "attention_core")
        dense = self._floor(self._dense_mlp(T), "mlp")
        shared = self._floor(self._shared(T), "mlp")
        experts = self._floor(self._experts(T), "experts") if s.num_experts else 0.0
        comm, comm_dense = self._comm(T, decode=True)
        head = self._gemm(T / c.attn_dp, self.pc["output_layer"] / c.tp) / c.pp
        comp = self.layers * (proj + core) + self.L_dense * dense + self.L_moe * (shared + experts) + head
        comm_t = self.L_moe * comm + self.L_dense * comm_dense
        parts = {"attention": self.layers * (proj + core) * c.pp, "experts": self.L_moe * experts * c.pp,
                 "dense_shared": (self.L_dense * dense + self.L_moe * shared) * c.pp, "communication": comm_t * c.pp}
        return comp, comm_t, parts

    def decode(self, batch_rank, ctx):
        """Seconds of one decode step: `batch_rank` running requests per attention-DP rank with a
        mean context of `ctx` tokens. Returns (seconds, dict of parts)."""
        c = self.c
        B = np.maximum(np.asarray(batch_rank, float), 1.0)
        comp, comm_t, parts = self._decode_gpu(B, ctx)
        comp_h, comm_h, _ = self._decode_gpu(np.maximum(B / 2.0, 1.0), ctx)
        gpu = self._two_batch((comp, comm_t), (comp_h, comm_h))
        graphs = (c.graph_bs > 0) & (B <= c.graph_bs)
        stage = self._launch(gpu, graphs)
        t = stage * c.pp  # the batch passes every stage once per token
        return t, {**parts, "cuda_graphs": graphs}

    def _prefill_gpu(self, C, prefix, seg, ranks):
        """(compute, communication, parts) seconds of one prefill step of `C` tokens per rank, made
        of segments of `seg` new tokens (one per request), each after `prefix` tokens of its own,
        on `ranks` attention-DP ranks at once (the MoE layers see their tokens together)."""
        s, c, pl = self.s, self.c, self.pc["per_layer"]
        T = C * ranks
        proj = self._floor(self._gemm(C, pl["attention"] / c.attn_tp), "attention_proj")
        heads = s.num_attention_heads / c.attn_tp
        if s.mla:  # prefill runs MLA un-absorbed: q.k over (nope + rope) dims, values over v dim
            dqk, dv = s.qk_head_dim + s.qk_pos_emb_head_dim, s.v_head_dim
        else:
            dqk = dv = s.head_dim
        # causal within each request only: a token attends to its request's prefix and the
        # tokens of its own segment before it (packed prompts do not see each other; SGLang's
        # extend attention runs one variable-length batch of C / seg sequences)
        fl = 2.0 * heads * C * (prefix + seg / 2.0) * (dqk + dv)
        core, _ = self.ops.attention(fl, prefix + seg, min(dqk, 256), heads * C / seg)
        core = self._floor(core, "attention_core")
        dense = self._floor(self._dense_mlp(T), "mlp")
        shared = self._floor(self._shared(T), "mlp")
        experts = self._floor(self._experts(T), "experts") if s.num_experts else 0.0
        comm, comm_dense = self._comm(T)
        comp = self.layers * (proj + core) + self.L_dense * dense + self.L_moe * (shared + experts)
        comm_t = self.L_moe * comm + self.L_dense * comm_dense
        parts = {"attention": self.layers * (proj + core) * c.pp, "experts": self.L_moe * experts * c.pp,
                 "communication": comm_t * c.pp}
        return comp, comm_t, parts

    def prefill(self, chunk_rank, prefix, seg=None, ranks=None):
        """Seconds of one prefill (extend) step of `chunk_rank` new tokens per attention-DP rank:
        requests' segments of `seg` new tokens each (default the whole chunk: one request) whose
        requests already hold `prefix` tokens of context (chunked prefill). TBO splits the chunk
        in two halves: whole requests when several are packed, else one request's two halves (the
        second half's attention also reads the first's tokens). `ranks`: attention-DP ranks that
        extend in this step (default all; the others wait for it at the MoE layers)."""
        c = self.c
        C = np.maximum(np.asarray(chunk_rank, float), 1.0)
        seg = C if seg is None else np.clip(np.asarray(seg, float), 1.0, C)
        ranks = c.attn_dp if ranks is None else np.clip(np.asarray(ranks, float), 1.0, c.attn_dp)
        comp, comm_t, parts = self._prefill_gpu(C, prefix, seg, ranks)
        seg_h = np.minimum(seg, np.maximum(C / 2.0, 1.0))
        comp_h, comm_h, _ = self._prefill_gpu(np.maximum(C / 2.0, 1.0), prefix + (seg - seg_h) / 2.0, seg_h, ranks)
        gpu = self._two_batch((comp, comm_t), (comp_h, comm_h))
        stage = self._launch(gpu, np.zeros(len(c), bool))
        return stage * c.pp, parts


def context_split(chunk, ctx):
    """(prefix, seg) of a prefill step of `chunk` tokens whose new tokens attend on average to
    `ctx` tokens (prefix plus position within their own segment; what the simulator tracks):
    one request's chunk when ctx >= chunk / 2 (ctx = prefix + chunk / 2), else packed prompts of
    2 ctx tokens each with no prefix. Causal attention work, C x ctx, is the same either way."""
    C = np.maximum(np.asarray(chunk, float), 1.0)
    ctx = np.maximum(np.asarray(ctx, float), 0.0)
    seg = np.clip(2.0 * ctx, 1.0, C)
    return np.maximum(ctx - C / 2.0, 0.0), seg
