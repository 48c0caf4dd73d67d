"""What cannot run on CPU with this stack (torch CPU build, megatron-core 0.16.1, no
TransformerEngine, no apex, no grouped_gemm, no DeepEP), established by running each feature
through the Megatron trial backend on tiny-moe (2 ranks, gloo). The evidence column quotes the
error megatron-core (or our own check) raised. `specs.stack.cpu_profile` turns it into
rejection rules, and the trial backend refuses the same plans on a machine without CUDA
(`trials.megatron.spec_choice.layer_spec_choice`), so the plan space and the CPU backend agree.
"""
from __future__ import annotations

# code -> (sentence, evidence)
CPU_UNSUPPORTED: dict[str, tuple[str, str]] = {
    "grouped_gemm": (
        "grouped GEMM experts need CUDA kernels (TE GroupedLinear or the grouped_gemm package)",
        "GroupedMLP: 'Grouped GEMM is not available. Please run pip install ...grouped_gemm'"),
    "permute_fusion": (
        "fused token permutation (--moe-permute-fusion) needs TransformerEngine's fused permute kernels",
        "TransformerConfig: 'fused permutation is not available. Please install TE >= 2.1.0.'"),
    "router_fusion": (
        "the fused router (--moe-router-fusion) needs TransformerEngine's fused top-k kernels",
        "moe_utils.topk_routing_with_score_function: 'fused_topk_with_score_function is not available. "
        "Please install TE >= 2.7.0.'"),
    "tp_sequence_parallel": (
        "TP>1 with MoE requires sequence parallelism, whose norms need TE/apex (torch norm refuses SP)",
        "WrappedTorchNorm: 'sequence parallel not supported by torch LayerNorm'"),
    "context_parallel": (
        "context parallelism (CP>1) is only implemented by TEDotProductAttention",
        "SelfAttention: 'Context parallelism is only supported by TEDotProductAttention!'"),
    "flex_dispatcher": (
        "the flex dispatcher needs DeepEP or HybridEP CUDA kernels",
        "MoEFlexTokenDispatcher: 'DeepEP is not installed'"),
    "dist_opt": (
        "Megatron's DistributedOptimizer allocates CUDA buffers; CPU trials use torch Adam over "
        "param.main_grad, which needs the full (all-reduced) gradient",
        "with use_distributed_optimizer=True the DDP buffer is only reduce-scattered: an Adam step "
        "over it diverges (loss 6.164 vs 6.169 at step 2 on tiny-moe)"),
    "overlap_param_gather": (
        "parameter all-gather overlap belongs to the distributed optimizer (unsupported on CPU)",
        "requires dist_opt"),
    "fp8": (
        "FP8 recipes need TransformerEngine and FP8 tensor cores",
        "TransformerConfig: TypeError comparing TE version None (TE absent)"),
    "a2a_overlap": (
        "EP all-to-all overlap (overlap_moe_expert_parallel_comm) needs bf16/fp16 and CUDA streams; "
        "CPU trials run fp32",
        "TransformerConfig: 'overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 model'"),
    "recompute_moe_act": (
        "selective recompute of moe_act is only supported with grouped GEMM",
        "TransformerConfig: 'moe_act in recompute_modules is only supported with moe_grouped_gemm.'"),
    "fsdp": (
        "Megatron FSDP (--use-megatron-fsdp): the trial backend wraps the model in megatron-core's DDP, "
        "not its FullyShardedDataParallel, and FSDP needs the distributed optimizer (unsupported on CPU)",
        "our own check: trials/megatron/worker.py builds DistributedDataParallel"),
    "recompute_layernorm": (
        "selective recompute of layernorm uses CheckpointWithoutOutput, which calls TE's FP8 state",
        "tensor_parallel/random.py: NameError 'FP8GlobalStateManager' without TE"),
}

# Supported on CPU and exercised by tests: DP, EP (alltoall, allgather), PP with and without VPP,
# uneven first/last stages, mbs, recompute none/full(uniform|block)/selective(core_attn, mlp,
# moe, shared_experts), overlap_grad_reduce (gloo async all-reduce; CUDA streams are no-ops),
# shared experts with shared_expert_overlap. Precision: CPU trials run fp32 (bf16 plans measured
# in fp32; the measurement is of the schedule, not of bf16 kernels).


def cpu_rejections(plan, model=None) -> list[tuple[str, str]]:
    """(code, sentence) for every feature of `plan` that cannot run on CPU; [] = runnable."""
    out = []

    def add(code):
        out.append((code, CPU_UNSUPPORTED[code][0]))

    is_moe = model is None or getattr(model, "is_moe", True)
    if plan.grouped_gemm and is_moe:
        add("grouped_gemm")
    if getattr(plan, "permute_fusion", False) and is_moe:
        add("permute_fusion")
    if getattr(plan, "router_fusion", False) and is_moe:
        add("router_fusion")
    if plan.tp > 1:
        add("tp_sequence_parallel")
    if plan.cp > 1:
        add("context_parallel")
    if plan.dispatcher == "flex" and is_moe:
        add("flex_dispatcher")
    if plan.dist_opt:
        add("dist_opt")
    if plan.overlap_param_gather:
        add("overlap_param_gather")
    if getattr(plan, "fsdp", False):
        add("fsdp")
    if plan.fp8:
        add("fp8")
    if plan.a2a_overlap and is_moe:
        add("a2a_overlap")
    if plan.recompute == "selective":
        if "moe_act" in plan.recompute_modules:
            add("recompute_moe_act")
        if "layernorm" in plan.recompute_modules:
            add("recompute_layernorm")
    return out


def cpu_rejection_rules() -> list[tuple]:
    """(code, sentence, predicate(plan, model) -> bool) per unsupported feature, the form
    `specs.stack.cpu_profile` consumes."""
    rules = []
    for code, (sentence, _evidence) in CPU_UNSUPPORTED.items():
        def pred(plan, model, _code=code):
            return any(c == _code for c, _ in cpu_rejections(plan, model))
        rules.append((f"cpu-{code}", sentence, pred))
    return rules
