"""Shared helpers of the profile runners: device context, pinning, timing, sweep ordering."""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

SWEEPS = ("tiny", "small", "full")


@dataclass
class Ctx:
    """Where and how much to measure. device: "cpu" or "cuda"; sweep: tiny | small | full."""
    device: str = "cpu"
    sweep: str = "full"
    min_time_s: float = 0.01  # per timing batch
    reps: int = 3  # timing batches; the median is kept
    extra: dict = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def dtypes(self) -> list[tuple[str, object, list[str]]]:
        """[(measured dtype name, torch dtype, table dtype keys written)]. On CPU the trial stack
        runs bf16 plans in fp32 (specs/cpu_support.py), so the fp32 measurement is
        written under both keys; on GPU bf16 (and fp8 when the GEMM runner can run it)."""
        import torch
        if self.on_gpu:
            return [("bf16", torch.bfloat16, ["bf16"])]
        return [("fp32", torch.float32, ["bf16", "fp32"])]

    def sync(self):
        if self.on_gpu:
            import torch
            torch.cuda.synchronize()


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


def timeit(fn, ctx: Ctx, *, min_time_s: float | None = None, reps: int | None = None) -> float:
    """Seconds per call of fn(): the fastest of `reps` batches of >= min_time_s each (after warm-up).
    The minimum, not the median: on a shared host other processes only ever add time, so the
    least-interfered batch is the best estimate of the uncontended cost the model predicts."""
    min_time_s = ctx.min_time_s if min_time_s is None else min_time_s
    reps = ctx.reps if reps is None else reps
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
