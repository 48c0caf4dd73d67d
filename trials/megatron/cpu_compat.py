"""Compatibility shims for megatron-core 0.16: CPU patches (only when no CUDA device exists) and
the TransformerEngine-absent shim (whenever TE is missing, GPU or not).

megatron-core is written for CUDA: it creates streams/events, asks `torch.cuda.current_device()`
for allocation targets, keeps a CUDA RNG tracker, and a few places hard-code `device="cuda"`.
On a CPU-only torch build those calls raise. `apply()` patches exactly those call sites so that
unmodified megatron-core modules run on CPU with the gloo backend. Each patch says why.

On a machine with a GPU the CPU patches are not applied: trials run unmodified megatron-core
with NCCL. `shims_needed(te_present, gpu_present)` is the decision; `apply()` carries it out.
Only the trial worker process calls `apply()`; nothing else in moetune imports this module.
"""
from __future__ import annotations

import contextlib
import types

import torch

_APPLIED = False


class _NoopStream:
    """Stand-in for torch.cuda.Stream/Event: CPU ops are synchronous, so waits are no-ops."""

    def __init__(self, *a, **k):
        pass

    def wait_stream(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def record_event(self, *a, **k):
        return _NoopStream()

    def record(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def wait(self, *a, **k):
        pass

    def elapsed_time(self, other):
        return 0.0


class _CudaLiteralTorch(types.ModuleType):
    """Proxy for the `torch` module as seen from one megatron module: forwards everything to
    torch, but rewrites `device="cuda"` to CPU in tensor factories. Used for modules that
    hard-code `device="cuda"` (pipeline schedules' `total_num_tokens` counter)."""

    _FACTORIES = ("zeros", "ones", "empty", "tensor", "full", "arange")

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name in self._FACTORIES:
            def factory(*a, _f=attr, **k):
                if _is_cuda(k.get("device")):
                    k["device"] = "cpu"
                return _f(*a, **k)
            return factory
        return attr


def _is_cuda(dev) -> bool:
    if dev is None:
        return False
    if isinstance(dev, int):
        return True
    return str(dev).startswith("cuda")


def gpu_present() -> bool:
    return torch.cuda.is_available()


def shims_needed(te_present: bool, gpu_present: bool) -> frozenset:
    """Which shims a process needs: "te_general_gemm" whenever TransformerEngine is absent
    (megatron's moe_utils then never defines the name but the router reads it, NameError on the
    first MoE forward, GPU or CPU), "cpu" whenever there is no CUDA device."""
    out = set()
    if not te_present:
        out.add("te_general_gemm")
    if not gpu_present:
        out.add("cpu")
    return frozenset(out)


def apply_te_shim() -> bool:
    """Define `moe_utils.te_general_gemm = None` when megatron found no TE (`moe_utils.HAVE_TE`
    False): `RouterGatingLinearFunction` tests `te_general_gemm is not None` and then takes its
    existing torch.mm path. Returns True when the shim was applied."""
    from megatron.core.transformer.moe import moe_utils
    if moe_utils.HAVE_TE or hasattr(moe_utils, "te_general_gemm"):
        return False
    moe_utils.te_general_gemm = None
    return True


def apply() -> bool:
    """Apply the shims this process needs (`shims_needed`). Returns True when the CPU patches
    were applied (no GPU); the TE shim is applied on GPU too when TE is missing."""
    gpu = gpu_present()
    # CPU patches first: they must be in place before megatron modules touch torch.cuda.
    patched = _apply_cpu() if "cpu" in shims_needed(True, gpu) else False
    from megatron.core.transformer.moe import moe_utils
    if "te_general_gemm" in shims_needed(bool(moe_utils.HAVE_TE), gpu):
        apply_te_shim()
    return patched


def _apply_cpu() -> bool:
    """Patch megatron-core for CPU (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return True
    cuda = torch.cuda

    # 1. Allocation target: megatron allocates with device=torch.cuda.current_device()
    #    (DDP grad buffers, p2p receive buffers, layer weights). Return "cpu" so those land on CPU.
    cuda.current_device = lambda: "cpu"
    cuda.set_device = lambda *a, **k: None
    cuda.device_count = lambda: 0
    # 2. Streams/events: DDP (communication_stream), MoE overlap paths and the p2p code create
    #    and wait on CUDA streams/events; CPU execution is synchronous, so they become no-ops.
    cuda.Stream = _NoopStream
    cuda.Event = _NoopStream
    cuda.current_stream = lambda *a, **k: _NoopStream()
    cuda.default_stream = lambda *a, **k: _NoopStream()
    cuda.stream = lambda *a, **k: contextlib.nullcontext()
    cuda.synchronize = lambda *a, **k: None
    cuda.empty_cache = lambda *a, **k: None
    # Memory statistics: callers only log them; the worker measures RSS itself on CPU.
    cuda.memory_allocated = lambda *a, **k: 0
    cuda.max_memory_allocated = lambda *a, **k: 0
    cuda.reset_peak_memory_stats = lambda *a, **k: None
    cuda.nvtx = types.SimpleNamespace(range_push=lambda *a, **k: None, range_pop=lambda *a, **k: None,
                                      range=lambda *a, **k: contextlib.nullcontext())
    # 3. Tied embeddings with PP>1: LanguageModule.setup_embeddings_and_output_layer does
    #    `weight.data = weight.data.cuda()` before all-reducing the shared weight between the
    #    first and last stage. On CPU keep the tensor where it is.
    torch.Tensor.cuda = lambda self, *a, **k: self

    # 4. RNG tracker: CudaRNGStatesTracker stores/forks CUDA generator states (used by dropout,
    #    GPU-side init and activation recomputation). On CPU, track the CPU generator instead;
    #    fork/restore semantics are unchanged (model-parallel streams still get their own seeds).
    from megatron.core.tensor_parallel import random as mrandom

    def _get_state(device="cuda", clone=False, graph_safe=False):
        return torch.get_rng_state()

    def _set_state(new_state, device=-1, graph_safe=False):
        torch.set_rng_state(new_state)

    mrandom._get_cuda_rng_state = _get_state
    mrandom._set_cuda_rng_state = _set_state

    def _add(self, name, seed):
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        self.seeds_.add(seed)
        if name in self.states_:
            raise Exception(f"cuda rng state {name} already exists")
        orig = torch.get_rng_state()
        torch.default_generator.manual_seed(int(seed))
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(orig)

    mrandom.CudaRNGStatesTracker.add = _add
    # model_parallel_cuda_manual_seed ends with torch.cuda.manual_seed(dp_seed): on CPU that is
    # the default CPU generator.
    # (torch.manual_seed itself calls torch.cuda.manual_seed_all: seed the generator directly.)
    cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    cuda.manual_seed_all = lambda seed: None
    cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    cuda.set_rng_state = lambda s, *a, **k: torch.set_rng_state(s)

    # 5. (`te_general_gemm`: see apply_te_shim, applied by apply() whenever TE is missing.)
    # 5b. The alltoall dispatcher turns its split sizes into host numpy arrays with
    #     maybe_move_tensor_to_cpu(as_numpy=True), which only converts *CUDA* tensors; a CPU
    #     tensor is passed through and torch.distributed.all_to_all_single rejects a tensor as
    #     split sizes. On CPU convert to numpy as the GPU path does.
    from megatron.core.transformer.moe import moe_utils, token_dispatcher
    _orig_move = moe_utils.maybe_move_tensor_to_cpu

    def _move(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return _orig_move(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = _move
    token_dispatcher.maybe_move_tensor_to_cpu = _move

    # 6. Pipeline schedules hard-code `torch.zeros([], dtype=torch.int, device="cuda")` for the
    #    token counter in all three schedules; give that module a torch proxy mapping it to CPU.
    from megatron.core.pipeline_parallel import schedules
    schedules.torch = _CudaLiteralTorch()
    # Same for the default causal/sliding-window attention masks (transformer/utils.py builds
    # them with device="cuda"; used by the local DotProductAttention when no mask is passed) and
    # the MoE aux-loss logging tracker (moe_utils: torch.zeros(num_layers, device="cuda")).
    from megatron.core.transformer import utils as tutils
    tutils.torch = _CudaLiteralTorch()
    moe_utils.torch = _CudaLiteralTorch()
    # torch.autocast("cuda", ...) is entered only when config.enable_autocast; we never set it.

    _APPLIED = True
    return True
