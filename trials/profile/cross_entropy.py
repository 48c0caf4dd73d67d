"""Cross-entropy over the vocabulary on fp32-upcast logits, forward + backward: `membw` op
cross_entropy in the cost model's convention (T*V*10 bytes each direction: ce_f, ce_b)."""
from __future__ import annotations

from trials.profile.common import Ctx, timeit

NAME = "cross_entropy"
CPU = {"tiny": [(256, 512)], "small": [(256, 512), (1024, 8192)],
       "full": [(256, 512), (2048, 512), (1024, 8192), (1024, 32768)]}
GPU = {"tiny": [(4096, 32768)], "small": [(4096, 32768), (8192, 131072)],
       "full": [(2048, 32768), (4096, 65536), (8192, 131072), (4096, 163840)]}


def points(ctx: Ctx) -> list[dict]:
    return [dict(id=f"ce|{t}|{v}", tokens=t, vocab=v, level=min(i, 3))
            for i, (t, v) in enumerate((GPU if ctx.on_gpu else CPU)[ctx.sweep])]


def measure(p: dict, ctx: Ctx) -> list[tuple[str, dict]]:
    import torch
    import torch.nn.functional as F
    dt = ctx.dtypes()[0][1]
    T, V = p["tokens"], p["vocab"]
    logits = torch.randn(T, V, dtype=dt, device=ctx.device, requires_grad=True)
    target = torch.randint(0, V, (T,), device=ctx.device)

    def fn():
        loss = F.cross_entropy(logits.float(), target)
        torch.autograd.grad(loss, logits)
    t = timeit(fn, ctx)
    nbytes = 20.0 * T * V
    return [("membw_sample", dict(op="cross_entropy", tokens=T, hidden=V, bytes=nbytes, seconds=t,
                                  gbps=nbytes / t / 1e9, source="measured:membw-cross_entropy"))]
