"""bench/gpu_check.sh step 4: the size of each timing bias the GPU profile corrects for.

    python bench/gpu_timing_probe.py --out probe.json [--max-s 110]

Each probe times the same work two ways and reports both and their ratio:
  clock      the old profile timing (perf_counter over a burst, minimum of 3 batches, no flush)
             vs CUDA events (median per call), without and with an L2 flush, for a small-m GEMM
             (operands fit in L2) and a large one
  sustained  TFLOPS of back-to-back 8192^3 bf16 GEMMs in 0.25 s windows after 2 s idle: the first
             window (boost clocks) vs the last (sustained clocks)
  fp8        torch._scaled_mm (e4m3, tensorwise) vs bf16 at three shapes (sm89+ only)
  flash      SDPA with the flash backend forced vs the default backend choice
  heads      SDPA flash TFLOPS with (1, 8, s, d), the old profile shape, vs the micro-batch shape
             trials/profile/attention.py now uses (batch x seq = 8192 tokens, 16 heads: OLMoE's)
  graph      the cost of one kernel inside a replayed CUDA graph, as a decode step runs them: a chain
             of 256 dependent tiny kernels (an in-place add on one 7168-wide bf16 row; a one-row GEMV
             against a 7168 x 256 weight) captured once and replayed, time per kernel against the
             serving model's KERNEL_MIN_S (cost_model/serving/constants.py; torch's kernels do not use
             programmatic dependent launch, so this is the cost without it)
Without CUDA it writes {"skipped": reason} and exits 0. Probes run in this order until --max-s.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _events(fn, flush: bool) -> float:
    from trials.profile.common import Ctx, timeit
    ctx = Ctx(device="cuda", flush_l2=flush, min_time_s=0.02, reps=3)
    return timeit(fn, ctx)


def _burst_min(fn) -> float:
    """The timing the profile used before: perf_counter over >= 10 ms batches, min of 3, no flush."""
    from trials.profile.common import Ctx, timeit
    return timeit(fn, Ctx(device="cuda", min_time_s=0.01, reps=3), clock="wall", flush=False)


def probe_clock() -> list[dict]:
    import torch
    out = []
    for m, n, k in ((128, 4096, 4096), (8192, 8192, 8192)):
        a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
        fn = lambda a=a, b=b: torch.nn.functional.linear(a, b)  # noqa: E731
        fl = 2.0 * m * n * k
        t = {"burst_min_wall": _burst_min(fn), "events_median": _events(fn, False),
             "events_median_l2_flushed": _events(fn, True)}
        row = dict(shape=[m, n, k], **{f"{key}_tflops": fl / v / 1e12 for key, v in t.items()})
        row["flush_bias"] = t["events_median_l2_flushed"] / t["events_median"]
        row["old_vs_new"] = t["events_median_l2_flushed"] / t["burst_min_wall"]
        out.append(row)
    return out


def probe_sustained(seconds: float = 6.0, window: float = 0.25) -> dict:
    import torch
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    time.sleep(2.0)  # idle: clocks return to boost
    series, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 0
        s.record()
        w0 = time.perf_counter()
        while time.perf_counter() - w0 < window:
            for _ in range(5):
                torch.mm(a, a)
            n += 5
        e.record()
        e.synchronize()
        series.append(n * 2.0 * 8192 ** 3 / (s.elapsed_time(e) / 1e3) / 1e12)
    return {"window_s": window, "tflops_series": series, "first_tflops": series[0], "last_tflops": series[-1],
            "sustained_vs_burst": series[-1] / series[0]}


def probe_fp8() -> list[dict]:
    import torch

    from trials.profile.common import Ctx, fp8_skip_reason
    from trials.profile.gemm import fp8_call
    why = fp8_skip_reason(Ctx(device="cuda"))
    if why:
        return [{"skipped": why}]
    out = []
    for m, n, k in ((256, 4096, 4096), (4096, 4096, 4096), (16384, 8192, 8192)):
        a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
        fl = 2.0 * m * n * k
        tb = _events(lambda a=a, b=b: torch.nn.functional.linear(a, b), True)
        tf = _events(fp8_call(m, n, k, "cuda"), True)
        out.append(dict(shape=[m, n, k], bf16_tflops=fl / tb / 1e12, fp8_tflops=fl / tf / 1e12, fp8_speedup=tb / tf))
    return out


def _sdpa_time(shape, backend: str | None) -> float:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from trials.profile.attention import sdpa_backend
    q, k, v = (torch.randn(*shape, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    if backend is None:
        return _events(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), True)
    be = sdpa_backend(backend)

    def fn():
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return _events(fn, True)


def probe_flash() -> list[dict]:
    out = []
    for shape in ((1, 16, 4096, 128), (4, 16, 2048, 128), (16, 16, 512, 64)):
        b, h, s, d = shape
        fl = b * h * s * s * 2.0 * d
        row = dict(shape=list(shape))
        for name in ("flash", "efficient", None):
            try:
                row[f"{name or 'default'}_tflops"] = fl / _sdpa_time(shape, name) / 1e12
            except RuntimeError as e:
                row[f"{name or 'default'}_error"] = str(e).splitlines()[0][:160]
        if "flash_tflops" in row and "default_tflops" in row:
            row["default_vs_flash"] = row["default_tflops"] / row["flash_tflops"]
        out.append(row)
    return out


def probe_heads() -> list[dict]:
    out = []
    for s in (512, 2048, 8192):
        d = 128
        old, new = (1, 8, s, d), (max(1, 8192 // s), 16, s, d)
        r = {}
        for name, shape in (("h8", old), ("model", new)):
            fl = shape[0] * shape[1] * s * s * 2.0 * d
            r[name] = fl / _sdpa_time(shape, "flash") / 1e12
        out.append(dict(seq=s, head_dim=d, old_shape=list(old), model_shape=list(new), h8_tflops=r["h8"],
                        model_tflops=r["model"], model_vs_h8=r["model"] / r["h8"]))
    return out


def probe_graph(chain: int = 256, replays: int = 50) -> list[dict]:
    import torch

    from cost_model.serving.constants import KERNEL_MIN_S
    x = torch.zeros(1, 7168, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(7168, 256, dtype=torch.bfloat16, device="cuda")
    y = torch.zeros(1, 256, dtype=torch.bfloat16, device="cuda")

    def add():
        x.add_(1.0)

    def gemv():
        torch.mm(x, w, out=y)

    out = []
    for name, op in (("add_1x7168", add), ("gemv_1x7168x256", gemv)):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm up off the capture (cuBLAS picks its kernel here)
            for _ in range(3):
                op()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(chain):
                op()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(replays):
                g.replay()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3 / (replays * chain))
        per = sorted(times)[len(times) // 2]
        out.append(dict(kernel=name, chain=chain, per_kernel_us=per * 1e6, vs_kernel_min_s=per / KERNEL_MIN_S))
    return out


PROBES = (("graph", probe_graph), ("clock", probe_clock), ("sustained", probe_sustained), ("fp8", probe_fp8), ("flash", probe_flash),
          ("heads", probe_heads))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file the results are written to.")
    ap.add_argument("--max-s", type=float, default=110.0, help="Stop starting new probes after this many seconds.")
    args = ap.parse_args(argv)
    import torch
    res: dict = {"torch": torch.__version__}
    if not torch.cuda.is_available():
        res["skipped"] = "no CUDA device visible to torch"
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
        print("SKIP probe: no CUDA device visible to torch")
        return 0
    res["gpu"] = torch.cuda.get_device_name(0)
    t0 = time.time()
    for name, fn in PROBES:
        if time.time() - t0 > args.max_s:
            res[name] = {"skipped": f"--max-s {args.max_s:g} reached"}
            continue
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001 - one failing probe must not lose the others
            res[name] = {"error": f"{type(e).__name__}: {e}"}
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")  # partial results survive a kill
        print(name, json.dumps(res[name])[:300], flush=True)
    res["elapsed_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"probe done in {res['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
