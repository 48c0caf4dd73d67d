"""What the target toolchain can build: a `StackProfile` per kind of target.

A plan that needs a piece the profile lacks (TransformerEngine for fp8, DeepEP/HybridEP for the
flex dispatcher, CUDA grouped GEMM, ...) is not realizable there; `tuner.space.megatron_rules` asks the profile.
`stack_defaults` is the one place where a profile's implied plan defaults are decided.
The cpu-local profile takes its list from what the CPU trial backend can really run
(`specs/cpu_support.py`), so the plan space and the backend agree.

Two questions, two answers:
- *Planning / emitting* for a cluster kind (`--stack auto`, the default): a GPU cluster kind is
  planned for `gpu-full` (NVIDIA's training container: TE 2.9, DeepEP, HybridEP) whatever this
  machine has installed, because the plan will run there, not here; a CPU cluster kind gets
  `cpu-local`. Name another target (`gpu-te`, `gpu-plain`) when the cluster's stack differs, or
  `installed` to plan for exactly what this machine has.
- *Running a trial here*: the trial backend checks the plan against `detect_installed()` (what
  this machine really has) before launching and refuses, as unrealizable, what it cannot build.

`detect_installed()` finds packages lazily with `importlib.util.find_spec` /
`importlib.metadata.version`; torch is imported only inside it (CUDA device count).
This module is also the one source of the launch environment (`launch_env`) and of the fp8
format/recipe pair per plan precision (`FP8_RECIPES`) shared by the emitted script and the trial.
"""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from dataclasses import asdict, dataclass, field

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


@functools.lru_cache(maxsize=256)  # te_at_least runs for every schedule/kernel option the enumerator checks
def _vtuple(v: str) -> tuple:
    out = []
    for p in v.replace("dev", ".").split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


# NVIDIA's current training container pairs megatron-core 0.16 with TE 2.9, DeepEP and HybridEP.
GPU_FULL = StackProfile("gpu-full", transformer_engine="2.9.0", deepep=True, hybridep=True)
# The same with the newest TE megatron-core 0.16.1 admits (its pyproject.toml: transformer-engine
# >=2.9.0a0,<2.12.0): what delay_wgrad with TE CUDA graphs needs (TE >= 2.10), as NVIDIA's recipes run it.
GPU_FULL_TE211 = StackProfile("gpu-full-te2.11", transformer_engine="2.11.0", deepep=True, hybridep=True)
GPU_NO_EP_LIBS = StackProfile("gpu-te", transformer_engine="2.9.0")
# Without TE: no grouped GEMM (TE's GroupedLinear; the legacy grouped_gemm package is not assumed),
# no sequence parallel (the local spec's RMSNorm is torch's, which refuses SP, so MoE with TP>1 is
# out) and no context parallel (TEDotProductAttention only).
GPU_NO_TE = StackProfile("gpu-plain", transformer_engine="", grouped_gemm=False, sequence_parallel=False,
                         context_parallel=False)


def cpu_profile() -> StackProfile:
    """Megatron-core on CPU with gloo: what the CPU trial backend can really run."""
    extra = tuple(cpu_rejection_rules())
    return StackProfile("cpu-local", transformer_engine="", deepep=False, hybridep=False, gpu=False,
                        grouped_gemm=False, dist_opt=False, overlap_grad_reduce=False,
                        sequence_parallel=False, context_parallel=False, extra=extra)


PROFILES = {"gpu-full": GPU_FULL, "gpu-full-te2.11": GPU_FULL_TE211, "gpu-te": GPU_NO_EP_LIBS, "gpu-plain": GPU_NO_TE}


def profile_for(cluster, name: str | None = None) -> StackProfile:
    """The stack profile to plan for on `cluster`.

    name: None/"auto" (gpu-full for a GPU cluster kind, cpu-local for a CPU one: planning is for
    the target, not for this machine), "installed" (built from `detect_installed()`), "cpu-local",
    or one of PROFILES. Raises SpecError for any other name."""
    if name in (None, "", "auto"):
        return GPU_FULL if cluster.is_gpu else cpu_profile()
    if name == "cpu-local":
        return cpu_profile()
    if name == "installed":
        return profile_from_installed(detect_installed())
    if name not in PROFILES:
        raise SpecError(f"unknown stack profile {name!r}: choose auto, installed, cpu-local, {', '.join(PROFILES)}")
    return PROFILES[name]


# ---- what this machine has installed --------------------------------------------------------------
@dataclass(frozen=True)
class Installed:
    """The training stack on this machine ("" = package absent)."""
    megatron_core: str = ""
    transformer_engine: str = ""
    deepep: bool = False
    hybridep: bool = False  # DeepEP's HybridEP buffer (deep_ep.HybridEPBuffer)
    grouped_gemm: bool = False  # the legacy `grouped_gemm` package (Megatron's GroupedMLP)
    apex: bool = False
    cuda: bool = False  # a CUDA device is visible to torch
    devices: int = 0  # visible CUDA devices

    def to_dict(self) -> dict:
        return asdict(self)


def _version(*dists: str) -> str:
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that fails to import
        return False


def _has_hybridep() -> bool:
    """HybridEP ships inside DeepEP (branch hybrid-ep) as `deep_ep.HybridEPBuffer`, the name
    megatron-core's fused_a2a imports. Only an import can tell; it loads DeepEP's CUDA extension."""
    if not _has_module("deep_ep"):
        return False
    try:
        import deep_ep
    except Exception:  # noqa: BLE001 - a broken install is "absent" (the message is irrelevant here)
        return False
    return hasattr(deep_ep, "HybridEPBuffer")


@functools.lru_cache(maxsize=1)
def detect_installed() -> Installed:
    """What this machine has: package versions from their distribution metadata, modules by
    `find_spec`, CUDA devices from torch (imported here, not at module level). Cached per process."""
    cuda, devices = False, 0
    if _has_module("torch"):
        import torch
        cuda = torch.cuda.is_available()
        devices = torch.cuda.device_count() if cuda else 0
    te = _version("transformer_engine", "transformer-engine", "transformer_engine_torch") \
        if _has_module("transformer_engine") else ""
    return Installed(
        megatron_core=_version("megatron-core", "megatron_core") if _has_module("megatron.core") else "",
        transformer_engine=te,
        deepep=_has_module("deep_ep"),
        hybridep=_has_hybridep(),
        grouped_gemm=_has_module("grouped_gemm"),
        apex=_has_module("apex"),
        cuda=cuda, devices=devices)


def profile_from_installed(inst: Installed) -> StackProfile:
    """The stack profile of an installation: cpu-local without CUDA; otherwise what TE and the
    expert-parallel libraries present allow (grouped GEMM from TE or the grouped_gemm package,
    sequence and context parallel only with TE)."""
    if not inst.cuda:
        return cpu_profile()
    te = inst.transformer_engine
    return StackProfile("installed", megatron_core=inst.megatron_core or StackProfile.megatron_core,
                        transformer_engine=te, deepep=inst.deepep, hybridep=inst.hybridep, gpu=True,
                        grouped_gemm=bool(te) or inst.grouped_gemm, sequence_parallel=bool(te),
                        context_parallel=bool(te))


# ---- what the emitted script and the trial both set ----------------------------------------------
# SMs HybridEP's dispatch/combine kernels hold (--moe-hybridep-num-sms; megatron-core 0.16.1's default is
# 16, transformer_config.py). NVIDIA's performance recipes set 32 whenever the flex backend is HybridEP
# (NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/perf_recipes/_common.py and
# scripts/performance/utils/overrides.py: `moe_hybridep_num_sms = 32`, with the note that it "needs to
# be adjusted when overlapping HybridEP with computation"), so the published HybridEP runs, the
# overlap A/B among them, hold 32 SMs; the emitted script and the trial set the same, and the cost
# model prices the SMs the communication takes from overlapped compute with it.
HYBRIDEP_NUM_SMS = 32
FP8_RECIPES = {  # plan precision -> (Megatron fp8 format, fp8 recipe): --fp8-format / --fp8-recipe
    "fp8-tensorwise": ("hybrid", "tensorwise"),
    "fp8-delayed": ("hybrid", "delayed"),
    "fp8-blockwise": ("e4m3", "blockwise"),
    "mxfp8": ("e4m3", "mxfp8"),
}


def launch_env(plan, cluster) -> dict:
    """Environment variables a GPU launch of `plan` on `cluster` sets (emitted script and trial).

    plan: the Plan (tp, cp, a2a_overlap, fsdp, dispatcher read); cluster: its `mxfp8` (Blackwell) and
    `nvlink_gbps` are read."""
    env = {}
    if plan.fsdp or (plan.a2a_overlap and (plan.tp > 1 or plan.cp > 1)):
        # Megatron FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1 (arguments.py validate_args), and EP
        # A2A overlap needs more than one queue (validate_args warns that TP/CP with it on Hopper
        # trade one for the other; NVIDIA's recipes keep the overlap): the value Megatron-Bridge's
        # perf scripts set (scripts/performance/utils/overrides.py: 32 for DeepEP / HybridEP, else 8)
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "32" if plan.dispatcher == "flex" else "8"
    elif (plan.tp > 1 or plan.cp > 1) and not getattr(cluster, "mxfp8", False):
        # validate_args requires it for TP/CP before Blackwell (ordering of comm vs GEMM kernels)
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    env["NCCL_NVLS_ENABLE"] = "0" if getattr(cluster, "nvlink_gbps", 0) == 0 else "1"
    env["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "1"
    return env


@dataclass(frozen=True)
class TeFusion:
    """A MoE plan field that switches on TransformerEngine's fused kernels: its Megatron-LM flag,
    the TE version that has them, what they are and what runs without them."""
    flag: str
    min_te: str
    kernels: str
    without: str


# The one table the stack defaults, the plan rules (tuner/space/megatron_rules.py) and the trial's
# layer-spec check (trials/megatron/spec_choice.py) read; plan field -> TeFusion
TE_FUSIONS = {
    # megatron-core 0.16.1 transformer_config.py: moe_permute_fusion raises "fused permutation is not
    # available. Please install TE >= 2.1.0." without TE's fused_permute / fused_unpermute / fused_sort_chunks_by_index
    "permute_fusion": TeFusion("--moe-permute-fusion", "2.1.0", "its fused permute kernels",
                               "permute_fusion=0 runs the PyTorch permutation"),
    # megatron-core 0.16.1 moe_utils.topk_routing_with_score_function / compute_routing_scores_for_aux_loss
    # with fused=True: "fused_topk_with_score_function is not available. Please install TE >= 2.7.0."
    "router_fusion": TeFusion("--moe-router-fusion", "2.7.0", "its fused top-k and aux-loss kernels",
                              "router_fusion=0 runs the PyTorch router"),
}


def stack_defaults(profile: StackProfile, is_moe: bool = True) -> dict:
    """The schedule/kernel defaults a stack profile implies (the one place they are decided)."""
    return dict(dist_opt=profile.dist_opt, overlap_grad_reduce=profile.overlap_grad_reduce,
                overlap_param_gather=profile.dist_opt and profile.overlap_grad_reduce,
                grouped_gemm=profile.grouped_gemm and is_moe,
                **{name: profile.te_at_least(f.min_te) and is_moe for name, f in TE_FUSIONS.items()})


def cpu_defaults(fields: dict) -> dict:
    """Defaults for a partial plan on cpu-local: those of the cpu-local stack profile (the
    GPU-oriented dist_opt, overlaps and grouped GEMM off) unless given explicitly."""
    return {**stack_defaults(cpu_profile()), **fields}
