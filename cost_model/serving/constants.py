"""Assumed constants of the serving cost model, each with why it has this value. Every hardware
rate comes from the shared tables (`cost_model.tables`); these are the few software facts the
tables do not hold."""

# Kernels of the generic decoder layer in one forward pass (attention: norm, qkv/MLA projections,
# rope, KV write, attention, o-proj; MoE: norm, router, top-k, dispatch/permute, 2 grouped GEMMs,
# activation, combine/unpermute, shared expert). Assumed; prices the eager CPU-launch floor and the
# GPU gap between kernels of CPU devices and of MLA models. A GPU step of a GQA model counts
# SGLang 0.5.23's own kernels instead (`layer_kernels`: 12-15 a layer); MLA's own count there
# (23-30) at KERNEL_MIN_S each overshoots every public DeepSeek TPOT on H200 by 20-36%
# (bench/serving_public_rows.py), so a kernel in that graph costs less than the minimum below or the
# measured SGLang versions launch fewer; until a GPU trace of the decode graph settles which, MLA
# keeps this generic layer, against which those public rows were checked.
KERNELS_PER_LAYER = 22

# GPU idle time between two kernels that are already queued (or captured in a CUDA graph):
# assumed 1.5 us, the usual figure for back-to-back launches on Hopper.
GPU_KERNEL_GAP_S = 1.5e-6

# Minimum duration of one GPU kernel in a step, back to back (gap included): a kernel with almost
# no work still pays its launch ramp, one HBM round trip and its tail. Public figures for the
# smallest kernels of a decode layer: RMSNorm with residual at DeepSeek's hidden 7168, batch 1-2,
# replayed from a CUDA graph, 5.2 us on H100 (vllm-project/vllm PR #36899, FlashInfer column);
# RMSNorm 1 x 4096 bf16, 6.1 us on H100 and 6.4 us on B200 (linkedin/Liger-Kernel PR #1462).
# Taken as 5 us on every GPU. Small decode batches are bound by it (floor x kernels x layers).
# The same figure from a whole step: in DeepSeek's public H800 training trace (deepseek-ai/profile-data
# train.json, kernels queued ahead of the GPU) the 254 kernels of <= 4 us that run right behind another
# last a median 3 us, 5 us with the gap before each (`python bench/trace_host_idle.py train.json`).
KERNEL_MIN_S = 5e-6

# Of KERNELS_PER_LAYER, the kernels the step prices by their work (each then floored at
# KERNEL_MIN_S): attention projections (MLA: q_a, q_b, kv_a, o; GQA: qkv, o and the rest fused),
# the attention kernel, the dense/shared MLP's two GEMMs, the routed experts' two grouped GEMMs,
# two collectives (priced by their own latency tables). The others (norms, rope, KV write, router,
# top-k, activation, permute/unpermute, quantize) do almost no work and cost KERNEL_MIN_S each.
PRICED_KERNELS = {"attention_proj": 4, "attention_core": 1, "mlp": 2, "experts": 2, "collectives": 2}
SMALL_KERNELS_PER_LAYER = KERNELS_PER_LAYER - sum(PRICED_KERNELS.values())
# Of the small kernels, the two RMSNorms of a layer (input and post-attention, each SGLang's fused
# residual-add + RMSNorm). Where SGLang turns FlashInfer all-reduce fusion on
# (specs.serve_resolve.allreduce_fusion) each runs inside the tensor-parallel all-reduce before it,
# one kernel (sglang layers/layernorm.py _forward_with_allreduce_fusion), so the layer launches
# two kernels fewer; the all-reduce keeps its price.
NORMS_PER_LAYER = 2

# Fixed cost of one request outside the GPU steps, added to its TTFT: HTTP handling, tokenization,
# the hop tokenizer -> scheduler, and streaming the first token back. Measured for SGLang with a
# mock model whose forward busy-waits 2.63 ms: median TTFT 9.54 ms at concurrency 1 for a 128-token
# prompt (tenstorrent/tt-inference-server issue #3560, tt-sglang-plugin CPU mock, TSU=380), i.e.
# ~6.9 ms beside the one forward. It runs in SGLang's tokenizer/detokenizer processes, apart from
# the scheduler, so it adds latency, not step time (throughput is unchanged).
REQUEST_FIXED_S = 6.9e-3
# Across nodes the first token is also gathered from the node that samples it: one more
# scale-out round trip, far below REQUEST_FIXED_S; not priced apart.

# CPU cost of scheduling one step when the overlap scheduler cannot hide it (SGLang disables it
# with pp > 1): assumed 2 ms (Python batch assembly per step).
SCHED_OVERHEAD_S = 2e-3

# Share of HBM bandwidth a memory-bound decode GEMM or attention kernel reaches is the table's
# membw "elementwise" rate (clusters/tables/<kind>/membw.csv); nothing assumed here.

# Activation bytes per prefill token per GPU, in units of hidden_size * 2 B: residual, normed
# input, attention output, gathered MoE input, routed copies (topk) and GEMM outputs of one layer
# at a time. Assumed; it only decides feasibility of very large chunks.
ACT_HIDDEN_MULT = 12

# SGLang caps the running requests of one scheduler (one attention-DP rank: each has its own) at
# its request-to-token pool when --max-running-requests is not given: model_runner's
# max_num_reqs = min(max(pool tokens / context_len * 512, 2048), 4096); the KV pool binds first at
# every context priced here, so the cap is 4096 per rank. A given flag is split over the ranks.
DEFAULT_MAX_RUNNING = 4096


# Bytes per weight of a serving checkpoint's weight format: (routed experts, the other linear layers
# of a transformer block: attention projections, dense MLP, shared expert). Embeddings and the LM
# head stay bf16 in every format here (serving.memory prices them apart).
# - fp8: e4m3, one fp32 scale per 128 x 128 block (+0.02%, dropped): DeepSeek-V3/R1, Kimi-K2.
# - mxfp4: OCP Microscaling MXFP4, 4-bit E2M1 elements with one 8-bit E8M0 scale per 32 (4.25 bits);
#   gpt-oss quantizes only its MoE experts (its config.json quantization_config
#   modules_to_not_convert: attention, router, embeddings, LM head), the rest is bf16.
# - nvfp4: NVIDIA NVFP4, 4-bit E2M1 with one FP8 E4M3 scale per 16 elements (4.5 bits) and an fp32
#   scale per tensor; NVIDIA's FP4 checkpoints (e.g. nvidia/DeepSeek-R1-0528-FP4, served by SGLang
#   with --quantization modelopt_fp4) quantize "the weights and activations of the linear operators
#   within transformer blocks" (their model cards).
# Memory and weight reads use these bytes; GEMM compute rates are the fp8 tables' for fp8-quantised
# linears, NVFP4's scaled on Blackwell by `nvfp4_gemm_time` below; gpt-oss's bf16 linears at the bf16
# table's, its MXFP4 experts at fp8 on Blackwell (MXFP8 activations) and as W4A16 (bf16 math) elsewhere
# (`step.StepModel.for_precision`).
WEIGHT_FORMAT_BYTES = {"bf16": (2.0, 2.0), "fp8": (1.0, 1.0), "mxfp4": (0.53125, 2.0), "nvfp4": (0.5625, 0.5625)}
# the serving precisions priced at the fp8 tables' GEMM rates with fp8 weights (training recipe names
# included: a serving plan priced beside a training precision)
FP8_PRECISIONS = ("fp8", "fp8-blockwise", "fp8-tensorwise", "fp8-delayed", "mxfp8")


# NVFP4 GEMMs on Blackwell's FP4 tensor cores against the fp8 ones the tables price, as a share of each
# format's dense peak. TransformerEngine's own GEMM benchmark on B300 (docs/examples/gemm_profiling/
# gemm_profiling.rst, model-config mode with --pre-quantize: hidden 4096, ffn 16384, 15,872 tokens, the
# GEMM kernels alone, fprop + dgrad + wgrad per layer): per-tensor FP8 6.812 ms, NVFP4 3.764 ms for the
# same FLOPs. At B300's dense peaks (4,500 fp8, 13,500 fp4 TFLOPS, clusters/b300.yaml) NVFP4 reaches
# (6.812 x 4,500) / (3.764 x 13,500) = 0.603 of the share of its peak that FP8 reaches: the fp4 kernel
# is held by what does not scale with the tensor-core rate (operand and scale loads, the epilogue).
# Other Blackwell parts keep that share at their own peaks (assumed: no second measurement), so a
# compute-bound GEMM takes fp8 time x (fp8 peak / fp4 peak) / 0.603: B300 and GB300 0.553 (B300 is the
# benchmark's ratio, 3.764 / 6.812), B200 and GB200 0.829. Memory-bound GEMMs (decode) are priced by
# their weight bytes, unchanged.
NVFP4_PEAK_SHARE_VS_FP8 = (6.812 * 4500.0) / (3.764 * 13500.0)


def nvfp4_gemm_time(cluster) -> float:
    """Compute-bound GEMM time of an NVFP4 checkpoint over the fp8 tables' time on `cluster`
    (`NVFP4_PEAK_SHARE_VS_FP8`): below 1 on GPUs with FP4 tensor cores (a datasheet fp4 peak above
    the fp8 one), else 1 (no FP4 path: NVFP4 weights are refused there, `tuner.space.serve_precision`)."""
    peaks = getattr(cluster, "peak_tflops", {}) or {}
    f4, f8 = float(peaks.get("fp4") or 0.0), float(peaks.get("fp8") or 0.0)
    if not (getattr(cluster, "is_gpu", False) and f4 > f8 > 0):
        return 1.0
    return min(1.0, f8 / f4 / NVFP4_PEAK_SHARE_VS_FP8)


def weight_format(precision: str) -> str:
    """The WEIGHT_FORMAT_BYTES key a serving precision prices its weights at (the fp8 tables' GEMM
    rates for every format but bf16). The one rule from a precision string to the step model."""
    if precision == "bf16" or precision in WEIGHT_FORMAT_BYTES:
        return precision
    if precision in FP8_PRECISIONS:
        return "fp8"
    raise ValueError(f"serving precision {precision!r}: not one of {', '.join((*WEIGHT_FORMAT_BYTES, *FP8_PRECISIONS))}")
