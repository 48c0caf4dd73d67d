"""The vectorised training cost model (ScalePlan-style, MOSAIC paper §5): `evaluate(workload,
PlanArrays, tables, ...) -> dict of arrays`.

Analytical skeleton, measured/published lookup tables, no hand-tuned constants:

* Per layer and microbatch, every GEMM (fwd, dgrad, wgrad) is timed from the `gemm` table at its
  real per-GPU shape: rows T = seq*mbs/cp (sequence-parallel activations are all-gathered over TP
  before the column-parallel GEMMs), columns/contraction sharded by TP. Routed experts use the
  `grouped_gemm` table keyed by local expert count E/ep and per-expert rows
  M_expert = ceil(ep*etp*(T/tp)*topk*imbalance/E) (tokens of the EP x ETP group routed to one
  expert). Flash attention from the `attention` table (causal flops, bwd = 2.5x fwd flops).
  Router, top-k, permutation, norms, activations, fp8 casts, cross-entropy and the optimizer are
  memory-bound: bytes / achieved bandwidth (`membw`).
* Communication: nccl-tests bus bandwidth curves (`collectives`) by size, group and members per
  scale-up domain; whether a group leaves the scale-up domain comes from `specs.ranks`
  (Megatron's rank order). EP dispatch/combine: per-GPU bytes T/tp * copies * hidden * bytes,
  copies = topk for the alltoall dispatcher, the expected number of distinct destination ranks
  for flex (DeepEP/HybridEP send a token once per rank), all tokens for allgather; intra-domain
  and cross-domain bytes go over their own fabric (`ep_dispatch`), slower one sets the time.
  Cross-domain bytes: NCCL alltoall ships every copy bound for another node; flex ships a token
  once per remote scale-up domain over RDMA and fans out over NVLink there (`_distinct_domains`,
  group-limited routing aware), which is what the DeepEP RDMA bandwidth rows measure.
* Pipeline: per-stage microbatch time (layers of the stage, embedding on the first, LM head + CE
  on the last, explicit layouts / uneven stages via `specs.pipeline`), the slowest stage sets the
  pace: step = (m + (pp-1)/vpp) * C_max (1F1B / interleaved bubble), plus exposed PP p2p.
* Per-microbatch CPU floor (§5.4): C_s = max(compute_s, kernels_s * dispatch gap) on GPUs (async
  launches); compute_s + kernels_s * gap on CPU devices (synchronous), gap of the trial stack
  (`dispatch_gap` mode "stack") when measured.
* DP: grad reduce-scatter (fp32 main grads) + param all-gather (dist-opt) or all-reduce, over the
  DP x CP group (dense) and expert-DP group (experts), exposed beyond the overlap window (backward
  resp. forward of one microbatch on the stage) when overlap is on, at least the last bucket.
* Recompute: full (uniform, or `block` of recompute_layers per virtual chunk) re-runs the layer
  forward; selective re-runs the listed modules' forward.
* Memory per stage: weights (bf16, +1 B/param fp8 weight cache), fp32 main grads, Adam (fp32
  master + m + v = 12 B/param, divided by DP x CP for dense and by expert-DP for experts with the
  distributed optimizer), activations x microbatches in flight (1F1B: min(pp - s, m); interleaved:
  2(pp-s-1) + (vpp-1)pp + 1 chunk-microbatches), dispatch buffers, CE logits on the loss stage.
  Activations per layer: Korthikanti et al. 2022 (`korthikanti_layer_bytes`) generalised in
  `_activation_terms` to GQA/MLA, gated MLPs, flash attention (no s^2 term; saves the log-sum-exp)
  and no dropout (MoE recipes train without dropout; pass dropout=True to get the paper's masks).
"""
from __future__ import annotations

import numpy as np

from cost_model.plans import MODULE_BIT, PlanArrays
from specs.ranks import group_size_stride, members_per_node, nodes_spanned

GIB = 1024.0 ** 3


# ---- closed forms tests pin -------------------------------------------------------------------
def korthikanti_layer_bytes(s, b, h, a, t=1, *, sequence_parallel=True) -> float:
    """Korthikanti et al. (2022) activation bytes of one GPT layer, no recompute:
    s*b*h*(34 + 5*a*s/h), divided by t with tensor + sequence parallelism."""
    total = s * b * h * (34.0 + 5.0 * a * s / h)
    return total / t if sequence_parallel else s * b * h * (10.0 + 24.0 / t + 5.0 * a * s / (h * t))


def optimizer_bytes_per_param(dist_opt: bool, dp_shard: int = 1, *, fp8: bool = False) -> float:
    """Static bytes per parameter: bf16 weight 2 + fp32 main grad 4 + Adam (fp32 master, m, v) 12,
    the 12 sharded over the DP group by the distributed optimizer; +1 for an fp8 weight copy."""
    return 2.0 + 4.0 + (12.0 / dp_shard if dist_opt else 12.0) + (1.0 if fp8 else 0.0)


def _activation_terms(spec, T, tp, mbs_seq, *, flash=True, dropout=False):
    """Per-layer activation bytes of one microbatch, by saved tensor, on one GPU.
    T: tokens of the microbatch on this CP rank (seq*mbs/cp); tp: TP size (sequence parallel:
    every term is divided by tp). Returns dict of arrays: attention terms + dense-MLP terms."""
    h = spec.hidden_size
    nh = spec.num_attention_heads
    d = {}
    d["ln1_in"] = 2.0 * T * h
    if spec.mla:
        dq = spec.qk_head_dim + spec.qk_pos_emb_head_dim
        dv = spec.v_head_dim
        ql, kvl = spec.q_lora_rank, spec.kv_lora_rank
        d["qkv_in"] = 2.0 * T * h
        d["mla_latent"] = 2.0 * T * (2 * ql + 2 * kvl + spec.qk_pos_emb_head_dim)
        d["mla_up"] = 2.0 * T * nh * (2 * dq + dv)  # Q, K, V after the up projections
        d["attn_out"] = 2.0 * T * nh * dv
        heads_s = nh
    else:
        hd, ng = spec.head_dim, spec.query_groups
        d["qkv_in"] = 2.0 * T * h
        d["qkv"] = 2.0 * T * (nh + 2 * ng) * hd
        d["attn_out"] = 2.0 * T * nh * hd
        heads_s = nh
    if flash:
        d["core_attn"] = 4.0 * T * heads_s  # fp32 log-sum-exp
    else:
        d["core_attn"] = 5.0 * heads_s * T * mbs_seq  # softmax 2 + dropout mask 1 + dropout out 2
    if dropout:
        d["dropout"] = 1.0 * T * h * 2  # attention-output and MLP-output dropout masks
    return {k: v / tp for k, v in d.items()}


def _mlp_terms(T, h, f, glu, tp, *, ln=True):
    d = {"fc1_in": 2.0 * T * h, "act_in": 2.0 * T * f * (2 if glu else 1), "fc2_in": 2.0 * T * f}
    if ln:
        d["ln2_in"] = 2.0 * T * h
    return {k: v / tp for k, v in d.items()}


# ---- pipeline structure (cached per distinct pp/vpp/first/last/layout) --------------------------
_STAGE_CACHE: dict = {}


def stage_structure(spec, pp, vpp, first, last, layout):
    """(n_dense[pp], n_moe[pp], emb[pp], loss[pp], note) for one pipeline split."""
    key = (spec.digest(), pp, vpp, first, last, layout)
    hit = _STAGE_CACHE.get(key)
    if hit is not None:
        return hit
    note = ""
    try:
        from specs.errors import LayoutError
        from specs.pipeline import balanced_layout, split_layers
        try:
            split = split_layers(spec.num_layers, pp, vpp, first, last, layout)
        except LayoutError as e:
            try:
                alt = balanced_layout(spec.num_layers, pp, vpp)
                split = split_layers(spec.num_layers, pp, vpp, 0, 0, alt)
                note = f"pipeline: {e}; costed with the balanced layout {alt}"
            except LayoutError as e2:
                raise ImportError(f"pipeline: {e2}") from None
        chunks, emb_at, loss_at = split.chunks, split.embedding_at, split.loss_at
    except ImportError as e:  # private fallback: near-even split over ranks
        note = note or (str(e) + "; costed with a near-even split" if str(e).startswith("pipeline") else "")
        counts = [spec.num_layers // pp] * pp
        for i in range(spec.num_layers - sum(counts)):
            counts[i] += 1
        chunks, nxt = [], 0
        for c in counts:
            chunks.append([tuple(range(nxt, nxt + c))])
            nxt += c
        emb_at, loss_at = (0, 0), (pp - 1, 0)
    moe = spec.moe_layers
    nd = np.zeros(pp)
    nm = np.zeros(pp)
    for p, rank in enumerate(chunks):
        for ch in rank:
            for i in ch:
                if moe[i]:
                    nm[p] += 1
                else:
                    nd[p] += 1
    emb = np.zeros(pp)
    loss = np.zeros(pp)
    emb[emb_at[0]] = 1
    loss[loss_at[0] % pp] = 1
    out = (nd, nm, emb, loss, note)
    _STAGE_CACHE[key] = out
    return out


def _stage_arrays(spec, pa: PlanArrays):
    """[P, S] arrays of dense/MoE layer counts, embedding/loss flags, stage mask; notes per plan."""
    keys = np.stack([pa.pp, pa.vpp, pa.pp_first, pa.pp_last, pa.layout], axis=1)
    code = np.zeros(pa.n, dtype=np.int64)  # mixed-radix code: a 1-D unique is far cheaper than axis=0
    for j, r in enumerate(keys.max(axis=0) + 1):
        code = code * int(r) + keys[:, j]
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    uniq, inv = keys[first], inv.reshape(-1)
    S = int(pa.pp.max())
    U = len(uniq)
    nd, nm, em, lo, mask = (np.zeros((U, S)) for _ in range(5))
    notes = []
    for u, (pp, vpp, f, l, lay) in enumerate(uniq):
        a, b, c, d, note = stage_structure(spec, int(pp), int(vpp), int(f), int(l), pa.layouts[int(lay)])
        nd[u, :pp], nm[u, :pp], em[u, :pp], lo[u, :pp], mask[u, :pp] = a, b, c, d, 1
        notes.append(note)
    return nd[inv], nm[inv], em[inv], lo[inv], mask[inv], [notes[i] for i in inv] if any(notes) else None


# ---- table helpers ------------------------------------------------------------------------------
class _Ops:
    def __init__(self, tables, cluster, fp8mask):
        self.t = tables
        self.c = cluster
        self.fp8 = fp8mask
        self.any_fp8 = bool(fp8mask.any()) and tables["gemm"].has("fp8")
        self.bw = {op: float(tables["membw"].lookup(op)) * 1e9 for op in
                   ("elementwise", "permute", "router", "cross_entropy", "optimizer")}
        # CPU devices execute ops on the dispatching thread: the floor adds to compute, and a
        # measured per-kernel gap of the trial stack itself (mode "stack", `moetune profile`) is
        # preferred over the bare-op chain ("eager") when the tables have it.
        self.async_launch = bool(getattr(cluster, "is_gpu", True))
        gaps = tables["dispatch_gap"]
        mode = "stack" if (not self.async_launch and gaps.has("stack")) else "eager"
        self.gap = float(gaps.lookup(mode)) * 1e-6
        # per layer and step (outside the microbatch loop: optimizer over the layer's tensors,
        # grad buffers) of the CPU trial stack, when measured; GPUs: in the optimizer bytes term
        self.step_gap = float(gaps.lookup("stack_step")) * 1e-6 if (mode == "stack" and gaps.has("stack_step")) else 0.0
        self.up = max(1, int(cluster.scaleup_size))
        self.first = self.inv = None

    def set_rowkey(self, first, inv):
        """Plans sharing a row key (the plan columns that shape one layer) issue the same table
        queries: `_q` then interpolates only the distinct rows and scatters the result back."""
        self.first, self.inv = first, inv

    def _q(self, fn, *arrays):
        """fn(*arrays) evaluated once per distinct row key when every per-plan array is constant
        within each key (checked, O(n)); otherwise on all rows."""
        first, inv = self.first, self.inv
        if first is not None and len(first) < 0.5 * len(inv):
            n = len(inv)
            arrs = [np.asarray(a, float) for a in arrays]
            if all(a.ndim == 0 or (a.shape == (n,) and np.array_equal(a, a[first][inv])) for a in arrs):
                sub = fn(*[a if a.ndim == 0 else a[first] for a in arrs])
                return np.asarray(sub)[inv] if np.ndim(sub) else np.full(n, float(sub))
        return fn(*arrays)

    def _tf(self, fam, m, n, k, groups=None):
        tab = self.t[fam]
        if groups is None:
            look = lambda key: self._q(lambda m_, n_, k_: tab.lookup(key, m=m_, n=n_, k=k_), m, n, k)  # noqa: E731
        else:
            look = lambda key: self._q(lambda g_, m_, n_, k_: tab.lookup(key, groups=g_, m=m_, n=n_, k=k_),  # noqa: E731
                                       groups, m, n, k)
        bf = look("bf16")
        if not self.any_fp8:
            return bf
        f8 = look("fp8")
        return np.where(self.fp8, f8, bf)

    def gemm(self, m, n, k):
        """fwd, bwd seconds of one linear layer y[m,n] = x[m,k] w[k,n] (bwd = dgrad + wgrad)."""
        m, n, k = (np.maximum(np.asarray(x, float), 1.0) for x in (m, n, k))
        fl = 2.0 * m * n * k
        f = fl / (self._tf("gemm", m, n, k) * 1e12)
        b = fl / (self._tf("gemm", m, k, n) * 1e12) + fl / (self._tf("gemm", k, n, m) * 1e12)
        if self.any_fp8:  # quantise activations (fwd) and output grads (bwd): read 2 B, write 1 B
            f = f + self.fp8 * 3.0 * m * k / self.bw["elementwise"]
            b = b + self.fp8 * 3.0 * m * n / self.bw["elementwise"]
        return f, b

    def grouped(self, g, m, n, k, use_grouped):
        g, m, n, k = (np.maximum(np.asarray(x, float), 1.0) for x in (g, m, n, k))
        fl = 2.0 * g * m * n * k
        gf = fl / (self._tf("grouped_gemm", m, n, k, g) * 1e12)
        gb = fl / (self._tf("grouped_gemm", m, k, n, g) * 1e12) + fl / (self._tf("grouped_gemm", k, n, m, g) * 1e12)
        # without grouped GEMM: one dense GEMM per local expert, sequentially
        sf, sb = self.gemm(m, n, k)
        sf, sb = sf * g, sb * g
        f = np.where(use_grouped, gf, sf)
        b = np.where(use_grouped, gb, sb)
        if self.any_fp8:
            f = f + self.fp8 * 3.0 * g * m * k / self.bw["elementwise"]
            b = b + self.fp8 * 3.0 * g * m * n / self.bw["elementwise"]
        return f, b

    def attention(self, flops_f, seq, head_dim):
        tab = self.t["attention"]
        f = flops_f / (self._q(lambda s_: tab.lookup(("bf16", "fwd"), seq=s_, head_dim=head_dim), seq) * 1e12)
        b = 2.5 * flops_f / (self._q(lambda s_: tab.lookup(("bf16", "bwd"), seq=s_, head_dim=head_dim), seq) * 1e12)
        return f, b

    def scope(self, size, stride):
        """(crosses scale-up domain?, members per domain) for a group of `size` with `stride`."""
        size = np.asarray(size)
        stride = np.asarray(stride)
        return nodes_spanned(size, stride, self.up) > 1, members_per_node(size, stride, self.up)

    def collective(self, coll, nbytes, size, stride):
        """Seconds of one collective whose full (gathered / reduced) buffer is `nbytes`."""
        size = np.asarray(size, float)
        nbytes = np.asarray(nbytes, float)
        out, per = self.scope(size, stride)
        tab = self.t["collectives"]
        g = np.maximum(size, 2)
        nb = np.maximum(nbytes, 1)
        bw_up = self._q(lambda g_, b_: tab.lookup((coll, "scaleup"), group=g_, per_node=g_, bytes=b_), g, nb)
        bw_out = self._q(lambda g_, p_, b_: tab.lookup((coll, "scaleout"), group=g_, per_node=p_, bytes=b_),
                         g, np.maximum(per, 1), nb)
        bw = np.where(out, bw_out, bw_up) * 1e9
        if coll == "all_reduce":
            vol = 2.0 * nbytes * (size - 1) / np.maximum(size, 1)
        elif coll in ("reduce_scatter", "all_gather"):
            vol = nbytes * (size - 1) / np.maximum(size, 1)
        else:
            vol = nbytes
        return np.where(size > 1, vol / bw, 0.0)

    def ep_dispatch(self, backend_code, nbytes_d, nbytes_c, ep, etp, inter=None):
        """fwd seconds of (dispatch, combine) for per-GPU payloads (all copies). `inter`: the share of
        the payload that crosses the scale-up domain (default: uniform, (ep - per)/ep); the share
        that stays inside is (per - 1)/ep. Slower fabric sets the time."""
        ep = np.asarray(ep, float)
        out, per = self.scope(ep, etp)
        per = np.minimum(per, ep)
        intra = (per - 1) / ep
        if inter is None:
            inter = (ep - per) / ep
        tab = self.t["ep_dispatch"]
        names = ("alltoall", "alltoall", "deepep", "hybridep")
        res_d = np.zeros_like(ep)
        res_c = np.zeros_like(ep)
        for code in np.unique(backend_code):
            sel = backend_code == code
            name = names[int(code)]
            if not tab.has(name, "scaleup"):
                name = "alltoall"
            lk = lambda scope, v: self._q(lambda e_: tab.lookup((name, scope), v, ep=e_), ep)  # noqa: E731
            du = lk("scaleup", "dispatch_gbps") * 1e9
            cu = lk("scaleup", "combine_gbps") * 1e9
            do = lk("scaleout", "dispatch_gbps") * 1e9
            co = lk("scaleout", "combine_gbps") * 1e9
            lat = np.where(out, lk("scaleout", "latency_us"), lk("scaleup", "latency_us")) * 1e-6
            td = np.maximum(nbytes_d * intra / du, nbytes_d * inter / do) + lat
            tc = np.maximum(nbytes_c * intra / cu, nbytes_c * inter / co) + lat
            res_d = np.where(sel, td, res_d)
            res_c = np.where(sel, tc, res_c)
        return np.where(ep > 1, res_d, 0.0), np.where(ep > 1, res_c, 0.0)


def _distinct_domains(spec, E, topk, ep, per):
    """Expected number of OTHER scale-up domains a token's top-k experts land on (DeepEP/HybridEP
    send a token once per remote domain over RDMA and fan it out over NVLink there; DeepEP README,
    "NVLink and RDMA forwarding"). EP ranks are contiguous, so a domain hosts E*per/ep experts.
    Group-limited routing (DeepSeek-V3: moe_router_num_groups / group_topk) picks experts only
    from group_topk groups; when groups align with domains the hit probability is taken per group."""
    ep = np.asarray(ep, float)
    per = np.maximum(np.minimum(np.asarray(per, float), ep), 1.0)
    nd = np.maximum(ep / per, 1.0)  # domains spanned by the EP group
    loc = E / nd  # experts per domain
    p = np.ones_like(nd)
    for i in range(topk):
        p = p * np.clip((E - loc - i) / (E - i), 0.0, None)
    G, gk = int(spec.moe_router_num_groups or 0), int(spec.moe_router_group_topk or 0)
    if G and gk and gk < G:
        gpd = G / nd  # groups per domain
        pg = np.ones_like(nd)
        for i in range(gk):
            pg = pg * np.clip((G - gpd - i) / (G - i), 0.0, None)
        aligned = (gpd >= 1) & (np.abs(gpd - np.round(gpd)) < 1e-9)
        p = np.where(aligned, np.maximum(p, pg), p)
    return (nd - 1.0) * (1.0 - p)


def structural_kernels(spec, tp=1, cp=1, grouped=False, local_experts=1):
    """Forward kernels per (attention block, dense MLP, MoE MLP) of one layer and microbatch (the
    CPU floor's structural counts; backward = 2x). Arrays broadcast."""
    tp, cp = np.asarray(tp, float), np.asarray(cp, float)
    k_attn = 14 + (6 if spec.mla else 0) + 4 * (tp > 1) + 2 * (cp > 1) * (cp - 1)
    k_dense = 6 + 2 * (tp > 1)
    k_moe = 16 + np.where(np.asarray(grouped, bool), 3, 3 * np.asarray(local_experts, float)) + (
        4 if spec.moe_shared_expert_ffn else 0)
    return k_attn, k_dense, k_moe


def _distinct_ranks(E, topk, ep):
    """Expected number of distinct EP ranks a token's top-k experts land on (uniform routing)."""
    ep = np.asarray(ep, float)
    loc = E / ep
    # P(rank not hit) = C(E - loc, k) / C(E, k) = prod_{i<k} (E - loc - i) / (E - i)
    p = np.ones_like(ep)
    for i in range(topk):
        p = p * np.clip((E - loc - i) / (E - i), 0.0, None)
    return ep * (1.0 - p)


# ---- the model ----------------------------------------------------------------------------------
def evaluate(workload, pa: PlanArrays, tables, **kw) -> dict:
    with np.errstate(divide="ignore", invalid="ignore"):
        return _evaluate(workload, pa, tables, **kw)


def _evaluate(workload, pa: PlanArrays, tables, *, imbalance=1.0, hbm_reserve=0.1, calibration_scale=1.0,
             flash=True, dropout=False, detail=True) -> dict:
    spec, cl = workload.model, workload.cluster
    W, gbs, seq = workload.world, workload.gbs, workload.seq
    f64 = lambda x: np.asarray(x, dtype=float)  # noqa: E731
    tp, cp, pp, vpp, ep, etp, mbs = (f64(getattr(pa, k)) for k in ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs"))
    ti, ci, pi, ei, eti = (getattr(pa, k) for k in ("tp", "cp", "pp", "ep", "etp"))
    dp_i = np.maximum(W // (ti * ci * pi), 1)
    edp_i = np.maximum(W // (eti * ei * pi), 1)
    dp, edp = f64(dp_i), f64(edp_i)
    m = np.ceil(gbs / (dp * mbs))  # microbatches per step
    fp8 = pa.precision != 0
    ops = _Ops(tables, cl, fp8)
    # row key: the plan columns every per-layer table query is a function of
    rk = np.stack([pa.tp, pa.cp, pa.ep, pa.etp, pa.mbs, pa.precision, pa.dispatch, pa.grouped_gemm], axis=1)
    radix = rk.max(axis=0) + 1
    code = np.zeros(pa.n, dtype=np.int64)
    for j in range(rk.shape[1]):
        code = code * int(radix[j]) + rk[:, j]
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    ops.set_rowkey(first, inv.reshape(-1))
    BWe = ops.bw["elementwise"]
    h, nh, V = spec.hidden_size, spec.num_attention_heads, spec.vocab_size
    glu = spec.gated_linear_unit
    nmat = 2 if glu else 1
    E, K = max(spec.num_experts, 1), max(spec.moe_router_topk, 1)
    T = seq * mbs / cp  # tokens of one microbatch on this CP rank (rows of TP-gathered GEMMs)
    Tsp = T / tp  # sequence-parallel tokens per GPU
    z = np.zeros(pa.n)
    mods = pa.recompute_modules
    sel_on = pa.recompute == 1
    has = lambda name: sel_on & ((mods & MODULE_BIT[name]) != 0)  # noqa: E731

    # -- attention block ------------------------------------------------------------------------
    if spec.mla:
        dq = spec.qk_head_dim + spec.qk_pos_emb_head_dim
        dv = spec.v_head_dim
        ql, kvl, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.qk_pos_emb_head_dim
        parts = []
        if ql:
            parts.append(ops.gemm(T, ql, h))
            qup = ops.gemm(T, nh * dq / tp, ql)
        else:
            qup = ops.gemm(T, nh * dq / tp, h)
        parts.append(ops.gemm(T, kvl + rope, h))
        kvup = ops.gemm(T, nh * (spec.qk_head_dim + dv) / tp, kvl)
        parts += [qup, kvup, ops.gemm(T, h, nh * dv / tp)]
        mla_up_f = qup[0] + kvup[0]
        kv_bytes = 2.0 * T * nh * (dq + dv) / tp
        head_dim_key = dq
    else:
        hd, ng = spec.head_dim, spec.query_groups
        dq = dv = hd
        parts = [ops.gemm(T, (nh + 2 * ng) * hd / tp, h), ops.gemm(T, h, nh * hd / tp)]
        mla_up_f = z
        kv_bytes = 2.0 * 2.0 * T * ng * hd / tp
        head_dim_key = hd
    attn_proj_f = sum(p[0] for p in parts)
    attn_proj_b = sum(p[1] for p in parts)
    core_flops = T * seq * (nh / tp) * (dq + dv)  # causal: half of 2*(dq+dv)*Tq*Tk
    core_f, core_b = ops.attention(core_flops, seq / cp, head_dim_key)
    # norms (2 per layer), residual adds (2), rope on q/k: read+write
    elem_attn_f = (2 * 2 * 2.0 * Tsp * h + 2 * 3 * 2.0 * Tsp * h + 4.0 * T * nh * dq / tp) / BWe
    ln_f = 2 * 2 * 2.0 * Tsp * h / BWe
    # TP (sequence parallel): all-gather before and reduce-scatter after each block
    act_bytes = 2.0 * T * h  # full gathered activation of one microbatch
    tp_ag = ops.collective("all_gather", act_bytes, tp, 1)
    tp_rs = ops.collective("reduce_scatter", act_bytes, tp, 1)
    tp_block = tp_ag + tp_rs
    # CP ring attention: (cp-1) K/V exchanges fwd, twice that bwd; hidden behind core attention
    cp_size, cp_stride = group_size_stride("cp", ti, ci, pi, ei, eti, W)
    cp_step = ops.collective("send_recv", kv_bytes, cp_size, cp_stride)
    cp_f = np.maximum(0.0, (cp - 1) * cp_step - core_f)
    cp_b = np.maximum(0.0, 2 * (cp - 1) * cp_step - core_b)

    # -- dense MLP ----------------------------------------------------------------------------
    fd = spec.ffn_hidden_size
    fc1 = ops.gemm(T, nmat * fd / tp, h)
    fc2 = ops.gemm(T, h, fd / tp)
    dense_f = fc1[0] + fc2[0] + 3 * 2.0 * T * fd / tp / BWe
    dense_b = fc1[1] + fc2[1] + 2 * 3 * 2.0 * T * fd / tp / BWe

    # -- MoE layer --------------------------------------------------------------------------------
    if spec.is_moe:
        fe = spec.moe_ffn_hidden_size
        G = E / ep  # local experts
        R = Tsp * K * imbalance * etp  # routed rows this GPU computes
        Me = np.ceil(ep * etp * Tsp * K * imbalance / E)
        e1 = ops.grouped(G, Me, nmat * fe / etp, h, pa.grouped_gemm.astype(bool))
        e2 = ops.grouped(G, Me, h, fe / etp, pa.grouped_gemm.astype(bool))
        moe_act_f = 3 * 2.0 * R * fe / etp / BWe
        expert_f = e1[0] + e2[0] + moe_act_f
        expert_b = e1[1] + e2[1] + 2 * moe_act_f
        # router (fp32 logits, score, top-k, aux loss) and permute/unpermute, memory-bound
        router_f = (4.0 * Tsp * E * 6) / ops.bw["router"] + 2.0 * Tsp * E * h / (
            ops._q(lambda m_: ops.t["gemm"].lookup("bf16", m=m_, n=E, k=h), Tsp) * 1e12 / 2)  # fp32 router GEMM at half bf16 rate
        # permute (read Tsp rows, write the routed copies) and unpermute (the reverse)
        perm_f = 2 * 2.0 * (Tsp + Tsp * K * imbalance) * h / ops.bw["permute"]
        router_perm_f = router_f + perm_f
        router_perm_b = 2 * router_f + perm_f
        # EP dispatch / combine
        disp = pa.dispatch
        copies = np.where(disp >= 2, _distinct_ranks(E, K, ep), np.minimum(K, ep) * 0 + K)
        d_bytes = np.where((disp >= 2) & fp8, 1.0 + 4.0 / 128, 2.0) * Tsp * copies * h * imbalance
        c_bytes = 2.0 * Tsp * copies * h * imbalance
        # cross-domain share: alltoall (NCCL) sends every copy; flex sends once per remote domain
        _, per_ep = ops.scope(ep, eti)
        remote = _distinct_domains(spec, E, K, ep, per_ep)
        inter = np.where(disp >= 2, remote / np.maximum(copies, 1e-9),
                         (ep - np.minimum(per_ep, ep)) / ep)
        ep_d, ep_c = ops.ep_dispatch(disp, d_bytes, c_bytes, ep, eti, inter=inter)
        ag_size = ep
        ag = ops.collective("all_gather", 2.0 * Tsp * h * ag_size, ep, eti)
        rs = ops.collective("reduce_scatter", 2.0 * Tsp * h * ag_size, ep, eti)
        ep_d = np.where(disp == 1, ag, ep_d)
        ep_c = np.where(disp == 1, rs, ep_c)
        # expert tensor parallelism: gather/scatter the routed rows over ETP
        etp_comm = ops.collective("all_gather", 2.0 * R * h, etp, 1) + ops.collective(
            "reduce_scatter", 2.0 * R * h, etp, 1)
        ep_total_f = ep_d + ep_c + etp_comm
        ep_total_b = ep_total_f.copy()
        fs = spec.moe_shared_expert_ffn
        if fs:
            s1 = ops.gemm(T, nmat * fs / tp, h)
            s2 = ops.gemm(T, h, fs / tp)
            shared_f = s1[0] + s2[0] + 3 * 2.0 * T * fs / tp / BWe + tp_block
            shared_b = s1[1] + s2[1] + 2 * 3 * 2.0 * T * fs / tp / BWe + tp_block
        else:
            shared_f = shared_b = z
        seo = pa.shared_expert_overlap.astype(bool)
        # shared expert overlapped with dispatch/combine: the pair costs the larger of the two
        ep_exp_f = np.where(seo, np.maximum(ep_total_f, shared_f) - shared_f, ep_total_f)
        ep_exp_b = np.where(seo, np.maximum(ep_total_b, shared_b) - shared_b, ep_total_b)
        # EP a2a overlap (1F1B fwd/bwd of two microbatches interleaved): hidden behind compute
        a2o = pa.a2a_overlap.astype(bool)
        window_f = attn_proj_f + core_f + expert_f
        window_b = attn_proj_b + core_b + expert_b
        ep_exp_f = np.where(a2o, np.maximum(0.0, ep_exp_f - window_b), ep_exp_f)
        ep_exp_b = np.where(a2o, np.maximum(0.0, ep_exp_b - window_f), ep_exp_b)
        moe_fwd_total = router_perm_f + ep_total_f + expert_f + shared_f
    else:
        fe = 0
        R = Me = G = z
        expert_f = expert_b = router_perm_f = router_perm_b = ep_exp_f = ep_exp_b = z
        shared_f = shared_b = moe_fwd_total = moe_act_f = z

    # -- per-layer totals -------------------------------------------------------------------------
    common_f = attn_proj_f + core_f + elem_attn_f + tp_block + cp_f
    common_b = attn_proj_b + core_b + 2 * elem_attn_f + tp_block + cp_b
    dense_layer_f = common_f + dense_f + tp_block
    dense_layer_b = common_b + dense_b + tp_block
    moe_layer_f = common_f + router_perm_f + ep_exp_f + expert_f + shared_f
    moe_layer_b = common_b + router_perm_b + ep_exp_b + expert_b + shared_b

    # recompute (extra forward work per layer)
    rc_full = pa.recompute == 2
    sel_dense = (has("core_attn") * core_f + has("mla_up_proj") * mla_up_f + has("layernorm") * ln_f
                 + has("mlp") * (dense_f + tp_block))
    sel_moe = (has("core_attn") * core_f + has("mla_up_proj") * mla_up_f + has("layernorm") * ln_f
               + has("moe_act") * moe_act_f + has("moe") * moe_fwd_total
               + has("shared_experts") * (1 - has("moe")) * shared_f)
    rec_dense = np.where(rc_full, dense_layer_f, sel_dense)
    rec_moe = np.where(rc_full, moe_layer_f, sel_moe)

    # -- stages -----------------------------------------------------------------------------------
    nd, nm, em, lo, smask, notes = _stage_arrays(spec, pa)
    nlay = nd + nm
    # full recompute with the block method: recompute_layers per virtual chunk, the rest not
    frac = np.ones_like(nlay)
    blk = rc_full & (pa.recompute_block == 1) & (pa.recompute_layers > 0)
    frac = np.where(blk[:, None], np.minimum(1.0, (pa.recompute_layers * vpp)[:, None] / np.maximum(nlay, 1)), frac)
    rc_frac = np.where(rc_full[:, None], frac, 1.0)
    # embedding (first stage) and LM head + cross-entropy (last stage)
    emb_f = 2 * 2.0 * Tsp * h / BWe + tp_rs
    emb_b = 2 * 2 * 2.0 * Tsp * h / BWe + tp_ag
    head = ops.gemm(T, V / tp, h)
    ce_f = T * V / tp * (2 + 4 + 4) / ops.bw["cross_entropy"]
    ce_b = T * V / tp * (4 + 2 + 4) / ops.bw["cross_entropy"]
    head_f = head[0] + ce_f + tp_ag + ln_f / 2
    head_b = head[1] + ce_b + tp_rs + ln_f
    col = lambda x: np.asarray(x, float)[:, None]  # noqa: E731
    comp = lambda: {  # noqa: E731  per stage, per microbatch, fwd+bwd seconds (breakdown only)
        "attention_proj": nlay * col(attn_proj_f + attn_proj_b),
        "core_attention": nlay * col(core_f + core_b),
        "dense_mlp": nd * col(dense_f + dense_b),
        "router_permutation": nm * col(router_perm_f + router_perm_b),
        "ep_dispatch_combine": nm * col(ep_exp_f + ep_exp_b),
        "expert_gemm": nm * col(expert_f + expert_b),
        "shared_expert": nm * col(shared_f + shared_b),
        "elementwise": nlay * col(3 * elem_attn_f),
        "tp_comm": nlay * col(2 * tp_block) + nd * col(2 * tp_block),
        "cp_comm": nlay * col(cp_f + cp_b),
        "embedding": em * col(emb_f + emb_b),
        "lm_head_ce": lo * col(head_f + head_b),
        "recompute": rc_frac * (nd * col(rec_dense) + nm * col(rec_moe)),
    }
    # the same sum, per layer kind first ([P] vectors), so only a few [P, S] passes are made
    per_common = (attn_proj_f + attn_proj_b + core_f + core_b + 3 * elem_attn_f + 2 * tp_block + cp_f + cp_b)
    per_dense = per_common + dense_f + dense_b + 2 * tp_block
    per_moe = (per_common + router_perm_f + router_perm_b + ep_exp_f + ep_exp_b + expert_f + expert_b
               + shared_f + shared_b)
    stage_compute = (nd * (col(per_dense) + rc_frac * col(rec_dense)) + nm * (col(per_moe) + rc_frac * col(rec_moe))
                     + em * col(emb_f + emb_b) + lo * col(head_f + head_b)) * smask
    stage_fwd = (nd * col(dense_layer_f) + nm * col(moe_layer_f) + em * col(emb_f) + lo * col(head_f)) * smask
    stage_bwd = stage_compute - stage_fwd
    # CPU floor: kernels per microbatch x dispatch gap (structural kernel counts, fwd; bwd = 2x)
    k_attn, k_dense, k_moe = structural_kernels(spec, tp, cp, pa.grouped_gemm.astype(bool), G)
    kern = 3 * (nd * col(k_attn + k_dense) + nm * col(k_attn + k_moe) + em * 4 + lo * 12)
    kern = kern + (pa.recompute > 0)[:, None] * nlay * col(k_attn) * rc_frac
    floor = kern * ops.gap
    # GPU: the host enqueues asynchronously, so the floor overlaps compute (max). CPU: one thread
    # dispatches and executes every op synchronously, so the dispatch time adds to the compute.
    stage_time = (np.maximum(stage_compute, floor) if ops.async_launch else stage_compute + floor) * smask
    slow = np.argmax(stage_time, axis=1)
    rows = np.arange(pa.n)
    C = stage_time[rows, slow]
    C_bwd = stage_bwd[rows, slow]
    C_fwd = stage_fwd[rows, slow]

    # -- pipeline -------------------------------------------------------------------------------
    bubble = (pp - 1) / vpp * C
    pp_size, pp_stride = group_size_stride("pp", ti, ci, pi, ei, eti, W)
    p2p = ops.collective("send_recv", 2.0 * Tsp * h, np.full(pa.n, 2), pp_stride)  # one stage boundary
    p2p_exposed = np.where(pp > 1, np.where(vpp > 1, 2 * (pp - 1) * vpp * p2p, 2 * (m + pp - 1) * p2p), 0.0)

    # -- params, DP comm, optimizer ----------------------------------------------------------
    from cost_model.flops import param_counts
    pc = param_counts(spec)
    pl = pc["per_layer"]
    dense_layer_p = pl["attention"] + pl["dense_mlp"] + pl["norms"]
    moe_layer_p = pl["attention"] + pl["shared_expert"] + pl["router"] + pl["norms"]
    expert_layer_p = pl["moe_experts"]
    out_layer = V * h if (not spec.tie_embeddings or pp.max() > 1) else 0
    dense_p = (nd * dense_layer_p + nm * moe_layer_p + em * V * h) / col(tp) \
        + lo * (np.where(col(pp) > 1, V * h, out_layer) / col(tp) + h)
    if spec.tie_embeddings:
        dense_p = dense_p - np.where(col(pp) == 1, lo * V * h / col(tp), 0.0)
    expert_p = nm * expert_layer_p / col(ep * etp)
    dense_p = dense_p * smask
    expert_p = expert_p * smask
    dshard = dp * cp
    dpc_size, dpc_stride = dshard, tp  # DP x CP group: tp-strided, contiguous over cp and dp
    edp_size, edp_stride = group_size_stride("edp", ti, ci, pi, ei, eti, W)
    dist = pa.dist_opt.astype(bool)
    Pd = dense_p[rows, slow]
    Pe = expert_p[rows, slow]
    rs_t = ops.collective("reduce_scatter", 4.0 * Pd, dpc_size, dpc_stride) + ops.collective(
        "reduce_scatter", 4.0 * Pe, edp_size, edp_stride)
    ar_t = ops.collective("all_reduce", 4.0 * Pd, dpc_size, dpc_stride) + ops.collective(
        "all_reduce", 4.0 * Pe, edp_size, edp_stride)
    ag_t = ops.collective("all_gather", 2.0 * Pd, dpc_size, dpc_stride) + ops.collective(
        "all_gather", 2.0 * Pe, edp_size, edp_stride)
    grad_t = np.where(dist, rs_t, ar_t)
    ag_t = np.where(dist, ag_t, 0.0)
    bucket = np.maximum(40e6, 1e6 * dp)  # Megatron DDP bucket size (params)
    last_bucket = np.minimum(1.0, bucket / np.maximum(Pd + Pe, 1.0))
    ogr = pa.overlap_grad_reduce.astype(bool)
    opg = pa.overlap_param_gather.astype(bool) & dist
    grad_exposed = np.where(ogr, np.maximum(grad_t - C_bwd, grad_t * last_bucket), grad_t)
    ag_exposed = np.where(opg, np.maximum(ag_t - C_fwd, ag_t * last_bucket), ag_t)
    # optimizer: Adam over the local shard, memory-bound (grad 4 R, master 4 RW, m/v 8 RW, bf16 2 W)
    local = np.where(dist, Pd / dshard + Pe / edp, Pd + Pe)
    opt_t = local * (4 + 8 + 16 + 2 + 4) / ops.bw["optimizer"]
    if ops.step_gap:
        opt_t = opt_t + nlay[rows, slow] * ops.step_gap

    # -- step ---------------------------------------------------------------------------------------
    steady = m * C
    raw = steady + bubble + p2p_exposed + grad_exposed + ag_exposed + opt_t
    step = raw * calibration_scale
    tokens = gbs * seq
    out = {"step_time_s": step, "tokens_per_s_per_gpu": tokens / step / W, "microbatches": m,
           "dp": dp, "raw_step_time_s": raw}
    try:
        from cost_model.flops import model_flops_per_token
        mflops = model_flops_per_token(spec, seq) * tokens
    except Exception:  # noqa: BLE001
        mflops = 6.0 * pc["active"] * tokens
    out["model_tflops_per_gpu"] = mflops / step / W / 1e12
    peak = float(cl.peak_tflops.get("bf16") or max(cl.peak_tflops.values()))
    out["mfu"] = out["model_tflops_per_gpu"] / peak

    # -- memory -------------------------------------------------------------------------------------
    static = (dense_p * (6.0 + fp8[:, None] * 1.0 + np.where(col(dist), 12.0 / col(dshard), 12.0))
              + expert_p * (6.0 + fp8[:, None] * 1.0 + np.where(col(dist), 12.0 / col(edp), 12.0)))
    a = _activation_terms(spec, T, tp, seq, flash=flash, dropout=dropout)
    dense_mlp_terms = _mlp_terms(T, h, fd, glu, tp)
    # fp8 linears save their quantised (1-byte) inputs for the weight gradient
    lin8 = np.where(fp8, 0.5, 1.0)
    for key in ("qkv_in", "mla_latent", "attn_out"):
        if key in a:
            a[key] = a[key] * lin8
    for key in ("fc1_in", "fc2_in"):
        dense_mlp_terms[key] = dense_mlp_terms[key] * lin8
    # selective recompute drops what the module recomputes
    full_attn = sum(a.values())
    drop_attn = (has("core_attn") * a["core_attn"] + has("mla_up_proj") * a.get("mla_up", 0.0)
                 + has("layernorm") * a["qkv_in"])
    attn_mem = full_attn - drop_attn
    dense_mlp_mem = sum(dense_mlp_terms.values()) - has("mlp") * (sum(dense_mlp_terms.values())
                                                                   - dense_mlp_terms["ln2_in"]) \
        - (has("layernorm") & ~has("mlp")) * dense_mlp_terms["fc1_in"]
    if spec.is_moe:
        router_in = 2.0 * Tsp * h
        logits = 2 * 4.0 * Tsp * E
        # routed experts: probs are applied inside the activation and the fused unpermute needs
        # only the routing map, so the expert output is not saved (Megatron >= 0.13)
        routed = {"fc1_in": 2.0 * R * h * lin8, "act_in": 2.0 * R * nmat * fe / etp,
                  "fc2_in": 2.0 * R * fe / etp * lin8}
        routed_sum = sum(routed.values())
        fs = spec.moe_shared_expert_ffn
        sh = _mlp_terms(T, h, fs, glu, tp, ln=False) if fs else {"x": z}
        for key in ("fc1_in", "fc2_in"):
            if key in sh:
                sh[key] = sh[key] * lin8
        sh_sum = sum(sh.values())
        moe_mem = (2.0 * Tsp * h + router_in + logits + routed_sum + sh_sum
                   - has("moe") * (router_in + logits + routed_sum + sh_sum)
                   - (has("moe_act") & ~has("moe")) * routed["fc2_in"]
                   - (has("shared_experts") & ~has("moe")) * sh_sum
                   - (has("layernorm") & ~has("moe")) * router_in)
        dispatch_buf = 2 * 2.0 * R * h
    else:
        moe_mem = z
        dispatch_buf = z
    layer_in = 2.0 * Tsp * h
    dense_act = np.where(rc_full, layer_in, attn_mem + dense_mlp_mem)
    moe_act = np.where(rc_full, layer_in, attn_mem + moe_mem)
    dense_act_nr = attn_mem + dense_mlp_mem
    moe_act_nr = attn_mem + moe_mem
    # per-stage activation of one microbatch (block recompute: only part of the layers)
    per_mb = (rc_frac * (nd * col(dense_act) + nm * col(moe_act))
              + (1 - rc_frac) * (nd * col(dense_act_nr) + nm * col(moe_act_nr))
              + em * col(2.0 * Tsp * h)) * smask
    s_idx = np.arange(stage_time.shape[1])[None, :]
    inflight_1f1b = np.minimum(col(pp) - s_idx, col(m))
    inflight_chunks = np.minimum(col(m * vpp), 2 * (col(pp) - s_idx - 1) + (col(vpp) - 1) * col(pp) + 1)
    inflight = np.where(col(vpp) > 1, inflight_chunks / col(vpp), inflight_1f1b)
    acts = per_mb * np.maximum(inflight, 0)
    transient = (nm > 0) * col(dispatch_buf) + lo * col(T * V / tp * (2 + 4))
    mem = (static + acts + transient) * smask / GIB
    peak_mem = mem.max(axis=1)
    usable = cl.hbm_gib * (1.0 - hbm_reserve)
    out.update(peak_memory_gib=peak_mem, fits=peak_mem <= usable, usable_gib=usable)
    if detail:
        bd = {k: m * v[rows, slow] for k, v in comp().items()}
        floor_extra = (np.maximum(0.0, floor[rows, slow] - stage_compute[rows, slow]) if ops.async_launch
                       else floor[rows, slow])
        bd["cpu_launch_floor"] = m * floor_extra
        bd.update(pipeline_bubble=bubble, pp_p2p=p2p_exposed, dp_grad_reduce_scatter=grad_exposed,
                  dp_param_all_gather=ag_exposed, optimizer_step=opt_t,
                  calibration=raw * (calibration_scale - 1.0))
        out["breakdown_s"] = bd
        out["memory_by_stage_gib"] = mem
        out["stage_mask"] = smask
        out["slowest_stage"] = slow
        out["m_expert"] = np.broadcast_to(Me, (pa.n,))
        # one MoE block alone (pre-MLP norm, router, permutation, dispatch/combine, experts,
        # shared expert), per microbatch: what Megatron's moe_perf tests time
        out["moe_block_fwd_s"] = ln_f / 2 + router_perm_f + ep_exp_f + expert_f + shared_f
        out["moe_block_bwd_s"] = ln_f + router_perm_b + ep_exp_b + expert_b + shared_b
        out["notes"] = notes
    return out
