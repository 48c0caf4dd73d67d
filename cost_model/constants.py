"""Fixed numbers of the cost model, each with where it comes from.

Everything that varies with hardware lives in the tables (`cost_model.tables`); what is here is
either a property of the software being modelled (Megatron-core, FlashAttention, Adam) or a
design choice of this model, and says which.
"""
from __future__ import annotations

from specs.stack import HYBRIDEP_NUM_SMS

# ---- attention ----------------------------------------------------------------------------------
# FlashAttention's own FLOP accounting: the backward pass runs 5 of the forward's 2 GEMM-sized
# products (recomputed S, dP, dS, dQ/dK/dV), i.e. 2.5x the forward FLOPs. Dao-AILab/flash-attention
# benchmarks/benchmark_flash_attention.py `flops(..., mode="bwd") = 2.5 * f`; the `attention`
# table's bwd rows are achieved TFLOPS in that convention.
ATTN_BWD_FLOPS_FACTOR = 2.5

# ---- router -------------------------------------------------------------------------------------
# The router GEMM (hidden -> experts logits) is charged as an fp32 GEMM at the bf16 `gemm` table
# rate divided by this factor. Design choice: the router is kept in fp32 for stability (Megatron-
# core `moe_router_dtype="fp32"` in the DeepSeek/Qwen recipes), and fp32 GEMM throughput is taken
# as half of bf16.
FP32_ROUTER_GEMM_SLOWDOWN = 2

# ---- data-parallel gradient buckets --------------------------------------------------------------
# Megatron-core DistributedDataParallel: when `ddp_config.bucket_size` is None it becomes
# max(40_000_000, 1_000_000 * DP size) parameters (megatron/core/distributed/
# distributed_data_parallel.py). Megatron counts the DP size with context parallelism; this model
# uses DP alone (kept as it was when predictions were pinned by tests/test_regression.py).
DDP_BUCKET_MIN_PARAMS = 40e6
DDP_BUCKET_PARAMS_PER_DP_RANK = 1e6

# ---- bytes per parameter (mixed precision with Adam; Megatron's distributed optimizer) ----------
# Megatron-core mixed precision: bf16 weights, fp32 main gradients, and Adam's fp32 master weight,
# exp_avg and exp_avg_sq (megatron/core/optimizer/distrib_optimizer.py; Rajbhandari et al. 2020,
# ZeRO, §3: "16 bytes per parameter" for fp16 weights + grads + 12 B optimizer state; Megatron
# keeps the main grad in fp32, 4 B instead of 2 B).
WEIGHT_BYTES = 2.0          # bf16 parameter
MAIN_GRAD_BYTES = 4.0       # fp32 main gradient buffer
ADAM_STATE_BYTES = 12.0     # fp32 master + m + v, sharded over DP by the distributed optimizer
FP8_WEIGHT_COPY_BYTES = 1.0  # fp8 recipes keep a quantised copy of each weight (TransformerEngine)
# HBM traffic of one Adam step per local parameter, memory-bound: read the fp32 grad (4),
# read+write the fp32 master weight (8), read+write m and v (16), write the bf16 weight (2), plus
# 4 B that the original derivation does not itemise (kept: predictions are pinned by
# tests/test_regression.py). Design choice, not measured; the `membw` "optimizer" row sets the rate.
ADAM_STEP_BYTES_PER_PARAM = 4 + 8 + 16 + 2 + 4

# ---- cross-entropy --------------------------------------------------------------------------------
# Bytes moved per logit element of the vocab-parallel cross-entropy (memory-bound, `membw`
# "cross_entropy" row): forward 2 + 4 + 4 (bf16 logits read, fp32 upcast written and read),
# backward 4 + 2 + 4; the transient held on the loss stage is the bf16 logits plus their fp32
# copy. Design choice, after Megatron-core's fused cross-entropy (megatron/core/tensor_parallel/
# cross_entropy.py upcasts the logits to fp32).
CE_FWD_BYTES_PER_LOGIT = 2 + 4 + 4
CE_BWD_BYTES_PER_LOGIT = 4 + 2 + 4
CE_TRANSIENT_BYTES_PER_LOGIT = 2 + 4

# ---- GPT-OSS expert epilogues (megatron-core 0.16.1, unchanged in 0.17.0/0.17.1) ----------------------
# Bytes per element moved by passes that run outside the fused kernels, memory-bound at the
# `membw` "elementwise" rate (bf16 tensors, 2 B; probs taken as bf16 too, a lower bound).
# Clamped GLU (activation_clamp): fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl
# (:424-432) clamps the two halves of the fc1 output [rows, 2 ffn] with two torch clamps and
# torch.cat's them back before the fused activation: fwd = clamp (read 2 + write 2) + cat (read 2
# + write 2) = 8 B per element of [rows, 2 ffn]; bwd = clamp backward (read grad, read input,
# write grad: 6) + the chunk's backward cat of the two grads (4) = 10 B. Inside the "moe_act"
# recompute checkpoint (transformer/moe/experts.py bias_act_func), so recomputed with it.
GLU_CLAMP_FWD_BYTES_PER_ELEMENT = 2 + 2 + 2 + 2
GLU_CLAMP_BWD_BYTES_PER_ELEMENT = 6 + 4
# Expert fc2 bias (moe_expert_bias): TEGroupedMLP builds linear_fc2 with skip_bias_add=True
# (transformer/moe/experts.py:571-572) and adds the prob-weighted bias per local expert in Python,
# `torch.cat([t + b * p ...])` (experts.py:609-626 _apply_bias): fwd = b*p written (2) + add
# (read 2 + 2, write 2) + cat (read 2, write 2) = 12 B per element of [rows, hidden]; bwd = the
# mul's two reductions, grad*p and grad*b each written, read back and the grad read (2 x 6) = 12 B.
EXPERT_FC2_BIAS_FWD_BYTES_PER_ELEMENT = 2 + 6 + 4
EXPERT_FC2_BIAS_BWD_BYTES_PER_ELEMENT = 2 * 6
# Its kernels: `t + b * p` per local expert is two launches (the broadcast product, the add), then
# one torch.cat of the experts' outputs (experts.py:613-626, a Python loop over the local experts,
# each launch a PyTorch op the host issues); the backward (autograd of the same ops: each product's
# two gradients and their reductions) launches twice as many, as KERNEL_PASSES counts.
KERNELS_EXPERT_BIAS_PER_EXPERT = 2
KERNELS_EXPERT_BIAS_CAT = 1

# ---- CPU launch floor: structural kernel counts ---------------------------------------------------
# Forward kernels per layer and microbatch that the CPU launch floor charges (backward = 2x, see
# KERNEL_PASSES). Design choice: approximate counts of the ops Megatron-core's local layer spec
# launches (norm, GEMMs, RoPE, core attention, residual adds; router, top-k, permute, experts,
# unpermute). Only the product count x per-kernel gap enters the model: the CPU stack's measured
# gap (`dispatch_gap` mode "stack", trials/profile/stack_floor.py) is fitted per these counts, so
# changing a count re-scales that fit rather than the predicted floor of the reference model.
KERNELS_ATTENTION = 14           # attention block, MHA/GQA
KERNELS_MLA_EXTRA = 6            # MLA: down/up projections and their norms
KERNELS_TP_ATTENTION = 4         # TP > 1: gather/scatter around the attention block
KERNELS_CP_PER_STEP = 2          # CP ring: send + recv per step, (cp - 1) steps
KERNELS_DENSE_MLP = 6            # fc1, activation, fc2 and their casts
KERNELS_TP_DENSE_MLP = 2         # TP > 1: gather/scatter around the dense MLP
KERNELS_MOE = 16                 # router GEMM, softmax, top-k, aux loss, permute, unpermute, ...
KERNELS_PER_EXPERT_GEMMS = 3     # fc1, activation, fc2: once (grouped GEMM) or per local expert
KERNELS_SHARED_EXPERT = 4        # shared expert fc1, activation, fc2, add
KERNELS_EMBEDDING = 4            # embedding lookup (first stage)
KERNELS_LM_HEAD_LOSS = 12        # final norm, LM head GEMM, vocab-parallel cross-entropy
KERNEL_PASSES = 3                # forward + backward, backward launching twice the forward's
# fp8: kernels per quantised GEMM operand (an activation entering a GEMM forward, an output gradient
# backward; weights are cast once per step, not counted), per specs.plan.PRECISIONS code, from the
# TransformerEngine 2.9 quantizers: bf16 none; tensorwise (current scaling) an amax reduction then the
# cast-transpose (Float8CurrentScalingQuantizer); delayed scaling one cast-transpose with the amax
# fused (Float8Quantizer); blockwise one fused quantize (Float8BlockQuantizer); mxfp8 the quantize
# plus the swizzle of its scales the GEMM needs (csrc/extensions/gemm.cpp swizzle_scaling_factors).
KERNELS_FP8_PER_OPERAND = (0, 2, 1, 1, 2)
# fp8 GEMM operands per forward: attention block (QKV / MLA projections in, output projection in),
# dense MLP (fc1 in, fc2 in), MoE (grouped fc1 in, fc2 in; the shared expert's two more)
FP8_OPERANDS_ATTENTION = 2
FP8_OPERANDS_MLP = 2
# The part of KERNELS_MOE before the dispatch (design choice, same counting as above): the
# `moe_router` graph scope covers the pre-MLP norm, router GEMM, score function, top-k and aux loss
# (and a shared expert not overlapped with EP comm, arguments.py --cuda-graph-scope help); the
# `moe_preprocess` scope MoELayer.preprocess (routing map to token counts and the permute indices).
KERNELS_MOE_ROUTER = 8
# Of KERNELS_ATTENTION, the core attention's own (design choice, same counting): Megatron-core's
# local DotProductAttention forward runs baddbmm, the in-place mask, softmax, bmm and the
# contiguous copy of the context. On CPU, where each op's dispatch is part of its module's time,
# the floor's launches are placed by the module issuing them (breakdown cpu_launch_*).
CPU_KERNELS_CORE_ATTENTION = 5
KERNELS_MOE_PREPROCESS = 3

# ---- SMs held by communication ---------------------------------------------------------------------
# While an EP communication kernel runs beside compute (a2a overlap, shared-expert overlap) it holds
# SMs the compute would use. Per dispatcher code (cost_model.plans.DISPATCH_CODES):
# - NCCL all-to-all / all-gather: one CTA (SM) per channel, up to MAXCHANNELS = 32
#   (NCCL src/include/device.h; NCCL_MAX_NCHANNELS caps it).
# - DeepEP: megatron-core 0.16.1 transformer_config.py moe_deepep_num_sms = 20 (the emitted script
#   keeps the default; arXiv 2603.07685 §4.2.3: "DeepEP uses 20 SMs per GPU").
# - HybridEP: the count the emitted script sets, NVIDIA's performance recipes' 32
#   (`specs.stack.HYBRIDEP_NUM_SMS`, sources there; megatron-core's default is 16).
NCCL_COMM_SMS = 32
DEEPEP_SMS = 20
COMM_SMS = (NCCL_COMM_SMS, NCCL_COMM_SMS, DEEPEP_SMS, HYBRIDEP_NUM_SMS)

# ---- who gets the SMs when communication runs beside compute -----------------------------------------
# Per dispatcher code, whether its EP communication kernels are starved of SMs by the compute beside
# them (True) or hold their SMs (False; `blocks.paired_exposure`).
# - DeepEP holds where the GEMMs beside it give SMs up to it, and starves beside Hopper's. It launches
#   every kernel cooperatively (cudaLaunchAttributeCooperative, deepseek-ai/DeepEP
#   csrc/kernels/launch.cuh SETUP_LAUNCH_CONFIG), all its CTAs resident at once, on its own
#   high-priority stream (csrc/deep_ep.cpp: comm_stream(at::cuda::getStreamFromPool(true)), every
#   kernel enqueued there), where Megatron's own comm stream (pipeline_parallel/utils.py) has the
#   default priority. Once resident it runs on its SMs and the compute beside it on the SMs left
#   (arXiv 2603.07685 §4.2.3: DeepEP's 20 SMs cost the GEMMs beside it ~20% efficiency). Whether it
#   gets them while a GEMM runs is the GEMM's scheduler's doing:
#   - Blackwell: TE's sm100 GEMMs are dynamic persistent kernels (cluster launch control: a grid of
#     one cluster per tile, workers take the pending ones with clusterlaunchcontrol.try_cancel;
#     NVIDIA/cutlass media/docs/cpp/blackwell_cluster_launch_control.md), which "cooperate with the
#     GPU work scheduler to respect work priorities" (NVIDIA/cccl libcudacxx work_stealing,
#     cuda::for_each_canceled_block): the high-priority DeepEP kernel gets SMs as tiles finish, as
#     in DeepSeek's trace (DEEPEP_BESIDE_COMPUTE_RATE). Held. (Ampere's GEMMs launch one CTA per tile
#     and free SMs as they go, CUDA programming guide §4.12 "Preemption": held too.)
#   - Hopper: its GEMMs are static persistent kernels (one worker per SM looping over tiles, the same
#     CUTLASS document's "static scheduler"), whose SMs free only when the whole GEMM ends, so the
#     priority wins SMs only between kernels; megatron-core reserves none for DeepEP (TE
#     NVTE_EXT_MARGIN_SM unset), where DeepSeek's own GEMMs left its 20 SMs free and SGLang's
#     two-batch-overlap prefill does the same (sglang 0.5.23 srt/batch_overlap/operations_strategy.py
#     _compute_moe_deepseek_blog_prefill: deep_gemm_num_sms = SMs - DeepEP's; the serving model's
#     DeepEP stays held). Starved, at the one rate measured for an EP kernel beside TE's Hopper
#     GEMMs (HybridEP's, STARVED_*). Validation, not
#     fitted: the only public DeepEP overlap A/B on Hopper (Megatron-MoE-ModelZoo Qwen3-235B, 256
#     H100, 19.7 -> 17.6 s, -10.7%; bench/overlap_ab_pairs.py) is -9.6% priced starved, -30.2% held;
#     NVIDIA's tuned H100 MoE recipes do not pick DeepEP (Megatron-Bridge
#     skills/nemo-mbridge-perf-moe-dispatcher-selection: the 16xH100 Qwen3-30B winner is HybridEP,
#     the Qwen3-235B recipe all-to-all + overlap). Against it: 2603.07685 puts DeepSeek-V3's exposed
#     EP on 1024 H100 below 5% with DeepEP and 1F1B overlap, which this prices at 22% (8.5% held) on
#     TP2 PP8 VPP4 EP64 fp8-blockwise.
# - HybridEP is starved: it launches its dispatch / combine kernels as plain grids (DeepEP branch
#   hybrid-ep csrc/hybrid_ep/backend/hybrid_ep_backend.cuh `dispatch_kernel_ptr<<<NUM_OF_BLOCKS_TOTAL,
#   ...>>>`), whose CTAs wait for SMs like any kernel's; Megatron-core 0.16.1 reserves no SMs on its
#   TE GEMMs, which take them as they free. Measured: see STARVED_COMM_RATE.
# - NCCL (alltoall / allgather dispatchers; and the DP / PP collectives, priced the same way) holds:
#   its kernels are ordinary launches too (NVIDIA/nccl src/enqueue.cc ncclLaunchKernel), but one CTA
#   per channel, and the one public NCCL all-to-all overlap A/B (Megatron-Bridge
#   skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md, "Correctness-first alltoall smoke": Qwen3-30B-A3B
#   16 H100, no CUDA graphs, 41.25 -> 31.31 s, -24%, "directional") hides at least what the held
#   pricing allows (model -31%; starved -13%), so nothing says it starves.
COMM_STARVED = (False, False, False, True)  # beside GEMMs that give SMs up (Blackwell, Ampere)
COMM_STARVED_HOPPER = (False, False, True, True)  # beside Hopper's static persistent GEMMs
# The rate a starved communication kernel progresses at while GEMM / attention kernels run beside it,
# as a share of its rate alone, and the compute beside it at full speed. From the component split of
# one Nsight Systems A/B (Megatron-Bridge skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md,
# "Measured Evidence": Qwen3-30B-A3B, 16 H100, BF16, HybridEP 32 SMs, EP overlap off / on, rank 0):
# communication kernels 9.079 ms concurrent = 0.11% -> 8.25 s alone (off); 3,959 ms concurrent =
# 36.55% -> 10.83 s (on). The 6.87 s of the on case not beside GEMM / attention ran at the full
# rate, so the 3.96 s beside them did the remaining 8.25 - 6.87 = 1.38 s of work: rate 0.35
# (0.26-0.45 over the rounding of "0.11%"). The compute did not measurably slow: GPU-active union
# minus the communication alone, 22.82 - 8.25 = 14.57 s off, 21.22 - 6.87 = 14.35 s on (more only by
# what communication also overlapped outside GEMM / attention, which the note does not count; the
# same uncount would make the rate lower still). A kernel-level measurement of the mechanism, not the
# A/B's step times (which the model is checked against).
STARVED_COMM_RATE = 0.35
# ... and only while it is beside them: the same Nsight has the on case's communication kernels
# concurrent with GEMM / attention for 3.96 s, where the model pairs each of them with a whole compute
# node (`blocks.ep_exposed`), 10.67 s of paired compute for that workload (the first pair of
# bench/overlap_ab_pairs.py: its hidden communication is linear in the rate, 7.572 s beyond at rate 0
# and 3.838 s at 0.35). A plain-launched grid gets an SM only when a whole SM frees, and TE's Hopper
# GEMM CTAs hold most of an SM's shared memory, so the communication runs in the GEMMs' tail waves and
# between kernels: share 3.96 / 10.67 = 0.37 of the paired window. Priced (`blocks.paired_exposure`),
# a starved kernel does STARVED_COMM_RATE x STARVED_COMM_CONCURRENCY = 0.13 s of its work per second of
# the compute it is paired with (the Nsight's 1.38 s of hidden work), where the rate alone hid 3.7 s.
STARVED_COMM_CONCURRENCY = 3.959 / 10.67
STARVED_WORK_PER_PAIRED_S = STARVED_COMM_RATE * STARVED_COMM_CONCURRENCY
# The rate a held communication kernel progresses at while compute runs beside it, as a share of its
# rate alone (`blocks.paired_exposure`; the compute beside it on the SMs left). DeepEP's normal
# kernels (`bench/deepep_overlap_rate.py`): in DeepSeek's public training trace (deepseek-ai/
# profile-data train.json: H800, EP64 over 8 nodes, 4,096 tokens per micro-batch, balanced routing,
# DeepEP on 20 SMs, FP8 dispatch / BF16 combine, DualPipe: every kernel beside compute-stream
# kernels 72-100% of its time) the 8 dispatch and 8 combine kernels take 3.88 and 6.18 ms on average;
# DeepEP's own benchmark of that setting, published the same week (deepseek-ai/DeepEP README at
# ebfe47e, 2025-02-24: internode EP64 46 GB/s dispatch, 45 GB/s combine, RDMA bytes of
# tests/test_internode.py, 3.99 destination nodes per token) puts them alone at 2.62 and 5.20 ms:
# rate 0.78 (0.70 against the README's later 51 / 50 GB/s, after DeepEP's April 2025 speed-ups).
# The trace's notify kernels (1.0-3.8 ms each: waiting for the other ranks) are not in it. A caveat
# on carrying it to megatron-core: the trace's GEMMs (DeepSeek's persistent CUTLASS grouped GEMMs)
# launch 112 CTAs on the H800's 132 SMs, leaving DeepEP's 20 free (printed by the same bench), while
# TE's GEMMs under megatron-core take every SM (TE gemm.py: NVTE_EXT_MARGIN_SM, which Megatron-LM,
# Megatron-Bridge and the ModelZoo leave unset), so there DeepEP's kernels also wait for SMs to free;
# no measurement of that wait exists, so the rate is used as measured (an upper bound). NCCL's
# all-to-all: no kernel-level measurement beside compute (1.0; its one public overlap A/B hides at
# least what the held pricing allows, see COMM_STARVED); HybridEP is starved (STARVED_COMM_RATE).
DEEPEP_BESIDE_COMPUTE_RATE = 0.78
HELD_COMM_RATE = (1.0, 1.0, DEEPEP_BESIDE_COMPUTE_RATE, 1.0)

# ---- CUDA graphs (megatron-core 0.16.1 --cuda-graph-impl / --cuda-graph-scope) ----------------------
# A graphed region replaces its kernel launches by one graph replay per pass: TE
# make_graphed_callables captures a forward and a backward graph per callable, so a region costs
# 2 host launches per layer and microbatch (each a launch of the same order as one kernel's,
# cudaGraphLaunch) instead of KERNEL_PASSES x its kernels. The local full-iteration graph replays
# the whole forward-backward of a step as one graph (cuda_graphs.py FullCudaGraphWrapper): one launch.
GRAPH_LAUNCHES_PER_REGION = 2
# Memory: each graphed callable keeps static input and output buffers per microbatch in flight
# (cuda_graphs.py TECudaGraphHelper._get_sample_arguments reuses them once a microbatch's backward is
# done); modelled as one [tokens_sp, hidden] bf16 tensor in and one out per region.
GRAPH_STATIC_BUFFERS_PER_REGION = 2

# ---- fp8 quantization (TransformerEngine 2.9 recipes) ---------------------------------------------
# HBM bytes moved per element quantized for an fp8 GEMM operand (the activation entering a GEMM in
# the forward pass, the output gradient in the backward), memory-bound at the quantisation kernels'
# own rate (`TableOps.bw_fp8_quant`, FP8_QUANT_HBM_FRACTION below). Index = specs.plan.PRECISIONS code.
#   tensorwise (current scaling): an amax reduction pass (read bf16, 2 B) before the cast, then
#     cast + transpose (read 2 B, write the row-wise and the column-wise fp8 copy, 1 + 1 B):
#     TE `Float8CurrentScalingQuantizer` (pytorch/tensor/float8_tensor.py) computes amax first;
#     Hopper fp8 GEMMs take only TN layouts, hence the transposed copy (TE `cast_transpose`).
#   delayed scaling: the scale comes from the amax history, the amax of this tensor is fused
#     into the cast-transpose kernel: read 2 + write 1 + 1 (+ one small amax-history update per
#     step, not charged). TE `Float8Quantizer`, `DelayedScaling` recipe.
#   blockwise (1x128 / 128x128 scales): one fused kernel, read 2, write row- and column-wise fp8
#     1 + 1 and an fp32 scale per 128 elements each way: 2 + 2 + 2*4/128. TE
#     `Float8BlockQuantizer` (pytorch/tensor/float8_blockwise_tensor.py).
#   mxfp8 (1x32 E8M0 scales): read 2, write row- and column-wise copies 1 + 1 and a 1-byte scale
#     per 32 elements each way: 2 + 2 + 2/32. TE `MXFP8Quantizer`.
FP8_QUANT_BYTES_PER_ELEMENT = (0.0, 2 + 2 + 1 + 1, 2 + 1 + 1, 2 + 1 + 1 + 2 * 4 / 128, 2 + 1 + 1 + 2 / 32)
# Share of the GPU's HBM bandwidth training's quantisation kernels achieve (GPUs; `TableOps.bw_fp8_quant`,
# the one rate that prices them): well below the 0.80 assumed for fused elementwise kernels, since a
# cast + transpose reads rows and writes columns (strided tiles, a reduction for the scales). Applied
# to every byte of FP8_QUANT_BYTES_PER_ELEMENT, the tensorwise amax read included.
# Value: TransformerEngine's own cast + transpose on H100 SXM, fp16 in, fp8 row- and column-wise out
# (NVIDIA/TransformerEngine PR 101, 2023, table "Run time": 4096 x 4096 in 51.53 us):
# 4096^2 x (2 + 1 + 1) B / 51.53 us = 1.30 TB/s = 0.39 of 3.35 TB/s (3072 x 3072: 24.51 us, 0.46).
# Check on another kernel and GPU: pytorch/ao PR 4356 (2026) MXFP8 quantisation of 8192 x 5120 on
# B200 reports 3.65-4.43 TB/s, 0.46-0.55 of 8 TB/s.
FP8_QUANT_HBM_FRACTION = 0.39
# fp8 GEMM time per recipe against the per-tensor-scaled fp8 GEMM the `gemm` / `grouped_gemm` tables
# price (index = specs.plan.PRECISIONS code; bf16 unused), on Hopper and on Blackwell. From
# TransformerEngine's own GEMM benchmark (docs/examples/gemm_profiling/gemm_profiling.rst, model-config
# mode: hidden 4096, ffn 16384, 15,872 tokens; fprop + dgrad + wgrad ms per layer):
# - Hopper (H200 NVL): per-tensor pre-quantized 16.785, current scaling autocast 20.285, delayed
#   18.978 (its GEMM is the per-tensor one, so 2.19 of it is quantisation), blockwise autocast 22.882.
#   Blockwise quantises in one fused pass like delayed scaling (FP8_QUANT_BYTES_PER_ELEMENT: 4.06
#   against 4 B), so ~2.22 of it is quantisation and its GEMM (cuBLAS 1D x 2D block-scaled) takes
#   20.66 / 16.785 = 1.23x the per-tensor one (1.22x taking the quantisation from current scaling's
#   3.50 x 4.06 / 6). MXFP8 does not run on Hopper.
# - Blackwell (B300): MXFP8 pre-quantized 7.161 against per-tensor 6.812: 1.05x; blockwise runs there
#   emulated on MXFP8 GEMMs (the same document; TransformerEngine PR 2157), so the MXFP8 factor.
# The same benchmark checks the quantisation bytes above: its current scaling quantised 3.50 ms per
# layer (H200 NVL), the model's bytes at FP8_QUANT_HBM_FRACTION give ~4.0 (weights re-cast every call
# there included); delayed 2.19 against ~2.7.
FP8_GEMM_TIME_HOPPER = (1.0, 1.0, 1.0, 1.23, 1.0)
FP8_GEMM_TIME_BLACKWELL = (1.0, 1.0, 1.0, 1.05, 1.05)

# ---- sliding-window attention ----------------------------------------------------------------------
# Megatron-core `window_attn_skip_freq` (transformer_config.py): with an int N, every N-th layer
# (layer_number % N == 0) keeps full causal attention and the others use `window_size` (the tokens
# a query sees, itself included: megatron-bridge gpt_oss_bridge.py sets window_size =
# (sliding_window - 1, 0) and TE passes left bound + 1 to cuDNN, fused_attn_f16_arbitrary_seqlen.cu
# set_diagonal_band_left_bound(window_size_left + 1)). The fused kernel skips the key blocks wholly
# outside the band and computes every block it touches in full (masking inside it), so a windowed
# layer costs the (query block x key block) tiles it visits, not its unmasked FLOPs: a causal query
# block i of ATTENTION_TILE rows visits blocks floor((i B - w + 1) / B) .. i (`blocks.window_fraction`).
# ATTENTION_TILE = 128: the 128 x 128 tiles of the FlashAttention-2 / cuDNN SDPA kernels.
# Check on cuDNN's own timings (cudnn-frontend PR 505, cuDNN SDPA backward, S4096 H16 D64, us):
# causal 558.2, window 511 171.0 (0.306 of causal; tiles 150/528 = 0.284; FLOPs 0.234), window 1023
# 276.6 (0.496; tiles 252/528 = 0.477; FLOPs 0.437). That cuDNN skips out-of-window blocks:
# cudnn-frontend PR 866 (its own SM80 engine without the skip ran the gpt_oss W=128 d=64 backward
# 5-75x slower than the cuDNN backend). At w = 128 and 4096 tokens a windowed layer visits 63 of a
# causal layer's 528 tiles (0.119), twice its FLOP share (0.0615). On GB200 (cudnn-frontend
# benchmark/sdpa_benchmark_training/results/gpt_oss, cuDNN 9.22) the W=128 kernel runs at 161/182
# TFLOPS fwd/bwd of its unmasked FLOPs against 574/617 at W=1024 (cuDNN 9.19): a fixed cost per query
# block the tile count leaves out, not charged here (no Hopper measurement at W=128; the H200 row at
# W=1024 is tests/test_cost_model_physics.py's check).
# Sinks (GPT-OSS softmax_type "learnable"): TE keeps them on FusedAttention (cuDNN >= 9.13.1;
# pytorch/attention/dot_product_attention/utils.py get_attention_backend disables only
# FlashAttention for softmax_type != vanilla, fused_attn.cpp nvte_get_fused_attn_backend), where
# cuDNN adds the sink logit to the softmax denominator (sdpa set_sink_token) and its gradient is one
# reduction over the rows (cudnn-frontend scaled_dot_product_flash_attention.h, dSink = reduce(exp(sink
# - stats) * sum(dO * O))): per-row work, not charged.
ATTENTION_TILE = 128

# ---- RoPE outside TE's fused kernel (YaRN with a concentration factor) ------------------------------
# megatron-core 0.16.1 SelfAttention passes mscale = _yarn_get_concentration_factor_from_config(config)
# to apply_rotary_pos_emb (transformer/attention.py:1096-1116); the concentration factor is
# yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim), yarn_get_mscale(s, m) =
# 0.1 m ln(s) + 1 (models/common/embeddings/yarn_rotary_pos_embedding.py:252-271; 1.3466 for GPT-OSS,
# YaRN factor 32 with neither mscale set: megatron-bridge gpt_oss_bridge.py). With mscale != 1
# rope_utils.apply_rotary_pos_emb (:279-284) warns "mscale=... is not supported by TE's fused RoPE.
# Using unfused implementation." even under apply_rope_fusion, and runs _apply_rotary_pos_emb_bshd
# (:92-127) in eager PyTorch on q and on k. Bytes per element of the rotated tensor (bf16, 2 B),
# counted from that function (design choice: each op one pass, no fusion):
#   forward: t * cos (read 2, write 2), -x2 on the half (1 + 1), rotate_half's cat (2 + 2), * sin
#     (2 + 2), the add (4 + 2), the cat with the empty pass-through part (2 + 2) = 24
#   backward (autograd of the same ops): grad * sin (4), the neg (2), the chunk's cat (4), grad * cos
#     (4), the two gradients of t summed (6), the rot_dim slice's backward (zeros 2 + copy 4) = 26
# Forward kernels per rotated tensor: those 6 passes + cos, sin, their mscale products and bf16 casts
# on the [s, 1, 1, d] frequencies (6) = 12.
ROPE_EAGER_FWD_BYTES_PER_ELEMENT = 4 + 2 + 4 + 4 + 6 + 4
ROPE_EAGER_BWD_BYTES_PER_ELEMENT = 4 + 2 + 4 + 4 + 6 + 6
KERNELS_ROPE_EAGER = 12

# ---- MoE host synchronisation -----------------------------------------------------------------------
# Dropless token dispatchers copy the per-expert token counts to the host before the expert GEMMs
# (Megatron-core moe/token_dispatcher.py `_maybe_dtoh_and_synchronize`, the alltoall and flex
# dispatchers; TE GroupedLinear takes the split sizes as host ints). The stream drains at that
# point: the GPU waits one device-to-host round trip and the first launch, and then for the host
# wherever the kernels after the sync are issued slower than they run (the host cannot have queued
# them ahead): exposed per MoE layer forward = D2H + one dispatch gap + max(0, the MoE kernels after
# the sync x the gap - their GPU seconds) (`blocks.moe_host_sync`; the kernels after the sync from
# `nongemm.layer_kernels`: the MoE block less its router and preprocess). The round trip is the CUDA
# D2H small-copy latency, ~10 us (NVIDIA CUDA C++ Best Practices Guide, "Data Transfer Between Host
# and Device": small transfers are latency-bound at ~10 us).
D2H_SYNC_S = 10e-6
# What the GPU measurably idles per MoE layer forward after the dropless dispatcher's host sync, when
# no other microbatch's work is queued behind it (no EP a2a overlap): the same Nsight A/B as
# STARVED_COMM_RATE (Megatron-Bridge skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md, Qwen3-30B-A3B
# 16 H100 BF16 HybridEP, TE graphs of moe_router + moe_preprocess) has the overlap-off step at
# 24.714 s against a 22.821 s GPU-active union: 1.89 s idle over 48 layers x 64 microbatches of MoE
# forwards, 616 us each (the host's Python between the sync's return and the next launch: the
# dispatch's output allocation, the permutation and grouped-GEMM setup from the host token counts;
# the D2H round trip and the first launch above are a small part of it). With overlap on, the union
# covers the step (21.221 s against 20.992 s): the other microbatch's queued work fills the drain.
# Priced as a floor under the modelled drain (`blocks.moe_host_sync`). It is host work, so it is
# counted in the host's per-launch time: 616 us over the 22 us per launch of an x86 host
# (HOST_US_PER_LAUNCH) = 28 launches' worth, scaled by the kind's own `dispatch_gap` (a Grace host's
# 2.75x, `build_default_tables` GRACE_OVER_X86_HOST; a `moetune profile` table's measured gap).
POST_SYNC_IDLE_S = (24.714 - 22.821) / (48 * 64)
# The shipped host time per PyTorch-level launched kernel of an x86 host, in us
# (`build_default_tables` writes it into every x86 kind's dispatch_gap table, with its source:
# deepseek-ai/profile-data train.json, the leanest compute phase, a lower bound).
HOST_US_PER_LAUNCH = 22.0
POST_SYNC_IDLE_LAUNCHES = POST_SYNC_IDLE_S / (HOST_US_PER_LAUNCH * 1e-6)

# ---- DeepEP / HybridEP: what their bandwidth figures count, and the per-token cost ------------------
# The `ep_dispatch` rows of the flex backends are the libraries' own benchmark figures, which count
# per-token *deduplicated destination* bytes with the local rank / local node included (DeepEP
# tests/test_internode.py: num_rdma_token_sent counts every node a token reaches, its own among
# them; test_intranode.py: the received rows, the rank's own included; NVIDIA-NeMo/Automodel
# docs/deepep_vs_hybridep_benchmark.md §2 "per-token deduplicated destination bytes, local rank
# included"; the H100 EP16 figures of 80-86 GB/s exceed the 50 GB/s NIC, which only that counting
# allows). The model therefore charges the same counted bytes: every received row on the NVLink
# leg (in multi-node runs the RDMA peer forwards each remote token over NVLink too: Automodel §5.4,
# HybridEP EP16 sustains 285.8 GB/s NVLink and 85.7 GB/s RDMA in one kernel) and, on the RDMA leg,
# one copy per domain the token reaches, its own included.
# Small tokens run below the large-token rate: the same benchmark at hidden 2048 (Qwen3-30B dims)
# and 7168 (DeepSeek-V3 dims) fits t = tokens x c0 + bytes / peak per backend, leg and direction
# (two points each; H100, 24 SMs except HybridEP RDMA at 7168, measured at 8 SMs where it already
# saturates). c0 in seconds per counted token; FLEX_REF_TOKEN_BYTES are the token sizes of the
# table rows (FP8 dispatch 7168 + 7168/128 x 4 B scales, BF16 combine 2 x 7168 B), at which the
# correction is zero. The same c0 is used on other GPUs (no second measurement exists).
#   HybridEP NVLink:  dispatch FP8 358 / 272 GB/s, combine 364 / 304  -> c0 2.6 / 3.1 ns
#   HybridEP RDMA:    dispatch FP8 81.6 / 61.4,   combine 76.5 / 49.3  -> c0 11.9 / 41.4 ns
#   DeepEP NVLink:    dispatch FP8 323 / 210,     combine 326 / 287    -> c0 4.9 / 2.4 ns
#   DeepEP RDMA:      dispatch FP8 79.5 / 36.2,   combine 68.2 / 59.1  -> c0 44.5 / 12.9 ns
# (rates at 7168 / 2048; copied into cost_model/data/ep_dispatch_combine_bandwidth.csv)
FLEX_REF_TOKEN_BYTES = (7168 + 7168 / 128 * 4, 2 * 7168)  # (dispatch, combine)
FLEX_PER_TOKEN_S = {  # (backend, leg): (dispatch, combine) seconds per counted token
    ("hybridep", "scaleup"): (2.6e-9, 3.1e-9),
    ("hybridep", "scaleout"): (11.9e-9, 41.4e-9),
    ("deepep", "scaleup"): (4.9e-9, 2.4e-9),
    ("deepep", "scaleout"): (44.5e-9, 12.9e-9),
}

# ---- memory: allocator and runtime reserve ---------------------------------------------------------
# Share of HBM a plan may not count on: the CUDA context and cuBLAS/cuDNN workspaces (~1-2 GiB),
# NCCL's per-communicator buffers and the PyTorch caching allocator's fragmentation. Megatron-core
# docs ("Memory usage": `--empty-unused-memory-level`) and PyTorch's CUDA semantics notes
# (`expandable_segments` exists to cut fragmentation) describe the effect but give no figure; 10%
# is the reserve moetune has always used (a stated assumption, not a measurement).
HBM_RESERVE_FRACTION = 0.10

# ---- activation offloading ---------------------------------------------------------------------------
# megatron-core 0.16.1 fine-grained activation offloading (transformer_config.py
# `fine_grained_activation_offloading`, `offload_modules`) copies each listed module's saved input
# to pinned host memory on a side stream in the forward and back in the backward. Achievable share
# of the PCIe link's per-direction rate for large pinned copies: ~0.8 (NVIDIA CUDA samples
# `bandwidthTest` reports ~52-55 GB/s pinned D2H on a Gen5 x16 link of 64 GB/s per direction).
PCIE_ACHIEVABLE_FRACTION = 0.8

# ---- kernels outside the GEMM / attention tables, priced per kernel (issue 22 item 4) ---------------
# Every kernel pays, on the GPU, a fixed slot beyond its work: grid launch, ramp-up and tail of a
# kernel in a stream. ~3 us: the launch-to-launch time of back-to-back null kernels on recent GPUs
# and drivers (NVIDIA developer forum, "Too much time for kernel launch latency",
# forums.developer.nvidia.com/t/233645, reply 3: "about 3 microseconds ... a new speed of light").
# The byte terms (bytes / `membw`) and the GEMM tables (a roofline fitted to DeepGEMM's kernel
# durations, `build_default_tables`) have no such term, so every kernel `cost_model.nongemm`
# counts is charged it once (`nongemm.latency`).
KERNEL_LATENCY_S = 3e-6
# Forward kernels per op of megatron-core 0.16.1's TransformerEngine layer spec (backward launches
# twice as many, KERNEL_PASSES); design choice, counted from the module structure, each op in its
# own function of `cost_model.nongemm` (which cites the modules):
KERNELS_NORM = 1              # TE RMSNorm / LayerNorm (fused into LayerNormLinear or standalone)
KERNELS_ROPE = 2              # TE fused RoPE, one kernel per rotated tensor (q, k); eager: KERNELS_ROPE_EAGER each
KERNELS_RESIDUAL = 1          # bias-dropout-add after the attention / MLP block
KERNELS_ROUTER_SCORE = 5      # fp32 input cast, softmax/sigmoid, top-k, routing-map scatter, prob gather/normalise
KERNELS_ROUTER_GROUP = 3      # group-limited routing (DeepSeek): group scores, group top-k, mask
KERNELS_AUX_LOSS = 5          # load-balancing loss: tokens per expert, prob sums, product, scale, tracker copy
# the same under router_fusion (TE PR 1883; megatron-core 0.16.1 router.py with fused=True): the fp32
# input cast and one fused score / (group-limited) top-k / routing-map kernel; the aux loss as TE's
# fused scores-for-aux-loss and fused aux-loss kernels beside the tokens-per-expert sum and the
# tracker copy. 13 -> 6 forward kernels for DeepSeek-V3's router (Megatron-LM's DeepSeek-V3 GB200
# notes count 72 -> 31 for fwd + bwd with their extra kernels: the same 0.43)
KERNELS_ROUTER_FUSED = 2
KERNELS_AUX_LOSS_FUSED = 4
KERNELS_PREPROCESS = (5, 2, 3, 3)  # per dispatcher code: alltoall (counts, all-to-all of counts, D2H, cumsums),
#                                    allgather (counts, D2H), flex DeepEP / HybridEP (metadata, notify, D2H)
# drop-and-pad (a capacity factor with padding): the alltoall dispatcher knows every size in advance
# (token_dispatcher.py preprocess under drop_and_pad: no counts, no all-to-all of counts, no D2H;
# one device fill of the per-expert counts); HybridEP keeps its metadata and notify kernels, not the D2H
KERNELS_PREPROCESS_DROP_PAD = (1, 2, 3, 2)
# token drop (any capacity factor): moe_utils.apply_router_token_dropping after the top-k: top-k over
# the token dimension per expert (a transposed copy and the radix select), zeros, scatter of the kept
# indices, the bool mask, the masked routing map, probabilities x mask
KERNELS_TOKEN_DROP = 6
# its bytes per router score (one fp32 [tokens, experts] element): forward transpose 8, select 8,
# zeros 4, bool 5, map 2, multiply 9; backward the multiply's gradient 9
TOKEN_DROP_FWD_BYTES_PER_SCORE = 36.0
TOKEN_DROP_BWD_BYTES_PER_SCORE = 9.0
KERNELS_PERMUTE = 4           # permute (index sort + gather) and unpermute (weighted scatter-add); none
#                               under HybridEP, which permutes inside its dispatch / combine kernels
# the same two ops unfused (permute_fusion=0; megatron-core 0.16.1 moe_utils.permute / unpermute, the
# dropless path with probabilities): permute = routing-map transpose, arange, masked_select of the token
# indices, probabilities transpose + masked_select, index_select; unpermute = probabilities and
# routing-map transposes, masked_select, multiply, zeros, scatter_add; a masked_select is ~3 kernels
# (mask count, scan, select: ATen's nonzero-based masked_select) and one device-to-host sync of its size
KERNELS_PERMUTE_UNFUSED = 18
PERMUTE_UNFUSED_SYNCS = 3     # the three masked_selects' device-to-host syncs per MoE layer forward
KERNELS_EP_COMM = 2           # dispatch + combine kernels (NCCL all-to-all, DeepEP / HybridEP, all-gather/RS)
KERNELS_ACTIVATION = 1        # fused (Sw)iGLU per activation call
KERNELS_GEMM_ATTENTION = 2    # QKV and output projection GEMMs (MLA: its 5 projections)
KERNELS_GEMM_ATTENTION_MLA = 5
KERNELS_CORE_ATTENTION = 1    # cuDNN / flash fused attention
KERNELS_GEMM_ROUTER = 1
# Whether an expert GEMM is one kernel: TE GroupedLinear launches one cuBLAS GEMM per local expert
# (over 4 streams; common/gemm/cublaslt_gemm.cu multi_stream_cublas_gemm) on Hopper and for fp8
# everywhere; Blackwell bf16 runs one cuBLASLt grouped GEMM (docs/DESIGN.md, issue 10 notes). The
# per-expert GEMMs go round-robin over TE's compute streams (transformer_engine/common/util/
# multi_stream.cpp num_compute_streams = 4), so their fixed device slots overlap that many ways; the
# host still launches each one.
TE_GEMM_STREAMS = 4

# ---- wgrad into fp32 main grads ------------------------------------------------------------------
# Megatron's gradient_accumulation_fusion: the weight-gradient GEMM accumulates into the main_grad
# buffer (beta = 1; TE `fuse_wgrad_accumulation`), so per weight element and microbatch it reads
# and writes the main grad (2 x grad bytes) where a plain bf16 GEMM output writes 2 B: the extra
# HBM bytes are priced memory-bound at the `membw` "elementwise" rate (megatron-core
# tensor_parallel/layers.py LinearWithGradAccumulationAndAsyncCommunication, main_grad dtype fp32
# with grad_reduce_in_fp32, else the param dtype). Added to the GEMM's table time, not folded into
# its roofline: an upper bound where the accumulate epilogue overlaps the next tile's main loop.
WGRAD_OUTPUT_BYTES = 2.0

# ---- HBM traffic of overlapped communication ------------------------------------------------------
# A communication kernel beside compute reads what it sends and writes what it receives from HBM,
# so while it runs the compute's memory-bound kernels have the rest of the bandwidth: per GPU, 2 x
# the payload over the communication's duration (design choice: send and receive volumes taken
# equal, as they are under balanced routing and for ring collectives).
COMM_HBM_BYTES_PER_PAYLOAD = 2.0

# ---- SMs held by hidden pipeline p2p ------------------------------------------------------------------
# The interleaved schedule overlaps its stage-boundary send/recv with the next chunk's compute
# (megatron-core 0.16.1 schedules.py forward_backward_pipelining_with_interleaving, overlap_p2p_comm);
# NCCL runs a p2p on its own channels, one CTA (SM) each: NCCL_NCHANNELS_PER_NET_PEER defaults to 2
# over the network, and an NVLink peer gets 2 x max(1, path bw / link bw) (NCCL src/graph/paths.cc
# ncclTopoGetNchannels; the floor of 2 used for both). A stage exchanges with two neighbours at once
# (send_forward_recv_backward / send_backward_recv_forward, p2p_communication.py), so 2 peers x 2.
P2P_CHANNELS_PER_PEER = 2
P2P_PEERS = 2

# ---- host time of one launch issued from C++ -----------------------------------------------------------
# A kernel launched from a C++ loop (TE GroupedLinear's per-expert GEMMs and quantizers) costs the
# host the CUDA launch call alone, not a PyTorch-level op: 3.8 us per cudaLaunchKernel /
# cudaLaunchKernelExC on average over the compute phases of DeepSeek's public training trace
# (github.com/deepseek-ai/profile-data train.json, H800 host, CUPTI tracing on: 3.1-4.0 us by phase;
# `python bench/trace_host_idle.py train.json`). The per-op host time of everything else is the
# `dispatch_gap` table (shipped: cost_model/build_default_tables.py HOST_US_PER_LAUNCH).
LAUNCH_API_S = 3.8e-6
