"""The CPU dispatch floor of the trial stack itself (`dispatch_gap` mode "stack", CPU only).

On CPU one thread dispatches and executes every op, and for small shapes Megatron-core's Python
(module hooks, autograd Functions, router / permutation / dispatcher bookkeeping) costs far more
than a bare op chain. Measured as the trials run it: the Megatron trial backend (one rank, gloo,
pinned, one thread) trains the reference MoE model (tiny-moe) with L = 1 and L = 3 layers at a
negligible token count (16 tokens, mbs 1); the per-layer fwd+bwd time is (T3 - T1) / 2, and the
row is that time per structural kernel of the layer as the cost model counts them
(`cost_model.model.structural_kernels`, x3 for fwd + bwd), so kernels x gap reproduces the
measured per-layer floor. On GPUs launches are asynchronous and mode "eager" is used instead."""
from __future__ import annotations

import dataclasses
import statistics

NAME = "stack_floor"
REF_MODEL = "tiny-moe"
TOKENS = 16
LAYERS = (1, 3)


def skip_reason(ctx):
    if ctx.on_gpu:
        return "GPU: kernel launches are asynchronous; the eager dispatch gap applies"
    return None


def points(ctx) -> list[dict]:
    return [dict(id=f"stack|{REF_MODEL}|L{n}", layers=n, level=0) for n in LAYERS]


def measure_layers(n_layers: int, iters: int = 8, warmup: int = 3) -> float:
    """Median step time (s) of the reference model with n_layers MoE layers at TOKENS tokens."""
    from trials.megatron.backend import launch
    from trials.megatron.cpu_support import cpu_defaults
    from tuner.model_spec import load_model
    from tuner.plan import Plan
    base = load_model(REF_MODEL)
    spec = dataclasses.replace(base, num_layers=n_layers, moe_layers=(True,) * n_layers)
    res = launch(Plan(**cpu_defaults({})).canonical(), spec.to_dict(), 1, TOKENS, 1, timeout_s=300, iters=iters, warmup=warmup)
    if not res["ok"]:
        raise RuntimeError(f"stack floor trial failed: {res['kind']}: {res['message'][:300]}")
    return statistics.median(res["ranks"][0]["step_times_s"])


def rows_from(times: dict[int, float]) -> list[tuple[str, dict]]:
    from cost_model.model import structural_kernels
    from tuner.model_spec import load_model
    spec = load_model(REF_MODEL)
    lo, hi = min(times), max(times)
    per_layer = max((times[hi] - times[lo]) / (hi - lo), 1e-9)
    k_attn, _, k_moe = structural_kernels(spec, 1, 1, False, spec.num_experts)
    kern = 3.0 * float(k_attn + k_moe)
    return [("dispatch_gap", dict(mode="stack", gap_us=per_layer / kern * 1e6,
                                  source=f"measured:stack-floor ({REF_MODEL}, {TOKENS} tokens: "
                                         f"{per_layer * 1e3:.2f} ms per MoE layer fwd+bwd / {kern:.0f} kernels)"))]
