"""The CPU dispatch floor of the trial stack itself (`dispatch_gap` modes "stack" and
"stack_step", CPU only).

On CPU one thread dispatches and executes every op, and for small shapes Megatron-core's Python
(module hooks, autograd Functions, router / permutation / dispatcher bookkeeping) costs far more
than a bare op chain. Measured as the trials run it: the Megatron trial backend (gloo, one pinned
thread per rank) trains the reference MoE model (tiny-moe) with L in {1, 3} MoE layers and
m in {1, 4} microbatches of 16 tokens (negligible compute) per rank, on as many ranks as the
profile has CPU devices (data-parallel, so every core runs a rank as in a cpu-local trial). One
rank alone measured a floor the trials do not see: with the other core idle, Python runs up to
1.3-1.6x faster per core than with both cores busy (a 5M-iteration loop on this 2-vCPU VM: 1.01-1.05
s alone, 1.27-1.60 s on each core when both run it), and a two-rank step also waits for the slower
rank. With T(L, m) the least-interfered step time:

  per layer and microbatch  b = [T(3,4) - T(1,4) - T(3,1) + T(1,1)] / (2 * 3)
  per layer and step        s = [T(3,1) - T(1,1)] / 2 - b   (optimizer over the layer's tensors,
                                                              grad-buffer zeroing, DDP hooks)

The grid is measured in ROUNDS interleaved rounds and each point keeps its fastest sample: on a
shared host the load changes within seconds, and the double difference above subtracts four
step times, so one point taken in a busier moment than the others (observed on this 2-core host:
T(3,4) = 295 ms next to T(1,1) = 16, T(3,1) = 37, T(1,4) = 51 ms, i.e. b = 37 ms with s = a =
-26 ms) would otherwise set b several times too high. b is moreover bounded by what the grid
itself shows a layer and a microbatch to cost: per-layer-per-step and per-microbatch costs are not
negative, so b <= (T(3,1) - T(1,1)) / 2 and b <= (T(1,4) - T(1,1)) / 3; a b beyond that bound is
interference, clamped to it and said so in the row's source.

Row "stack" is b per structural kernel of the layer as the cost model counts them
(`cost_model.model.structural_kernels`, x3 for fwd + bwd), so kernels x gap reproduces the
measured per-layer floor; row "stack_step" is s in microseconds per layer (not per kernel). On
GPUs launches are asynchronous and mode "eager" is used instead.

Where the floor's time shows in a trial's split. A trial splits its step by calibration class
(trials/megatron/components.py: module hooks and the profiler), and the per-component fit compares
the model's parts with that split. How much of the floor a split puts in host_launch (Python between
ops) and how much inside the ops and modules (attention, experts, router, linear layers, the
collectives' wrappers) is a property of the stack, not of the kernel counts: each grid point is
split as a trial's step is, and rows "stack@<class>" hold the part of the per-kernel gap that the
split of T(3,4) - T(1,1) (the grid's largest and smallest steps, almost all of it the layers'
per-microbatch floor: 11 b of 11 b + 2 s + 3 a) measures in <class>, so they sum to row "stack".
On the 2-core host: attention 10%, grouped_gemm 28-29%, elementwise 25-26%, host_launch 28%, gemm 3%,
the collectives 4-6%, where the kernel counts placed 11 / 26 / 17 / 46% (issue 27)."""
from __future__ import annotations

import dataclasses

from cost_model.ops import FLOOR_SPLIT_MODE

NAME = "stack_floor"
REF_MODEL = "tiny-moe"
TOKENS = 16
GRID = ((1, 1), (3, 1), (1, 4), (3, 4))  # (layers, microbatches)
ROUNDS = 2  # interleaved passes over GRID; each point keeps its fastest sample


def skip_reason(ctx):
    if ctx.on_gpu:
        return "GPU: kernel launches are asynchronous; the eager dispatch gap applies"
    return None


def points(ctx) -> list[dict]:
    # round-major, so the rounds interleave (and a budget cut leaves whole rounds)
    return [dict(id=f"stack|{REF_MODEL}|L{n}|m{m}|r{r}", layers=n, microbatches=m, level=0, round=r)
            for r in range(ROUNDS) for n, m in GRID]


def measure_layers(n_layers: int, microbatches: int = 1, iters: int = 8, warmup: int = 3,
                   world: int = 1) -> tuple[float, dict]:
    """Fastest step time (s) of the reference model with n_layers MoE layers, `microbatches`
    microbatches of TOKENS tokens per rank, on `world` data-parallel ranks (the step ends when
    the slowest rank does), and that step's split by calibration class ({class: s}, the ranks'
    mean shares as a trial records them; {} when the trial recorded none)."""
    from specs.models import load_model
    from specs.plan import Plan
    from specs.stack import cpu_defaults
    from trials.megatron.backend import cpu_allocator_env, launch
    from trials.megatron.components import component_times
    base = load_model(REF_MODEL)
    spec = dataclasses.replace(base, num_layers=n_layers, moe_layers=(True,) * n_layers)
    res = launch(Plan(**cpu_defaults({})).canonical(), spec.to_dict(), microbatches * world, TOKENS, world,
                 timeout_s=300, iters=iters, warmup=warmup, env=cpu_allocator_env())  # as the CPU trials run
    if not res["ok"]:
        raise RuntimeError(f"stack floor trial failed: {res['kind']}: {res['message'][:300]}")
    best = min(res["ranks"][0]["step_times_s"])
    return best, component_times(res["ranks"][0].get("component_shares"), best)


def floor_split(splits: dict[tuple[int, int], dict]) -> dict[str, float]:
    """{class: share} of the floor a trial's split measures in each class (module docstring): the
    classes' time in T(3,4) less their time in T(1,1), negative differences (noise) dropped, as
    shares summing to 1; {} without both splits."""
    hi, lo = splits.get((3, 4)) or {}, splits.get((1, 1)) or {}
    if not hi or not lo:
        return {}
    diff = {c: max(0.0, hi.get(c, 0.0) - lo.get(c, 0.0)) for c in set(hi) | set(lo)}
    total = sum(diff.values())
    return {c: v / total for c, v in sorted(diff.items()) if v > 0} if total > 0 else {}


def rows_from(times: dict[tuple[int, int], float],
              splits: dict[tuple[int, int], dict] | None = None) -> list[tuple[str, dict]]:
    from cost_model.model import structural_kernels
    from specs.models import load_model
    if not all(k in times for k in GRID):
        return []
    spec = load_model(REF_MODEL)
    T = times
    b_raw = (T[3, 4] - T[1, 4] - T[3, 1] + T[1, 1]) / (2 * 3)
    # physical bound (module docstring): neither the per-layer-per-step cost s nor the
    # per-microbatch cost a is negative
    bound = min((T[3, 1] - T[1, 1]) / 2, (T[1, 4] - T[1, 1]) / 3)
    b = max(min(b_raw, bound), 1e-9)
    clamp = (f"; double difference {b_raw * 1e3:.2f} ms clamped to the grid's per-layer/per-microbatch "
             f"bound {bound * 1e3:.2f} ms (interference)") if b_raw > bound else ""
    s = max((T[3, 1] - T[1, 1]) / 2 - b, 0.0)
    k_attn, _, k_moe = structural_kernels(spec, 1, 1, False, spec.num_experts)
    kern = 3.0 * float(k_attn + k_moe)
    gap_us = b / kern * 1e6
    shares = floor_split(splits or {})
    return [("dispatch_gap", dict(mode="stack", gap_us=gap_us,
                                  source=f"measured:stack-floor ({REF_MODEL}, {TOKENS} tokens: {b * 1e3:.2f} ms "
                                         f"per MoE layer fwd+bwd per microbatch / {kern:.0f} kernels{clamp})")),
            ("dispatch_gap", dict(mode="stack_step", gap_us=max(s * 1e6, 1e-3),
                                  source=f"measured:stack-floor ({REF_MODEL}: {s * 1e3:.2f} ms per layer per step, "
                                         "outside the microbatch loop)"))] + [
            ("dispatch_gap", dict(mode=f"{FLOOR_SPLIT_MODE}{c}", gap_us=gap_us * v,
                                  source=f"measured:stack-floor ({v:.1%} of the per-kernel gap in a trial's {c} "
                                         "split, T(3,4) - T(1,1))")) for c, v in shares.items()]
