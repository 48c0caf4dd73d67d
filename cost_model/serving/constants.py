"""Assumed constants of the serving cost model, each with why it has this value. Every hardware
rate comes from the shared tables (`cost_model.tables`); these are the few software facts the
tables do not hold."""

# Kernels one decoder layer launches in one forward pass (attention: norm, qkv/MLA projections,
# rope, KV write, attention, o-proj; MoE: norm, router, top-k, dispatch/permute, 2 grouped GEMMs,
# activation, combine/unpermute, shared expert). Assumed from the op list of SGLang's DeepSeek /
# Qwen3-MoE forward; prices the eager CPU-launch floor and the GPU gap between kernels.
KERNELS_PER_LAYER = 22

# GPU idle time between two kernels that are already queued (or captured in a CUDA graph):
# assumed 1.5 us, the usual figure for back-to-back launches on Hopper.
GPU_KERNEL_GAP_S = 1.5e-6

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
