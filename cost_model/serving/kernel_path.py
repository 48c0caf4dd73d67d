"""Which GEMM kernels SGLang 0.5.x runs for a plan, and how fast each is next to the GEMM tables.

The shared GEMM tables hold one kernel family: fp8 is a tiled-roofline fit to DeepGEMM's H800 rows
(`cost_model/build_default_tables.py`), bf16 the cuBLAS-class MAMF rate. SGLang does not always run
those kernels; what it runs (source: sgl-project/sglang python/sglang/srt/):
- dense fp8 block-quantised linears (`layers/quantization/fp8_utils.py` dispatch_w8a8_block_fp8_linear,
  auto): DeepGEMM when `deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM` (sm >= 90 and SGLANG_ENABLE_JIT_DEEPGEMM,
  default true); else FlashInfer TRT-LLM groupwise on Blackwell, else CUTLASS
  (sgl-kernel fp8_blockwise_scaled_mm) on Hopper, else Triton w8a8_block_fp8_matmul.
- routed experts, fp8 block: a DeepEP all-to-all runs the DeepGEMM grouped runner (contiguous
  layout in normal mode, the DeepGEMM README's "grouped" rows); without an all-to-all
  (`moe_a2a_backend none`) the MoE runner `auto` stays the Triton fused_moe kernel on Hopper, and on
  sm100 becomes flashinfer_trtllm for DeepSeek-V3 / Qwen3-MoE fp8 (`server_args.py`,
  "Use flashinfer_trtllm as MoE runner backend on sm100").
- bf16: cuBLAS for dense linears (the bf16 table), Triton fused_moe for experts, except Qwen3-MoE on
  sm100 without an all-to-all, whose model override sets the MoE runner to flashinfer_trtllm for
  bf16, fp8 and FP4 checkpoints alike (`arg_groups/model_overrides/qwen3_moe.py:76-86`).

Efficiency of each path relative to the table's kernel, from public same-GPU comparisons
(cost_model/data/fp8_block_gemm_kernel_paths.csv, DeepSeek-V3 shapes at prefill-sized m >= 1024):
the geometric mean of t(DeepGEMM) / t(path). The routed experts' Triton fused_moe at fp8 is
measured as itself (cost_model/data/fused_moe_prefill_latency.csv: the whole fused-MoE call at
1024-4096 tokens on H100): below the table's rate wherever the table is slower, and never above a
ceiling of its own (`step.fused_moe_fp8_peak_fraction`) on the rows it computes, each expert's
padded to the kernel's row tile (moe_align_block_size; `StepModel.expert_flops`). With the step
model's own memory-bound pieces (activation, casts, top-k sum) taken out, the measured call's GEMMs
run at 235-242 TFLOPS on those padded rows from 64 to 256 rows per expert (160 -> 216 on the routed
rows alone), flat where the table (DeepGEMM-grade) climbs from 283 to 667, so the kernel's own
throughput, not the table's shape curve, bounds prefill-sized calls. The ceiling is the highest
padded net rate measured, as a fraction of that GPU's dense fp8 peak; assumed to carry over to
other Hopper parts as that fraction. It replaces the assumption that fused_moe shares the dense
Triton block-fp8 matmul's ratio (~0.53 of the table at every shape).
- FlashInfer TRT-LLM (Blackwell, DeepGEMM JIT off) and bf16 Triton fused_moe: no public
  prefill-size comparison found; priced at the table's rate (ratio 1).
The ratio divides the table's GEMM time (`StepModel._gemm` / `_experts`); the weight-read floor
beside it (and the decode expert bandwidth of `fused_moe`, itself measured on the Triton kernel)
is unchanged, so small decode batches stay bandwidth-priced and prefill-sized GEMMs take the ratio.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from clusters import is_blackwell, is_hopper

DATA = Path(__file__).resolve().parent.parent / "data" / "fp8_block_gemm_kernel_paths.csv"
PREFILL_MIN_M = 1024  # rows of a prefill-sized GEMM: smaller m is bound by the weight read
_RATIO: dict | None = None


def path_ratios() -> dict[str, float]:
    """{path: geometric mean of t(DeepGEMM) / t(path)} over the measured prefill-sized rows."""
    global _RATIO
    if _RATIO is None:
        rows = [r for r in csv.DictReader(DATA.open()) if int(r["m"]) >= PREFILL_MIN_M]
        dg = np.array([float(r["deep_gemm_us"]) for r in rows])
        _RATIO = {"deep_gemm": 1.0}
        for path in ("cutlass", "triton"):
            t = np.array([float(r[f"{path}_us"]) for r in rows])
            _RATIO[path] = float(np.exp(np.mean(np.log(dg / t))))
    return _RATIO


def dense_path(cluster, fp8: bool, deepgemm_jit: bool = True) -> str:
    """The kernel SGLang runs for a dense (attention, shared-expert, dense-MLP) linear."""
    if not fp8:
        return "cublas"
    if deepgemm_jit and (is_hopper(cluster) or is_blackwell(cluster)):
        return "deep_gemm"
    if is_blackwell(cluster):
        return "flashinfer_trtllm"
    return "cutlass" if is_hopper(cluster) else "triton"


# architectures whose MoE runner SGLang 0.5.23 sets to flashinfer_trtllm on sm100 without an
# all-to-all whatever the checkpoint's format, bf16 included (module doc)
TRTLLM_BF16_MOE_ARCHS = frozenset({"Qwen3MoeForCausalLM"})


def moe_path(cluster, fp8: bool, a2a: bool, deepgemm_jit: bool = True, arch: str | None = None) -> str:
    """The kernel SGLang runs for the routed experts (`a2a`: a DeepEP-like all-to-all backend;
    `arch`: the model's architecture, `specs.hf_export.pick_architecture`)."""
    if not fp8:
        if arch in TRTLLM_BF16_MOE_ARCHS and not a2a and is_blackwell(cluster):
            return "flashinfer_trtllm"
        return "triton_fused_moe"
    if a2a and deepgemm_jit:
        return "deep_gemm"
    if is_blackwell(cluster):
        return "flashinfer_trtllm"
    return "triton_fused_moe"


def deepep_normal_fp8_wire(cluster, fp8: bool, deepgemm_jit: bool = True) -> bool:
    """Whether DeepEP's normal-mode dispatch carries fp8 tokens (1 B + a 4-B scale per 128): SGLang
    0.5.x quantizes before that dispatch only `if deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM and
    self.use_fp8` (layers/moe/token_dispatcher/deepep.py `_DeepEPDispatcherImplNormal.dispatch_a`),
    so with DeepGEMM's JIT off (or on a GPU it does not support) the hidden states go as bf16. The
    low-latency kernels take `use_fp8` alone (fp8 either way)."""
    return bool(fp8 and dense_path(cluster, fp8, deepgemm_jit) == "deep_gemm")


def paths(cluster, fp8: bool, a2a: bool, deepgemm_jit: bool = True, dense_fp8: bool | None = None,
          arch: str | None = None) -> dict[str, str]:
    """{"dense": path, "experts": path} of one plan, as a prediction reports them (CPU: "cpu");
    `dense_fp8`: whether the non-expert linears run fp8 where it differs from the experts (gpt-oss's
    bf16 linears beside MXFP4 experts; default: as `fp8`); `arch`: the model's architecture (the
    MoE runner can depend on it, `moe_path`)."""
    if not getattr(cluster, "is_gpu", True):
        return {"dense": "cpu", "experts": "cpu"}
    dense = fp8 if dense_fp8 is None else dense_fp8
    return {"dense": dense_path(cluster, dense, deepgemm_jit), "experts": moe_path(cluster, fp8, a2a, deepgemm_jit, arch)}


# path -> the measured path whose ratio it takes (None: the table's own rate)
_RATIO_OF = {"deep_gemm": "deep_gemm", "cutlass": "cutlass", "triton": "triton",
             "triton_fused_moe": None, "cublas": None, "flashinfer_trtllm": None}


def efficiency(path: str, fp8: bool) -> float:
    """Rate of `path` as a fraction of the GEMM table's rate (1 = the table's kernel; Triton
    fused_moe at fp8 has its ceiling apart, `step.fused_moe_ceiling_flops`)."""
    src = _RATIO_OF[path]
    if src is None or not fp8:  # bf16 Triton fused_moe: unmeasured, the table's rate
        return 1.0
    return path_ratios()[src]


def step_efficiencies(cluster, fp8: bool, moe_kernels, deepgemm_jit: bool = True,
                      dense_fp8: bool | None = None) -> tuple[float, np.ndarray]:
    """(dense efficiency, routed-expert efficiency per plan) of a step on `cluster`; GPUs only
    (a CPU runs no SGLang kernel: 1). `moe_kernels`: the routed experts' kernel per plan (`moe_path`);
    `dense_fp8` as in `paths`."""
    kernels = np.asarray(moe_kernels)
    if not getattr(cluster, "is_gpu", True):
        return 1.0, np.ones(len(kernels))
    dfp8 = fp8 if dense_fp8 is None else dense_fp8
    dense = efficiency(dense_path(cluster, dfp8, deepgemm_jit), dfp8)
    return dense, np.array([efficiency(str(k), fp8) for k in kernels])
