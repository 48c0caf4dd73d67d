"""Dense GEMM sweep: y = F.linear(x[m,k], w[n,k]) as Megatron's linear layers run it; achieved
TFLOPS = 2mnk / time, over (M, N, K) per dtype.

fp8 (GPU, sm89+): torch._scaled_mm on float8_e4m3fn operands with tensorwise scales and a bf16
output (the cuBLASLt fp8 GEMM that TransformerEngine's fp8 linears run); the quantisation itself is
not timed, the cost model adds it as a memory-bound term. Where fp8 cannot be measured the driver
keeps the shipped fp8 rows and says so in the tables' notes."""
from __future__ import annotations

from trials.profile.common import Ctx, fp8_skip_reason, grid_points, timeit

NAME = "gemm"
SOURCE = "measured:gemm"
SOURCE_FP8 = "measured:scaled-mm-fp8"
CPU_AXES = {"tiny": [16, 256], "small": [16, 128, 1024], "full": [4, 16, 64, 256, 1024, 4096]}
# GPU: rows (tokens) from decode-sized 16 up; n, k over the hidden/ffn sizes of the presets.
GPU_M = {"tiny": [64, 4096], "small": [16, 256, 4096, 16384],
         "full": [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]}
GPU_NK = {"tiny": [4096], "small": [1024, 4096, 16384], "full": [256, 512, 1024, 2048, 4096, 8192, 16384]}
CPU_MAX_FLOPS = 2 * 1024 * 2048 * 2048  # ~0.2 s per call on one core; larger shapes saturate


def points(ctx: Ctx) -> list[dict]:
    """Sweep points, coarse-to-fine levels; fp8 points only where `fp8_skip_reason` is None."""
    if ctx.on_gpu:
        axes = {"m": GPU_M[ctx.sweep], "n": GPU_NK[ctx.sweep], "k": GPU_NK[ctx.sweep]}
    else:
        ax = CPU_AXES[ctx.sweep]
        axes = {"m": ax, "n": ax, "k": ax}
    names = [n for n, _, _ in ctx.dtypes()] + ([] if fp8_skip_reason(ctx) else ["fp8"])
    out = []
    for name in names:
        for p in grid_points(axes, dtype=name):
            if not ctx.on_gpu and 2 * p["m"] * p["n"] * p["k"] > CPU_MAX_FLOPS:
                continue
            p["id"] = f"gemm|{name}|{p['m']}|{p['n']}|{p['k']}"
            out.append(p)
    return out


def fp8_call(m: int, n: int, k: int, device):
    """A zero-argument fp8 GEMM y[m,n] = x[m,k] w[n,k]^T via torch._scaled_mm (operands prepared
    outside the call: mat2 column-major, as cuBLASLt's fp8 GEMM requires)."""
    import torch
    x = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device=device).to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32, device=device)
    wt = w.t()  # [k, n], column-major

    def fn():
        return torch._scaled_mm(x, wt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)
    return fn


def measure(p: dict, ctx: Ctx) -> list[tuple[str, dict]]:
    """One point: [("gemm", row)] per table dtype key the measurement stands for."""
    import torch
    import torch.nn.functional as F
    if p["dtype"] == "fp8":
        fn, keys, source = fp8_call(p["m"], p["n"], p["k"], ctx.device), ["fp8"], SOURCE_FP8
    else:
        tdt, keys = next((t, k) for n, t, k in ctx.dtypes() if n == p["dtype"])
        x = torch.randn(p["m"], p["k"], dtype=tdt, device=ctx.device)
        w = torch.randn(p["n"], p["k"], dtype=tdt, device=ctx.device)
        source = SOURCE

        def fn():
            return F.linear(x, w)
    with torch.no_grad():
        t = timeit(fn, ctx)
    tf = 2.0 * p["m"] * p["n"] * p["k"] / t / 1e12
    return [("gemm", dict(dtype=k, m=p["m"], n=p["n"], k=p["k"], tflops=tf, source=source)) for k in keys]
