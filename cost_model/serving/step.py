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
from scipy.stats import poisson

from clusters import is_blackwell, is_hopper, load_cluster
from cost_model.blocks import distinct_ranks, ep_wire_seconds
from cost_model.constants import DEEPEP_BESIDE_COMPUTE_RATE, DEEPEP_SMS
from cost_model.flops import attention_params_per_rank, param_counts
from cost_model.ops import TableOps
from cost_model.serving.constants import (
    GPU_KERNEL_GAP_S,
    KERNEL_MIN_S,
    SCHED_OVERHEAD_S,
    WEIGHT_FORMAT_BYTES,
    nvfp4_gemm_time,
    weight_format,
)
from cost_model.serving.fused_moe import (
    FUSED_MOE_BLOCK_M,
    FUSED_MOE_BLOCK_M_SMALL,
    PREFILL_DATA,
    PREFILL_MIN_TOKENS,
    TUNED_CONFIG_SPEEDUP,
    expert_bandwidth_efficiency,
    ships_tuned_config,
)
from cost_model.serving.kernel_path import deepep_normal_fp8_wire, dense_path, moe_path, step_efficiencies
from cost_model.serving.layer_kernels import generic, layer_kernels
from cost_model.serving.memory import kv_bytes_per_token
from cost_model.serving.plans import effective_plans, to_cols
from cost_model.tables import load_tables, tables_dir_for
from specs.errors import InputError
from specs.hf_export import pick_architecture
from specs.models import load_model
from specs.serve_plan import ServePlan

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


def shared_expert_fused(spec, c, moe_kernel) -> np.ndarray:
    """Per plan, whether SGLang 0.5.23 runs the model's shared expert inside the routed experts'
    Triton fused_moe, as one more expert that every token picks (its weights beside the routed
    ones, E = 257), rather than as an MLP of its own. SGLang does it unless told not to
    (--disable-shared-experts-fusion, default off) where models/deepseek_v2.py
    shared_experts_fusion_disable_reason finds no reason: a DeepseekV3ForCausalLM checkpoint of 256
    routed experts and one shared, no two-batch overlap, no DeepEP-class all-to-all, moe_ep_size 1
    (plain TP experts), an NVIDIA GPU of sm 80 or newer; and a MoE runner that keeps it
    (arg_groups/overrides.py _moe_runner_fusion_disable: not flashinfer_trtllm, Blackwell's fp8
    runner). `moe_kernel`: the routed experts' kernel per plan (`kernel_path.moe_path`)."""
    if not (spec.num_experts == 256 and spec.moe_shared_expert_count == 1
            and pick_architecture(spec) == "DeepseekV3ForCausalLM"):
        return np.zeros(len(c), bool)
    return ((np.asarray(moe_kernel) == "triton_fused_moe") & (np.asarray(c.ep) == 1) & ~np.asarray(c.tbo, bool)
            & (np.asarray(c.a2a) == 0))


def shared_on_side_stream(spec, c, cluster) -> np.ndarray:
    """Per plan, whether SGLang 0.5.23 runs DeepSeek-V3's shared expert on a second CUDA stream
    beside the routed experts in a decode step (sglang models/deepseek_v2.py, DeepseekV2MoE, every
    CUDA device having the model's alt_stream, the shared expert not fused into the routed kernel:
    num_fused_shared_experts 0, the caller removes `shared_expert_fused` plans):
    - without an all-to-all, `forward_normal_dual_stream` while a CUDA graph is captured (the step
      must replay one: `StepModel._decode_gpu`'s `graphs`), beside the router, top-k and routed
      experts;
    - under DeepEP, `forward_deepep` in every step, from after the router gate until the combine
      returns: beside the top-k, dispatch, routed experts and combine (single-batch overlap, which
      moves it elsewhere, is off by default).
    Two-batch overlap schedules its own operations and never takes either path."""
    if not (cluster.is_gpu and spec.moe_shared_expert_ffn and pick_architecture(spec) == "DeepseekV3ForCausalLM"):
        return np.zeros(len(c), bool)
    return ~np.asarray(c.tbo, bool)


# Rows per expert at which the bf16 grouped-GEMM table is compute-bound (its weights amortised over
# the rows): the rate W4A16 experts' FLOPs are priced at (`StepModel._expert_parts`).
W4A16_RATE_ROWS = 4096.0


class StepModel:
    """Step-time functions of one model on one cluster (fixed precision) for plan columns `c`."""

    def __init__(self, spec, cluster, tables, c, *, fp8: bool, imbalance: float = 1.0, routing_skew: float = 0.0,
                 deepgemm_jit: bool = True, weights: str | None = None, kernel_rates: tuple | None = None):
        # the boundary of the serving model: a NaN here would become a NaN clock in the simulator
        if not (math.isfinite(routing_skew) and routing_skew >= 0):
            raise InputError(f"routing skew must be a finite number >= 0, got {routing_skew}")
        if not (math.isfinite(imbalance) and imbalance >= 1):
            raise InputError(f"routing imbalance must be a finite number >= 1, got {imbalance}")
        self.s, self.cl, self.c = spec, cluster, c
        self.arch = pick_architecture(spec)
        self.fp8 = fp8
        # the normal-mode DeepEP dispatch's token format (fp8 only with DeepGEMM's JIT on)
        self.fp8_wire = deepep_normal_fp8_wire(cluster, fp8, deepgemm_jit)
        # bytes per weight (routed experts, other linears) of the checkpoint's format (`constants`
        # WEIGHT_FORMAT_BYTES; default: fp8 or bf16 as `fp8` says)
        self.weights = weights or ("fp8" if fp8 else "bf16")
        self.wbytes = WEIGHT_FORMAT_BYTES[self.weights]
        self.wexp, self.wlin = self.wbytes
        # the GEMM tables' queries: the quantized GEMMs' time against the fp8 tables' kernel is
        # TableOps' own per-format factor (NVFP4 on Blackwell's FP4 tensor cores, `nvfp4_gemm_time`)
        f4 = nvfp4_gemm_time(cluster) if self.weights == "nvfp4" else None
        self.ops = TableOps(tables, cluster, np.full(len(c), fp8), f4)
        # the non-expert linears (attention projections, dense MLP, shared expert) run fp8 GEMMs only where
        # the checkpoint quantizes them: gpt-oss's MXFP4 checkpoint keeps them bf16 (2 B per weight)
        self.lin_fp8 = bool(fp8) and self.wlin < 2.0
        self.lin_ops = self.ops if self.lin_fp8 == bool(fp8) else TableOps(tables, cluster, np.full(len(c), self.lin_fp8))
        # the LM head stays bf16 in every checkpoint: priced at the linears' table, without a format's factor
        self.head_ops = self.lin_ops if f4 is None else TableOps(tables, cluster, np.full(len(c), self.lin_fp8))
        # MXFP4 experts without fp8 math (W4A16, Hopper): bf16 tensor cores on weights upcast in the
        # kernel, so the GEMMs take the bf16 rate for their FLOPs while the weights are read at their
        # own 4.25 bits (`_expert_parts`); the bf16 table itself would read them at 2 B
        self.w4a16 = self.weights == "mxfp4" and not fp8
        # the GEMM kernels SGLang runs (DeepGEMM, CUTLASS, Triton fused_moe, ...) next to the
        # tables' kernel: dense linears, and routed experts per plan (`kernel_path`)
        # and the routed experts' FLOP/s ceiling of the kernel each plan runs (Triton fused_moe on
        # fp8 weights: `fused_moe_ceiling_flops`; inf elsewhere, sub-byte checkpoints included, whose
        # MoE kernels are others). `kernel_rates`: (dense, routed-expert) rates given instead and no
        # ceiling, the tables' own kernel, against which `fused_moe_fp8_peak_fraction` measures one
        a2a = np.asarray(c.a2a) > 0
        # the routed experts' kernel per plan (it depends on the all-to-all flag only)
        self.moe_kernel = np.array([moe_path(cluster, fp8, x, deepgemm_jit, self.arch) for x in (False, True)])[
            a2a.astype(int)]
        if kernel_rates is None:
            self.dense_eff, self.moe_eff = step_efficiencies(cluster, fp8, self.moe_kernel, deepgemm_jit,
                                                             dense_fp8=self.lin_fp8)
            self.moe_ceiling = (np.array([fused_moe_ceiling_flops(cluster, fp8, k) for k in self.moe_kernel])
                                if self.weights == "fp8" else np.full(len(c), np.inf))
        else:
            self.dense_eff, self.moe_eff = kernel_rates[0], np.full(len(c), float(kernel_rates[1]))
            self.moe_ceiling = np.full(len(c), np.inf)
        # compute-bound kernels of a TBO prefill MoE layer run on the SMs DeepEP's kernels leave
        # (`_tbo_prefill`): time x sm_count / (sm_count - DeepEP's SMs) for DeepGEMM (SGLang's
        # setting) and, beside an all-to-all, for every other compute-bound kernel too
        n_sm = float(getattr(cluster, "sm_count", 0) or 0)
        cap = n_sm / (n_sm - DEEPEP_SMS) if (cluster.is_gpu and n_sm > DEEPEP_SMS) else 1.0
        dg_dense = dense_path(cluster, self.lin_fp8, deepgemm_jit) == "deep_gemm"
        dg_moe = self.moe_kernel == "deep_gemm"
        self.tbo_dense_cap = np.where(a2a | dg_dense, cap, 1.0)  # attention projections, shared expert
        self.tbo_moe_cap = np.where(a2a | dg_moe, cap, 1.0)  # routed experts' grouped GEMMs
        self.tbo_core_cap = np.where(a2a, cap, 1.0)  # attention core (FlashAttention: all SMs it finds)
        # per plan, whether SGLang runs the shared expert inside the routed experts' Triton fused_moe as
        # one more expert every token picks (E = 257 for DeepSeek-V3/R1) instead of as its own MLP
        # (`shared_expert_fused`)
        self.shared_fused = shared_expert_fused(spec, c, self.moe_kernel) & bool(cluster.is_gpu)
        # per plan, whether a decode step captured in a CUDA graph runs the shared expert on a second
        # stream beside the router and routed experts (`shared_on_side_stream`)
        self.shared_side_stream = shared_on_side_stream(spec, c, cluster) & ~self.shared_fused
        # per plan and phase, whether the all-to-all runs DeepEP's normal kernels (not low latency):
        # read by the experts' scatter / gather and the TBO prefill on every simulated step
        self.deepep_normal = {"decode": a2a & ~np.asarray(c.low_latency_decode, bool),
                              "prefill": a2a & ~np.asarray(c.low_latency_prefill, bool)}
        # a GPU kernel's minimum duration (constants.KERNEL_MIN_S); on CPU only the launch gap
        self.kmin = KERNEL_MIN_S if cluster.is_gpu else GPU_KERNEL_GAP_S
        # the kernels one layer launches, priced and small (`layer_kernels`: SGLang 0.5.23's own per
        # architecture, GPU family and kernel path; CPU devices and MLA models the generic count)
        self.kernels = (self.sglang_kernels() if cluster.is_gpu and not spec.mla
                        else generic(len(c), self.shared_fused, c.ar_fusion))
        self.imb = imbalance
        self.pc = param_counts(spec)
        # the attention weights one attention-TP rank holds and multiplies (MLA's down projections whole)
        self.attn_params = attention_params_per_rank(spec, c.attn_tp)
        self.hbm_bw = self.ops.bw["elementwise"]  # achieved bytes/s of a memory-bound kernel
        # Triton fused_moe runs a tuned block config where SGLang ships one for the shape
        # (`fused_moe.ships_tuned_config`): its decode calls read their weights at the tuned
        # configs' measured bandwidth, its compute-bound calls run TUNED_CONFIG_SPEEDUP faster
        self.tuned_moe = np.zeros(len(c), bool)
        if cluster.is_gpu and spec.num_experts:
            self.tuned_moe = (self.moe_kernel == "triton_fused_moe") & ships_tuned_config(cluster, spec.num_experts / np.asarray(c.ep, float),
                                                         spec.moe_ffn_hidden_size / np.asarray(c.moe_tp, float), fp8)
            speed = np.where(self.tuned_moe, TUNED_CONFIG_SPEEDUP, 1.0)
            self.moe_eff = self.moe_eff * speed
            self.moe_ceiling = self.moe_ceiling * speed
        # achieved bytes/s of the routed-expert kernel (GPU: measured fused-MoE timings by kernel,
        # block-config class and shard row bytes)
        self.expert_bw = (cluster.hbm_tbps * 1e12 * expert_bandwidth_efficiency(spec.moe_ffn_hidden_size / c.moe_tp,
                                                                               self.wexp, self.tuned_moe, self.moe_kernel)
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

    @classmethod
    def for_precision(cls, spec, cluster, tables, c, precision: str, **kw) -> "StepModel":
        """The step model of a serving precision string (bf16, an fp8 recipe, mxfp4, nvfp4):
        `constants.weight_format` decides the weight bytes; the GEMMs run at fp8 rates where the format
        quantizes them (NVFP4's scaled to Blackwell's FP4 rate, `constants.nvfp4_gemm_time`), bf16 rates
        for gpt-oss's bf16 linears and, on Hopper, its MXFP4 experts."""
        fmt = weight_format(precision)
        # the routed experts' math: fp8 tensor cores for fp8 and NVFP4 checkpoints; gpt-oss's MXFP4
        # experts only on Blackwell, where SGLang 0.5.23 runs MXFP8 activations against the MXFP4 weights
        # (layers/quantization/mxfp4.py: "The Blackwell paths already run MXFP8 activations"); on Hopper
        # they are W4A16 (FlashInfer cutlass_sm90 "W4A16 by default", triton_kernels use_mxfp4_w4a16):
        # the weights are upcast and multiplied on bf16 tensor cores
        fp8 = fmt != "bf16" and (fmt != "mxfp4" or is_blackwell(cluster))
        return cls(spec, cluster, tables, c, fp8=fp8, weights=fmt, **kw)

    def sglang_kernels(self):
        """SGLang 0.5.23's own kernels of one layer of this model on this GPU, per plan
        (`layer_kernels.layer_kernels`): what a GQA step counts; for MLA models the source count the
        generic layer is set against (module doc of `layer_kernels`)."""
        c, cl = self.c, self.cl
        return layer_kernels(self.s, hopper=is_hopper(cl), blackwell=is_blackwell(cl), n=len(c), ar_fusion=c.ar_fusion,
                             moe_kernel=self.moe_kernel, shared_fused=self.shared_fused,
                             side_stream=self.shared_side_stream, kv_bytes=c.kv_bytes, weights=self.weights,
                             lin_quant=self.lin_fp8)

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

    def _gemm(self, m, params_per_gpu, ops=None):
        """Seconds of the dense GEMMs holding `params_per_gpu` weights at m rows: the slower of
        the table's compute rate (as one [m, h] x [h, n] GEMM) and reading the weights once.
        `ops`: the table queries (default the transformer-block linears', `lin_ops`)."""
        ops = ops or self.lin_ops
        h = self.s.hidden_size
        n = np.maximum(params_per_gpu / h, 1.0)
        f, _ = ops.gemm(m, n, h)
        f = f / self.dense_eff + ops.fp8_cast(np.maximum(np.asarray(m, float), 1.0) * h)  # the input cast (fp8 linears)
        return np.maximum(f, params_per_gpu * self.wlin / self.hbm_bw)

    def _shared_step(self, tokens_inst):
        """Seconds of the shared expert's own MLP (with the router's weights, `_shared`, each kernel
        floored) in one MoE layer; 0 where SGLang runs the shared expert inside the routed experts'
        kernel (`shared_fused`: priced there). The router's own kernel is one of the small kernels
        `_launch` counts at a kernel's minimum duration, which its weight read (7168 x 256 at most a
        few MB, ~1 us) stays under."""
        return np.where(self.shared_fused, 0.0, self._floor(self._shared(tokens_inst), self.kernels.shared))

    def _shared_split(self):
        """Per plan, (token divisor, weight divisor) of the shared expert on one GPU. Under a DeepEP
        all-to-all SGLang keeps the shared expert whole on every rank (sglang models/deepseek_v2.py:
        "disable tp for shared experts when enable deepep moe", tp_size=1), each rank running its
        own tokens (T / tp); otherwise it is TP-sharded (weights / tp) over the gathered tokens."""
        a2a = self.c.a2a > 0
        return np.where(a2a, self.c.tp, 1.0), np.where(a2a, 1.0, self.c.tp)

    def _shared(self, tokens_inst):
        """Seconds of the shared expert (and router) on one GPU for `tokens_inst` tokens of the
        instance (`_shared_split`). Same FLOPs either way, different shapes: T x (params / tp) is a
        thin GEMM."""
        pl = self.pc["per_layer"]
        tok_div, w_div = self._shared_split()
        return self._gemm(tokens_inst / tok_div, (pl["shared_expert"] + pl["router"]) / w_div)

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
        # (+ the shared expert where the fused_moe runs it as one more, always active: `shared_fused`)
        return np.minimum(self.distinct_experts(tokens_inst) / c.ep * (1 + c.redundant / E), e_loc) + self.shared_fused

    def expert_weight_bytes(self, tokens_inst):
        """Bytes of routed-expert weights one GPU reads in one MoE layer for `tokens_inst` tokens of
        the instance (gate, up and down of each activated local expert): the HBM floor of the layer."""
        s, c = self.s, self.c
        if not s.num_experts:
            return np.zeros(len(c))
        f_loc = s.moe_ffn_hidden_size / c.moe_tp
        return self.active_local_experts(tokens_inst) * 3 * s.hidden_size * f_loc * self.wexp

    def _experts(self, tokens_inst, decode: bool = False):
        """Routed-expert seconds per MoE layer on one GPU for `tokens_inst` tokens of the instance."""
        gemms, other = self._expert_parts(tokens_inst, decode)
        return gemms + other

    def _expert_parts(self, tokens_inst, decode: bool = False):
        """(grouped GEMMs, memory-bound kernels beside them) of the routed experts, seconds per MoE
        layer on one GPU for `tokens_inst` tokens of the instance."""
        s, c = self.s, self.c
        if not s.num_experts:
            return 0.0, 0.0
        k, h = s.moe_router_topk, s.hidden_size
        f_loc = s.moe_ffn_hidden_size / c.moe_tp
        rows = self._expert_rows(tokens_inst)
        active = np.maximum(self.active_local_experts(tokens_inst), 1e-9)
        m = np.maximum(rows / active, 1.0)
        if self.w4a16:
            # the bf16 table's rate at a compute-bound row count, on the rows the kernel's tiles run
            # (each expert's padded to its row tile, `expert_flops`), split in the GEMMs' FLOP ratio
            ref = W4A16_RATE_ROWS
            t_up, _ = self.ops.grouped(active, ref, 2 * f_loc, h, True)
            t_dn, _ = self.ops.grouped(active, ref, h, f_loc, True)
            rate = 2.0 * np.maximum(active, 1.0) * ref * 3.0 * f_loc * h / (t_up + t_dn)
            comp = self.expert_flops(tokens_inst, rows, active) / rate
            up, down = comp * 2.0 / 3.0, comp / 3.0
        else:
            up, _ = self.ops.grouped(active, m, 2 * f_loc, h, True)
            down, _ = self.ops.grouped(active, m, h, f_loc, True)
        up, down = up / self.moe_eff, down / self.moe_eff  # the kernel SGLang runs (`kernel_path`)
        # ... at no more than that kernel's own throughput (Triton fused_moe at fp8), split in the
        # GEMMs' FLOP ratio (up: 2 f_loc columns, down: f_loc); the padded-row sums only where some
        # plan has such a ceiling (this runs in every simulated step)
        if np.isfinite(self.moe_ceiling).any():
            ceil_s = self.expert_flops(tokens_inst, rows, active) / self.moe_ceiling
            up, down = np.maximum(up, ceil_s * 2.0 / 3.0), np.maximum(down, ceil_s / 3.0)
        g = np.maximum(active, 1.0)  # as `grouped` clamps it
        R = g * m  # rows the grouped GEMMs run
        a2a = c.a2a > 0
        normal = self.deepep_normal["decode" if decode else "prefill"]
        # the up GEMM's input: without an all-to-all fused_moe casts each routed row (w8a8); DeepEP
        # sends the tokens already cast, and its normal kernels' receive buffer (one copy per token
        # and rank) is copied into the per-expert contiguous layout (sglang ep_moe/kernels.py
        # ep_scatter: reads each received token, writes each routed row) while the low-latency
        # kernels write the masked layout themselves
        recv = tokens_inst / c.tp * distinct_ranks(s, s.num_experts, k, c.ep) * self.imb  # tokens received
        tok_b = h + h / 128 * 4 if self.fp8 else 2.0 * h  # fp8 row and its per-128 scales, or bf16
        scatter = (recv + R) * tok_b / self.hbm_bw
        up = up + np.where(a2a, 0.0, self.ops.fp8_cast(R * h))
        down = down + self.ops.fp8_cast(R * f_loc)
        # decode: the weights the batch activates, read at the bandwidth the fused-MoE kernel
        # reaches at this shard width (thin expert-TP shards far below the HBM peak; `fused_moe`)
        gemms = np.maximum(up + down, self.expert_weight_bytes(tokens_inst) / self.expert_bw)
        # the activation between the GEMMs, a kernel of its own on every path (silu_and_mul: reads
        # the gate and up halves, writes one, bf16: 6 B per row and expert column). The LMSYS
        # authors' unit test of one 8,192-token EP32 micro-batch on H100: 0.30 ms beside 5.25 ms of
        # DeepGEMM (`bench/serving_prefill_components.py`); 65,536 rows x 2048 x 6 B at H100's HBM
        # is 0.30 ms
        act = R * f_loc * 6.0 / self.hbm_bw
        # the top-k sum of each token's routed copies: without an all-to-all the fused_moe runner
        # writes every routed copy's output ([tokens, topk, hidden] bf16) and a separate kernel sums
        # them (sglang fused_moe.py moe_sum_reduce_triton: reads them, writes [tokens, hidden]);
        # DeepEP's normal path sums the copies bound for each rank before the combine (ep_gather:
        # reads each routed row's output, writes one row per received token); the low-latency
        # combine sums them itself (priced in `_comm`)
        topk_sum = tokens_inst * (k + self.shared_fused + 1) * h * 2.0 / self.hbm_bw
        gather = (R + recv) * h * 2.0 / self.hbm_bw
        return gemms, act + np.where(normal, scatter + gather, np.where(a2a, 0.0, topk_sum))

    def _expert_rows(self, tokens_inst):
        """Rows the routed-expert kernel runs on one GPU per MoE layer for `tokens_inst` tokens of the
        instance: the routed copies landing here, and each token once more where the shared expert
        runs inside the kernel (`shared_fused`)."""
        return tokens_inst * self.s.moe_router_topk / self.c.ep * self.imb + tokens_inst * self.shared_fused

    def expert_flops(self, tokens_inst, rows=None, active=None):
        """FLOPs the Triton fused_moe kernel runs for the routed experts' two GEMMs (gate + up, down)
        on one GPU per MoE layer for `tokens_inst` tokens of the instance: on its padded rows.
        moe_align_block_size pads each expert's rows to a multiple of the kernel's row tile
        (FUSED_MOE_BLOCK_M), and the tiles compute the padding: with n rows routed to an active
        expert (Poisson about the mean, uniform routing) it computes E[ceil(n / BM) | n >= 1] BM.
        `rows`, `active`: the routed rows and active local experts `_expert_parts` already has for
        the same tokens (computed here when not given)."""
        s, c = self.s, self.c
        if not s.num_experts:
            return np.zeros(len(c))
        if rows is None:
            rows = self._expert_rows(tokens_inst)
        if active is None:
            active = self.active_local_experts(tokens_inst)
        rows = np.atleast_1d(np.asarray(rows, float))
        active = np.maximum(np.atleast_1d(np.asarray(active, float)), 1e-9)
        lam = np.maximum(rows / active, 1e-9)  # mean rows per active expert
        # the row tile (`fused_moe` FUSED_MOE_BLOCK_M*): SGLang's tuned configs take the small one
        # while the kernel's M (every token of the instance reaches each GPU's fused_moe) is at most
        # its E (the GPU's local experts), the large one above; its default fp8 block config the
        # large one at every M
        M = np.atleast_1d(np.asarray(tokens_inst, float))
        small = (M <= s.num_experts / np.asarray(c.ep, float)) & self.tuned_moe
        bm = np.where(small, FUSED_MOE_BLOCK_M_SMALL, FUSED_MOE_BLOCK_M)
        # E[ceil(n / bm) | n >= 1] = sum_j P(n > j bm) / P(n >= 1), exactly up to 16 tiles a mean
        # (the sum's terms vanish within 40 tiles there); beyond, lam / bm + 1/2 (n spreads over
        # several tiles, its remainder about uniform), which keeps a ranking's arrays small
        x = lam / bm
        j = np.arange(0, 41, dtype=float)
        exact = poisson.sf(j[None, :] * bm[:, None], np.minimum(lam, 16.0 * bm)[:, None]).sum(axis=1) / -np.expm1(-lam)
        tiles = np.where(x > 16.0, x + 0.5, exact)
        padded = active * tiles * bm
        return 2.0 * padded * s.hidden_size * 3.0 * s.moe_ffn_hidden_size / c.moe_tp

    def _comm(self, tokens_inst, decode: bool = False, legs=None):
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
        s, c, o = self.s, self.c, self.ops
        act = tokens_inst * s.hidden_size * 2.0  # bf16 hidden states of the instance
        # no all-to-all: attention-TP all-reduce, or with attention-DP a gather before the MoE and a
        # reduce-scatter after it over the whole TP group
        ar_attn = self.all_reduce(act / c.attn_dp, c.attn_tp)
        gather = o.collective("all_gather", act, c.tp, 1) + o.collective("reduce_scatter", act, c.tp, 1)
        ar_moe = self.all_reduce(act, c.tp)
        plain = np.where(c.attn_dp > 1, ar_attn + gather, 2 * ar_moe)
        d, cb = self._ep_legs(tokens_inst, decode) if legs is None else legs  # `_ep_legs` of the same tokens
        a2a = ar_attn + d + cb
        dense = np.where(c.dense_tp == 1, ar_attn, plain)
        return np.where(c.a2a > 0, a2a, plain), dense

    def _ep_legs(self, tokens_inst, decode: bool = False):
        """(dispatch, combine) seconds of the all-to-all backend on one GPU per MoE layer for
        `tokens_inst` tokens of the instance (normal or low-latency kernels, as `_comm` says)."""
        global _LL
        s, c, o = self.s, self.c, self.ops
        h = s.hidden_size
        # DeepEP: tokens of this GPU go to top-k experts (low-latency: fp8 dispatch, bf16 combine)
        mine = tokens_inst / c.tp * s.moe_router_topk * self.imb
        bd, bc = mine * h * 1.0, mine * h * 2.0
        # normal kernels: each token crosses RDMA once per node it reaches and fans out over
        # NVLink there, the bytes the DeepEP README's rates count (`blocks.ep_wire_seconds`, the
        # rule the training model uses); charging every top-k copy on RDMA overprices them ~2x
        d, cb, _, _ = ep_wire_seconds(s, o, np.where(c.a2a > 0, 2, 0), tokens_inst / c.tp, h, np.full(len(c), self.fp8_wire),
                                      c.ep, 1, self.imb)
        if _LL is None:
            _LL = _low_latency_rates()
        eps, dg, cg = _LL
        lep = np.log(np.maximum(c.ep, 1.0))
        ll_d = bd / (np.interp(lep, np.log(eps), dg) * 1e9)
        ll_c = bc / (np.interp(lep, np.log(eps), cg) * 1e9)
        lat = np.asarray(o.ep_dispatch(np.full(len(c), 2), 0.0 * bd, 0.0 * bc, c.ep, 1)[0])  # the table's latency
        ll = (c.low_latency_decode if decode else c.low_latency_prefill)
        return np.where(ll, ll_d + lat, d), np.where(ll, ll_c + lat, cb)

    def _two_batch(self, whole, half):
        """GPU seconds of a decode step: (compute, communication) of the whole batch `whole`, and of one
        half batch `half` for two-batch-overlap plans (prefill: `_tbo_prefill`). TBO runs the step as
        two half-batch sub-steps, each with all of its kernels (each half re-reads the expert weights it activates, and launches
        its own kernels); layer by layer one half's communication runs while the other half
        computes, so communication hides only behind the other half's compute:
            TBO = 2 max(comp_h, comm_h)        otherwise comp + comm.
        At small decode batches comp_h is ~ comp (the expert weights dominate), so TBO costs about a
        second step; it pays only where communication is a large share of the step."""
        comp, comm = whole
        comp_h, comm_h = half
        tbo = 2.0 * np.maximum(comp_h, comm_h)
        return np.where(self.c.tbo, tbo, comp + comm)

    def _floor(self, t, kernels):
        """`t` seconds of `kernels` priced kernels (a `layer_kernels.LayerKernels` count: proj, core,
        dense_mlp, shared, experts), each lasting at least a kernel's minimum duration: small batches
        are floor-bound, not bandwidth-bound."""
        return np.maximum(t, kernels * self.kmin)

    def _launch(self, gpu_s, graphs):
        """Launch cost and the kernels the step does not price by work. `gpu_s` holds the priced
        kernels (each already floored); the small kernels of every layer (norms, rope, router,
        activation, quantization, ...: `layer_kernels`) add a kernel's minimum duration each, and
        the priced ones on the main stream the GPU gap between kernels. Eager steps are floored by
        the CPU enqueueing every kernel, and each of their kernels also waits a launch gap (a graph
        replays them back to back, as the kernel minimum was measured). A TBO step launches every
        kernel twice (once per half batch). The generic layer (CPU devices, MLA models) counts
        constants.KERNELS_PER_LAYER, two norms fewer under all-reduce fusion."""
        c = self.c
        twice = np.where(c.tbo, 2, 1)
        priced, small = self.kernels.per_step(self.layers, self.L_moe, self.L_dense)
        priced, small = priced * twice, small * twice
        kernels = priced + small
        gpu = gpu_s + small * self.kmin + priced * GPU_KERNEL_GAP_S
        t = np.where(graphs, gpu, np.maximum(gpu, kernels * self.ops.gap) + kernels * GPU_KERNEL_GAP_S)
        return t + np.where(c.overlap_sched, 0.0, SCHED_OVERHEAD_S)

    # ---- steps ----------------------------------------------------------------------------
    def _decode_gpu(self, B, ctx, graphs=False):
        """(compute, communication, parts) seconds of one decode step at `B` requests per rank;
        `graphs` (per plan): the step replays a CUDA graph."""
        s, c = self.s, self.c
        T = B * c.attn_dp
        proj = self._floor(self._gemm(B, self.attn_params), self.kernels.proj)
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
        core = self._floor(np.maximum(kv_read / self.hbm_bw, core_f), self.kernels.core)
        dense = self._floor(self._dense_mlp(T), self.kernels.dense_mlp)
        shared = self._shared_step(T)
        experts = self._floor(self._experts(T, decode=True), self.kernels.experts) if s.num_experts else 0.0
        legs = self._ep_legs(T, decode=True)
        comm, comm_dense = self._comm(T, decode=True, legs=legs)
        # the shared expert on its own stream beside the routed experts (`shared_on_side_stream`;
        # under DeepEP beside the dispatch and combine too): the layer takes the longer stream, and
        # no less than both weight reads one after the other at the HBM rate (a small batch's
        # kernels are floor-bound and overlap; a large one's share the bandwidth). `moe` is the
        # layer's compute beyond its all-to-all legs, which `comm` keeps
        a2a = np.asarray(c.a2a) > 0
        side = self.shared_side_stream & (np.asarray(graphs, bool) | a2a)
        reads = (self.pc["per_layer"]["shared_expert"] / self._shared_split()[1] * self.wlin / self.hbm_bw
                 + (self.expert_weight_bytes(T) / self.expert_bw if s.num_experts else 0.0))
        ep_legs = np.where(a2a, legs[0] + legs[1], 0.0)
        overlapped = np.maximum(np.maximum(shared, experts + ep_legs), reads + ep_legs) - ep_legs
        moe = np.where(side, overlapped, shared + experts)
        head = self._gemm(T / c.attn_dp, self.pc["output_layer"] / c.tp, ops=self.head_ops) / c.pp
        comp = self.layers * (proj + core) + self.L_dense * dense + self.L_moe * moe + head
        comm_t = self.L_moe * comm + self.L_dense * comm_dense
        parts = {"attention": self.layers * (proj + core) * c.pp, "experts": self.L_moe * experts * c.pp,
                 "dense_shared": (self.L_dense * dense + self.L_moe * shared) * c.pp, "communication": comm_t * c.pp,
                 # of the parts above, what the shared expert's side stream hides under the routed experts
                 "shared_hidden": self.L_moe * (shared + experts - moe) * c.pp}
        return comp, comm_t, parts

    def decode(self, batch_rank, ctx):
        """Seconds of one decode step: `batch_rank` running requests per attention-DP rank with a
        mean context of `ctx` tokens. Returns (seconds, dict of parts)."""
        c = self.c
        B = np.maximum(np.asarray(batch_rank, float), 1.0)
        graphs = (c.graph_bs > 0) & (B <= c.graph_bs)
        comp, comm_t, parts = self._decode_gpu(B, ctx, graphs)
        comp_h, comm_h, _ = self._decode_gpu(np.maximum(B / 2.0, 1.0), ctx, graphs)
        gpu = self._two_batch((comp, comm_t), (comp_h, comm_h))
        stage = self._launch(gpu, graphs)
        t = stage * c.pp  # the batch passes every stage once per token
        return t, {**parts, "cuda_graphs": graphs}

    def _prefill_pieces(self, C, prefix, seg, ranks) -> dict:
        """Seconds per layer on one GPU of a prefill step of `C` tokens per rank, made of segments of
        `seg` new tokens (one per request), each after `prefix` tokens of its own, on `ranks`
        attention-DP ranks at once (the MoE layers see their tokens together), one piece per
        operation: attention projections and core, dense MLP, shared expert, routed experts (and
        their grouped GEMMs apart), all-to-all dispatch and combine, and the collectives of a MoE
        layer (`moe_comm`: the all-to-all's, or the plain gather/all-reduces) and of a dense layer."""
        s, c = self.s, self.c
        T = C * ranks
        proj = self._floor(self._gemm(C, self.attn_params), self.kernels.proj)
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
        core = self._floor(core, self.kernels.core)
        egemm, eother = self._expert_parts(T) if s.num_experts else (0.0, 0.0)
        experts = self._floor(egemm + eother, self.kernels.experts) if s.num_experts else 0.0
        disp, comb = self._ep_legs(T)
        moe_comm, comm_dense = self._comm(T, legs=(disp, comb))
        return {"attn_proj": proj, "attn_core": core, "dense": self._floor(self._dense_mlp(T), self.kernels.dense_mlp),
                "shared": self._shared_step(T), "experts": experts, "experts_gemm": egemm,
                "dispatch": np.where(c.a2a > 0, disp, 0.0), "combine": np.where(c.a2a > 0, comb, 0.0),
                "moe_comm": moe_comm, "dense_comm": comm_dense}

    def _prefill_gpu(self, C, prefix, seg, ranks, pieces=None):
        """(compute, communication, parts) seconds of one prefill step run whole (no TBO): every
        layer's compute and its collectives one after another (`_prefill_pieces`, or `pieces` of
        the same arguments)."""
        c = self.c
        p = self._prefill_pieces(C, prefix, seg, ranks) if pieces is None else pieces
        attn = p["attn_proj"] + p["attn_core"]
        comp = self.layers * attn + self.L_dense * p["dense"] + self.L_moe * (p["shared"] + p["experts"])
        comm_t = self.L_moe * p["moe_comm"] + self.L_dense * p["dense_comm"]
        parts = {"attention": self.layers * attn * c.pp, "experts": self.L_moe * p["experts"] * c.pp,
                 "communication": comm_t * c.pp}
        return comp, comm_t, parts

    def _tbo_prefill(self, C, prefix, seg, ranks, whole=None):
        """GPU seconds of a two-batch-overlap prefill step as SGLang runs it (models/deepseek_v2.py:
        the first dense layers run on the whole batch, the MoE layers in two micro-batches with
        `_compute_moe_deepseek_blog_prefill`'s operation order, tbo_delta_stages 0):
        - per micro-batch and MoE layer: attention block and gate (A), then dispatch; experts (E),
          then combine; shared expert (S); its attention-TP collective on the compute stream;
          without an all-to-all its MoE collectives too (nothing to overlap);
        - the two micro-batches interleave those stages on one compute stream while dispatch and
          combine run on the communication stream (`tbo_prefill_layer_seconds`);
        - DeepEP's normal-mode dispatch and combine progress at DEEPEP_BESIDE_COMPUTE_RATE of their
          speed alone, as they do beside compute in DeepSeek's own trace (`cost_model.constants`;
          low-latency mode keeps its rate: its RDMA runs in the background, no SMs held);
        - compute-bound kernels run on sm_count - DeepEP's SMs in those layers: DeepGEMM because
          SGLang sets `deep_gemm_num_sms = total_num_sms - DeepEPConfig.num_sms` (DeepEP's default
          Buffer.num_sms, 20); under an all-to-all the others (attention core, CUTLASS/Triton
          GEMMs) too, since in this order each runs beside a dispatch or combine whose kernels
          hold their SMs while they run (DeepSeek profile-data README: prefill's all-to-all
          occupies SMs, decode's does not): time x sm_count / (sm_count - 20). Memory-bound
          kernels keep their time (fewer SMs still saturate HBM).
        Micro-batches: whole requests when several are packed, else one request's two halves (the
        second half's attention also reads the first's tokens). `whole`: the step's
        `_prefill_pieces` when the caller has them."""
        w = self._prefill_pieces(C, prefix, seg, ranks) if whole is None else whole
        seg_h = np.minimum(seg, np.maximum(C / 2.0, 1.0))
        h = self._prefill_pieces(np.maximum(C / 2.0, 1.0), prefix + (seg - seg_h) / 2.0, seg_h, ranks)
        dense_layers = self.L_dense * (w["attn_proj"] + w["attn_core"] + w["dense"] + w["dense_comm"])
        cap_d, cap_m = self.tbo_dense_cap, self.tbo_moe_cap
        A = (cap_d * h["attn_proj"] + self.tbo_core_cap * h["attn_core"]
             + h["moe_comm"] - h["dispatch"] - h["combine"])  # the collectives beside the a2a legs
        E = h["experts"] + (cap_m - 1.0) * h["experts_gemm"]
        S = cap_d * h["shared"]
        stretch = np.where(self.deepep_normal["prefill"], 1.0 / DEEPEP_BESIDE_COMPUTE_RATE, 1.0)
        moe_layer = tbo_prefill_layer_seconds(A, E, S, stretch * h["dispatch"], stretch * h["combine"])
        return dense_layers + self.L_moe * moe_layer

    def prefill(self, chunk_rank, prefix, seg=None, ranks=None):
        """Seconds of one prefill (extend) step of `chunk_rank` new tokens per attention-DP rank:
        requests' segments of `seg` new tokens each (default the whole chunk: one request) whose
        requests already hold `prefix` tokens of context (chunked prefill); TBO plans as SGLang
        overlaps two micro-batches (`_tbo_prefill`). `ranks`: attention-DP ranks that extend in
        this step (default all; the others wait for it at the MoE layers)."""
        c = self.c
        C = np.maximum(np.asarray(chunk_rank, float), 1.0)
        seg = C if seg is None else np.clip(np.asarray(seg, float), 1.0, C)
        ranks = c.attn_dp if ranks is None else np.clip(np.asarray(ranks, float), 1.0, c.attn_dp)
        whole = self._prefill_pieces(C, prefix, seg, ranks)
        comp, comm_t, parts = self._prefill_gpu(C, prefix, seg, ranks, pieces=whole)
        gpu = comp + comm_t
        if np.any(c.tbo):
            gpu = np.where(c.tbo, self._tbo_prefill(C, prefix, seg, ranks, whole=whole), gpu)
        stage = self._launch(gpu, np.zeros(len(c), bool))
        return stage * c.pp, parts


_FUSED: float | None = None


def fused_moe_fp8_peak_fraction() -> float:
    """The Triton fused_moe kernel's fp8 GEMM throughput ceiling as a fraction of the GPU's dense
    fp8 peak: the highest net rate over the measured calls of PREFILL_DATA with at least
    PREFILL_MIN_TOKENS tokens. Each call is priced by the serving step model itself (its
    `StepModel._expert_parts` for that model, GPU and token count at the table's rate, run at rates 1 and 1/2
    to separate the GEMMs from the casts beside them); the net rate is the GEMMs' FLOPs over what
    the measured call leaves them once those memory-bound pieces are taken out."""
    global _FUSED
    if _FUSED is None:
        fractions = []
        for r in csv.DictReader(PREFILL_DATA.open()):
            if int(r["batch"]) < PREFILL_MIN_TOKENS:
                continue
            kind = {"h100": "h100-sxm", "h200": "h200-sxm"}[r["gpu"]]
            spec, cl, T = load_model(r["model"].lower()), load_cluster(kind, 1), float(r["batch"])
            c = to_cols(effective_plans([ServePlan.parse("tp=1")], spec, cl))
            parts = []
            for rate in (1.0, 0.5):
                sm = StepModel(spec, cl, load_tables(tables_dir_for(kind)), c, fp8=True, kernel_rates=(1.0, rate))
                sm.expert_bw = np.inf  # the GEMMs' own time, not the weight-read floor
                parts.append([float(np.ravel(x)[0]) for x in sm._expert_parts(np.array([T]))])
            (g1, other), (g2, _) = parts
            casts = g1 - (g2 - g1)  # the GEMMs double at half the rate; the casts do not
            net = float(r["kernel_us"]) * 1e-6 - other - casts
            fractions.append(float(np.ravel(sm.expert_flops(np.array([T])))[0]) / net / (cl.peak_tflops["fp8"] * 1e12))
        _FUSED = max(fractions)
    return _FUSED


def fused_moe_ceiling_flops(cluster, fp8: bool, kernel: str) -> float:
    """FLOP/s the routed experts' GEMMs cannot exceed on `kernel`, the one SGLang runs for them
    (`kernel_path.moe_path`): the Triton fused_moe ceiling at fp8 on a GPU
    (`fused_moe_fp8_peak_fraction` x the dense fp8 peak); inf for every other path (their tables'
    rates apply)."""
    if not (getattr(cluster, "is_gpu", True) and fp8 and kernel == "triton_fused_moe"):
        return np.inf
    return fused_moe_fp8_peak_fraction() * float(cluster.peak_tflops["fp8"]) * 1e12


def tbo_prefill_layer_seconds(A, E, S, D, Cm, layers: int = 6):
    """Seconds per MoE layer, in steady state, of SGLang's two-batch-overlap prefill: micro-batches
    0 and 1, each with attention block A, experts E, shared expert S (compute stream) and dispatch D,
    combine Cm (communication stream, in issue order). Stages split at the yield points (attention
    and dispatch launch | dispatch wait, experts, combine launch | shared expert, combine wait,
    output) and run micro-batch 0 then 1 per stage, so with the next layer's first stage merged
    into the last one the streams run
        compute: E0  E1  S0 [wait C0] A0'  S1 [wait C1] A1' [wait D0'] E0' ...
        comm:    C0 after E0, C1 after E1, D0' after A0', D1' after A1'
    Communication hides only behind the compute the order puts beside it (combine 0 behind E1 and
    S0, dispatch 1 behind E0, ...): the layer takes max(compute, communication) when they pair
    evenly and more when they do not. Simulated for a few layers from a cold start."""
    z = np.zeros_like(np.asarray(A + E + S + D + Cm, float))
    # cold start: both micro-batches' attention and dispatch of the first layer
    a0e = z + A
    d0e = a0e + D
    a1e = a0e + A
    d1e = np.maximum(a1e, d0e) + D
    tc, starts = a1e, []
    for _ in range(layers):
        e0s = np.maximum(tc, d0e)
        starts.append(e0s)
        e0e = e0s + E
        e1e = np.maximum(e0e, d1e) + E
        c0e = np.maximum(e0e, d1e) + Cm
        c1e = np.maximum(e1e, c0e) + Cm
        a0e = np.maximum(e1e + S, c0e) + A
        a1e = np.maximum(a0e + S, c1e) + A
        d0e = np.maximum(a0e, c1e) + D
        d1e = np.maximum(a1e, d0e) + D
        tc = a1e
    return (starts[-1] - starts[-3]) / 2.0  # a max-plus recurrence: average two periods


def context_split(chunk, ctx):
    """(prefix, seg) of a prefill step of `chunk` tokens whose new tokens attend on average to
    `ctx` tokens (prefix plus position within their own segment; what the simulator tracks):
    one request's chunk when ctx >= chunk / 2 (ctx = prefix + chunk / 2), else packed prompts of
    2 ctx tokens each with no prefix. Causal attention work, C x ctx, is the same either way."""
    C = np.maximum(np.asarray(chunk, float), 1.0)
    ctx = np.maximum(np.asarray(ctx, float), 0.0)
    seg = np.clip(2.0 * ctx, 1.0, C)
    return np.maximum(ctx - C / 2.0, 0.0), seg
