"""Who gets the SMs when a small communication-like grid runs beside cuBLAS GEMMs on one GPU (a
step of bench/gpu_check.sh; issue 22's open question, measured on the mechanism).

    python bench/sm_share_probe.py --out OUT/sm_share.json [--max-s 50]

The cost model prices EP communication beside compute two ways (cost_model/constants.py): a
"starved" kernel (HybridEP's plain grids) does STARVED_WORK_PER_PAIRED_S (0.13) s of its work per
second of the compute it is paired with, from one Nsight A/B; a "held" kernel (DeepEP: its own
high-priority stream, cooperative launch) keeps its SMs and runs at DEEPEP_BESIDE_COMPUTE_RATE
(0.78) of its speed alone, from DeepSeek's trace, where the GEMMs left its SMs free. Under
megatron-core the GEMMs are TE's cuBLAS calls, which take every SM; the model prices DeepEP held
beside Blackwell's GEMMs (dynamic persistent: they give SMs up to a higher priority as tiles finish)
and starved beside Hopper's (static persistent: SMs free only when the GEMM ends; blocks.comm_starved).
Whether a grid launched on a high-priority stream still gets its SMs while they run is what no
public measurement shows: on a Hopper GPU a high-priority rate near the starved one confirms that
pricing, one near 0.78 says DeepEP holds there too.

What runs (one GPU, no NCCL): a loop of bf16 cuBLAS GEMMs (torch.matmul, 8192^3) on a
normal-priority stream, and a 20-program Triton copy kernel (memory-bound work on 20 SMs, as
DeepEP's 20 SMs move tokens) on a second stream, timed with CUDA events on each stream:
- comm alone; the GEMM loop alone;
- together, the copy on a high-priority stream (as DeepEP launches), then on a normal-priority one
  (as a plain grid), then, where Triton can, launched cooperatively on the high-priority stream;
each three times, medians kept. The copy is enqueued after the GEMMs, so it starts beside them; the
GEMM window is about four times the copy's time alone, so the copy ends inside it.
Derived per case: the copy's rate beside the GEMMs (time alone / time beside), its work per second
of GEMM (to set against STARVED_WORK_PER_PAIRED_S and DEEPEP_BESIDE_COMPUTE_RATE), and the GEMMs'
slowdown. The cuBLAS kernel's name and grid are recorded (a persistent kernel's grid is the SM
count). Without CUDA or Triton it writes {"ok": false, "reason": ...} and prints a SKIP line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

COMM_PROGRAMS = 20  # DeepEP's SMs under megatron-core (cost_model.constants.DEEPEP_SMS)
GEMM_N = 8192
COMM_TARGET_S = 0.02
GEMM_WINDOW_X = 4.0
REPEATS = 3


def _skip(out: Path | None, reason: str) -> int:
    print(f"SKIP sm_share: {reason}")
    if out:
        out.write_text(json.dumps({"ok": False, "reason": reason}, indent=1) + "\n")
    return 0


def _kernel_launches(torch, fn) -> list[dict]:
    """Name, grid and block of the CUDA kernels one call of `fn` launches (torch.profiler); an
    error entry where the profiler cannot trace here (the measurement does not depend on it)."""
    from torch.profiler import ProfilerActivity, profile
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "trace.json"
            prof.export_chrome_trace(str(path))
            events = json.loads(path.read_text()).get("traceEvents", [])
    except Exception as e:  # noqa: BLE001 -- the kernel names are a side note of the probe
        return [{"error": f"{type(e).__name__}: {str(e)[:200]}"}]
    return [{"name": e.get("name", "")[:160], "grid": e.get("args", {}).get("grid"), "block": e.get("args", {}).get("block"),
             "dur_us": e.get("dur")} for e in events if e.get("cat") == "kernel"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="JSON result file.")
    ap.add_argument("--max-s", type=float, default=50.0, help="Stop starting new cases after this many seconds.")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    try:
        import torch
    except ImportError as e:
        return _skip(a.out, f"torch not importable ({e})")
    if not torch.cuda.is_available():
        return _skip(a.out, "no CUDA device visible to torch")
    try:
        import triton
        import triton.language as tl
    except ImportError as e:
        return _skip(a.out, f"triton not importable ({e})")

    @triton.jit
    def copy_loop(src, dst, n_per_prog, reps, BLOCK: tl.constexpr):
        base = tl.program_id(0) * n_per_prog
        for _ in range(reps):
            for off in range(0, n_per_prog, BLOCK):
                idx = base + off + tl.arange(0, BLOCK)
                tl.store(dst + idx, tl.load(src + idx))

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    n_per_prog = 1 << 24  # 32 MiB of bf16 per program
    src = torch.ones(COMM_PROGRAMS * n_per_prog, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    x = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device=dev)
    w = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device=dev)
    s_gemm = torch.cuda.Stream(priority=0)
    s_hi = torch.cuda.Stream(priority=-100)  # below the range: torch maps it to the highest priority
    s_lo = torch.cuda.Stream(priority=0)

    def comm(stream, reps, cooperative=False):
        kw = {"launch_cooperative_grid": True} if cooperative else {}
        with torch.cuda.stream(stream):
            copy_loop[(COMM_PROGRAMS,)](src, dst, n_per_prog, reps, BLOCK=1024, num_warps=8, **kw)

    def timed(stream, fn):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(stream)
        fn()
        e1.record(stream)
        return e0, e1

    # warm-up and size the copy to ~COMM_TARGET_S alone
    comm(s_hi, 1)
    torch.cuda.synchronize()
    e0, e1 = timed(s_hi, lambda: comm(s_hi, 1))
    torch.cuda.synchronize()
    reps = max(1, round(COMM_TARGET_S / max(e0.elapsed_time(e1) / 1e3, 1e-6)))
    comm(s_hi, reps)  # Triton specializes on the argument: compile this one before timing it
    torch.cuda.synchronize()
    comm_alone = []
    for _ in range(REPEATS):
        e0, e1 = timed(s_hi, lambda: comm(s_hi, reps))
        torch.cuda.synchronize()
        comm_alone.append(e0.elapsed_time(e1) / 1e3)
    t_comm = statistics.median(comm_alone)

    torch.matmul(x, w)
    torch.cuda.synchronize()
    e0, e1 = timed(s_gemm, lambda: [torch.matmul(x, w) for _ in range(5)])
    torch.cuda.synchronize()
    n_gemm = max(4, round(GEMM_WINDOW_X * t_comm / (e0.elapsed_time(e1) / 1e3 / 5)))

    def gemms():
        with torch.cuda.stream(s_gemm):
            for _ in range(n_gemm):
                torch.matmul(x, w)
    gemm_alone = []
    for _ in range(REPEATS):
        e0, e1 = timed(s_gemm, gemms)
        torch.cuda.synchronize()
        gemm_alone.append(e0.elapsed_time(e1) / 1e3)
    t_gemm = statistics.median(gemm_alone)

    result = {"ok": True, "gpu": props.name, "sm_count": props.multi_processor_count,
              "stream_priorities": {"high": s_hi.priority, "normal": s_lo.priority}, "comm_programs": COMM_PROGRAMS,
              "comm_bytes": 2 * 2 * COMM_PROGRAMS * n_per_prog * reps, "comm_alone_s": t_comm,
              "gemm": f"bf16 {GEMM_N}^3 x {n_gemm}", "gemm_alone_s": t_gemm,
              "gemm_kernels": _kernel_launches(torch, lambda: torch.matmul(x, w)), "cases": {}}
    cases = [("high_priority", s_hi, False), ("normal_priority", s_lo, False), ("cooperative_high_priority", s_hi, True)]
    for name, stream, coop in cases:
        if time.perf_counter() - t_start > a.max_s:
            result["cases"][name] = {"skipped": f"--max-s {a.max_s:.0f} reached"}
            continue
        spans, gspans = [], []
        try:
            for _ in range(REPEATS):
                torch.cuda.synchronize()
                g0, g1 = timed(s_gemm, gemms)  # GEMMs first: the copy starts beside them
                c0, c1 = timed(stream, lambda st=stream, co=coop: comm(st, reps, co))
                torch.cuda.synchronize()
                spans.append(c0.elapsed_time(c1) / 1e3)
                gspans.append(g0.elapsed_time(g1) / 1e3)
        except Exception as e:  # noqa: BLE001 -- a probe step reports any failure (e.g. a Triton without cooperative launch)
            result["cases"][name] = {"skipped": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        t_c, t_g = statistics.median(spans), statistics.median(gspans)
        # the copy's own work (seconds alone) per second beside the GEMMs: the model's 0.13 for a
        # starved grid, 0.78 for a held one; a lower bound where the copy outlasted the GEMMs
        result["cases"][name] = {
            "comm_beside_s": t_c, "gemm_with_comm_s": t_g, "comm_ended_inside_gemm_window": t_c <= t_g,
            "comm_rate_beside": t_comm / t_c, "gemm_slowdown": t_g / t_gemm}
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    line = "; ".join(f"{k}: rate {v['comm_rate_beside']:.2f}, GEMMs x{v['gemm_slowdown']:.2f}" if "comm_rate_beside" in v
                     else f"{k}: {v['skipped']}" for k, v in result["cases"].items())
    print(f"sm_share: copy alone {t_comm * 1e3:.1f} ms on {COMM_PROGRAMS} programs, GEMMs alone {t_gemm * 1e3:.1f} ms; {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
