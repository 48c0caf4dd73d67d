"""Memory-bound ops -> achieved bandwidth (`membw`), in the cost model's byte convention (the
bytes `cost_model/blocks.py` charges for the op, activations counted at 2 B per element as in
bf16 training; on CPU the trial stack runs them in fp32 and the measurement times fp32 ops):

    elementwise  residual add (r2 w1) + SiLU (r1 w1) + RMSNorm (r1 w1) on [T, h]: 2*7*T*h bytes
    permute      MoE permute (index_select of T*K rows) + unpermute (index_add back):
                 2*2*(T + T*K)*h bytes (model: perm_f)
    router       fp32 softmax + top-k + routing map + aux-loss sum on [T, E] logits: 24*T*E bytes
    optimizer    torch Adam step over P fp32 params (foreach): 34*P bytes (model: opt_t)

The table has no size axis: each op is swept over a few sizes and the median bandwidth is kept
(the per-size samples stay in the partial CSV)."""
from __future__ import annotations

from trials.profile.common import Ctx, timeit

NAME = "elementwise"
CPU_SIZES = {"tiny": [(256, 64)], "small": [(256, 64), (2048, 512)],
             "full": [(256, 64), (1024, 64), (2048, 256), (4096, 1024)]}
GPU_SIZES = {"tiny": [(4096, 4096)], "small": [(4096, 2048), (16384, 4096)],
             "full": [(2048, 2048), (4096, 4096), (16384, 4096), (16384, 7168)]}
OPS = ("elementwise", "permute", "router", "optimizer")
TOPK = 2


def points(ctx: Ctx) -> list[dict]:
    sizes = (GPU_SIZES if ctx.on_gpu else CPU_SIZES)[ctx.sweep]
    out = []
    for lvl, (t, h) in enumerate(sizes):
        for op in OPS:
            out.append(dict(id=f"membw|{op}|{t}|{h}", op=op, tokens=t, hidden=h, level=min(lvl, 3)))
    return out


def measure(p: dict, ctx: Ctx) -> list[tuple[str, dict]]:
    import torch
    dt = ctx.dtypes()[0][1]
    dev = ctx.device
    T, h, op = p["tokens"], p["hidden"], p["op"]
    with torch.no_grad():
        if op == "elementwise":
            x = torch.randn(T, h, dtype=dt, device=dev)
            r = torch.randn(T, h, dtype=dt, device=dev)
            w = torch.ones(h, dtype=dt, device=dev)

            def fn():
                y = x + r
                y = torch.nn.functional.silu(y)
                return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * w
            nbytes = 2.0 * 7 * T * h
        elif op == "permute":
            x = torch.randn(T, h, dtype=dt, device=dev)
            idx = torch.randint(0, T, (T * TOPK,), device=dev).sort().values
            out = torch.zeros(T, h, dtype=dt, device=dev)

            def fn():
                y = x.index_select(0, idx)
                return out.zero_().index_add_(0, idx, y)
            nbytes = 2.0 * 2 * (T + T * TOPK) * h
        elif op == "router":
            E = max(8, h // 8)
            logits = torch.randn(T, E, dtype=torch.float32, device=dev)

            def fn():
                probs = torch.softmax(logits, dim=-1)
                top, ind = torch.topk(probs, TOPK, dim=-1)
                routing = torch.zeros_like(probs).scatter_(1, ind, top)
                return routing.sum(0) * probs.mean(0)
            nbytes = 24.0 * T * E
        else:  # optimizer
            P = T * h * 4
            params = [torch.nn.Parameter(torch.randn(P // 8, dtype=torch.float32, device=dev)) for _ in range(8)]
            for q in params:
                q.grad = torch.randn_like(q)
            opt = torch.optim.Adam(params, lr=1e-4)
            fn = opt.step
            nbytes = 34.0 * (P // 8) * 8
        t = timeit(fn, ctx)
    return [("membw_sample", dict(op=op, tokens=T, hidden=h, bytes=nbytes, seconds=t, gbps=nbytes / t / 1e9,
                                  source=f"measured:membw-{op}"))]
