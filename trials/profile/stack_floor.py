"""The CPU dispatch floor of the trial stack itself (`dispatch_gap` modes "stack" and
"stack_step", CPU only).

On CPU one thread dispatches and executes every op, and for small shapes Megatron-core's Python
(module hooks, autograd Functions, router / permutation / dispatcher bookkeeping) costs far more
than a bare op chain. Measured as the trials run it: the Megatron trial backend (one rank, gloo,
pinned, one thread) trains the reference MoE model (tiny-moe) with L in {1, 3} MoE layers and
m in {1, 4} microbatches of 16 tokens (negligible compute). With T(L, m) the least-interfered
step time:

  per layer and microbatch  b = [T(3,4) - T(1,4) - T(3,1) + T(1,1)] / (2 * 3)
  per layer and step        s = [T(3,1) - T(1,1)] / 2 - b   (optimizer over the layer's tensors,
                                                              grad-buffer zeroing, DDP hooks)

Row "stack" is b per structural kernel of the layer as the cost model counts them
(`cost_model.model.structural_kernels`, x3 for fwd + bwd), so kernels x gap reproduces the
measured per-layer floor; row "stack_step" is s in microseconds per layer (not per kernel). On
GPUs launches are asynchronous and mode "eager" is used instead."""
from __future__ import annotations

import dataclasses

NAME = "stack_floor"
REF_MODEL = "tiny-moe"
TOKENS = 16
GRID = ((1, 1), (3, 1), (1, 4), (3, 4))  # (layers, microbatches)


def skip_reason(ctx):
    if ctx.on_gpu:
        return "GPU: kernel launches are asynchronous; the eager dispatch gap applies"
    return None


def points(ctx) -> list[dict]:
    return [dict(id=f"stack|{REF_MODEL}|L{n}|m{m}", layers=n, microbatches=m, level=0) for n, m in GRID]


def measure_layers(n_layers: int, microbatches: int = 1, iters: int = 8, warmup: int = 3) -> float:
    """Fastest step time (s) of the reference model with n_layers MoE layers, `microbatches`
    microbatches of TOKENS tokens, one rank."""
    from specs.models import load_model
    from specs.plan import Plan
    from specs.stack import cpu_defaults
    from trials.megatron.backend import launch
    base = load_model(REF_MODEL)
    spec = dataclasses.replace(base, num_layers=n_layers, moe_layers=(True,) * n_layers)
    res = launch(Plan(**cpu_defaults({})).canonical(), spec.to_dict(), microbatches, TOKENS, 1, timeout_s=300,
                 iters=iters, warmup=warmup)
    if not res["ok"]:
        raise RuntimeError(f"stack floor trial failed: {res['kind']}: {res['message'][:300]}")
    return min(res["ranks"][0]["step_times_s"])


def rows_from(times: dict[tuple[int, int], float]) -> list[tuple[str, dict]]:
    from cost_model.model import structural_kernels
    from specs.models import load_model
    if not all(k in times for k in GRID):
        return []
    spec = load_model(REF_MODEL)
    T = times
    b = max((T[3, 4] - T[1, 4] - T[3, 1] + T[1, 1]) / (2 * 3), 1e-9)
    s = max((T[3, 1] - T[1, 1]) / 2 - b, 0.0)
    k_attn, _, k_moe = structural_kernels(spec, 1, 1, False, spec.num_experts)
    kern = 3.0 * float(k_attn + k_moe)
    return [("dispatch_gap", dict(mode="stack", gap_us=b / kern * 1e6,
                                  source=f"measured:stack-floor ({REF_MODEL}, {TOKENS} tokens: {b * 1e3:.2f} ms "
                                         f"per MoE layer fwd+bwd per microbatch / {kern:.0f} kernels)")),
            ("dispatch_gap", dict(mode="stack_step", gap_us=max(s * 1e6, 1e-3),
                                  source=f"measured:stack-floor ({REF_MODEL}: {s * 1e3:.2f} ms per layer per step, "
                                         "outside the microbatch loop)"))]
