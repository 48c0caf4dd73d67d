"""Core attention forward and backward over (seq, head_dim). GPU: SDPA (flash backend) in bf16,
causal. CPU: the math of Megatron's local (non-TE) DotProductAttention, which the CPU trials run:
scores = baddbmm(q, k^T) * 1/sqrt(d), causal mask, fp32 softmax, bmm with V (unfused, full s^2).
TFLOPS are in causal flops (the cost model's convention): fwd = b*h*s^2*2*d, bwd = 2.5 x fwd."""
from __future__ import annotations

from trials.profile.common import Ctx, grid_points, timeit

NAME = "attention"
HEADS = 8  # batch x heads of one call (the table has no head axis; per-head work is what scales)
CPU = {"tiny": dict(seq=[128, 256], head_dim=[16, 64]),
       "small": dict(seq=[128, 512, 2048], head_dim=[16, 64, 128]),
       "full": dict(seq=[64, 128, 256, 512, 1024, 2048], head_dim=[16, 32, 64, 128])}
GPU = {"tiny": dict(seq=[1024, 4096], head_dim=[128]),
       "small": dict(seq=[512, 2048, 8192], head_dim=[64, 128]),
       "full": dict(seq=[512, 1024, 2048, 4096, 8192, 16384], head_dim=[64, 128, 192, 256])}


def points(ctx: Ctx) -> list[dict]:
    s = (GPU if ctx.on_gpu else CPU)[ctx.sweep]
    out = []
    for name, _, _ in ctx.dtypes():
        for p in grid_points(s, dtype=name):
            p["id"] = f"attention|{name}|{p['seq']}|{p['head_dim']}"
            out.append(p)
    return out


def _cpu_attention(q, k, v, mask, scale):
    import torch
    scores = torch.baddbmm(torch.empty(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype),
                           q, k.transpose(1, 2), beta=0.0, alpha=scale)
    scores = scores.masked_fill(mask, -10000.0)
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.bmm(probs, v)


def measure(p: dict, ctx: Ctx) -> list[tuple[str, dict]]:
    import torch
    tdt, keys = next((t, k) for n, t, k in ctx.dtypes() if n == p["dtype"])
    s, d = p["seq"], p["head_dim"]
    scale = d ** -0.5
    if ctx.on_gpu:
        import torch.nn.functional as F
        shape = (1, HEADS, s, d)
        src = "measured:sdpa-flash"

        def fwd(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        shape = (HEADS, s, d)
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
        src = "measured:megatron-local-attention"

        def fwd(q, k, v):
            return _cpu_attention(q, k, v, mask, scale)
    q, k, v = (torch.randn(*shape, dtype=tdt, device=ctx.device, requires_grad=True) for _ in range(3))
    go = torch.randn(*shape, dtype=tdt, device=ctx.device)
    with torch.no_grad():
        tf_ = timeit(lambda: fwd(q, k, v), ctx)

    def fb():
        out = fwd(q, k, v)
        torch.autograd.grad(out, (q, k, v), go)
    tfb = timeit(fb, ctx)
    tb = max(tfb - tf_, 1e-3 * tfb)
    flops = HEADS * s * s * 2.0 * d
    rows = []
    for kk in keys:
        rows.append(("attention", dict(dtype=kk, direction="fwd", seq=s, head_dim=d, tflops=flops / tf_ / 1e12,
                                       source=src)))
        rows.append(("attention", dict(dtype=kk, direction="bwd", seq=s, head_dim=d,
                                       tflops=2.5 * flops / tb / 1e12, source=src)))
    return rows
