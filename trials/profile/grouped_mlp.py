"""The expert linears of the MoE MLP as the stack executes them, keyed by local experts (groups),
per-expert rows M (tokens) and shape (N, K); TFLOPS = 2*g*m*n*k / time. Forward, and the two
backward GEMMs, each written at the table coordinates the cost model looks it up at
(cost_model/model.py `_Ops.grouped`):

    fwd    y[m,n]  = x[m,k] w[k,n]      -> (groups, m, n, k)
    dgrad  dx[m,k] = dy[m,n] w[k,n]^T   -> (groups, m, k, n)
    wgrad  dw[k,n] = x[m,k]^T dy[m,n]   -> (groups, k, n, m)   (tokens on the k axis)

Backends (`backend(ctx)`), recorded in every row's `source` as measured:<backend>/<op>:
    te-grouped-linear  GPU with TransformerEngine: te.pytorch.GroupedLinear, the layer under
                       Megatron's TEGroupedMLP (TEGroupedLinear subclasses it), fwd and backward
                       through autograd (dgrad alone: weights frozen; wgrad alone: input without
                       grad); fp8 under te fp8_autocast (DelayedScaling) where the GPU has fp8
    grouped-mm         GPU without TE: torch._grouped_mm (no stack runs it; a stand-in, labelled)
    sequential-loop    GPU without TE or _grouped_mm: one F.linear per group
    sequential-mlp     CPU: Megatron's SequentialMLP (split per expert, one F.linear each, cat),
                       which is what the CPU trial stack runs
A backend's kernel failing on a point is an error for that point, never a switch to another backend.
"""
from __future__ import annotations

from trials.profile.common import Ctx, fp8_skip_reason, grid_points, te_skip_reason, timeit

NAME = "grouped_mlp"
OPS = ("fwd", "dgrad", "wgrad")
CPU = {"tiny": dict(groups=[1, 2], m=[16, 64], nk=[64]),
       "small": dict(groups=[1, 4], m=[16, 128, 1024], nk=[64, 512]),
       "full": dict(groups=[1, 2, 4, 8, 16], m=[4, 16, 64, 256, 1024], nk=[64, 256, 1024])}
# GPU: up to 256 local experts (DeepSeek-V3 / Kimi-K2 at EP=1), tokens per expert from 16 (the
# wgrad contraction of a sparsely routed expert) up, n and k over the presets' expert ffn / hidden.
GPU = {"tiny": dict(groups=[1, 8], m=[64, 1024], nk=[2048]),
       "small": dict(groups=[1, 16, 256], m=[16, 256, 4096], nk=[1024, 4096]),
       "full": dict(groups=[1, 2, 4, 8, 16, 32, 64, 128, 256], m=[16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192],
                    nk=[512, 1024, 2048, 4096, 8192])}
CPU_MAX_FLOPS = 2 * 1024 * 2048 * 2048
GPU_MAX_BYTES = 16 * 2 ** 30  # operands of one point (weights + tokens + grads), bf16
GPU_MAX_FLOPS = 4e13  # ~60 ms per call at bf16 peak: larger points add nothing the grid lacks


def backend(ctx: Ctx) -> str:
    """The grouped-GEMM implementation measured on this device (see the module docstring)."""
    if not ctx.on_gpu:
        return "sequential-mlp"
    if te_skip_reason() is None:
        import transformer_engine.pytorch as te
        if hasattr(te, "GroupedLinear"):
            return "te-grouped-linear"
    import torch
    return "grouped-mm" if hasattr(torch, "_grouped_mm") else "sequential-loop"


def fp8_grouped_skip_reason(ctx: Ctx) -> str | None:
    """None when fp8 grouped GEMMs are measured here (TE GroupedLinear under fp8_autocast)."""
    why = fp8_skip_reason(ctx)
    if why:
        return why
    if backend(ctx) != "te-grouped-linear":
        return ("fp8 grouped GEMM is measured through TE GroupedLinear only (the stack without TE cannot "
                "run fp8); " + (te_skip_reason() or "TE has no GroupedLinear"))
    return None


def _fits(g: int, m: int, n: int, k: int, on_gpu: bool) -> bool:
    if not on_gpu:
        return 2 * g * m * n * k <= CPU_MAX_FLOPS
    return 2 * (2 * g * n * k + 2 * g * m * (n + k)) <= GPU_MAX_BYTES and 2 * g * m * n * k <= GPU_MAX_FLOPS


def points(ctx: Ctx) -> list[dict]:
    """Sweep points (one per (dtype, groups, m, n, k); each measures fwd, dgrad and wgrad)."""
    s = (GPU if ctx.on_gpu else CPU)[ctx.sweep]
    names = [n for n, _, _ in ctx.dtypes()] + ([] if fp8_grouped_skip_reason(ctx) else ["fp8"])
    out = []
    for name in names:
        for p in grid_points({"groups": s["groups"], "m": s["m"], "n": s["nk"], "k": s["nk"]}, dtype=name):
            if not _fits(p["groups"], p["m"], p["n"], p["k"], ctx.on_gpu):
                continue
            p["id"] = f"grouped|{name}|{p['groups']}|{p['m']}|{p['n']}|{p['k']}"
            out.append(p)
    return out


def table_coords(op: str, m: int, n: int, k: int) -> tuple[int, int, int]:
    """(m, n, k) of the grouped_gemm table row a timed op stands for (see the module docstring)."""
    return {"fwd": (m, n, k), "dgrad": (m, k, n), "wgrad": (k, n, m)}[op]


def _torch_calls(name: str, g: int, m: int, n: int, k: int, tdt, device) -> dict:
    """{op: zero-argument call} for the torch backends, operands laid out outside the call."""
    import torch
    import torch.nn.functional as F
    x = torch.randn(g * m, k, dtype=tdt, device=device)
    dy = torch.randn(g * m, n, dtype=tdt, device=device)
    w = torch.randn(g, n, k, dtype=tdt, device=device)  # per-expert weights as nn.Linear keeps them
    if name == "grouped-mm":
        offs = torch.arange(1, g + 1, device=device, dtype=torch.int32) * m
        w_f = w.transpose(-2, -1)  # [g, k, n] column-major
        w_d = w.transpose(-2, -1).contiguous().transpose(-2, -1)  # [g, n, k] column-major
        x_t = x.t().contiguous()  # [k, g*m] row-major
        dy_c = dy.t().contiguous().t()  # [g*m, n] column-major
        return {"fwd": lambda: torch._grouped_mm(x, w_f, offs=offs),
                "dgrad": lambda: torch._grouped_mm(dy, w_d, offs=offs),
                "wgrad": lambda: torch._grouped_mm(x_t, dy_c, offs=offs)}
    counts = [m] * g
    ws = list(w.unbind(0))

    def fwd():  # SequentialMLP: split per expert, one linear each, concatenate
        return torch.cat([F.linear(xi, wi) for xi, wi in zip(torch.split(x, counts), ws)])

    def dgrad():
        return torch.cat([dyi @ wi for dyi, wi in zip(torch.split(dy, counts), ws)])

    def wgrad():
        return [dyi.t() @ xi for dyi, xi in zip(torch.split(dy, counts), torch.split(x, counts))]
    return {"fwd": fwd, "dgrad": dgrad, "wgrad": wgrad}


def _fp8_context(fp8: bool):
    """TE's fp8 autocast (DelayedScaling, TE's default recipe) or a null context."""
    import contextlib
    if not fp8:
        return contextlib.nullcontext()
    from transformer_engine.common.recipe import DelayedScaling
    from transformer_engine.pytorch import fp8_autocast
    return fp8_autocast(enabled=True, fp8_recipe=DelayedScaling())


def _te_times(g: int, m: int, n: int, k: int, fp8: bool, ctx: Ctx) -> dict:
    """{op: seconds} through te.pytorch.GroupedLinear: forward with autograd recording (as in
    training), and each backward GEMM alone as (fwd + backward) - fwd with only that gradient
    required."""
    import torch
    import transformer_engine.pytorch as te
    mod = te.GroupedLinear(g, k, n, bias=False, params_dtype=torch.bfloat16, device=ctx.device)
    params = list(mod.parameters())
    x = torch.randn(g * m, k, dtype=torch.bfloat16, device=ctx.device)
    go = torch.randn(g * m, n, dtype=torch.bfloat16, device=ctx.device)
    splits = [m] * g

    def run(x_grad: bool, w_grad: bool, backward: bool):
        x.requires_grad_(x_grad)
        for q in params:
            q.requires_grad_(w_grad)
        wrt = ([x] if x_grad else []) + (params if w_grad else [])

        def fn():
            with _fp8_context(fp8):
                out = mod(x, splits)
            if backward:
                torch.autograd.grad(out, wrt, go)
        return timeit(fn, ctx)

    fwd = run(True, True, False)
    fd, fw = run(True, False, False), run(False, True, False)
    return {"fwd": fwd, "dgrad": max(run(True, False, True) - fd, 1e-3 * fd),
            "wgrad": max(run(False, True, True) - fw, 1e-3 * fw)}


def measure(p: dict, ctx: Ctx) -> list[tuple[str, dict]]:
    """One point: a grouped_gemm row per op (fwd, dgrad, wgrad) and table dtype key."""
    import torch
    g, m, n, k = p["groups"], p["m"], p["n"], p["k"]
    be = backend(ctx)
    if p["dtype"] == "fp8":
        keys = ["fp8"]
        if be != "te-grouped-linear":
            raise RuntimeError(f"fp8 grouped point on backend {be}: {fp8_grouped_skip_reason(ctx)}")
    else:
        tdt, keys = next((t, kk) for nm, t, kk in ctx.dtypes() if nm == p["dtype"])
    if be == "te-grouped-linear":
        times = _te_times(g, m, n, k, p["dtype"] == "fp8", ctx)
    else:
        calls = _torch_calls(be, g, m, n, k, tdt, ctx.device)
        with torch.no_grad():
            times = {op: timeit(fn, ctx) for op, fn in calls.items()}
    rows = []
    for op in OPS:
        tm, tn, tk = table_coords(op, m, n, k)
        tf = 2.0 * g * m * n * k / times[op] / 1e12
        rows += [("grouped_gemm", dict(dtype=kk, groups=g, m=tm, n=tn, k=tk, tflops=tf, source=f"measured:{be}/{op}"))
                 for kk in keys]
    return rows
