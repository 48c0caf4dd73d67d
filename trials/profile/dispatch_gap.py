"""Per-kernel dispatch gap: the steady-state time between small ops in an eager stream (mode
eager: a chain of 1-element adds, no autograd; mode autograd: the same chain recorded and
back-propagated, per op of fwd + bwd). On GPU the chain is launch-bound; on CPU it is the
framework's per-op overhead, which dominates small-shape trials."""
from __future__ import annotations

from trials.profile.common import Ctx, timeit

NAME = "dispatch_gap"
CHAIN = 200


def points(ctx: Ctx) -> list[dict]:
    return [dict(id="gap|eager", mode="eager", level=0), dict(id="gap|autograd", mode="autograd", level=0)]


def measure(p: dict, ctx: Ctx) -> list[tuple[str, dict]]:
    import torch
    x = torch.zeros(1, device=ctx.device, requires_grad=p["mode"] == "autograd")
    if p["mode"] == "eager":
        def fn():
            with torch.no_grad():
                y = x
                for _ in range(CHAIN):
                    y = y + 1.0
            return y
        per = CHAIN
    else:
        def fn():
            y = x
            for _ in range(CHAIN):
                y = y * 1.0001
            torch.autograd.grad(y.sum(), x)
        per = 2 * CHAIN
    # wall clock on every device: the gap is host time per launch, which CUDA events would not see
    t = timeit(fn, ctx, min_time_s=max(ctx.min_time_s, 0.02), reps=max(ctx.reps, 5), clock="wall", flush=False)
    return [("dispatch_gap", dict(mode=p["mode"], gap_us=t / per * 1e6, source=f"measured:dispatch-gap-{p['mode']}"))]
