"""The expert linears of the MoE MLP as the trial stack executes them, keyed by local experts
(groups), per-expert rows M_expert and shape (N, K): on GPU one grouped GEMM (torch._grouped_mm
when this torch has it); on CPU Megatron's SequentialMLP (no grouped GEMM there): split the
permuted tokens per expert, one F.linear per local expert, concatenate. TFLOPS = 2*g*m*n*k / time."""
from __future__ import annotations

from trials.profile.common import Ctx, grid_points, timeit

NAME = "grouped_mlp"
SOURCE_CPU = "measured:sequential-mlp"
SOURCE_GPU = "measured:grouped-mm"
CPU = {"tiny": dict(groups=[1, 2], m=[16, 64], nk=[64]),
       "small": dict(groups=[1, 4], m=[16, 128, 1024], nk=[64, 512]),
       "full": dict(groups=[1, 2, 4, 8, 16], m=[4, 16, 64, 256, 1024], nk=[64, 256, 1024])}
GPU = {"tiny": dict(groups=[1, 8], m=[128, 1024], nk=[2048]),
       "small": dict(groups=[1, 8, 32], m=[64, 512, 4096], nk=[1024, 4096]),
       "full": dict(groups=[1, 2, 4, 8, 16, 32, 64], m=[32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
                    nk=[1024, 2048, 4096, 7168])}
CPU_MAX_FLOPS = 2 * 1024 * 2048 * 2048


def points(ctx: Ctx) -> list[dict]:
    s = (GPU if ctx.on_gpu else CPU)[ctx.sweep]
    out = []
    for name, _, _ in ctx.dtypes():
        for p in grid_points({"groups": s["groups"], "m": s["m"], "n": s["nk"], "k": s["nk"]}, dtype=name):
            if not ctx.on_gpu and 2 * p["groups"] * p["m"] * p["n"] * p["k"] > CPU_MAX_FLOPS:
                continue
            p["id"] = f"grouped|{name}|{p['groups']}|{p['m']}|{p['n']}|{p['k']}"
            out.append(p)
    return out


def measure(p: dict, ctx: Ctx) -> list[tuple[str, dict]]:
    import torch
    import torch.nn.functional as F
    tdt, keys = next((t, k) for n, t, k in ctx.dtypes() if n == p["dtype"])
    g, m, n, k = p["groups"], p["m"], p["n"], p["k"]
    x = torch.randn(g * m, k, dtype=tdt, device=ctx.device)
    ws = [torch.randn(n, k, dtype=tdt, device=ctx.device) for _ in range(g)]
    counts = [m] * g
    source = SOURCE_CPU
    if ctx.on_gpu and hasattr(torch, "_grouped_mm"):
        wt = torch.stack([w.t() for w in ws]).contiguous()
        offs = torch.arange(1, g + 1, device=ctx.device, dtype=torch.int32) * m
        try:
            torch._grouped_mm(x, wt, offs=offs)

            def fn():
                return torch._grouped_mm(x, wt, offs=offs)
            source = SOURCE_GPU
        except Exception:  # noqa: BLE001 - unsupported dtype/arch: the sequential loop
            fn = None
    else:
        fn = None
    if fn is None:
        def fn():  # SequentialMLP: per-expert split, one linear each, concatenate
            parts = torch.split(x, counts)
            return torch.cat([F.linear(xi, wi) for xi, wi in zip(parts, ws)])
    with torch.no_grad():
        t = timeit(fn, ctx)
    tf = 2.0 * g * m * n * k / t / 1e12
    return [("grouped_gemm", dict(dtype=kk, groups=g, m=m, n=n, k=k, tflops=tf, source=source)) for kk in keys]
