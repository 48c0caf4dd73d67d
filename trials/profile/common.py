"""Shared helpers of the profile runners: device context, pinning, timing, sweep ordering."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

SWEEPS = ("tiny", "small", "full")


@dataclass
class Ctx:
    """Where and how much to measure. device: "cpu" or "cuda"; sweep: tiny | small | full.

    Timing (see `timeit`): on CPU the minimum of `reps` wall-clock batches of >= min_time_s each;
    on GPU the median of per-call CUDA-event times over about reps * min_time_s of calls, with
    the L2 cache flushed before each call when `flush_l2`, after `sustain_s` seconds of
    back-to-back GEMMs once per device so clocks have settled to their sustained value.
    extra: runner options (attention: "attn_heads", "attn_tokens", "sdpa_backends")."""
    device: str = "cpu"
    sweep: str = "full"
    min_time_s: float = 0.01  # per timing batch (CPU) / per point's share of calls (GPU: x reps)
    reps: int = 3  # CPU: timing batches, the minimum is kept; GPU: sizes the number of timed calls
    flush_l2: bool = True  # GPU only: zero a buffer larger than L2 before each timed call
    sustain_s: float = 2.0  # GPU only: clock warm-up per device before the first point
    extra: dict = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def statistic(self) -> str:
        """The statistic `timeit` returns on this device, and why (written into the tables' meta)."""
        if self.on_gpu:
            return ("median of per-call CUDA-event times" + (", L2 flushed before each call" if self.flush_l2 else "")
                    + f", after {self.sustain_s:g} s of sustained GEMMs: on a dedicated GPU the noise is "
                    "symmetric (clock and power jitter), so the median is the typical call; the minimum "
                    "would keep a boosted-clock outlier")
        return ("minimum of %d wall-clock batches of >= %g s (perf_counter): on a shared host other processes "
                "only ever add time, so the least-interfered batch is the uncontended cost" % (self.reps, self.min_time_s))

    def dtypes(self) -> list[tuple[str, object, list[str]]]:
        """[(measured dtype name, torch dtype, table dtype keys written)] of the bf16-class
        measurement. On CPU the trial stack runs bf16 plans in fp32 (specs/cpu_support.py), so
        the fp32 measurement is written under both keys; on GPU bf16. fp8 is not listed here:
        the runners that can measure it (gemm via torch._scaled_mm, grouped_mlp via TE) add
        their own fp8 points when `fp8_skip_reason` is None."""
        import torch
        if self.on_gpu:
            return [("bf16", torch.bfloat16, ["bf16"])]
        return [("fp32", torch.float32, ["bf16", "fp32"])]

    def sync(self):
        if self.on_gpu:
            import torch
            torch.cuda.synchronize()


def fp8_skip_reason(ctx: Ctx) -> str | None:
    """None when this device can run fp8 GEMMs (torch._scaled_mm on float8_e4m3fn, sm89+), else why not."""
    if not ctx.on_gpu:
        return "fp8 GEMMs are GPU only (the CPU trial stack runs bf16 plans in fp32)"
    import torch
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no _scaled_mm / float8_e4m3fn"
    major, minor = torch.cuda.get_device_capability(torch.device(ctx.device))
    if (major, minor) < (8, 9):
        return f"sm{major}{minor} has no fp8 tensor cores (needs sm89 or newer)"
    return None


def te_skip_reason() -> str | None:
    """None when TransformerEngine's PyTorch layers import here, else why not."""
    try:
        import transformer_engine.pytorch as te  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure (missing, ABI mismatch) means "no TE"
        return f"TransformerEngine not importable ({type(e).__name__}: {str(e)[:120]})"
    return None


def pin_to_core(index: int) -> int | None:
    """One thread, pinned to the index-th usable core (as trial ranks are)."""
    import torch
    torch.set_num_threads(1)
    try:
        cores = sorted(os.sched_getaffinity(0))
        core = cores[index % len(cores)]
        os.sched_setaffinity(0, {core})
        return core
    except (AttributeError, OSError):
        return None


def timeit(fn, ctx: Ctx, *, min_time_s: float | None = None, reps: int | None = None,
           flush: bool | None = None, clock: str | None = None) -> float:
    """Seconds per call of fn() (after warm-up).

    fn: the call to time; ctx: device and defaults; min_time_s, reps: override ctx's;
    flush: GPU only, flush L2 before each call (default ctx.flush_l2); clock: "wall"
    (perf_counter, the CPU default and what a launch-gap measurement needs) or "events"
    (CUDA events, the GPU default: GPU time only, no host launch cost).
    CPU/wall: the fastest of `reps` batches of >= min_time_s each: on a shared host other
    processes only ever add time, so the least-interfered batch is the best estimate of the
    uncontended cost the model predicts. GPU/events: see `_timeit_events` (median)."""
    min_time_s = ctx.min_time_s if min_time_s is None else min_time_s
    reps = ctx.reps if reps is None else reps
    clock = clock or ("events" if ctx.on_gpu else "wall")
    if clock == "events":
        return _timeit_events(fn, ctx, min_time_s * reps, ctx.flush_l2 if flush is None else flush)
    fn()
    ctx.sync()
    t0 = time.perf_counter()
    fn()
    ctx.sync()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, min(10000, int(math.ceil(min_time_s / one))))
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ctx.sync()
        out.append((time.perf_counter() - t0) / n)
    return min(out)


_FLUSH: dict = {}


def l2_bytes(device) -> int:
    """L2 cache size of `device` in bytes (torch device properties; 50 MiB, an H100/H200's, if unknown)."""
    import torch
    props = torch.cuda.get_device_properties(torch.device(device))
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2 ** 20)


def flush_l2(device) -> None:
    """Evict the L2 cache: zero a buffer of twice its size (kept per device), so the next kernel
    reads its operands from HBM as a training step's GEMMs on fresh activations and weights do."""
    import torch
    buf = _FLUSH.get(str(device))
    if buf is None:
        buf = _FLUSH[str(device)] = torch.empty(2 * l2_bytes(device) // 4 + 1024, dtype=torch.int32,
                                                device=device)
    buf.zero_()


def _timeit_events(fn, ctx: Ctx, total_s: float, flush: bool, min_calls: int = 5, max_calls: int = 2000) -> float:
    """Median GPU seconds per call: one CUDA event pair around each call, the flush (when asked)
    enqueued before the start event so it is not counted. The host runs ahead of the GPU, so the
    launch of fn overlaps the flush and event times hold GPU work only."""
    import statistics

    import torch
    fn()  # warm-up: allocator, cuBLAS heuristics, lazy module init
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if flush:
        flush_l2(ctx.device)
    s.record()
    fn()
    e.record()
    e.synchronize()
    one = max(s.elapsed_time(e) / 1e3, 1e-6)
    n = int(max(min_calls, min(max_calls, math.ceil(total_s / one))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if flush:
            flush_l2(ctx.device)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) / 1e3 for a, b in zip(starts, ends))


def sustain_clocks(ctx: Ctx, seconds: float | None = None) -> float:
    """Run back-to-back bf16 GEMMs for `seconds` (default ctx.sustain_s) so the GPU's clocks drop
    from their boost value to the sustained one under load before anything is timed (a burst of
    a few ms would measure boost clocks no training step sees). Returns the seconds spent."""
    if not ctx.on_gpu:
        return 0.0
    import torch
    seconds = ctx.sustain_s if seconds is None else seconds
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=ctx.device)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def bisect_order(n: int) -> list[int]:
    """Indices 0..n-1, ends first, then midpoints of the gaps (coarse-to-fine)."""
    if n <= 0:
        return []
    order, seen = [0], {0}
    if n > 1:
        order.append(n - 1)
        seen.add(n - 1)
    gaps = [(0, n - 1)]
    while gaps:
        nxt = []
        for a, b in gaps:
            if b - a < 2:
                continue
            m = (a + b) // 2
            if m not in seen:
                order.append(m)
                seen.add(m)
            nxt += [(a, m), (m, b)]
        gaps = nxt
    return order


def level_of(i: int, n: int) -> int:
    """Refinement level of grid index i on an axis of n values (0 = ends)."""
    pos = bisect_order(n).index(i)
    return 0 if pos < 2 else int(math.floor(math.log2(pos)))


def grid_points(axes: dict[str, list], **fixed) -> list[dict]:
    """Full grid over axes, each point tagged with its coarse-to-fine `level`."""
    import itertools
    names = list(axes)
    pts = []
    for idx in itertools.product(*[range(len(axes[a])) for a in names]):
        p = {a: axes[a][i] for a, i in zip(names, idx)}
        p["level"] = max([level_of(i, len(axes[a])) for a, i in zip(names, idx)] or [0])
        p.update(fixed)
        pts.append(p)
    return pts


def host_info() -> dict:
    import platform
    import socket

    import torch
    info = {"host": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu": _cpu_name(), "usable_cores": len(os.sched_getaffinity(0))}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            pass
    import warnings
    for mod in ("megatron.core", "ray"):
        try:
            warnings.simplefilter("ignore")
            m = __import__(mod, fromlist=["__version__"])
            info[mod.split(".")[0] + ("-core" if mod == "megatron.core" else "")] = getattr(m, "__version__", "?")
        except Exception:  # noqa: BLE001
            pass
    return info


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"
