"""The cost model's blocks: one function per part of a training step, each returning a small
struct of numpy arrays over the plans being evaluated (seconds per layer and microbatch unless a
docstring says per step). `cost_model.model.evaluate` gathers the inputs (`Inputs`), calls these
and assembles the step; what each block models is described in `cost_model.model`'s docstring.

Every expression here is kept term for term as the model had it when `tests/test_regression.py`
pinned its predictions: floating-point sums are written in the same order on purpose.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from clusters import is_hopper
from cost_model.constants import (
    ADAM_STEP_BYTES_PER_PARAM,
    ATTENTION_TILE,
    CE_BWD_BYTES_PER_LOGIT,
    CE_FWD_BYTES_PER_LOGIT,
    COMM_SMS,
    COMM_STARVED,
    COMM_STARVED_HOPPER,
    D2H_SYNC_S,
    DDP_BUCKET_MIN_PARAMS,
    DDP_BUCKET_PARAMS_PER_DP_RANK,
    EXPERT_FC2_BIAS_BWD_BYTES_PER_ELEMENT,
    EXPERT_FC2_BIAS_FWD_BYTES_PER_ELEMENT,
    FP8_OPERANDS_ATTENTION,
    FP8_OPERANDS_MLP,
    FP8_QUANT_BYTES_PER_ELEMENT,
    FP8_WEIGHT_COPY_BYTES,
    FP32_ROUTER_GEMM_SLOWDOWN,
    GLU_CLAMP_BWD_BYTES_PER_ELEMENT,
    GLU_CLAMP_FWD_BYTES_PER_ELEMENT,
    HELD_COMM_RATE,
    KERNELS_ATTENTION,
    KERNELS_CP_PER_STEP,
    KERNELS_DENSE_MLP,
    KERNELS_FP8_PER_OPERAND,
    KERNELS_MLA_EXTRA,
    KERNELS_MOE,
    KERNELS_MOE_PREPROCESS,
    KERNELS_MOE_ROUTER,
    KERNELS_PER_EXPERT_GEMMS,
    KERNELS_SHARED_EXPERT,
    KERNELS_TP_ATTENTION,
    KERNELS_TP_DENSE_MLP,
    NCCL_COMM_SMS,
    P2P_CHANNELS_PER_PEER,
    P2P_PEERS,
    POST_SYNC_IDLE_LAUNCHES,
    ROPE_EAGER_BWD_BYTES_PER_ELEMENT,
    ROPE_EAGER_FWD_BYTES_PER_ELEMENT,
    STARVED_WORK_PER_PAIRED_S,
    TOKEN_DROP_BWD_BYTES_PER_SCORE,
    TOKEN_DROP_FWD_BYTES_PER_SCORE,
    WEIGHT_BYTES,
)
from cost_model.nongemm import (
    comm_hbm_share,
    dispatcher_syncs,
    drop_and_pad,
    hbm_contention,
    permute_unfused,
    rope_eager,
)
from cost_model.ops import TableOps
from cost_model.plans import GRAPH_BIT, MODULE_BIT, WHOLE_LAYER_GRAPH, PlanArrays
from specs.ranks import group_size_stride


# ---- inputs ---------------------------------------------------------------------------------------
@dataclass
class Inputs:
    """What every block reads, gathered once per evaluation. Arrays are [P] over plans (float
    unless named *_i); scalars are the model's and the workload's."""
    spec: object
    pa: PlanArrays
    ops: TableOps
    world: int
    seq: int
    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    dp: np.ndarray
    edp: np.ndarray
    microbatches: np.ndarray
    fp8: np.ndarray  # bool: an fp8 recipe
    tokens: np.ndarray  # T: tokens of one microbatch on this CP rank (rows of TP-gathered GEMMs)
    tokens_sp: np.ndarray  # T / tp: sequence-parallel tokens per GPU
    imbalance: np.ndarray  # [P] routed load of the busiest expert over the mean (`nongemm.routed_load`)
    zero: np.ndarray
    grad_bytes: np.ndarray | float = 4.0  # [P] main-gradient bytes per parameter (fp32; 2 with bf16 grad reduction)
    offload_modules: tuple = ()  # megatron-core fine-grained activation offloading (memory.OFFLOAD_MODULES)

    @property
    def ranks(self):
        """Integer degrees (tp, cp, pp, ep, etp) as `specs.ranks.group_size_stride` takes them."""
        pa = self.pa
        return pa.tp, pa.cp, pa.pp, pa.ep, pa.etp

    @property
    def hidden(self) -> int:
        return self.spec.hidden_size

    @property
    def mlp_matrices(self) -> int:
        """2 for gated MLPs (gate and up projections fused into fc1), else 1."""
        return 2 if self.spec.gated_linear_unit else 1

    @property
    def bw_elementwise(self) -> float:
        return self.ops.bw["elementwise"]

    def recomputes(self, module: str) -> np.ndarray:
        """[P] bool: selective recompute of `module` (specs.plan.RECOMPUTE_MODULES)."""
        pa = self.pa
        return (pa.recompute == 1) & ((pa.recompute_modules & MODULE_BIT[module]) != 0)


@dataclass
class FwdBwd:
    """Forward and backward seconds of one block, per layer and microbatch."""
    f: np.ndarray
    b: np.ndarray


@dataclass
class Node(FwdBwd):
    """A block whose backward reports `w`, its weight-gradient part (of b): the node megatron-core's
    delay_wgrad_compute runs apart (the nodes of the merged forward-backward, `ep_exposed`)."""
    w: np.ndarray | float = 0.0


# ---- tensor and context parallelism ----------------------------------------------------------------
@dataclass
class TPComm:
    """Sequence-parallel TP collectives around one block (all-gather before, reduce-scatter
    after), seconds of one microbatch."""
    all_gather: np.ndarray
    reduce_scatter: np.ndarray
    block: np.ndarray  # all_gather + reduce_scatter


def tp_comm(x: Inputs) -> TPComm:
    act_bytes = 2.0 * x.tokens * x.hidden  # full gathered activation of one microbatch
    ag = x.ops.collective("all_gather", act_bytes, x.tp, 1)
    rs = x.ops.collective("reduce_scatter", act_bytes, x.tp, 1)
    return TPComm(ag, rs, ag + rs)


# ---- attention -------------------------------------------------------------------------------------
@dataclass
class Attention:
    proj_f: np.ndarray  # QKV (or MLA down/up) and output projections
    proj_b: np.ndarray
    core_f: np.ndarray  # flash attention
    core_b: np.ndarray
    elem_f: np.ndarray  # norms, residual adds, RoPE (memory-bound); bwd = 2x
    norm_f: np.ndarray  # the two norms alone (selective recompute of "layernorm")
    mla_up_f: np.ndarray  # MLA up projections (selective recompute of "mla_up_proj")
    kv_bytes: np.ndarray  # K/V bytes one CP ring step exchanges
    rope_eager: FwdBwd  # eager RoPE beyond the fused kernel elem_f charges (YaRN mscale; 0 otherwise)
    proj_w: np.ndarray  # the projections' weight-gradient GEMMs (part of proj_b)


def attention(x: Inputs) -> Attention:
    spec, ops, T, Tsp, tp = x.spec, x.ops, x.tokens, x.tokens_sp, x.tp
    h, nh = spec.hidden_size, spec.num_attention_heads
    if spec.mla:
        dq = spec.qk_head_dim + spec.qk_pos_emb_head_dim
        dv = spec.v_head_dim
        ql, kvl, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.qk_pos_emb_head_dim
        parts = []
        if ql:
            parts.append(ops.linear(T, ql, h))
            qup = ops.linear(T, nh * dq / tp, ql)
        else:
            qup = ops.linear(T, nh * dq / tp, h)
        parts.append(ops.linear(T, kvl + rope, h))
        kvup = ops.linear(T, nh * (spec.qk_head_dim + dv) / tp, kvl)
        parts += [qup, kvup, ops.linear(T, h, nh * dv / tp)]
        mla_up_f = qup[0] + kvup[0]
        kv_bytes = 2.0 * T * nh * (dq + dv) / tp
        head_dim_key = dq
    else:
        hd, ng = spec.head_dim, spec.query_groups
        dq = dv = hd
        parts = [ops.linear(T, (nh + 2 * ng) * hd / tp, h), ops.linear(T, h, nh * hd / tp)]
        mla_up_f = x.zero
        kv_bytes = 2.0 * 2.0 * T * ng * hd / tp
        head_dim_key = hd
    proj_f = sum(p[0] for p in parts)
    proj_b = sum(p[1] for p in parts)
    proj_w = sum(p[2] for p in parts)
    core_flops = T * x.seq * (nh / tp) * (dq + dv) * window_fraction(spec, x.seq)  # causal: half of 2*(dq+dv)*Tq*Tk
    # one call per layer and micro-batch: mbs sequences x the rank's heads (CP splits the
    # sequence, not the heads)
    core_f, core_b = ops.attention(core_flops, x.seq / x.cp, head_dim_key, np.asarray(x.pa.mbs, float) * (nh / tp))
    BWe = x.bw_elementwise
    # norms (2 per layer), residual adds (2), rope on q/k: read+write
    rope_fused = 4.0 * T * nh * dq / tp  # TE's fused RoPE: q read and written, bf16
    elem_f = (2 * 2 * 2.0 * Tsp * h + 2 * 3 * 2.0 * Tsp * h + rope_fused) / BWe
    norm_f = 2 * 2 * 2.0 * Tsp * h / BWe
    return Attention(proj_f, proj_b, core_f, core_b, elem_f, norm_f, mla_up_f, kv_bytes,
                     eager_rope(x, dq, 0 if spec.mla else spec.query_groups, rope_fused), proj_w)


def eager_rope(x: Inputs, dq, kv_heads, fused_bytes) -> FwdBwd:
    """Seconds RoPE takes beyond the fused kernel `attention` charges (`fused_bytes` forward,
    backward 2x) where megatron-core runs it in eager PyTorch on q and k (`nongemm.rope_eager`: YaRN
    with a concentration factor; `constants`, "RoPE outside TE's fused kernel"); 0 elsewhere."""
    if not rope_eager(x.spec):
        return FwdBwd(x.zero, x.zero)
    nh, tp, T, BWe = x.spec.num_attention_heads, x.tp, x.tokens, x.bw_elementwise
    elems = T * (nh + kv_heads) * dq / tp
    return FwdBwd((ROPE_EAGER_FWD_BYTES_PER_ELEMENT * elems - fused_bytes) / BWe,
                  (ROPE_EAGER_BWD_BYTES_PER_ELEMENT * elems - 2 * fused_bytes) / BWe)


def window_fraction(spec, seq) -> float:
    """Mean share of a causal layer's attention cost a layer does under sliding-window attention,
    in the fused kernel's (query block x key block) tiles (`constants`, "sliding-window attention"):
    1 without a window."""
    w = int(getattr(spec, "window_size", 0) or 0)
    if w <= 0 or w >= seq:
        return 1.0
    windowed = window_tiles(seq, w) / window_tiles(seq, seq)
    n = int(getattr(spec, "window_attn_skip_freq", 0) or 0)
    full_share = 1.0 / n if n > 0 else 0.0
    return full_share + (1.0 - full_share) * windowed


def window_tiles(seq, w, tile=ATTENTION_TILE) -> float:
    """ATTENTION_TILE x ATTENTION_TILE tiles a causal kernel visits when each query sees its last `w`
    tokens (itself included; w >= seq: plain causal, n (n + 1) / 2 over n = seq / tile query
    blocks): query block i reads key blocks i - ceil((w - 1) / tile) .. i, so past the first k =
    ceil((w - 1) / tile) + 1 blocks each visits k. n is kept fractional so that the count grows
    smoothly with seq (a longer sequence never visits fewer tiles per token)."""
    n = seq / tile
    k = math.ceil((w - 1) / tile) + 1
    if w >= seq or n <= k:
        return n * (n + 1) / 2
    return k * n - k * (k - 1) / 2


def cp_comm(x: Inputs, attn: Attention) -> FwdBwd:
    """CP ring attention: (cp-1) K/V exchanges forward, twice that backward, exposed beyond the
    core attention they overlap with."""
    cp_size, cp_stride = group_size_stride("cp", *x.ranks, x.world)
    step = x.ops.collective("send_recv", attn.kv_bytes, cp_size, cp_stride)
    f = np.maximum(0.0, (x.cp - 1) * step - attn.core_f)
    b = np.maximum(0.0, 2 * (x.cp - 1) * step - attn.core_b)
    return FwdBwd(f, b)


# ---- MLPs ------------------------------------------------------------------------------------------
def dense_mlp(x: Inputs) -> FwdBwd:
    """fc1 (gate+up when gated), activation (memory-bound), fc2; TP-sharded columns."""
    ops, T, tp, h = x.ops, x.tokens, x.tp, x.hidden
    fd = x.spec.ffn_hidden_size
    fc1 = ops.gemm(T, x.mlp_matrices * fd / tp, h)
    fc2 = ops.gemm(T, h, fd / tp)
    BWe = x.bw_elementwise
    return FwdBwd(fc1[0] + fc2[0] + 3 * 2.0 * T * fd / tp / BWe,
                  fc1[1] + fc2[1] + 2 * 3 * 2.0 * T * fd / tp / BWe)


@dataclass
class RoutedExperts:
    f: np.ndarray
    b: np.ndarray
    act_f: np.ndarray  # the expert activation alone (selective recompute of "moe_act")
    rows: np.ndarray  # R: routed rows this GPU computes
    m_expert: np.ndarray  # rows per expert GEMM
    local_experts: np.ndarray
    w: np.ndarray | float = 0.0  # the expert GEMMs' weight-gradient part of b


def routed_experts(x: Inputs) -> RoutedExperts:
    """Grouped (or per-expert) GEMMs of the E/ep local experts, M_expert rows each."""
    spec, ops = x.spec, x.ops
    E, K = max(spec.num_experts, 1), max(spec.moe_router_topk, 1)
    fe, h, nmat = spec.moe_ffn_hidden_size, x.hidden, x.mlp_matrices
    ep, etp, Tsp, imb = x.ep, x.etp, x.tokens_sp, x.imbalance
    G = E / ep  # local experts
    R = Tsp * K * imb * etp  # routed rows this GPU computes
    Me = np.ceil(ep * etp * Tsp * K * imb / E)
    grouped = x.pa.grouped_gemm.astype(bool)
    e1 = ops.grouped_linear(G, Me, nmat * fe / etp, h, grouped)
    e2 = ops.grouped_linear(G, Me, h, fe / etp, grouped)
    BWe = x.bw_elementwise
    act_f = 3 * 2.0 * R * fe / etp / BWe
    act_b = 2 * act_f
    if spec.activation_clamp and nmat == 2:  # the clamp runs unfused (`constants`, "GPT-OSS expert epilogues")
        act_f = act_f + GLU_CLAMP_FWD_BYTES_PER_ELEMENT * R * 2 * fe / etp / BWe
        act_b = act_b + GLU_CLAMP_BWD_BYTES_PER_ELEMENT * R * 2 * fe / etp / BWe
    bias_f = bias_b = 0.0
    if getattr(spec, "moe_expert_bias", False):  # fc2 bias added per expert in Python, outside the GEMM
        bias_f = EXPERT_FC2_BIAS_FWD_BYTES_PER_ELEMENT * R * h / BWe
        bias_b = EXPERT_FC2_BIAS_BWD_BYTES_PER_ELEMENT * R * h / BWe
    return RoutedExperts(e1[0] + e2[0] + act_f + bias_f, e1[1] + e2[1] + act_b + bias_b, act_f, R, Me, G,
                         e1[2] + e2[2])


def router_permutation(x: Inputs) -> FwdBwd:
    """Router (fp32 logits GEMM, score, top-k, aux loss) and token permute/unpermute,
    memory-bound except the router GEMM."""
    spec, ops, Tsp, h = x.spec, x.ops, x.tokens_sp, x.hidden
    E, K = max(spec.num_experts, 1), max(spec.moe_router_topk, 1)
    router_f = (4.0 * Tsp * E * 6) / ops.bw["router"] + 2.0 * Tsp * E * h / (
        ops.router_gemm_bf16_tflops(Tsp, E, h) * 1e12 / FP32_ROUTER_GEMM_SLOWDOWN)
    # token drop (a capacity factor): the capacity top-k, mask and masked probabilities over the
    # [tokens, experts] scores (`constants` TOKEN_DROP_*_BYTES_PER_SCORE)
    drops = np.asarray(x.pa.capacity_factor, float) > 0
    drop_f = drops * TOKEN_DROP_FWD_BYTES_PER_SCORE * Tsp * E / ops.bw["router"]
    drop_b = drops * TOKEN_DROP_BWD_BYTES_PER_SCORE * Tsp * E / ops.bw["router"]
    # permute (read Tsp rows, write the routed copies) and unpermute (the reverse); HybridEP
    # permutes inside its dispatch and combine kernels (Megatron's fused_a2a calls
    # dispatch_with_permute / combine_with_unpermute; Automodel docs/deepep_vs_hybridep_benchmark.md
    # §5.2), so no separate pass
    TK = Tsp * K * x.imbalance
    perm_f = 2 * 2.0 * (Tsp + TK) * h / ops.bw["permute"] * (x.pa.dispatch != 3)
    perm_b = perm_f
    # without permute_fusion (GPUs; megatron-core 0.16.1 moe_utils.permute / unpermute, bf16 rows):
    # permute = index_select of the TK routed rows (read, write); unpermute = the rows times their
    # probabilities (read, write), zeros, scatter_add (read the rows, accumulate T rows); backward:
    # scatter_add's gather, the multiply's two gradients (rows; probabilities, reading rows and
    # gradients), index_select's zeros + index_add. In bytes per hidden element: forward 10 TK + 6 T,
    # backward 12 TK + 8 T, against the fused kernels' 4 TK + 4 T each way. CPU devices keep the
    # permutation they were measured with (their stack floor and tables hold it)
    unfused = permute_unfused(x.pa.dispatch, x.pa.permute_fusion) & x.ops.async_launch
    perm_f = np.where(unfused, 2.0 * (5 * TK + 3 * Tsp) * h / ops.bw["permute"], perm_f)
    perm_b = np.where(unfused, 2.0 * (6 * TK + 4 * Tsp) * h / ops.bw["permute"], perm_b)
    # the alltoall dispatcher regroups the received rows by local expert after the exchange and
    # back before the combine (megatron-core 0.16.1 token_dispatcher.py MoEAlltoAllTokenDispatcher
    # dispatch_postprocess / combine_preprocess: sort_chunks_by_idxs, or a transpose().contiguous()
    # under drop-and-pad, when num_local_experts > 1): two passes reading and writing the R routed
    # rows this GPU computes (ETP-gathered), fwd and (the inverse sorts) bwd
    R = Tsp * K * x.imbalance * x.etp
    regroup = (x.pa.dispatch == 0) & (E / x.ep > 1)
    sort_f = 2 * 2 * 2.0 * R * h / ops.bw["permute"] * regroup
    return FwdBwd(router_f + drop_f + perm_f + sort_f, 2 * router_f + drop_b + perm_b + sort_f)


def shared_experts(x: Inputs, tp: TPComm) -> Node:
    """The shared expert: a dense MLP of moe_shared_expert_ffn columns, TP-sharded."""
    fs = x.spec.moe_shared_expert_ffn
    if not fs:
        return Node(x.zero, x.zero)
    ops, T, h, tpd = x.ops, x.tokens, x.hidden, x.tp
    s1 = ops.linear(T, x.mlp_matrices * fs / tpd, h)
    s2 = ops.linear(T, h, fs / tpd)
    act = shared_expert_activation(x)
    return Node(s1[0] + s2[0] + act + tp.block,
                s1[1] + s2[1] + 2 * act + tp.block, s1[2] + s2[2])


def shared_expert_activation(x: Inputs):
    """Forward seconds of the shared expert's activation (memory-bound; bwd = 2x); 0 without one."""
    return 3 * 2.0 * x.tokens * (x.spec.moe_shared_expert_ffn or 0) / x.tp / x.bw_elementwise


# ---- EP dispatch / combine ---------------------------------------------------------------------------
def _p_not_hit(total, local, k):
    """P(none of k draws without replacement from `total` items lands in a given `local` of
    them) = C(total - local, k) / C(total, k) = prod_{i<k} (total - local - i) / (total - i)."""
    p = np.ones_like(local)
    for i in range(k):
        p = p * np.clip((total - local - i) / (total - i), 0.0, None)
    return p


def distinct_ranks(spec, E, topk, ep):
    """Expected number of distinct EP ranks a token's top-k experts land on: uniform routing, or
    group-limited routing where the router groups align with the ranks (`distinct_domains` with
    one rank per domain, the token's own rank counted like any other)."""
    ep = np.asarray(ep, float)
    others = distinct_domains(spec, E, topk, ep, np.ones_like(ep))
    return np.where(ep > 1, others * ep / np.maximum(ep - 1.0, 1e-9), 1.0)


def distinct_domains(spec, E, topk, ep, per):
    """Expected number of OTHER scale-up domains a token's top-k experts land on (DeepEP/HybridEP
    send a token once per remote domain over RDMA and fan it out over NVLink there; DeepEP README,
    "NVLink and RDMA forwarding"). EP ranks are contiguous, so a domain hosts E*per/ep experts.
    Group-limited routing (DeepSeek-V3: moe_router_num_groups / group_topk) picks experts only
    from group_topk groups; when groups align with domains the hit probability is taken per group."""
    ep = np.asarray(ep, float)
    per = np.maximum(np.minimum(np.asarray(per, float), ep), 1.0)
    nd = np.maximum(ep / per, 1.0)  # domains spanned by the EP group
    p = _p_not_hit(E, E / nd, topk)  # E / nd: experts per domain
    G, gk = int(spec.moe_router_num_groups or 0), int(spec.moe_router_group_topk or 0)
    if G and gk and gk < G:
        gpd = G / nd  # groups per domain
        pg = _p_not_hit(G, gpd, gk)
        aligned = (gpd >= 1) & (np.abs(gpd - np.round(gpd)) < 1e-9)
        p = np.where(aligned, np.maximum(p, pg), p)
    return (nd - 1.0) * (1.0 - p)


def ep_wire_seconds(spec, ops, disp, tokens, h, fp8_wire, ep, etp, imb=1.0):
    """(dispatch s, combine s, dispatch bytes, combine bytes), fwd, of `tokens` tokens per GPU
    over the EP group by the all-to-all backend `disp` (0/1 alltoall, 2 DeepEP, 3 HybridEP: the flex backends' normal
    kernels). The one rule for what goes on each fabric (training and serving both call it).
    `fp8_wire`: the stack quantizes before a flex dispatch (1 B per element + a 4-B scale per 128),
    as SGLang's DeepEP does for fp8 models; the combine is bf16 either way."""
    E, K = max(spec.num_experts, 1), max(spec.moe_router_topk, 1)
    # copies of a token on the wire: topk (alltoall) or the distinct destination ranks (flex)
    copies = np.where(disp >= 2, distinct_ranks(spec, E, K, ep), float(K))
    tok_d = np.where((disp >= 2) & fp8_wire, 1.0 + 4.0 / 128, 2.0) * h  # bytes per dispatched token
    d_bytes = tok_d * tokens * copies * imb
    c_bytes = 2.0 * tokens * copies * h * imb
    # cross-domain share: alltoall (NCCL) sends every copy; flex sends once per remote domain.
    # Flex rows count what DeepEP / HybridEP benchmarks count (`constants`, "DeepEP / HybridEP"):
    # every received row on the NVLink leg, and one copy per domain reached, the token's own
    # included (by symmetry it is hit as often as any other: all = remote x nd / (nd - 1)).
    _, per_ep = ops.scope(ep, etp)
    remote = distinct_domains(spec, E, K, ep, per_ep)
    nd = np.maximum(ep / np.maximum(np.minimum(per_ep, ep), 1.0), 1.0)
    reached = remote * nd / np.maximum(nd - 1.0, 1e-9)
    flex = disp >= 2
    inter = np.where(flex, reached / np.maximum(copies, 1e-9), (ep - np.minimum(per_ep, ep)) / ep)
    intra = np.where(flex, 1.0, (np.minimum(per_ep, ep) - 1) / ep)
    d, c = ops.ep_dispatch(disp, d_bytes, c_bytes, ep, etp, inter=inter, intra=intra,
                           token_bytes=(tok_d, 2.0 * h + 0.0 * tok_d))
    return d, c, d_bytes, c_bytes


def ep_dispatch_combine(x: Inputs, experts: RoutedExperts) -> FwdBwd:
    """EP token dispatch + combine and the ETP gather/scatter of the routed rows, fwd seconds
    (bwd moves the same bytes the other way), before any overlap."""
    spec, ops, pa = x.spec, x.ops, x.pa
    ep, Tsp, h, imb = x.ep, x.tokens_sp, x.hidden, x.imbalance
    eti = pa.etp
    disp = pa.dispatch
    # megatron-core dispatches the bf16 hidden states under every fp8 recipe (0.16.1 and main,
    # fused_a2a.py: HybridEP asserts `not fp8_dispatch`, "does not support fp8 dispatch now";
    # DeepEP's FusedDispatch hands `x` to buffer.dispatch as it is); the experts quantize after
    ep_d, ep_c, d_bytes, c_bytes = ep_wire_seconds(spec, ops, disp, Tsp, h, False, ep, eti, imb)
    # allgather dispatcher: every EP rank gathers all tokens of the group, reduce-scatters back
    ag = ops.collective("all_gather", 2.0 * Tsp * h * ep, ep, eti)
    rs = ops.collective("reduce_scatter", 2.0 * Tsp * h * ep, ep, eti)
    ep_d = np.where(disp == 1, ag, ep_d)
    ep_c = np.where(disp == 1, rs, ep_c)
    # expert tensor parallelism: gather/scatter the routed rows over ETP
    R = experts.rows
    etp_ag = ops.collective("all_gather", 2.0 * R * h, x.etp, 1)
    etp_rs = ops.collective("reduce_scatter", 2.0 * R * h, x.etp, 1)
    d, c = ep_d + etp_ag, ep_c + etp_rs
    total = d + c
    with np.errstate(divide="ignore", invalid="ignore"):
        etp_share = np.where(total > 0, (etp_ag + etp_rs) / total, 0.0)
    return EPComm(total, total.copy(), d, c, d_bytes, c_bytes, etp_share)


@dataclass
class EPComm(FwdBwd):
    """Dispatch + combine seconds per layer and microbatch (f, b: the backward moves the same
    bytes the other way), and the two apart (forward; the backward's dispatch mirrors the
    forward's combine and vice versa)."""
    dispatch: np.ndarray = None
    combine: np.ndarray = None
    dispatch_bytes: np.ndarray = None  # per-GPU payload of one dispatch / combine (all copies)
    combine_bytes: np.ndarray = None
    # share of the total that is expert-TP's gather / scatter of the routed rows (a collective
    # of its own kind, all-gather / reduce-scatter over ETP, priced apart in the breakdown)
    etp_share: np.ndarray = None


@dataclass
class EPExposed:
    """What of dispatch/combine lengthens the step, per layer and microbatch, in three parts:
    `serial` runs with nothing beside it (no overlap, or the unpaired first forward / last
    backward of a virtual stage under a2a overlap), `beyond` outlasts the compute it is paired
    with, `sm_share` is the paired compute slowed down while the communication kernels hold SMs,
    `hbm_share` its memory-bound kernels slowed down by the HBM bandwidth the communication takes."""
    serial: FwdBwd
    beyond: FwdBwd
    sm_share: FwdBwd
    hbm_share: FwdBwd = None

    @property
    def total(self) -> FwdBwd:
        h = self.hbm_share if self.hbm_share is not None else FwdBwd(0.0, 0.0)
        return FwdBwd(self.serial.f + self.beyond.f + self.sm_share.f + h.f,
                      self.serial.b + self.beyond.b + self.sm_share.b + h.b)


def comm_sm_share(x: Inputs) -> np.ndarray:
    """[P] share of the GPU's SMs the EP communication kernels hold while they run
    (`constants` "SMs held by communication"): DeepEP / HybridEP their configured SM counts, NCCL's
    all-to-all one CTA per channel."""
    sms = np.asarray(COMM_SMS)[x.pa.dispatch]
    n = float(getattr(x.ops.c, "sm_count", 0) or 0)
    return np.clip(sms / n, 0.0, 0.9) if n > 1 else x.zero


def comm_starved(x: Inputs) -> np.ndarray:
    """[P] whether each plan's EP communication kernels are starved of SMs by the GEMMs beside them
    (`constants` COMM_STARVED): by the dispatcher, and for DeepEP by the GPU's GEMM scheduler (Hopper's
    static persistent GEMMs keep their SMs to their end; Blackwell's dynamic ones, and Ampere's one-CTA-
    per-tile grids, give them up to its high-priority stream)."""
    table = COMM_STARVED_HOPPER if is_hopper(x.ops.c) else COMM_STARVED
    return np.asarray(table)[x.pa.dispatch]


def paired_exposure(comm, compute, share, held, rate=1.0):
    """(beyond, sm_share) of `comm` run beside `compute`, by who gets the SMs (`constants`
    COMM_STARVED). `held` (e.g. a cooperatively launched kernel, all its CTAs resident): comm holds
    `share` of the SMs and progresses at `rate` of its speed alone while the compute runs
    (`constants` HELD_COMM_RATE), the compute at (1 - share) of its speed. If the compute outlasts
    it ((1 - share) comm / rate <= compute) the pair's excess over `compute` is the slowed compute,
    share x comm / rate; else the compute ends first, at compute / (1 - share), and comm finishes
    alone at full speed: excess comm + (1 - rate) compute / (1 - share) - compute, of which
    share x comm / rate is counted as the slowed compute and the rest as communication left over
    (rate 1: max(comm, compute + share x comm) as wall time). Not held (starved: plain-launched
    CTAs waiting for the SMs the compute takes): the compute keeps its speed and comm does
    STARVED_WORK_PER_PAIRED_S of its work per second of that compute (its rate while beside it x the
    share of the window it is), then runs alone at full speed: wall compute +
    max(0, comm - STARVED_WORK_PER_PAIRED_S x compute), all of the excess communication."""
    held = np.asarray(held, dtype=bool)
    rate = np.asarray(rate, dtype=float)
    slowed = share * comm / rate
    left = comm + (1.0 - rate) * compute / (1.0 - share) - compute - slowed
    beyond = np.where(held, np.where((1.0 - share) * comm / rate <= compute, 0.0, np.maximum(0.0, left)),
                      np.maximum(0.0, comm - STARVED_WORK_PER_PAIRED_S * compute))
    return beyond, np.where(held, slowed, 0.0)


def wgrad_left(first, node: Node, share, held, rate=1.0):
    """Seconds of `node`'s weight-gradient part (node.w, the end of its backward node.b) still to
    run once the communication `first`, started with the node's backward, has finished: it held
    `share` of the SMs for first / rate (`rate`: its speed beside compute), so the compute did
    (1 - share) x first / rate meanwhile, or it was starved and the compute did
    first / STARVED_WORK_PER_PAIRED_S (`paired_exposure`'s two cases)."""
    done = first * np.where(held, (1.0 - share) / rate, 1.0 / STARVED_WORK_PER_PAIRED_S)
    return np.clip(node.b - done, 0.0, node.w)


def ep_exposed(x: Inputs, ep: EPComm, shared: FwdBwd, attn_node: Node, mlp_node: Node,
               unpaired: np.ndarray, membound: tuple | None = None) -> EPExposed:
    """Dispatch/combine on the critical path.

    Shared-expert overlap: the shared expert runs on a side stream beside the whole dispatch +
    combine. EP a2a overlap (megatron-core 0.16.1 model_chunk_schedule_plan.py
    TransformerLayerSchedulePlan.run, the merged forward-backward of two microbatches):
        comm stream: combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
        comp stream: attn_fwd    | mlp_bwd (+dw) -> mlp_fwd     | attn_bwd
    so each communication hides under one node of the other microbatch only (`attn_node`: the
    attention block, router and dispatch preprocess; `mlp_node`: the experts and the shared
    expert). `unpaired`: the share of a stage's forward (and backward) chunks that run without a
    partner (the first forwards and last backwards of each virtual stage), whose communication is
    serial. Communication kernels hold SMs the paired compute would use (`comm_sm_share`), or, where
    they are starved (`comm_starved`: HybridEP; DeepEP on Hopper), get the SMs the compute leaves and trickle
    (`paired_exposure`). Both take HBM bandwidth the paired memory-bound kernels would use (a
    starved one at its lower rate): `membound` = (attention node, MLP node, shared
    expert) memory-bound FwdBwd seconds (`nongemm.hbm_contention`; None: not charged)."""
    z = x.zero
    s = comm_sm_share(x)
    held = ~comm_starved(x)
    r = np.asarray(HELD_COMM_RATE)[x.pa.dispatch]  # a held kernel's speed beside compute
    seo = x.pa.shared_expert_overlap.astype(bool)
    a2o = x.pa.a2a_overlap.astype(bool)
    disp, comb = ep.dispatch, ep.combine
    # a2a overlap: forward-side comm (dispatch_f with mlp_b, combine_f with attn_b), backward-side
    # comm (combine_b with attn_f, dispatch_b with mlp_f); the backward's dispatch moves the
    # forward combine's bytes and vice versa
    bf1, sf1 = paired_exposure(disp, mlp_node.b, s, held, r)
    bf2, sf2 = paired_exposure(comb, attn_node.b, s, held, r)
    # the combine node unpermutes after the combine (fine_grained_callables.py
    # submodule_combine_forward: mlp.combine, then mlp.postprocess); unfused, its masked_select makes
    # the host wait for the combine before it issues attn_b, so that pair runs one after the other
    solo = permute_unfused(x.pa.dispatch, x.pa.permute_fusion)
    bf2, sf2 = np.where(solo, comb, bf2), np.where(solo, 0.0, sf2)
    # delay_wgrad_compute: a node's backward runs as data gradients, then its weight gradients
    # (backward_dw), and the next communication on the stream waits only for the data gradients,
    # so the backward dispatch (after the forward dispatch) and the next layer's backward combine
    # (after the forward combine) also hide under the part of that wgrad node the first
    # communication of the pair left; without it they wait for the whole backward node
    delay = x.pa.delay_wgrad.astype(bool) & a2o
    bb1, sb1 = paired_exposure(disp, attn_node.f + np.where(delay, wgrad_left(comb, attn_node, s, held, r), 0.0),
                               s, held, r)
    bb2, sb2 = paired_exposure(comb, mlp_node.f + np.where(delay, wgrad_left(disp, mlp_node, s, held, r), 0.0),
                               s, held, r)
    # shared-expert overlap: the shared expert beside the whole dispatch + combine
    bsf, ssf = paired_exposure(ep.f, shared.f, s, held, r)
    bsb, ssb = paired_exposure(ep.b, shared.b, s, held, r)
    paired = 1.0 - unpaired
    serial = FwdBwd(np.where(a2o, unpaired * ep.f, np.where(seo, z, ep.f)),
                    np.where(a2o, unpaired * ep.b, np.where(seo, z, ep.b)))
    beyond = FwdBwd(np.where(a2o, paired * (bf1 + bf2), np.where(seo, bsf, z)),
                    np.where(a2o, paired * (bb1 + bb2), np.where(seo, bsb, z)))
    sm = FwdBwd(np.where(a2o, paired * (sf1 + sf2), np.where(seo, ssf, z)),
                np.where(a2o, paired * (sb1 + sb2), np.where(seo, ssb, z)))
    if membound is None or ep.dispatch_bytes is None:
        return EPExposed(serial, beyond, sm, FwdBwd(z, z))
    mb_attn, mb_mlp, mb_shared = membound
    hbm = float(getattr(x.ops.c, "hbm_tbps", 0.0) or 0.0) * 1e12
    if hbm <= 0:
        return EPExposed(serial, beyond, sm, FwdBwd(z, z))
    hd = comm_hbm_share(ep.dispatch_bytes, disp, hbm)
    hc = comm_hbm_share(ep.combine_bytes, comb, hbm)
    # the same pairs as above; the backward's dispatch moves the forward combine's bytes
    hf = hbm_contention(mb_mlp.b, disp, hd) + np.where(solo, 0.0, hbm_contention(mb_attn.b, comb, hc))
    hb = hbm_contention(mb_attn.f, disp, hc) + hbm_contention(mb_mlp.f, comb, hd)
    hall = comm_hbm_share(ep.dispatch_bytes + ep.combine_bytes, ep.f, hbm)
    hsf, hsb = hbm_contention(mb_shared.f, ep.f, hall), hbm_contention(mb_shared.b, ep.b, hall)
    # a starved kernel moves its bytes at its lower rate while the compute runs, a held one at `r`
    hr = np.where(held, r, STARVED_WORK_PER_PAIRED_S)
    hs = FwdBwd(hr * np.where(a2o, paired * hf, np.where(seo, hsf, z)),
                hr * np.where(a2o, paired * hb, np.where(seo, hsb, z)))
    return EPExposed(serial, beyond, sm, hs)


# ---- fp8 quantization ------------------------------------------------------------------------------
@dataclass
class Fp8Quantize:
    """Seconds per layer and microbatch of casting fp8 GEMM operands (`constants`
    FP8_QUANT_BYTES_PER_ELEMENT): the attention block (every layer), the dense MLP, the MoE block.
    Forward casts each GEMM's input activation, backward each GEMM's output gradient."""
    attn: FwdBwd
    dense: FwdBwd
    moe: FwdBwd


def fp8_quantize(x: Inputs, experts: RoutedExperts | None) -> Fp8Quantize:
    spec, T, tp, h = x.spec, x.tokens, x.tp, x.hidden
    nh = spec.num_attention_heads
    bpe = np.asarray(FP8_QUANT_BYTES_PER_ELEMENT)[x.pa.precision] / x.ops.bw_fp8_quant
    if spec.mla:
        dq, dv = spec.qk_head_dim + spec.qk_pos_emb_head_dim, spec.v_head_dim
        ql, kvl, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.qk_pos_emb_head_dim
        a_in = T * (2 * h + (ql or h) + kvl + nh * dv / tp)  # q-down, kv-down, q-up, kv-up, out inputs
        a_out = T * ((ql or 0) + kvl + rope + nh * dq / tp + nh * (spec.qk_head_dim + dv) / tp + h)
    else:
        hd, ng = spec.head_dim, spec.query_groups
        a_in = T * (h + nh * hd / tp)
        a_out = T * ((nh + 2 * ng) * hd / tp + h)
    nmat = x.mlp_matrices
    fd = spec.ffn_hidden_size
    d_in, d_out = T * (h + fd / tp), T * (nmat * fd / tp + h)
    if experts is not None:
        fe, R, etp = spec.moe_ffn_hidden_size, experts.rows, x.etp
        fs = spec.moe_shared_expert_ffn
        m_in = R * (h + fe / etp) + (T * (h + fs / tp) if fs else 0.0)
        m_out = R * (nmat * fe / etp + h) + (T * (nmat * fs / tp + h) if fs else 0.0)
    else:
        m_in = m_out = x.zero
    return Fp8Quantize(FwdBwd(a_in * bpe, a_out * bpe), FwdBwd(d_in * bpe, d_out * bpe),
                       FwdBwd(m_in * bpe, m_out * bpe))


def moe_host_sync(x: Inputs, after: np.ndarray, after_gpu_s: np.ndarray, extra_syncs=0.0) -> np.ndarray:
    """Seconds per MoE layer and microbatch (forward) the GPU idles after the dropless
    dispatcher's device-to-host sync of the token counts (`constants`, "MoE host
    synchronisation"): the round trip, the first launch, and what launching the `after` kernels
    takes beyond their `after_gpu_s` GPU seconds; the allgather dispatcher keeps the counts on the
    device. `extra_syncs` more syncs in the layer (the unfused permutation's masked_selects,
    `nongemm.permute_syncs`) each idle the round trip and the next launch. Without EP a2a overlap
    (nothing of another microbatch queued behind the sync) the dispatcher's drain idles at least
    the measured POST_SYNC_IDLE_S per forward, host work counted in the kind's launch time
    (`constants` POST_SYNC_IDLE_LAUNCHES x gap). GPUs only (CPU devices execute on the dispatching
    thread)."""
    gap = x.ops.gap
    t = D2H_SYNC_S + gap + np.maximum(0.0, after * gap - after_gpu_s)
    n = dispatcher_syncs(x.pa.dispatch, drop_and_pad(x.pa))
    floor = np.where(x.pa.a2a_overlap.astype(bool), 0.0, POST_SYNC_IDLE_LAUNCHES * gap) * (n > 0)
    t = np.maximum(n * t, floor) + extra_syncs * (D2H_SYNC_S + gap)
    return t * (1.0 if x.ops.async_launch else 0.0)


# ---- embedding and LM head -----------------------------------------------------------------------------
def embedding(x: Inputs, tp: TPComm) -> FwdBwd:
    Tsp, h, BWe = x.tokens_sp, x.hidden, x.bw_elementwise
    return FwdBwd(2 * 2.0 * Tsp * h / BWe + tp.reduce_scatter, 2 * 2 * 2.0 * Tsp * h / BWe + tp.all_gather)


def lm_head_loss(x: Inputs, tp: TPComm, attn: Attention) -> FwdBwd:
    """Final norm, LM head GEMM and vocab-parallel cross-entropy (last stage)."""
    ops, T, V, tpd = x.ops, x.tokens, x.spec.vocab_size, x.tp
    # the output layer is megatron-core's own ColumnParallelLinear, not a TransformerEngine module
    # (models/gpt/gpt_model.py:241 in 0.16.1), so fp8 autocast leaves it in bf16
    head = ops.gemm(T, V / tpd, x.hidden, bf16=True)
    ce_f = T * V / tpd * CE_FWD_BYTES_PER_LOGIT / ops.bw["cross_entropy"]
    ce_b = T * V / tpd * CE_BWD_BYTES_PER_LOGIT / ops.bw["cross_entropy"]
    return FwdBwd(head[0] + ce_f + tp.all_gather + attn.norm_f / 2, head[1] + ce_b + tp.reduce_scatter + attn.norm_f)


# ---- CPU launch floor --------------------------------------------------------------------------------
def expert_gemm_calls(grouped, local_experts) -> np.ndarray:
    """Routed-expert GEMM calls per layer and pass: one grouped GEMM, or one per local expert."""
    return np.where(np.asarray(grouped, bool), 1.0, np.asarray(local_experts, float))


def structural_kernels(spec, tp=1, cp=1, grouped=False, local_experts=1, precision=0):
    """Forward kernels per (attention block, dense MLP, MoE MLP) of one layer and microbatch (the
    CPU floor's structural counts, `cost_model.constants`; backward = 2x); `precision`: the
    specs.plan.PRECISIONS code, whose fp8 quantisation kernels count per GEMM operand
    (KERNELS_FP8_PER_OPERAND). Arrays broadcast."""
    tp, cp = np.asarray(tp, float), np.asarray(cp, float)
    q = np.asarray(KERNELS_FP8_PER_OPERAND, float)[np.asarray(precision)]
    k_attn = (KERNELS_ATTENTION + (KERNELS_MLA_EXTRA if spec.mla else 0) + KERNELS_TP_ATTENTION * (tp > 1)
              + KERNELS_CP_PER_STEP * (cp > 1) * (cp - 1)) + q * FP8_OPERANDS_ATTENTION
    k_dense = KERNELS_DENSE_MLP + KERNELS_TP_DENSE_MLP * (tp > 1) + q * FP8_OPERANDS_MLP
    experts = expert_gemm_calls(grouped, local_experts)
    k_moe = KERNELS_MOE + KERNELS_PER_EXPERT_GEMMS * experts + q * FP8_OPERANDS_MLP * experts + (
        KERNELS_SHARED_EXPERT + q * FP8_OPERANDS_MLP if spec.moe_shared_expert_ffn else 0)
    return k_attn, k_dense, k_moe


@dataclass
class Graphs:
    """CUDA graphs of one plan column set (`--cuda-graph-impl/--cuda-graph-scope`), [P] arrays:
    the forward kernels per layer left to launch one by one (attention block, dense MLP, MoE MLP),
    the graphed regions per dense / MoE layer (each replayed as one launch per pass), and whether
    the whole iteration is one graph (no per-kernel host cost at all)."""
    k_attn: np.ndarray
    k_dense: np.ndarray
    k_moe: np.ndarray
    regions_dense: np.ndarray
    regions_moe: np.ndarray
    full_iteration: np.ndarray
    attn: np.ndarray  # 1.0 where the attention block is one graph replay (a recompute replays it)


def cuda_graphs(spec, pa: PlanArrays, k_attn, k_dense, k_moe, k_router=KERNELS_MOE_ROUTER,
                k_preprocess=KERNELS_MOE_PREPROCESS) -> Graphs:
    """What each plan's CUDA graphs leave of the structural kernel counts (`structural_kernels`).

    Scopes (megatron-core 0.16.1 arguments.py --cuda-graph-scope help): attn = the attention part
    of the layer; mlp = a dense layer's MLP; moe = a whole MoE MLP; moe_router = up to the router
    (with the shared expert unless it overlaps EP comm); moe_preprocess = MoELayer.preprocess;
    the empty scope = whole layers; full_iteration = the whole forward-backward. `k_router` /
    `k_preprocess`: the launches of the moe_router / moe_preprocess scopes."""
    g = pa.cuda_graph
    on = g != 0

    def bit(s):
        return (g & GRAPH_BIT[s]) != 0
    whole = (g & WHOLE_LAYER_GRAPH) != 0
    full = bit("full_iteration")
    attn = bit("attn") | whole
    mlp = bit("mlp") | whole
    moe = bit("moe") | whole
    router = bit("moe_router") & ~moe
    pre = bit("moe_preprocess") & router
    shared = KERNELS_SHARED_EXPERT * (~pa.shared_expert_overlap.astype(bool)) if spec.moe_shared_expert_ffn else 0
    k_moe_left = np.where(moe, 0.0, k_moe - router * (k_router + shared) - pre * k_preprocess)
    one = np.ones(pa.n)
    regions_dense = np.where(whole, one, attn + mlp)
    regions_moe = np.where(whole, one, attn + (router | moe))
    zero = np.zeros(pa.n)
    return Graphs(np.where(attn, 0.0, k_attn) * one, np.where(mlp, 0.0, k_dense) * one, k_moe_left * one,
                  np.where(full | ~on, zero, regions_dense), np.where(full | ~on, zero, regions_moe), full,
                  np.where(attn & ~full, 1.0, 0.0))


# ---- pipeline -----------------------------------------------------------------------------------------
@dataclass
class Pipeline:
    """Per step: the 1F1B / interleaved bubble and the exposed stage-boundary p2p; `hidden`: the
    p2p seconds that run beside compute (the interleaved schedule's overlapped send/recv), and
    `p2p_bytes` the payload of one of them."""
    bubble: np.ndarray
    p2p: np.ndarray
    hidden: np.ndarray = None
    one: np.ndarray = None  # seconds of one stage-boundary transfer
    p2p_bytes: np.ndarray = None  # its payload


def pipeline(x: Inputs, slowest_stage_s: np.ndarray) -> Pipeline:
    pp, vpp, m = x.pp, x.vpp, x.microbatches
    bubble = (pp - 1) / vpp * slowest_stage_s
    _, pp_stride = group_size_stride("pp", *x.ranks, x.world)
    # one stage boundary: the sequence-parallel activation of one microbatch
    nbytes = 2.0 * x.tokens_sp * x.hidden
    p2p = x.ops.collective("send_recv", nbytes, np.full(x.pa.n, 2), pp_stride)
    exposed = np.where(pp > 1, np.where(vpp > 1, 2 * (pp - 1) * vpp * p2p, 2 * (m + pp - 1) * p2p), 0.0)
    # interleaved: every microbatch crosses each of the stage's chunk boundaries forward (activation)
    # and backward (gradient), 2 m vpp transfers, of which the warm-up / cool-down ones are exposed
    hidden = np.where((pp > 1) & (vpp > 1), np.maximum(0.0, 2 * m * vpp - 2 * (pp - 1) * vpp) * p2p, 0.0)
    return Pipeline(bubble, exposed, hidden, p2p, nbytes + 0.0 * p2p)


def pp_p2p_sm_share(cluster, hidden_s: np.ndarray) -> np.ndarray:
    """Per step: the compute slowed while the hidden PP send/recv holds its NCCL channels' SMs
    (`constants` P2P_CHANNELS_PER_PEER x P2P_PEERS CTAs) beside it: that share of the SMs for the
    hidden p2p's duration."""
    n = float(getattr(cluster, "sm_count", 0) or 0)
    share = min(P2P_CHANNELS_PER_PEER * P2P_PEERS / n, 0.9) if n > 1 else 0.0
    return share * np.asarray(hidden_s, float)


# ---- data-parallel collectives and optimizer ------------------------------------------------------------
@dataclass
class DPComm:
    """Per step: exposed gradient reduce(-scatter) and parameter all-gather."""
    grad: np.ndarray
    param_gather: np.ndarray
    sm_share: np.ndarray = None  # compute slowed while the hidden collectives hold SMs
    grad_s: np.ndarray = None  # seconds of the whole grad reduce(-scatter) / param all-gather
    gather_s: np.ndarray = None
    grad_bytes: np.ndarray = None  # per-GPU bytes each moves per step (gradients; bf16 parameters)
    gather_bytes: np.ndarray = None
    windows: np.ndarray | float = 1.0  # microbatches whose compute the hidden part runs beside (FSDP: all)

    @property
    def hidden_grad(self) -> np.ndarray:
        """Seconds of the grad reduce(-scatter) hidden under the backward."""
        return self.grad_s - self.grad

    @property
    def hidden_gather(self) -> np.ndarray:
        """Seconds of the param all-gather hidden under the forward."""
        return self.gather_s - self.param_gather


def dp_collectives(x: Inputs, dense_params: np.ndarray, expert_params: np.ndarray,
                   stage_fwd_s: np.ndarray, stage_bwd_s: np.ndarray, layers=1.0) -> DPComm:
    """Grad reduce-scatter (fp32 main grads; all-reduce without the distributed optimizer) and
    param all-gather (bf16, or fp8 with --fp8-param-gather; distributed optimizer) over the DP x CP group (dense parameters) and
    the expert-DP group (experts) of one stage's parameters; with overlap, exposed beyond the
    backward resp. forward window of one microbatch (`stage_bwd_s`, `stage_fwd_s`: wall time), at
    least the last bucket. Megatron FSDP plans move them every microbatch (`layers`: the stage's
    layers, whose first gather and last reduce-scatter stay exposed)."""
    ops, pa = x.ops, x.pa
    Pd, Pe = dense_params, expert_params
    dpc_size, dpc_stride = x.dp * x.cp, x.tp  # DP x CP group: tp-strided, contiguous over cp and dp
    edp_size, edp_stride = group_size_stride("edp", *x.ranks, x.world)
    dist = pa.dist_opt.astype(bool)
    gb = x.grad_bytes
    rs_t = ops.collective("reduce_scatter", gb * Pd, dpc_size, dpc_stride) + ops.collective(
        "reduce_scatter", gb * Pe, edp_size, edp_stride)
    ar_t = ops.collective("all_reduce", gb * Pd, dpc_size, dpc_stride) + ops.collective(
        "all_reduce", gb * Pe, edp_size, edp_stride)
    # the distributed optimizer gathers the bf16 parameters, or their fp8 copies (--fp8-param-gather)
    pb = np.where(pa.fp8_param.astype(bool), FP8_WEIGHT_COPY_BYTES, WEIGHT_BYTES)
    ag_t = ops.collective("all_gather", pb * Pd, dpc_size, dpc_stride) + ops.collective(
        "all_gather", pb * Pe, edp_size, edp_stride)
    grad_t = np.where(dist, rs_t, ar_t)
    ag_t = np.where(dist, ag_t, 0.0)
    bucket = np.maximum(DDP_BUCKET_MIN_PARAMS, DDP_BUCKET_PARAMS_PER_DP_RANK * x.dp)
    last_bucket = np.minimum(1.0, bucket / np.maximum(Pd + Pe, 1.0))
    ogr = pa.overlap_grad_reduce.astype(bool)
    opg = pa.overlap_param_gather.astype(bool) & dist
    grad = np.where(ogr, np.maximum(grad_t - stage_bwd_s, grad_t * last_bucket), grad_t)
    gather = np.where(opg, np.maximum(ag_t - stage_fwd_s, ag_t * last_bucket), ag_t)
    # Megatron FSDP (optim_grads_params): every microbatch gathers the weights before the forward
    # and again before the backward and reduce-scatters the gradients after it, each layer's beside
    # the neighbouring layers' compute: the forward window holds one gather, the backward window the
    # second gather and the reduce-scatter together; at least one layer's worth stays exposed
    fsdp = pa.fsdp.astype(bool)
    windows = np.where(fsdp, x.microbatches, 1.0)  # the microbatches whose compute the collectives run beside
    if fsdp.any():
        n_layers = np.maximum(np.asarray(layers, float), 1.0)
        one = 1.0 / n_layers  # the first gather / last reduce-scatter of a pass has nothing beside it
        f_exp = np.where(opg, np.maximum(ag_t - stage_fwd_s, ag_t * one), ag_t)
        both = ag_t + rs_t
        b_exp = np.where(ogr & opg, np.maximum(both - stage_bwd_s, both * one), both)
        with np.errstate(divide="ignore", invalid="ignore"):
            ag_share = np.where(both > 0, ag_t / both, 0.0)
        grad = np.where(fsdp, windows * b_exp * (1.0 - ag_share), grad)
        gather = np.where(fsdp, windows * (f_exp + b_exp * ag_share), gather)
        grad_t = np.where(fsdp, windows * rs_t, grad_t)
        ag_t = np.where(fsdp, 2.0 * windows * ag_t, ag_t)
    # the hidden part runs NCCL kernels beside the backward / forward, one SM per channel
    # (`constants` NCCL_COMM_SMS): the compute under it loses that share of the SMs
    n = float(getattr(ops.c, "sm_count", 0) or 0)
    share = min(NCCL_COMM_SMS / n, 0.9) if (n > 1 and ops.async_launch) else 0.0
    sm = share * ((grad_t - grad) + (ag_t - gather))
    # bytes moved per step: FSDP reduce-scatters every microbatch and gathers twice in each
    return DPComm(grad, gather, sm, grad_t, ag_t, windows * gb * (Pd + Pe),
                  np.where(fsdp, 2.0, 1.0) * windows * pb * (Pd + Pe), windows)


def optimizer_step(x: Inputs, dense_params: np.ndarray, expert_params: np.ndarray,
                   layers: np.ndarray) -> np.ndarray:
    """Per step: Adam over the local (DP-sharded with the distributed optimizer) parameters of the
    slowest stage, memory-bound, plus the CPU stack's per-layer step overhead when measured."""
    ops = x.ops
    dist = x.pa.dist_opt.astype(bool)
    local = np.where(dist, dense_params / (x.dp * x.cp) + expert_params / x.edp, dense_params + expert_params)
    t = local * ADAM_STEP_BYTES_PER_PARAM / ops.bw["optimizer"]
    if ops.step_gap:
        t = t + layers * ops.step_gap
    return t
