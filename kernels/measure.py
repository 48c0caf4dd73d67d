"""The measurement job: sweep the (c, K) grid on every GPU of a node, keep the measured grids with
provenance, refit the curves and regenerate the tables.

The pattern of vLLM's `benchmarks/kernels/benchmark_moe.py`: one Ray actor per GPU
(`num_gpus=1`), the search space split round-robin across the actors, results gathered by the
driver. Each actor owns a *timer*:

* `gpu`: times the persistent Weave-style Triton kernel (`kernels.weave_kernel`) on its GPU with
  CUDA events. Only EP 1 cases: the communication programs move the local permutation traffic,
  so these grids calibrate the compute side (TFLOPS(n), eff_chunk(K)); BW(c) and alpha need the
  cross-GPU dispatch that is not implemented yet and keep their defaults.
* `stand-in`: for machines without a GPU. It follows a known ground-truth curve set (the Weave
  model under given `Curves`) with optional seeded multiplicative noise, so the whole job (Ray
  actors, sweep split, provenance, refit, tables) runs end to end and a test can check that the
  refit finds the ground truth again.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from kernels import calibrate, store
from kernels.weave import K_CHOICES, Curves, LayerShape, curves_from_dict
from specs.errors import UsageError

log = logging.getLogger(__name__)


class StandInTimer:
    """CPU stand-in: the ground-truth model latency (ms) of a point, times seeded noise."""

    def __init__(self, truth: dict, noise: float = 0.0, seed: int = 0):
        self.truth = curves_from_dict(truth)
        self.noise = float(noise)
        self.rng = np.random.default_rng(seed)

    def __call__(self, case: dict, c: int, k: int) -> float:
        gc = calibrate.case_from_dict(case, [{"c": c, "K": k}])
        ms = float(calibrate.predict_case(gc, self.truth)[0])
        return ms * float(np.exp(self.rng.normal(0.0, self.noise))) if self.noise else ms


class GpuTimer:
    """Times the Weave-style persistent kernel at (c, K) on this actor's GPU (median of `iters`)."""

    def __init__(self, iters: int = 10, warmup: int = 3):
        import torch
        if not torch.cuda.is_available():
            raise UsageError("the gpu timer needs a CUDA device")
        self.iters, self.warmup = iters, warmup
        self._inputs = {}

    def __call__(self, case: dict, c: int, k: int) -> float:
        import torch

        from kernels import weave_kernel
        if case["ep"] != 1:
            # Cross-GPU dispatch through peer memory is not implemented in kernels.weave_kernel.
            raise UsageError("the gpu timer measures one GPU (EP 1): cross-GPU dispatch is not implemented")
        key = (tuple(sorted(case["shape"].items())), case["tokens"], case["skew"])
        if key not in self._inputs:
            self._inputs[key] = weave_kernel.random_inputs(LayerShape(**case["shape"]), int(case["tokens"]),
                                                           skew=case["skew"], device="cuda", dtype=torch.bfloat16)
        inp = self._inputs[key]
        sm = torch.cuda.get_device_properties(0).multi_processor_count
        for _ in range(self.warmup):
            weave_kernel.weave_moe(*inp, num_programs=sm, comm_programs=c, chunks=k,
                                   block_m=64, block_n=64, block_k=64, block_h=256)
        return cuda_median_ms(lambda: weave_kernel.weave_moe(*inp, num_programs=sm, comm_programs=c, chunks=k,
                                                             block_m=64, block_n=64, block_k=64, block_h=256),
                              iters=self.iters, warmup=0)


# Block configurations tried by the fused-MoE sweep (SGLang keys); a small set around the shapes
# SGLang's shipped H100 tables pick for bf16 expert GEMMs.
BLOCK_CANDIDATES = [
    {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": gm, "num_warps": nw, "num_stages": ns}
    for bm, bn, bk, gm, nw, ns in [
        (16, 64, 64, 1, 4, 3), (32, 64, 64, 8, 4, 3), (64, 64, 64, 8, 4, 3), (64, 128, 64, 8, 4, 3),
        (64, 128, 64, 16, 8, 4), (128, 128, 64, 8, 8, 3), (128, 64, 64, 1, 4, 4), (128, 256, 64, 8, 8, 3),
    ]
]


def cuda_median_ms(fn, iters: int = 10, warmup: int = 3) -> float:
    """Median time of fn() in ms by CUDA events (GPU only)."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def sweep_block_configs(shape: LayerShape, m_list, out_root, deadline: float | None = None,
                        candidates=None) -> dict:
    """Time the fused MoE kernel (bf16) for each block configuration at each M on this GPU and write
    the best per M as an SGLang table under out_root (`tables.sglang_config_path`).

    Args:
        shape: expert shape (E local experts, N = per-partition expert FFN width).
        m_list: token counts M to tune.
        out_root: folder standing for SGLANG_MOE_CONFIG_DIR.
        deadline: time.time() after which no further configuration is tried.
        candidates: configurations to try (default BLOCK_CANDIDATES).
    Returns:
        {"table": path or None, "best": {M: {"ms", config...}}, "timings": [...]}.
    """
    import torch
    import triton

    from kernels import tables
    from kernels.fused_moe import fused_moe
    from kernels.weave_kernel import random_inputs
    best, timings = {}, []
    for m in m_list:
        inp = random_inputs(shape, int(m), device="cuda", dtype=torch.bfloat16)
        for cfg in candidates or BLOCK_CANDIDATES:
            if deadline is not None and time.time() > deadline:
                break
            try:
                ms = cuda_median_ms(lambda cfg=cfg, inp=inp: fused_moe(*inp, config=cfg), iters=5, warmup=2)
            except Exception as e:  # noqa: BLE001 - a config that does not fit (shared memory) is skipped
                timings.append({"M": int(m), "config": cfg, "error": str(e).splitlines()[0][:200]})
                continue
            timings.append({"M": int(m), "config": cfg, "ms": ms})
            if m not in best or ms < best[m][0]:
                best[m] = (ms, cfg)
    dev = torch.cuda.get_device_name().replace(" ", "_")
    path = tables.sglang_config_path(out_root, shape.num_experts, shape.inter, dev, triton.__version__)
    if best:
        tables.write_block_table(path, {int(m): cfg for m, (_, cfg) in best.items()})
    return {"table": str(path) if best else None, "timings": timings,
            "best": {str(m): {"ms": v[0], **v[1]} for m, v in best.items()}}


def _make_worker_class(use_gpu: bool):
    import ray

    # Stand-in actors reserve no CPU so several share a 1-CPU local Ray (the split is what is tested).
    opts = {"num_gpus": 1} if use_gpu else {"num_cpus": 0}

    @ray.remote(**opts)
    class GridWorker:
        """One per GPU: measures its share of the (case, c, K) points."""

        def __init__(self, timer: str, timer_args: dict):
            self.timer = StandInTimer(**timer_args) if timer == "stand-in" else GpuTimer(**timer_args)

        def measure(self, items: list) -> list:
            out = []
            for i, case, c, k in items:
                out.append((i, self.timer(case, c, k)))  # (case index, ms), in the share's order
            return out

    return GridWorker


def sweep_points(sm_count: int, c_step: int, ks=K_CHOICES) -> list[tuple[int, int]]:
    return [(c, k) for c in range(c_step, sm_count - c_step + 1, c_step) for k in ks]


def run_job(kind: str, cases: list[dict], timer: str = "gpu", timer_args: dict | None = None,
            workers: int | None = None, c_step: int = 8, sm_count: int | None = None,
            refit: bool = True, source: str = "") -> dict:
    """Measure the (c, K) grid of every case, keep the grids, refit and regenerate the tables.

    Args:
        kind: hardware kind measured (names the $MOETUNE_HOME/kernels/<kind>/ folder).
        cases: workloads, each {"shape": {...}, "tokens", "ep", "skew"} (`calibrate.case_to_dict`).
        timer: "gpu" (CUDA events on the Weave kernel) or "stand-in" (ground-truth curves).
        timer_args: keyword arguments of the timer (stand-in: truth=Curves dict, noise, seed).
        workers: actors to start (default: the GPUs Ray sees; stand-in: 1).
        c_step: step of the communication-SM sweep.
        sm_count: SMs per device (default: the catalog's for `kind`).
        refit: refit the curves and regenerate tables afterwards.
        source: provenance note stored with each grid.
    Ray must be running (`trials.ray_runtime.ray_session`; stand-in actors reserve no CPU).
    Returns:
        {"grids": [paths], "refit": refit report or None, "seconds": wall time}.
    """
    import ray

    # kernels sits below trials, so the caller starts Ray: trials.ray_runtime (token, loopback),
    # as `moetune kernels tune` does; a bare ray.init here would be neither
    if not ray.is_initialized():
        raise RuntimeError("kernels.measure.run_job runs on a Ray the caller started (trials.ray_runtime.ray_session)")
    return _run(kind, cases, timer, timer_args, workers, c_step, sm_count, refit, source, time.time())


def _run(kind, cases, timer, timer_args, workers, c_step, sm_count, refit, source, t0) -> dict:
    import ray

    from clusters import load_cluster
    use_gpu = timer == "gpu"
    n = workers or (int(ray.cluster_resources().get("GPU", 0)) if use_gpu else 1)
    if n <= 0:
        raise UsageError("no GPU visible to Ray: run with a GPU or use the stand-in timer")
    sm = sm_count or int(load_cluster(kind).sm_count)
    items = [(i, case, c, k) for i, case in enumerate(cases) for c, k in sweep_points(sm, c_step)]
    Worker = _make_worker_class(use_gpu)
    actors = [Worker.remote(timer, dict(timer_args or {}, **({"seed": j} if timer == "stand-in" else {})))
              for j in range(n)]
    shares = [items[j::n] for j in range(n)]  # round-robin: each GPU gets every n-th point
    results = ray.get([a.measure.remote(s) for a, s in zip(actors, shares) if s])
    for a in actors:
        ray.kill(a)
    # Each share comes back in its own order; rebuild the points of every case.
    per_case_points = {i: [] for i in range(len(cases))}
    for part, share in zip(results, [s for s in shares if s]):
        for (i, ms), (_, _, c, k) in zip(part, share):
            per_case_points[i].append({"c": c, "K": k, "ms": round(float(ms), 6)})
    paths = []
    src = source or f"moetune kernels tune ({timer} timer, {n} worker(s))"
    for i, case in enumerate(cases):
        pts = sorted(per_case_points[i], key=lambda p: (p["c"], p["K"]))
        paths.append(str(store.save_grid(kind, case, pts, source=src)))
    rep = calibrate.refit_kind(kind) if refit else None
    return {"grids": paths, "refit": rep, "seconds": time.time() - t0, "workers": n}


def cases_for(shape: LayerShape, tokens, ep: int, skews=(1.0,)) -> list[dict]:
    """Measurement cases for one layer shape over token counts and skews."""
    out = []
    for t in np.atleast_1d(tokens):
        for s in skews:
            out.append(calibrate.case_to_dict(calibrate.GridCase(shape, float(t), ep, float(s), [])))
    return out


def truth_dict(curves: Curves) -> dict:
    return curves.to_dict()
