"""The vectorised training cost model (ScalePlan-style, MOSAIC paper §5): `evaluate(workload,
PlanArrays, tables, ...) -> dict of arrays`.

Analytical skeleton and measured/published lookup tables; the few fixed numbers (kernel counts,
DDP bucket, bytes per parameter, attention backward factor) are in `cost_model.constants`, each
with its source. Layout: `cost_model.blocks` (one function per block, each returning a struct of
arrays), `cost_model.memory` (static and activation bytes), `cost_model.ops` (table queries);
this module gathers the inputs, calls the blocks and assembles the step:

* Per layer and microbatch, every GEMM (fwd, dgrad, wgrad) is timed from the `gemm` table at its
  real per-GPU shape: rows T = seq*mbs/cp (sequence-parallel activations are all-gathered over TP
  before the column-parallel GEMMs), columns/contraction sharded by TP. Routed experts use the
  `grouped_gemm` table keyed by local expert count E/ep and per-expert rows
  M_expert = ceil(ep*etp*(T/tp)*topk*imbalance/E) (tokens of the EP x ETP group routed to one
  expert). Flash attention from the `attention` table (causal flops, bwd = 2.5x fwd flops,
  FlashAttention's convention).
  Router, top-k, permutation, norms, activations, fp8 casts, cross-entropy and the optimizer are
  memory-bound: bytes / achieved bandwidth (`membw`).
* Communication: nccl-tests bus bandwidth curves (`collectives`) by size, group and members per
  scale-up domain; whether a group leaves the scale-up domain comes from `specs.ranks`
  (Megatron's rank order). EP dispatch/combine: per-GPU bytes T/tp * copies * hidden * bytes,
  copies = topk for the alltoall dispatcher, the expected number of distinct destination ranks
  for flex (DeepEP/HybridEP send a token once per rank), all tokens for allgather; intra-domain
  and cross-domain bytes go over their own fabric (`ep_dispatch`), slower one sets the time.
  Cross-domain bytes: NCCL alltoall ships every copy bound for another node; flex ships a token
  once per remote scale-up domain over RDMA and fans out over NVLink there (`blocks.distinct_domains`,
  group-limited routing aware). Flex is charged the bytes the DeepEP / HybridEP benchmarks count
  (every received row on NVLink, one copy per domain reached incl. the token's own on RDMA) plus a
  per-token cost for tokens smaller than the rows' (`constants` "DeepEP / HybridEP").
* Pipeline: per-stage microbatch time (layers of the stage, embedding on the first, LM head + CE
  on the last, explicit layouts / uneven stages via `specs.pipeline`), the slowest stage sets the
  pace: step = (m + (pp-1)/vpp) * C_max (1F1B / interleaved bubble), plus exposed PP p2p.
* Per-microbatch CPU floor (§5.4): on GPUs (async launches) a host clock against the GPU clock,
  aligned at each MoE layer's dispatcher sync: sum over those layers of max(layer forward, its
  launches x gap + the D2H copy) plus max(rest, rest launches x gap); without syncs
  C_s = max(compute_s, kernels_s * dispatch gap); compute_s + kernels_s * gap on CPU devices (synchronous), gap of the trial stack
  (`dispatch_gap` mode "stack") when measured.
* DP: grad reduce-scatter (fp32 main grads) + param all-gather (dist-opt) or all-reduce, over the
  DP x CP group (dense) and expert-DP group (experts), exposed beyond the overlap window (on GPUs
  2/3 resp. 1/3 of one microbatch's stage wall time) when overlap is on, at least the last bucket;
  each stage its own, and the step waits for the stage whose DP terms sum the largest.
* Recompute: full (uniform, or `block` of recompute_layers per virtual chunk) re-runs the layer
  forward; selective re-runs the listed modules' forward.
* Memory per stage: weights (bf16, +1 B/param fp8 weight cache), fp32 main grads, Adam (fp32
  master + m + v = 12 B/param, divided by DP x CP for dense and by expert-DP for experts with the
  distributed optimizer), activations x microbatches in flight (1F1B: min(pp - s, m); interleaved:
  2(pp-s-1) + (vpp-1)pp + 1 chunk-microbatches), dispatch buffers, CE logits on the loss stage.
  Activations per layer: Korthikanti et al. 2022 (`memory.korthikanti_layer_bytes`) generalised in
  `memory.activation_terms` to GQA/MLA, gated MLPs, flash attention (no s^2 term; saves the log-sum-exp)
  and no dropout (MoE recipes train without dropout; pass dropout=True to get the paper's masks).
* Step: the per-microbatch stage time and its breakdown are two aggregations of ONE list of
  terms (`StepTerms`: breakdown component, which layers it applies to, seconds); the step time is
  the sum of the breakdown's components (tests/test_cost_model.py checks it to 1e-12 relative).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cost_model.blocks import (  # noqa: F401  structural_kernels: re-exported (trials/profile/stack_floor)
    EPExposed,
    FwdBwd,
    Inputs,
    Node,
    RoutedExperts,
    attention,
    cp_comm,
    cuda_graphs,
    dense_mlp,
    dp_collectives,
    embedding,
    ep_dispatch_combine,
    ep_exposed,
    expert_gemm_calls,
    fp8_quantize,
    lm_head_loss,
    moe_host_sync,
    optimizer_step,
    pipeline,
    pp_p2p_sm_share,
    routed_experts,
    router_permutation,
    shared_expert_activation,
    shared_experts,
    structural_kernels,
    tp_comm,
)
from cost_model.constants import (
    CPU_KERNELS_CORE_ATTENTION,
    D2H_SYNC_S,
    FP8_GEMM_TIME_BLACKWELL,
    FP8_GEMM_TIME_HOPPER,
    GRAPH_LAUNCHES_PER_REGION,
    HBM_RESERVE_FRACTION,
    KERNEL_PASSES,
    KERNELS_EMBEDDING,
    KERNELS_LM_HEAD_LOSS,
    KERNELS_MOE_ROUTER,
    KERNELS_PER_EXPERT_GEMMS,
    MAIN_GRAD_BYTES,
    PCIE_ACHIEVABLE_FRACTION,
    WEIGHT_BYTES,
)
from cost_model.flops import model_flops_per_token
from cost_model.memory import OFFLOAD_MODULES, col, memory_by_stage, offload_bytes, stage_params
from cost_model.nongemm import (
    dispatcher_preprocess,
    dispatcher_syncs,
    drop_and_pad,
    hidden_comm_hbm,
    host_moe_launches,
    latency,
    layer_kernels,
    layer_weights,
    lm_head_wgrad_main_grad,
    permute_syncs,
    qk_norm,
    routed_load,
    wgrad_main_grad,
)
from cost_model.ops import TableOps
from cost_model.plans import PlanArrays
from specs.errors import LayoutError
from specs.pipeline import balanced_layout, split_layers

# ---- pipeline structure (cached per distinct pp/vpp/first/last/layout) --------------------------
_STAGE_CACHE: dict = {}


def _near_even_split(num_layers: int, pp: int):
    """Chunks of a near-even split over pp ranks (one chunk each), embedding on the first and the
    loss on the last: what a layout that cannot be split at all is costed with."""
    counts = [num_layers // pp] * pp
    for i in range(num_layers - sum(counts)):
        counts[i] += 1
    chunks, nxt = [], 0
    for c in counts:
        chunks.append([tuple(range(nxt, nxt + c))])
        nxt += c
    return chunks, (0, 0), (pp - 1, 0)


def stage_structure(spec, pp, vpp, first, last, layout, embedding=False, loss=False):
    """(n_dense[pp], n_moe[pp], emb[pp], loss[pp], note) for one pipeline split. A layout
    `specs.pipeline` refuses is costed with the balanced layout, or when even that cannot be
    split, with a near-even split; `note` says which."""
    key = (spec.digest(), pp, vpp, first, last, layout, embedding, loss)
    hit = _STAGE_CACHE.get(key)
    if hit is not None:
        return hit
    note = ""
    try:
        split = split_layers(spec.num_layers, pp, vpp, first, last, layout, embedding, loss)
        chunks, emb_at, loss_at = split.chunks, split.embedding_at, split.loss_at
    except LayoutError as e:
        try:
            alt = balanced_layout(spec.num_layers, pp, vpp)
            split = split_layers(spec.num_layers, pp, vpp, 0, 0, alt)
            chunks, emb_at, loss_at = split.chunks, split.embedding_at, split.loss_at
            note = f"pipeline: {e}; costed with the balanced layout {alt}"
        except LayoutError as e2:
            chunks, emb_at, loss_at = _near_even_split(spec.num_layers, pp)
            note = f"pipeline: {e2}; costed with a near-even split"
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


@dataclass
class Stages:
    """[P, S] per plan and pipeline stage: dense / MoE layer counts, embedding and loss flags, the
    stage mask (stages past pp are 0), the share of layers that recompute; notes per plan."""
    dense: np.ndarray
    moe: np.ndarray
    embedding: np.ndarray
    loss: np.ndarray
    mask: np.ndarray
    notes: list | None
    recompute_fraction: np.ndarray

    @property
    def layers(self) -> np.ndarray:
        return self.dense + self.moe

    def count(self, group: str) -> np.ndarray:
        """How many of `group` (a `StepTerms` group) a stage holds."""
        return {"layer": self.layers, "dense": self.dense, "moe": self.moe, "embedding": self.embedding,
                "loss": self.loss}[group]


def _code(keys: np.ndarray) -> np.ndarray:
    """Mixed-radix code of the rows of an int matrix: a 1-D unique is far cheaper than axis=0."""
    code = np.zeros(keys.shape[0], dtype=np.int64)
    for j, r in enumerate(keys.max(axis=0) + 1):
        code = code * int(r) + keys[:, j]
    return code


def _stages(spec, pa: PlanArrays, vpp_f: np.ndarray) -> Stages:
    """The stage structure of every plan (`stage_structure` once per distinct split); `vpp_f`:
    the plans' vpp as floats."""
    keys = np.stack([pa.pp, pa.vpp, pa.pp_first, pa.pp_last, pa.layout, pa.pp_embedding, pa.pp_loss], axis=1)
    _, first, inv = np.unique(_code(keys), return_index=True, return_inverse=True)
    uniq, inv = keys[first], inv.reshape(-1)
    S = int(pa.pp.max())
    U = len(uniq)
    nd, nm, em, lo, mask = (np.zeros((U, S)) for _ in range(5))
    notes = []
    for u, (pp, vpp, pp_first, pp_last, lay, emb, los) in enumerate(uniq):
        a, b, c, d, note = stage_structure(spec, int(pp), int(vpp), int(pp_first), int(pp_last),
                                           pa.layouts[int(lay)], bool(emb), bool(los))
        nd[u, :pp], nm[u, :pp], em[u, :pp], lo[u, :pp], mask[u, :pp] = a, b, c, d, 1
        notes.append(note)
    nd, nm = nd[inv], nm[inv]
    return Stages(nd, nm, em[inv], lo[inv], mask[inv], [notes[i] for i in inv] if any(notes) else None,
                  _recompute_fraction(pa, vpp_f, nd + nm))


def _recompute_fraction(pa: PlanArrays, vpp: np.ndarray, nlay: np.ndarray) -> np.ndarray:
    """[P, S] share of a stage's layers whose forward is recomputed: all of them for full uniform
    recompute, recompute_layers per virtual chunk with the block method; 1 (unused) otherwise."""
    rc_full = pa.recompute == 2
    frac = np.ones_like(nlay)
    blk = rc_full & (pa.recompute_block == 1) & (pa.recompute_layers > 0)
    frac = np.where(blk[:, None], np.minimum(1.0, (pa.recompute_layers * vpp)[:, None] / np.maximum(nlay, 1)), frac)
    return np.where(rc_full[:, None], frac, 1.0)


# ---- the step as one list of terms ---------------------------------------------------------------
# Breakdown components, in the order `breakdown_s` lists them.
COMPONENTS = ("attention_proj", "core_attention", "dense_mlp", "router_permutation", "ep_dispatch_combine",
              "etp_gather_scatter",
              "ep_overlap_beyond", "ep_overlap_sm_share", "ep_overlap_hbm_share", "dispatcher_preprocess",
              "expert_gemm", "shared_expert", "elementwise", "kernel_latency", "wgrad_main_grad",
              "fp8_quantize", "moe_host_sync", "tp_comm", "cp_comm", "embedding", "lm_head_ce", "mtp",
              "activation_offload", "recompute", "recompute_core_attention", "recompute_experts")
# The memory-bound components: what loses HBM bandwidth to a communication running beside it
# (`nongemm.hidden_comm_hbm`), as a share of the stage's compute.
MEMBOUND_COMPONENTS = ("elementwise", "router_permutation", "fp8_quantize", "wgrad_main_grad")
# What a term is counted per: every transformer layer, dense layers, MoE layers, the embedding
# (first stage), the LM head + loss (last stage).
GROUPS = ("layer", "dense", "moe", "embedding", "loss")
_LAYER_KINDS = ("dense", "moe")


@dataclass
class Term:
    component: str  # one of COMPONENTS
    group: str  # one of GROUPS
    seconds: np.ndarray  # [P] seconds per microbatch and unit of `group` (fwd + bwd, or a share)
    fwd: np.ndarray | None = None  # the forward part of `seconds` (None: backward only)
    recomputed: bool = False  # the extra forward of recompute: scaled by the recompute fraction


def _chain(arrays):
    """Left-to-right sum (the order of the terms is the order of the additions)."""
    it = iter(arrays)
    acc = next(it)
    for a in it:
        acc = acc + a
    return acc


@dataclass
class StepTerms:
    """Every per-microbatch cost of a stage, once: the stage time (`stage_compute`), its forward
    part (`stage_fwd`) and the breakdown (`breakdown`) are sums of these same terms."""
    terms: list = field(default_factory=list)

    def add(self, component, group, seconds, fwd=None, recomputed=False):
        assert component in COMPONENTS and group in GROUPS, (component, group)
        self.terms.append(Term(component, group, seconds, fwd, recomputed))

    def _of(self, group):
        """Terms a unit of `group` costs: a dense or MoE layer also pays every "layer" term."""
        groups = ("layer", group) if group in _LAYER_KINDS else (group,)
        return [t for t in self.terms if t.group in groups and not t.recomputed]

    def unit_fwd(self, group) -> np.ndarray:
        """[P] forward seconds of one unit of `group` (e.g. one dense layer), recompute excluded."""
        return _chain(t.fwd for t in self._of(group) if t.fwd is not None)

    def stage_compute(self, st: Stages) -> np.ndarray:
        """[P, S] seconds of one microbatch's forward + backward (and recompute) per stage."""
        parts = []
        for g in GROUPS[1:]:
            unit = col(_chain(t.seconds for t in self._of(g)))
            rec = [t.seconds for t in self.terms if t.group == g and t.recomputed]
            if rec:
                unit = unit + st.recompute_fraction * col(_chain(rec))
            parts.append(st.count(g) * unit)
        return _chain(parts) * st.mask

    def stage_fwd(self, st: Stages) -> np.ndarray:
        """[P, S] forward seconds of one microbatch per stage (recompute excluded)."""
        return _chain(st.count(g) * col(self.unit_fwd(g)) for g in GROUPS[1:]) * st.mask

    def breakdown(self, st: Stages, components=COMPONENTS) -> dict:
        """{component: [P, S] seconds of one microbatch per stage}; the components sum to
        `stage_compute` (up to the order of the additions)."""
        out = {}
        for c in components:
            parts = []
            for g in GROUPS:
                ts = [t for t in self.terms if t.component == c and t.group == g]
                if ts:
                    parts.append(st.count(g) * col(_chain(t.seconds for t in ts)))
            if not parts:  # a component this model has no term for (e.g. mtp without MTP layers)
                out[c] = st.mask * 0.0
                continue
            total = _chain(parts)
            if any(t.recomputed for t in self.terms if t.component == c):
                total = st.recompute_fraction * total
            out[c] = total
        return out


def _recompute_forward(x: Inputs, st_terms: StepTerms, attn, tp, dense: FwdBwd, router: FwdBwd,
                       experts: RoutedExperts | None, ep_total: FwdBwd, shared: FwdBwd):
    """[P] extra forward seconds per dense and per MoE layer that recompute re-runs: the whole
    layer forward (full), or the listed modules' forward (selective); and of those, the core
    attention's and the routed experts' (per layer, per MoE layer)."""
    has = x.recomputes
    rc_full = x.pa.recompute == 2
    z = x.zero
    moe_act_f = experts.act_f if experts is not None else z
    expert_f = experts.f if experts is not None else z
    moe_fwd_total = router.f + ep_total.f + expert_f + shared.f if experts is not None else z
    sel_dense = (has("core_attn") * attn.core_f + has("mla_up_proj") * attn.mla_up_f + has("layernorm") * attn.norm_f
                 + has("mlp") * (dense.f + tp.block))
    sel_moe = (has("core_attn") * attn.core_f + has("mla_up_proj") * attn.mla_up_f + has("layernorm") * attn.norm_f
               + has("moe_act") * moe_act_f + has("moe") * moe_fwd_total
               + has("shared_experts") * (1 - has("moe")) * shared.f)
    # the re-run core attention and routed experts, apart (they are the attention's and the
    # experts' time, where a trial's split finds them: trials/megatron/components.py)
    core = np.where(rc_full, 1.0, has("core_attn")) * attn.core_f
    exp = np.where(rc_full, expert_f, has("moe") * expert_f + (1 - has("moe")) * has("moe_act") * moe_act_f)
    return (np.where(rc_full, st_terms.unit_fwd("dense"), sel_dense),
            np.where(rc_full, st_terms.unit_fwd("moe"), sel_moe), core, exp)


def _add_offload(x: Inputs, terms: StepTerms, experts, cluster):
    """Fine-grained activation offloading: the offloaded inputs go to the host in the forward
    and come back in the backward over PCIe (`cluster.pcie_gbps` per direction), on a side stream
    that overlaps the layer's own compute (megatron-core 0.16.1 fine_grained_activation_offloading;
    `constants`, "activation offloading"); what exceeds the layer's forward (backward) is exposed."""
    if not x.offload_modules:
        return
    off = offload_bytes(x, None, experts)
    bw = max(float(cluster.pcie_gbps or 0.0), 1e-3) * 1e9 * PCIE_ACHIEVABLE_FRACTION
    for kind, moved in (("dense", off.attn_kept_off + off.dense_mlp), ("moe", off.attn_kept_off + off.moe)):
        unit = _chain(t.seconds for t in terms._of(kind))
        uf = terms.unit_fwd(kind)
        f = np.maximum(0.0, moved / bw - uf)
        b = np.maximum(0.0, moved / bw - (unit - uf))
        terms.add("activation_offload", kind, f, f)
        terms.add("activation_offload", kind, b)


def _add_mtp(x: Inputs, terms: StepTerms, head: FwdBwd):
    """Multi-token prediction (Megatron-core multi_token_prediction.py), on the loss stage: per
    MTP depth, two norms and the eh-projection GEMM (2h -> h) over the concatenated embedding and
    hidden state, one transformer layer of the model's last-layer kind, and the shared LM head +
    cross-entropy again."""
    n = int(getattr(x.spec, "mtp_num_layers", 0) or 0)
    if n <= 0:
        return
    kind = "moe" if x.spec.moe_layers[-1] else "dense"
    proj = x.ops.gemm(x.tokens, x.hidden / x.tp, 2 * x.hidden)
    layer = _chain(t.seconds for t in terms._of(kind))
    layer_f = terms.unit_fwd(kind)
    terms.add("mtp", "loss", n * (layer_f + proj[0] + head.f), n * (layer_f + proj[0] + head.f))
    terms.add("mtp", "loss", n * (layer - layer_f + proj[1] + head.b))


def _unpaired_share(x: Inputs) -> np.ndarray:
    """[P] share of a stage's forward (and backward) chunks that EP a2a overlap cannot pair: the
    warm-up forwards and cool-down backwards of the first stage, 2(pp-1) + (vpp-1)pp + 1 of its
    m x vpp chunk-microbatches (Megatron's interleaved 1F1B warm-up; one of m without a pipeline:
    the first forward and the last backward)."""
    warm = 2 * (x.pp - 1) + (x.vpp - 1) * x.pp + 1
    return np.minimum(1.0, warm / np.maximum(x.microbatches * x.vpp, 1.0))


# ---- the model ----------------------------------------------------------------------------------
def evaluate(workload, pa: PlanArrays, tables, **kw) -> dict:
    """`_evaluate` with numpy's divide/invalid warnings off (degenerate plans give inf/nan that
    the caller masks); arguments as `_evaluate`."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _evaluate(workload, pa, tables, **kw)


def _row_key(pa: PlanArrays):
    """(first, inverse) of the plan columns every per-layer table query is a function of."""
    rk = np.stack([pa.tp, pa.cp, pa.ep, pa.etp, pa.mbs, pa.precision, pa.dispatch, pa.grouped_gemm], axis=1)
    _, first, inv = np.unique(_code(rk), return_index=True, return_inverse=True)
    return first, inv.reshape(-1)


def _inputs(workload, pa: PlanArrays, tables, imbalance) -> Inputs:
    W, gbs, seq = workload.world, workload.gbs, workload.seq
    tp, cp, pp, vpp, ep, etp, mbs = (np.asarray(getattr(pa, k), dtype=float)
                                     for k in ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs"))
    dp = np.asarray(np.maximum(W // (pa.tp * pa.cp * pa.pp), 1), dtype=float)
    edp = np.asarray(np.maximum(W // (pa.etp * pa.ep * pa.pp), 1), dtype=float)
    fp8 = pa.precision != 0
    # the recipe's GEMM kernel: block-scaled fp8 runs slower than per-tensor (constants FP8_GEMM_TIME_*)
    per_recipe = FP8_GEMM_TIME_BLACKWELL if getattr(workload.cluster, "mxfp8", False) else FP8_GEMM_TIME_HOPPER
    ops = TableOps(tables, workload.cluster, fp8, np.asarray(per_recipe)[pa.precision])
    ops.set_rowkey(*_row_key(pa))
    T = seq * mbs / cp
    return Inputs(spec=workload.model, pa=pa, ops=ops, world=W, seq=seq, tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep,
                  etp=etp, dp=dp, edp=edp, microbatches=np.ceil(gbs / (dp * mbs)), fp8=fp8, tokens=T,
                  tokens_sp=T / tp, imbalance=routed_load(pa, imbalance), zero=np.zeros(pa.n))


def _evaluate(workload, pa: PlanArrays, tables, *, imbalance=1.0, hbm_reserve=HBM_RESERVE_FRACTION,
              calibration_scale=1.0, flash=True, dropout=False, detail=True, offload_modules=()) -> dict:
    """The model over all plans of `pa` at once.

    Args:
        workload: `specs.workload.Workload` (model, cluster, world size, global batch, sequence).
        pa: The plans, as columns.
        tables: `cost_model.tables.Tables` of the cluster.
        imbalance: Routed tokens of the busiest expert over the mean (1 = uniform routing).
        hbm_reserve: Share of HBM kept free (allocator fragmentation, CUDA context).
        calibration_scale: The calibration term's factor on the raw step time.
        flash: Flash attention (activation memory without the s^2 term).
        dropout: Count dropout masks in activation memory.
        detail: Also return the breakdown, per-stage memory and per-block diagnostics.
        offload_modules: megatron-core fine-grained activation offloading (`memory.OFFLOAD_MODULES`).

    Returns:
        dict of [P] arrays (step_time_s, tokens_per_s_per_gpu, microbatches, dp, raw_step_time_s,
        model_tflops_per_gpu, mfu, peak_memory_gib, fits) and usable_gib; with `detail`,
        breakdown_s (components that sum to step_time_s), memory_by_stage_gib, stage_mask,
        slowest_stage, m_expert, moe_block_fwd_s / moe_block_bwd_s and notes.
    """
    spec, cl = workload.model, workload.cluster
    x = _inputs(workload, pa, tables, imbalance)
    # main-gradient bytes per parameter: fp32, or bf16 under the plan's --grad-reduce-in-bf16
    x.grad_bytes = np.where(pa.grad_reduce_bf16.astype(bool), float(WEIGHT_BYTES), float(MAIN_GRAD_BYTES))
    bad = set(offload_modules) - set(OFFLOAD_MODULES)
    if bad:
        raise ValueError(f"offload_modules: unknown {sorted(bad)}; choose from {', '.join(OFFLOAD_MODULES)}")
    x.offload_modules = tuple(offload_modules)
    ops, m, z, W = x.ops, x.microbatches, x.zero, x.world

    # -- blocks, per layer and microbatch -----------------------------------------------------------
    tp = tp_comm(x)
    attn = attention(x)
    cp = cp_comm(x, attn)
    dense = dense_mlp(x)
    if spec.is_moe:
        experts = routed_experts(x)
        router = router_permutation(x)
        ep_total = ep_dispatch_combine(x, experts)
        shared = shared_experts(x, tp)
        # the nodes of Megatron's merged forward-backward (model_chunk_schedule_plan.py): "attn" =
        # the attention block, norms, router and dispatch preprocess; "mlp" = experts + shared expert
        # (`w`: the weight-gradient GEMMs within each backward, delay_wgrad_compute's own nodes)
        attn_node = Node(attn.proj_f + attn.core_f + attn.elem_f + router.f + attn.rope_eager.f,
                         attn.proj_b + attn.core_b + 2 * attn.elem_f + router.b + attn.rope_eager.b, attn.proj_w)
        mlp_node = Node(experts.f + shared.f, experts.b + shared.b, experts.w + shared.w)
        # the memory-bound kernels of each node lose HBM bandwidth to the communication beside them
        # (GPUs; issue 22 item 1): norms, residuals, RoPE, router and permute; the expert activation
        # (the shared expert's activation: the same bytes as `blocks.shared_experts` charges)
        sh_act = shared_expert_activation(x)
        mb_attn = FwdBwd(attn.elem_f + router.f + attn.rope_eager.f, 2 * attn.elem_f + router.b + attn.rope_eager.b)
        mb_mlp = FwdBwd(experts.act_f + sh_act, 2 * (experts.act_f + sh_act))
        mb_shared = FwdBwd(sh_act, 2 * sh_act)
        membound = (mb_attn, mb_mlp, mb_shared) if ops.async_launch else None
        epx = ep_exposed(x, ep_total, shared, attn_node, mlp_node, _unpaired_share(x), membound)
        ep = epx.total
        expert_t = FwdBwd(experts.f, experts.b)
    else:
        experts = None
        router = ep_total = shared = ep = expert_t = FwdBwd(z, z)
        epx = EPExposed(ep, ep, ep, ep)
    emb = embedding(x, tp)
    head = lm_head_loss(x, tp, attn)
    q8 = fp8_quantize(x, experts)
    # GPUs (TE layer spec): the kernel counts per op (`cost_model.nongemm`) set the host's launches,
    # each non-GEMM kernel's fixed device slot, the kernels after the dispatcher sync; the dispatcher's
    # metadata exchange and the wgrad's main-grad accumulation are priced. CPU devices keep the
    # structural counts their stack floor was fitted with and none of these terms.
    gpu = ops.async_launch
    lk = layer_kernels(spec, tp=x.tp, cp=x.cp, grouped=pa.grouped_gemm.astype(bool),
                       local_experts=experts.local_experts if experts is not None else z + 1,
                       precision=pa.precision, dispatch=pa.dispatch,
                       blackwell=bool(getattr(cl, "mxfp8", False)),
                       permute_fused=pa.permute_fusion.astype(bool),
                       router_fused=pa.router_fusion.astype(bool), capacity_factor=pa.capacity_factor,
                       drop_pad=drop_and_pad(pa)) if gpu else None
    # device-to-host syncs per MoE layer forward beyond the dispatcher's: the unfused permutation's
    perm_syncs = permute_syncs(pa.dispatch, pa.permute_fusion.astype(bool)) if spec.is_moe else z
    # the GPU seconds after the sync: dispatch / combine as exposed, the experts, the shared expert
    # and the experts' fp8 casts
    sync = (moe_host_sync(x, host_moe_launches(lk, ops.gap) - lk.router - lk.preprocess,
                          epx.total.f + expert_t.f + shared.f + q8.moe.f, perm_syncs)
            if (gpu and spec.is_moe) else z)

    # -- one list of terms: the stage time and the breakdown both sum it -----------------------------
    terms = StepTerms()
    terms.add("attention_proj", "layer", attn.proj_f, attn.proj_f)
    terms.add("attention_proj", "layer", attn.proj_b)
    terms.add("core_attention", "layer", attn.core_f, attn.core_f)
    terms.add("core_attention", "layer", attn.core_b)
    terms.add("elementwise", "layer", 3 * attn.elem_f, attn.elem_f)  # bwd = 2x fwd
    terms.add("elementwise", "layer", attn.rope_eager.f + attn.rope_eager.b, attn.rope_eager.f)  # 0 unless eager RoPE
    terms.add("tp_comm", "layer", 2 * tp.block, tp.block)  # attention block; bwd mirrors fwd
    terms.add("cp_comm", "layer", cp.f, cp.f)
    terms.add("cp_comm", "layer", cp.b)
    terms.add("dense_mlp", "dense", dense.f, dense.f)
    terms.add("dense_mlp", "dense", dense.b)
    terms.add("tp_comm", "dense", 2 * tp.block, tp.block)  # MLP block
    # the serial exchange apart: the dispatcher's tokens and expert TP's gather / scatter of the
    # routed rows (a different collective; the calibration gives it a class of its own)
    etp_s = ep_total.etp_share if spec.is_moe else z
    serial_ep = FwdBwd(epx.serial.f * (1.0 - etp_s), epx.serial.b * (1.0 - etp_s))
    serial_etp = FwdBwd(epx.serial.f * etp_s, epx.serial.b * etp_s)
    for name, blk in (("router_permutation", router), ("ep_dispatch_combine", serial_ep),
                      ("etp_gather_scatter", serial_etp),
                      ("ep_overlap_beyond", epx.beyond), ("ep_overlap_sm_share", epx.sm_share),
                      ("expert_gemm", expert_t), ("shared_expert", shared)):
        terms.add(name, "moe", blk.f, blk.f)
        terms.add(name, "moe", blk.b)
    for group, blk in (("layer", q8.attn), ("dense", q8.dense), ("moe", q8.moe)):
        terms.add("fp8_quantize", group, blk.f, blk.f)
        terms.add("fp8_quantize", group, blk.b)
    if gpu:
        terms.add("ep_overlap_hbm_share", "moe", epx.hbm_share.f, epx.hbm_share.f)
        terms.add("ep_overlap_hbm_share", "moe", epx.hbm_share.b)
        # every kernel's fixed slot: the fp8 quantisation kernels' in fp8_quantize, the rest here
        s_attn, s_dense, s_moe = lk.device_slots()
        for group, k, f8 in (("layer", s_attn, lk.attn_fp8), ("dense", s_dense, lk.dense_fp8),
                             ("moe", s_moe if spec.is_moe else z, lk.moe_fp8 if spec.is_moe else z),
                             ("embedding", z + KERNELS_EMBEDDING, z), ("loss", z + KERNELS_LM_HEAD_LOSS, z)):
            lf, lb = latency(k)
            terms.add("kernel_latency", group, lf, lf)
            terms.add("kernel_latency", group, lb)
            qf, qb = latency(f8)
            terms.add("fp8_quantize", group, qf, qf)
            terms.add("fp8_quantize", group, qb)
        qn = qk_norm(x)
        terms.add("elementwise", "layer", 3 * qn, qn)  # bwd = 2x fwd, as the attention block's norms
        wa, wd, wm = wgrad_main_grad(x, layer_weights(x))
        terms.add("wgrad_main_grad", "layer", wa)
        terms.add("wgrad_main_grad", "dense", wd)
        if spec.is_moe:
            terms.add("wgrad_main_grad", "moe", wm)
        terms.add("wgrad_main_grad", "loss", lm_head_wgrad_main_grad(x))
    if spec.is_moe:  # on every device: the CPU stack floor was measured without EP (no such exchanges)
        pre_f, pre_b = dispatcher_preprocess(x)
        terms.add("dispatcher_preprocess", "moe", pre_f, pre_f)
        terms.add("dispatcher_preprocess", "moe", pre_b)
    terms.add("moe_host_sync", "moe", sync, sync)
    terms.add("embedding", "embedding", emb.f, emb.f)
    terms.add("embedding", "embedding", emb.b)
    terms.add("lm_head_ce", "loss", head.f, head.f)
    terms.add("lm_head_ce", "loss", head.b)
    _add_offload(x, terms, experts, workload.cluster)
    _add_mtp(x, terms, head)
    rec_dense, rec_moe, rec_core, rec_exp = _recompute_forward(x, terms, attn, tp, dense, router, experts, ep_total,
                                                               shared)
    terms.add("recompute_core_attention", "dense", rec_core, recomputed=True)
    terms.add("recompute_core_attention", "moe", rec_core, recomputed=True)
    terms.add("recompute_experts", "moe", rec_exp, recomputed=True)
    # the rest of the re-run forward: the parts are within the totals, the max only drops the
    # rounding of the differences (-1e-17 s)
    terms.add("recompute", "dense", np.maximum(0.0, rec_dense - rec_core), recomputed=True)
    terms.add("recompute", "moe", np.maximum(0.0, rec_moe - rec_core - rec_exp), recomputed=True)

    # -- stages: compute, CPU launch floor, the slowest stage ------------------------------------------
    st = _stages(spec, pa, x.vpp)
    nd, nm, smask = st.dense, st.moe, st.mask
    stage_compute = terms.stage_compute(st)
    # CPU floor: kernels per microbatch x dispatch gap (structural kernel counts, fwd; bwd = 2x)
    # CUDA graphs: a graphed region's kernels become one replay per pass (`blocks.cuda_graphs`);
    # a full-iteration graph launches nothing per kernel
    if gpu:
        gr = cuda_graphs(spec, pa, lk.attn, lk.dense, host_moe_launches(lk, ops.gap), lk.router, lk.preprocess)
    else:
        gr = cuda_graphs(spec, pa, *structural_kernels(spec, x.tp, x.cp, pa.grouped_gemm.astype(bool),
                                                        experts.local_experts if experts is not None else z,
                                                        pa.precision))
    k_attn, k_dense, k_moe = gr.k_attn, gr.k_dense, gr.k_moe
    launches = nd * col(gr.regions_dense) + nm * col(gr.regions_moe)
    kern = KERNEL_PASSES * (nd * col(k_attn + k_dense) + nm * col(k_attn + k_moe) + st.embedding * KERNELS_EMBEDDING
                            + st.loss * KERNELS_LM_HEAD_LOSS)
    kern_fwd = kern / KERNEL_PASSES + launches  # the forward launches once (one replay per region), the backward twice
    kern = kern + GRAPH_LAUNCHES_PER_REGION * launches
    kern = kern + (pa.recompute > 0)[:, None] * st.layers * col(k_attn + gr.attn) * st.recompute_fraction
    no_host = col(gr.full_iteration)
    kern, kern_fwd = np.where(no_host, 0.0, kern), np.where(no_host, 0.0, kern_fwd)
    floor = kern * ops.gap
    fwd_floor = kern_fwd * ops.gap
    if ops.async_launch:
        # GPU: a host clock (launches x gap) against the GPU clock, aligned wherever the host
        # waits for the device: the dropless dispatcher's device-to-host copy of the token counts
        # in every MoE layer's forward drains the launch queue (`blocks.moe_host_sync`), so each
        # such layer's forward is a segment of its own, max(its GPU seconds, sync idle included;
        # its launches x gap + the copy). The rest of the microbatch (dense layers, embedding, loss,
        # the whole backward, where the host runs ahead) is one segment, max(GPU, host). Without
        # syncs this is max(compute, floor) over the microbatch. Under EP a2a overlap the host issues
        # one microbatch's forward and another's backward of a layer interleaved (the merged
        # forward-backward), so the sync drains both: the segment is the layer's whole forward +
        # backward, GPU and host (issue 22: with the forward alone, extra forward compute hid the
        # backward's communication outside its segment and more work could shorten the step).
        # (the unfused permutation's masked_selects sync too, under the allgather dispatcher as well)
        n_sync = col(dispatcher_syncs(pa.dispatch, drop_and_pad(pa)) + perm_syncs if spec.is_moe else z)
        seg = nm * (n_sync > 0)
        a2o = col(pa.a2a_overlap.astype(bool))
        u_moe = col(_chain(t.seconds for t in terms._of("moe"))) if spec.is_moe else col(z)
        u_f = np.where(a2o, u_moe, col(terms.unit_fwd("moe")) if spec.is_moe else col(z))
        k_layer = np.where(pa.a2a_overlap.astype(bool), KERNEL_PASSES * (k_attn + k_moe)
                           + GRAPH_LAUNCHES_PER_REGION * gr.regions_moe, k_attn + k_moe + gr.regions_moe)
        h_f = col(np.where(gr.full_iteration, 0.0, k_layer * ops.gap))
        moe_wall = seg * np.maximum(u_f, h_f + n_sync * D2H_SYNC_S)

        def wall(gpu, host):
            return moe_wall + np.maximum(gpu - seg * u_f, host - seg * h_f)
    else:
        # CPU: one thread dispatches and executes every op synchronously: the dispatch time adds
        def wall(gpu, host):
            return gpu + host
    stage_time = wall(stage_compute, floor) * smask
    slow = np.argmax(stage_time, axis=1)
    rows = np.arange(pa.n)
    C = stage_time[rows, slow]
    # the DP overlap windows are wall time, not GPU seconds: on a launch-bound stage extra compute
    # (recompute, a longer forward) runs under the launch floor and lengthens no window
    if ops.async_launch:
        # issue 22 item 7: the forward window (the param all-gather hides under it) and the backward
        # window (C - forward: the grad reduce-scatter) are fixed shares of the stage's wall time C,
        # so they move only as C does: more work (or recompute) lengthening C by dC widens the two
        # windows by dC together, hiding at most dC more, while the m microbatches add m dC. The
        # share is structural, 1/KERNEL_PASSES: the forward issues a third of the launches and does
        # a third of the GEMM work. Not the GPU seconds' ratio: on a host-bound stage whose C did not
        # move, more routed work moved that ratio and the wider backward window hid more of the grad
        # reduce-scatter (tests/test_properties.py regression cases 7-8). Not 1/(3 + recompute
        # share) either: the backward window then grew by more than C, and full recompute on a
        # launch-bound stage predicted a shorter step (tests/test_rank_top.py). Full recompute's
        # forward window is a little wide by this share (its backward re-runs the forward).
        fwd_win = C / KERNEL_PASSES
    else:
        # CPU: the forward's own GPU seconds and dispatch time (the host adds, it never runs ahead)
        fwd_win = wall(terms.stage_fwd(st), fwd_floor)[rows, slow]
    bwd_wall = C - fwd_win

    # -- per step: pipeline, DP collectives, optimizer -------------------------------------------------
    pipe = pipeline(x, C)
    params = stage_params(x, st)
    # every stage syncs its own gradients and runs its own optimizer step, and the step waits for
    # all of them (grad-norm clipping). The optimizer is the slowest stage's (max over stages: one
    # chosen stage let an MTP layer on the last stage move the choice to a cheaper one and shorten
    # the step, tests/test_properties.py). So are the DP collectives: each stage's exposed reduce-
    # scatter and all-gather, the compute slowed by the SMs and the HBM bandwidth its hidden ones
    # take, summed, under the same windows, and the step waits for the stage where that sum is the
    # largest (one chosen stage, the one holding the most parameters, let an MTP layer on the loss
    # stage move the choice to a stage whose dense / expert mix exposed less, and a maximum taken per
    # term let the HBM term fall when bytes joined a slower collective: test_properties.py
    # regression cases 9-10; per stage the sum never falls with more bytes or a longer C)
    S = params.dense.shape[1]
    per_stage = [dp_collectives(x, params.dense[:, s], params.expert[:, s], fwd_win, bwd_wall, st.layers[:, s])
                 for s in range(S)]
    # the HBM bandwidth hidden communication takes from the memory-bound compute under it (GPUs;
    # issue 22): the interleaved schedule's overlapped PP send/recv (under the m microbatches'
    # compute of the stage with the most memory-bound seconds: which stage is slowest can move with
    # a little more work elsewhere) and the hidden DP collectives (under one microbatch's backward /
    # forward of their own stage)
    hbm = float(getattr(cl, "hbm_tbps", 0.0) or 0.0) * 1e12
    if ops.async_launch and hbm > 0:
        mb_stage = _chain(terms.breakdown(st, MEMBOUND_COMPONENTS).values()) * smask
        p2p_sm = pp_p2p_sm_share(cl, pipe.hidden)
        p2p_hbm = hidden_comm_hbm(pipe.p2p_bytes, pipe.one, pipe.hidden, m * np.max(mb_stage, axis=1), hbm)
        dp_hbm_s = np.stack([hidden_comm_hbm(d.grad_bytes, d.grad_s, d.hidden_grad, d.windows * mb_stage[:, s], hbm)
                             + hidden_comm_hbm(d.gather_bytes, d.gather_s, d.hidden_gather, d.windows * mb_stage[:, s],
                                               hbm)
                             for s, d in enumerate(per_stage)], axis=1)
    else:
        p2p_sm = p2p_hbm = z
        dp_hbm_s = np.zeros((pa.n, S))
    dp_grad, dp_gather, dp_sm = (np.stack([getattr(d, k) for d in per_stage], axis=1)
                                 for k in ("grad", "param_gather", "sm_share"))
    dps = np.argmax((dp_grad + dp_gather + dp_sm + dp_hbm_s) * smask, axis=1)
    dp_grad, dp_gather, dp_sm, dp_hbm = (v[rows, dps] for v in (dp_grad, dp_gather, dp_sm, dp_hbm_s))
    opt_t = np.max(np.stack([optimizer_step(x, params.dense[:, s], params.expert[:, s], st.layers[:, s])
                             for s in range(S)], axis=1), axis=1)

    # -- step ---------------------------------------------------------------------------------------
    raw = (m * C + pipe.bubble + pipe.p2p + dp_grad + dp_gather + dp_sm + opt_t
           + p2p_sm + p2p_hbm + dp_hbm)
    step = raw * calibration_scale
    tokens = workload.gbs * workload.seq
    out = {"step_time_s": step, "tokens_per_s_per_gpu": tokens / step / W, "microbatches": m,
           "dp": x.dp, "raw_step_time_s": raw}
    out["model_tflops_per_gpu"] = model_flops_per_token(spec, workload.seq) * tokens / step / W / 1e12
    peak = float(cl.peak_tflops.get("bf16") or max(cl.peak_tflops.values()))
    out["mfu"] = out["model_tflops_per_gpu"] / peak

    # -- memory -------------------------------------------------------------------------------------
    mem = memory_by_stage(x, st, params, experts, flash=flash, dropout=dropout, graphs=gr)
    peak_mem = mem.max(axis=1)
    usable = cl.hbm_gib * (1.0 - hbm_reserve)
    out.update(peak_memory_gib=peak_mem, fits=peak_mem <= usable, usable_gib=usable)
    if detail:
        # the same terms per component, at the slowest stage, over the m microbatches
        bd = {k: m * v[rows, slow] for k, v in terms.breakdown(st).items()}
        # what the host clock adds to the GPU's (the whole dispatch time on CPU devices)
        floor_s = m * np.maximum(0.0, stage_time[rows, slow] - stage_compute[rows, slow])
        if ops.async_launch:
            bd["cpu_launch_floor"] = floor_s
        elif ops.floor_split:
            # CPU, where the profile measured it: the floor where a trial's split sees it (the
            # modules' hooks, the ops' own dispatch, the Python between ops: host_launch), as the
            # profile's stack-floor trials split it (trials/profile/stack_floor.py)
            for c, share in ops.floor_split.items():
                bd[f"cpu_floor_in_{c}"] = floor_s * share
        else:
            # CPU: one thread dispatches and runs each op, so an op's dispatch is part of its
            # module's time (what a trial's module hooks measure, trials/megatron/components.py):
            # the floor is placed by the modules issuing the launches, the rest stays the stack's
            n_exp = expert_gemm_calls(pa.grouped_gemm, experts.local_experts if experts is not None else z)
            share = {"cpu_launch_core_attention": (nd + nm) * CPU_KERNELS_CORE_ATTENTION,
                     "cpu_launch_experts": nm * col(KERNELS_PER_EXPERT_GEMMS * n_exp),
                     "cpu_launch_router": nm * KERNELS_MOE_ROUTER}
            total = kern[rows, slow] / KERNEL_PASSES
            left = floor_s
            for name, k in share.items():
                part = floor_s * np.where(total > 0, (k * smask)[rows, slow] / np.maximum(total, 1e-30), 0.0)
                bd[name] = part
                left = left - part
            bd["cpu_stack_floor"] = np.maximum(0.0, left)  # the rest, measured in situ (calibration: stack_floor)
        bd.update(pipeline_bubble=pipe.bubble, pp_p2p=pipe.p2p, dp_grad_reduce_scatter=dp_grad,
                  dp_param_all_gather=dp_gather, dp_overlap_sm_share=dp_sm, optimizer_step=opt_t,
                  pp_p2p_sm_share=p2p_sm, pp_p2p_hbm_share=p2p_hbm, dp_overlap_hbm_share=dp_hbm,
                  calibration=raw * (calibration_scale - 1.0))
        out["breakdown_s"] = bd
        out["memory_by_stage_gib"] = mem
        out["stage_mask"] = smask
        out["slowest_stage"] = slow
        out["m_expert"] = np.broadcast_to(experts.m_expert if experts is not None else z, (pa.n,))
        # one MoE block alone (pre-MLP norm, router, permutation, dispatch/combine, experts,
        # shared expert, fp8 casts, the dispatcher's host sync), per microbatch: what Megatron's
        # moe_perf tests time
        out["moe_block_fwd_s"] = attn.norm_f / 2 + router.f + ep.f + expert_t.f + shared.f + q8.moe.f + sync
        out["moe_block_bwd_s"] = attn.norm_f + router.b + ep.b + expert_t.b + shared.b + q8.moe.b
        # what a fused dispatch + experts + combine kernel would replace (forward, per microbatch
        # and MoE layer), and how many MoE layers the slowest stage runs: the megakernel what-if
        out["moe_dispatch_experts_fwd_s"] = np.broadcast_to(ep.f + expert_t.f, (pa.n,))
        out["moe_layers_slowest_stage"] = nm[rows, slow]
        out["notes"] = st.notes
    return out
