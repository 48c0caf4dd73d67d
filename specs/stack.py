"""What the target toolchain can build: a `StackProfile` per kind of target.

A plan that needs a piece the profile lacks (TransformerEngine for fp8, DeepEP/HybridEP for the
flex dispatcher, CUDA grouped GEMM, ...) is not realizable there; `tuner.realize` asks the profile.
`stack_defaults` is the one place where a profile's implied plan defaults are decided.
The cpu-local profile takes its list from what the CPU trial backend can really run
(`specs/cpu_support.py`), so the plan space and the backend agree.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specs.cpu_support import cpu_rejection_rules
from specs.errors import SpecError


@dataclass(frozen=True)
class StackProfile:
    name: str
    megatron_core: str = "0.16.1"
    transformer_engine: str = ""  # "" = not installed
    deepep: bool = False
    hybridep: bool = False
    gpu: bool = True
    grouped_gemm: bool = True  # CUDA grouped-GEMM kernels (TE or the grouped_gemm package)
    dist_opt: bool = True  # Megatron's DistributedOptimizer (CUDA only)
    overlap_grad_reduce: bool = True
    sequence_parallel: bool = True  # needed by MoE with TP > 1
    context_parallel: bool = True  # CP needs TE attention
    # Extra rejections: (code, sentence, predicate(plan, model) -> bool); the CPU stack fills this.
    extra: tuple = field(default=(), compare=False)

    def te_at_least(self, version: str) -> bool:
        if not self.transformer_engine:
            return False
        return _vtuple(self.transformer_engine) >= _vtuple(version)

    def describe(self) -> str:
        parts = [f"megatron-core {self.megatron_core}",
                 f"TE {self.transformer_engine}" if self.transformer_engine else "no TE"]
        parts += [n for n, ok in (("DeepEP", self.deepep), ("HybridEP", self.hybridep)) if ok]
        parts.append("GPU" if self.gpu else "CPU")
        return f"{self.name} ({', '.join(parts)})"


def _vtuple(v: str) -> tuple:
    out = []
    for p in v.replace("dev", ".").split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


# NVIDIA's current training container pairs megatron-core 0.16 with TE 2.9, DeepEP and HybridEP.
GPU_FULL = StackProfile("gpu-full", transformer_engine="2.9.0", deepep=True, hybridep=True)
GPU_NO_EP_LIBS = StackProfile("gpu-te", transformer_engine="2.9.0")
GPU_NO_TE = StackProfile("gpu-plain", transformer_engine="", grouped_gemm=True, context_parallel=False)


def cpu_profile() -> StackProfile:
    """Megatron-core on CPU with gloo: what the CPU trial backend can really run."""
    extra = tuple(cpu_rejection_rules())
    return StackProfile("cpu-local", transformer_engine="", deepep=False, hybridep=False, gpu=False,
                        grouped_gemm=False, dist_opt=False, overlap_grad_reduce=False,
                        sequence_parallel=False, context_parallel=False, extra=extra)


PROFILES = {"gpu-full": GPU_FULL, "gpu-te": GPU_NO_EP_LIBS, "gpu-plain": GPU_NO_TE}


def profile_for(cluster, name: str | None = None) -> StackProfile:
    if name in (None, "", "auto"):
        return GPU_FULL if cluster.is_gpu else cpu_profile()
    if name == "cpu-local":
        return cpu_profile()
    if name not in PROFILES:
        raise SpecError(f"unknown stack profile {name!r}: choose auto, cpu-local, {', '.join(PROFILES)}")
    return PROFILES[name]


def stack_defaults(profile: StackProfile, is_moe: bool = True) -> dict:
    """The schedule/kernel defaults a stack profile implies (the one place they are decided)."""
    return dict(dist_opt=profile.dist_opt, overlap_grad_reduce=profile.overlap_grad_reduce,
                overlap_param_gather=profile.dist_opt and profile.overlap_grad_reduce,
                grouped_gemm=profile.grouped_gemm and is_moe)


def cpu_defaults(fields: dict) -> dict:
    """Defaults for a partial plan on cpu-local: those of the cpu-local stack profile (the
    GPU-oriented dist_opt, overlaps and grouped GEMM off) unless given explicitly."""
    return {**stack_defaults(cpu_profile()), **fields}
