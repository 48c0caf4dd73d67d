"""Dense GEMM sweep: y = F.linear(x[m,k], w[n,k]) as Megatron's linear layers run it; achieved
TFLOPS = 2mnk / time, over (M, N, K) per dtype."""
from __future__ import annotations

from trials.profile.common import Ctx, grid_points, timeit

NAME = "gemm"
SOURCE = "measured:gemm"
CPU_AXES = {"tiny": [16, 256], "small": [16, 128, 1024], "full": [4, 16, 64, 256, 1024, 4096]}
GPU_AXES = {"tiny": [256, 4096], "small": [256, 2048, 16384], "full": [128, 256, 512, 1024, 2048, 4096, 8192, 16384]}
CPU_MAX_FLOPS = 2 * 1024 * 2048 * 2048  # ~0.2 s per call on one core; larger shapes saturate


def points(ctx: Ctx) -> list[dict]:
    ax = (GPU_AXES if ctx.on_gpu else CPU_AXES)[ctx.sweep]
    out = []
    for name, _, _ in ctx.dtypes():
        for p in grid_points({"m": ax, "n": ax, "k": ax}, dtype=name):
            if not ctx.on_gpu and 2 * p["m"] * p["n"] * p["k"] > CPU_MAX_FLOPS:
                continue
            p["id"] = f"gemm|{name}|{p['m']}|{p['n']}|{p['k']}"
            out.append(p)
    return out


def measure(p: dict, ctx: Ctx) -> list[tuple[str, dict]]:
    import torch
    import torch.nn.functional as F
    tdt, keys = next((t, k) for n, t, k in ctx.dtypes() if n == p["dtype"])
    x = torch.randn(p["m"], p["k"], dtype=tdt, device=ctx.device)
    w = torch.randn(p["n"], p["k"], dtype=tdt, device=ctx.device)
    with torch.no_grad():
        t = timeit(lambda: F.linear(x, w), ctx)
    tf = 2.0 * p["m"] * p["n"] * p["k"] / t / 1e12
    return [("gemm", dict(dtype=k, m=p["m"], n=p["n"], k=p["k"], tflops=tf, source=SOURCE)) for k in keys]
