"""The GPU kernels one decoder layer launches in an SGLang 0.5.23 forward step, by architecture, GPU
family and kernel path: how many the step prices by their work (GEMMs, attention, collectives),
each then lasting at least a kernel's minimum duration, and how many do almost no work (norms,
rope, KV writes, routing, activation quantization, ...) and cost that minimum alone.

A decode step at a small batch is made of these floors (constants.KERNEL_MIN_S each), so the count
decides it: a GQA layer (Qwen3-MoE, GPT-OSS) launches 12-15 kernels, an MLA layer of DeepSeek-V3
23-30. Counted from the installed SGLang 0.5.23 source for one CUDA-graph decode step at batch 1,
tensor parallel in one node, default flags (file:line below are sglang/srt/...):

- Both: the two tensor-parallel all-reduces (priced by their latency tables), each followed by a
  residual add + RMSNorm kernel, or with FlashInfer all-reduce fusion (specs.serve_resolve
  .allreduce_fusion; arg_groups/overrides.py:929-1002) one kernel doing all three
  (layers/layernorm.py:248).
- GQA attention (models/qwen3_moe.py, models/gpt_oss.py): qkv_proj and o_proj GEMMs; the q/k
  RMSNorm in one kernel where the model has it (models/utils.py:523, fused_inplace_qknorm; the
  fused qk-norm + rope is off on CUDA, arg_groups/fields/exec_.py:424-433); rope, which also writes
  K/V into the paged cache (layers/rotary_embedding/base.py:468 run_rope_store), except under the
  hybrid sliding-window pool of sink models (GPT-OSS: models/utils.py:296-303), whose store is a
  kernel of its own (mem_cache/memory_pool.py:176); one attention kernel (trtllm_mha on Blackwell,
  attention/trtllm_mha_backend.py:1511), FA3 on Hopper with its split combine (or its semaphore
  zero) beside it (attention/flashattention_backend.py:2285); with attention biases, the bias copy
  PyTorch's addmm makes at one row (cuBLASLt's bias epilogue needs M > 1) for qkv_proj, and for
  o_proj on TP rank 0, which adds it (layers/linear.py:1762) and which every rank waits for.
- MLA attention (models/deepseek_v2.py, forward_mla.py): fused_qkv_a, q_b_proj, the absorbed
  torch.bmm with w_kc and with w_vc, o_proj (five GEMMs); q_a_layernorm (kv_a_layernorm runs on the
  alternate stream, forward_mla.py:353-359); rope (forward_mla.py:611; fused into the KV write only
  with an fp8 KV cache on Blackwell, trtllm_mla_backend.py:1245-1275); the KV write (Hopper
  memory_pool.py:4936, Blackwell set_mla_kv_concat_q); FA3's MLA path adds its
  prepare_varlen_num_blocks and split combine around the attention kernel on Hopper
  (flashattention_backend.py:2366, 2455).
- Quantized linears (fp8 block, NVFP4 checkpoints): one per-token-group activation quantization
  kernel before each GEMM (layers/quantization/fp8_utils.py:1566, not fused into the norm).
- MoE block: the router gate GEMM (tiny); then by runner (`kernel_path.moe_path`):
  Triton fused_moe (Hopper; layers/moe/moe_runner/triton_utils/fused_moe.py): top-k
  (layers/moe/topk.py:1301, or FlashInfer's fused_topk_deepseek, topk.py:2052), align
  (moe_align_block_size.py:153), the two GEMMs, silu_and_mul, moe_sum_reduce, and with fp8 weights
  the two activation quantizations; with DeepSeek's shared expert fused in as one more expert, two
  F.pad (a fill and a copy each) and a torch.cat append it to the top-k (topk.py:2067-2068, 2611).
  FlashInfer trtllm-gen (Blackwell; moe_runner/flashinfer_trtllm.py): top-k bypassed into the
  call (topk.py:613-650, 793-803), the input quantized where the experts are (fp8 / MXFP8 / FP4),
  routing (one kernel for renormalized top-k, two for DeepSeek's grouped top-k,
  routing_deepseek.cu:572, 595), the two GEMMs, a separate activation only for DeepSeek's fp8
  block path (runner .cu:566-568; fused for bf16, MXFP4 and FP4), finalize.
  Under a DeepEP all-to-all (the DeepGEMM grouped runner; not counted from the source) the
  Triton list stands in, its dispatch and combine priced as communication.
  A shared expert that is not fused into the routed kernel runs gate_up, silu_and_mul and down
  (plus its two quantizations) on the alternate stream during a captured decode
  (`step.shared_on_side_stream`) or on the main one, and one add joins it (deepseek_v2.py:1286).
- A dense layer's MLP: gate_up, silu_and_mul, down (plus two quantizations where quantized).

Used for GQA layers on GPUs. MLA layers keep the generic count of constants.KERNELS_PER_LAYER
(`GenericLayer`): their own list above (23 kernels of a MoE layer on B200, 30 on H200) at the kernel
minimum overshoots every public DeepSeek TPOT on H200 by 20-36% (bench/serving_public_rows.py), and
which of the two is wrong for that graph (the count for the measured SGLang versions, or the cost of
a kernel chained by programmatic dependent launch) needs a GPU trace. CPU devices (vLLM's eager
torch ops, not SGLang's CUDA kernels) keep the generic count too.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_model.serving.constants import KERNELS_PER_LAYER, NORMS_PER_LAYER, PRICED_KERNELS, SMALL_KERNELS_PER_LAYER


@dataclass(frozen=True)
class LayerKernels:
    """Kernels of one layer, per plan. `proj`, `core`, `experts`, `shared`, `dense_mlp`: the priced
    kernels of each part (each floored at a kernel's minimum); `collectives`: the two all-reduces
    (or the attention-DP gather / scatter), priced by their own tables; `small_attn` (every layer),
    `small_moe` (MoE layers), `small_dense` (dense layers): the kernels that do almost no work, on
    the main stream; `shared_main`: the shared expert's GEMMs that run on the main stream."""
    proj: np.ndarray
    core: np.ndarray
    experts: np.ndarray
    shared: np.ndarray
    shared_main: np.ndarray
    dense_mlp: np.ndarray
    collectives: np.ndarray
    small_attn: np.ndarray
    small_moe: np.ndarray
    small_dense: np.ndarray

    def per_step(self, layers, moe_layers, dense_layers) -> tuple[np.ndarray, np.ndarray]:
        """(priced, small) kernels of `layers` layers on the main stream, `moe_layers` and
        `dense_layers` of them MoE and dense."""
        priced = (self.proj + self.core + self.collectives) * layers + (self.experts + self.shared_main) * moe_layers \
            + self.dense_mlp * dense_layers
        small = self.small_attn * layers + self.small_moe * moe_layers + self.small_dense * dense_layers
        return priced, small


def _full(n, v) -> np.ndarray:
    return np.full(n, float(v))


@dataclass(frozen=True)
class GenericLayer(LayerKernels):
    """The generic layer of constants.KERNELS_PER_LAYER (CPU devices; MLA models, module doc). Its
    floors are the constants' groups; its count is the constants' whole layer in every layer (a dense
    layer launches the MoE layer's kernels too), less the shared expert's GEMMs where the routed
    kernel runs it, and its small kernels less the two norms under all-reduce fusion (`small_attn`)."""

    def per_step(self, layers, moe_layers, dense_layers) -> tuple[np.ndarray, np.ndarray]:
        priced = ((KERNELS_PER_LAYER - SMALL_KERNELS_PER_LAYER) * layers
                  - (self.shared - self.shared_main) * moe_layers)
        return priced, self.small_attn * layers


def generic(n: int, shared_fused, ar_fusion) -> GenericLayer:
    """The generic layer (`GenericLayer`) for `n` plans: `shared_fused`, `ar_fusion` per plan."""
    p = PRICED_KERNELS
    small = SMALL_KERNELS_PER_LAYER - np.where(np.asarray(ar_fusion, bool), NORMS_PER_LAYER, 0)
    return GenericLayer(_full(n, p["attention_proj"]), _full(n, p["attention_core"]), _full(n, p["experts"]),
                        _full(n, p["mlp"]), np.where(np.asarray(shared_fused, bool), 0.0, p["mlp"]), _full(n, p["mlp"]),
                        _full(n, p["collectives"]), np.broadcast_to(small, (n,)).astype(float), _full(n, 0.0),
                        _full(n, 0.0))


def layer_kernels(spec, *, hopper: bool, blackwell: bool, n: int, ar_fusion, moe_kernel, shared_fused,
                  side_stream, kv_bytes, weights: str, lin_quant: bool) -> LayerKernels:
    """The SGLang 0.5.23 kernels of one layer of `spec` on a GPU (module doc), per plan.

    Args:
        hopper / blackwell: the GPU family (FA3 / trtllm attention; Triton / trtllm-gen MoE).
        n: plans; ar_fusion, moe_kernel, shared_fused, side_stream, kv_bytes: per plan (FlashInfer
            all-reduce fusion on; the routed experts' kernel path; shared expert fused into it; shared
            expert on the alternate stream; bytes of a KV element).
        weights: the routed experts' weight format (bf16, fp8, mxfp4, nvfp4).
        lin_quant: the other linears quantize their activations (fp8 / FP4 checkpoints).
    """
    ar_fusion = np.asarray(ar_fusion, bool)
    norms = np.where(ar_fusion, 0.0, float(NORMS_PER_LAYER))
    lq = 1.0 if lin_quant else 0.0
    # -- attention block
    if spec.mla:
        proj = 5.0  # fused_qkv_a, q_b_proj, bmm w_kc, bmm w_vc, o_proj
        fp8_kv_fused_rope = blackwell & (np.asarray(kv_bytes, float) < 2)
        small_attn = (1.0  # q_a_layernorm (kv_a_layernorm on the alternate stream)
                      + np.where(fp8_kv_fused_rope, 0.0, 1.0)  # rope
                      + 1.0  # KV write (Blackwell: with the q concatenation)
                      + 3.0 * lq  # activation quantization before fused_qkv_a, q_b_proj, o_proj
                      + (2.0 if hopper else 0.0))  # FA3 MLA: prepare_varlen_num_blocks, split combine
    else:
        proj = 2.0  # qkv_proj, o_proj
        sink_pool = bool(spec.window_size) and bool(getattr(spec, "attention_sinks", False))
        small_attn = ((1.0 if spec.qk_layernorm else 0.0)  # q/k RMSNorm in one kernel
                      + 1.0  # rope (with the K/V store into the paged cache)
                      + (1.0 if sink_pool else 0.0)  # the K/V store apart under the hybrid SWA pool
                      + (2.0 if spec.attention_bias else 0.0)  # addmm's bias copies (qkv; o_proj on rank 0)
                      + 2.0 * lq  # activation quantization before qkv_proj, o_proj
                      + (1.0 if hopper else 0.0))  # FA3's split combine / semaphore zero
    small_attn = small_attn + norms
    # -- MoE block
    mk = np.asarray(moe_kernel)
    trtllm = mk == "flashinfer_trtllm"
    quant_experts = weights != "bf16"
    grouped_topk = (getattr(spec, "moe_router_num_groups", 0) or 0) > 1
    shared_fused = np.asarray(shared_fused, bool)
    has_shared = bool(spec.moe_shared_expert_count)
    tri = (1.0  # top-k
           + 1.0 + 1.0 + 1.0  # align, silu_and_mul, moe_sum_reduce
           + (2.0 if weights == "fp8" else 0.0)  # W8A8 block: the input's and the intermediate's quantization
           + np.where(shared_fused, 5.0, 0.0))  # two F.pad (fill + copy each) and a cat append the shared expert
    trt = ((1.0 if quant_experts else 0.0)  # the input quantized to the experts' format
           + (2.0 if grouped_topk else 1.0)  # routing
           + (1.0 if weights == "fp8" else 0.0)  # DeepSeek fp8 block: the activation apart
           + 1.0)  # finalize
    shared_sep = has_shared & ~shared_fused
    side = np.asarray(side_stream, bool) & shared_sep
    small_moe = (1.0  # router gate GEMM
                 + np.where(trtllm, trt, tri)
                 + np.where(shared_sep, 1.0, 0.0)  # routed + shared
                 + np.where(shared_sep & ~side, 1.0 + 2.0 * lq, 0.0))  # the shared expert's activation (+ quants)
    shared = np.where(shared_sep, 2.0, 0.0)
    # -- dense layers: gate_up, silu_and_mul, down
    small_dense = _full(n, 1.0 + 2.0 * lq)
    return LayerKernels(_full(n, proj), _full(n, 1.0), _full(n, 2.0), shared, np.where(side, 0.0, shared),
                        _full(n, 2.0), _full(n, 2.0), np.broadcast_to(small_attn, (n,)).astype(float),
                        np.broadcast_to(small_moe, (n,)).astype(float), small_dense)
