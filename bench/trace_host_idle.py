"""Host time per launched kernel and GPU idle on the compute stream, from a PyTorch-profiler
(Chrome) trace: the component figures behind the host-timeline findings of issue 22.

    python bench/trace_host_idle.py TRACE.json [--stream TID]

Written for DeepSeek's public training trace (github.com/deepseek-ai/profile-data, train.json: one
DualPipe forward + backward chunk pair of 4 MoE layers each, H800, EP64 TP1, seq 4K, fp8), whose
host ranges are user annotations (attn(F), mlp(B), dispatch(F), ...). Prints, per annotated phase,
the kernels launched in it (cudaLaunchKernel / cudaLaunchKernelExC, any host thread), its host
wall time per launch and the GPU seconds of those kernels on the compute stream; then the compute
stream's idle time, split into back-to-back gaps (< 20 us) and waits (>= 20 us), and what a
near-empty kernel (<= 4 us) costs back to back with its gap. The host figures
include the profiler's own per-op cost. Reads only the file named.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys

WAIT_US = 20.0  # a gap this long is a wait (communication event, sync), not a launch-to-launch gap
TINY_US = 4.0  # a kernel this short does almost no work: its duration is the per-kernel floor


def load(path, tool="trace_host_idle", device=False):
    """The events of a PyTorch-profiler (Chrome) trace (with `device`: and the first GPU's
    properties, {} when the trace has none); a file that cannot be read, or holds no kernel
    events, ends the run with one line naming `tool` and exit code 2."""
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{tool}: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)
    ev = d.get("traceEvents") if isinstance(d, dict) else d
    if not isinstance(ev, list) or not any(e.get("cat") == "kernel" for e in ev if isinstance(e, dict)):
        print(f"{tool}: {path} has no kernel events (not a PyTorch profiler trace)", file=sys.stderr)
        sys.exit(2)
    if not device:
        return ev
    props = d.get("deviceProperties") if isinstance(d, dict) else None
    return ev, (props[0] if isinstance(props, list) and props and isinstance(props[0], dict) else {})


def compute_stream(events):
    """The stream (tid) running the most kernels."""
    c = collections.Counter(e["tid"] for e in events if e.get("cat") == "kernel")
    return c.most_common(1)[0][0]


def phases(events, stream):
    """{annotation: (ranges, launches, host us, gpu us on `stream`, us inside the launch calls)}."""
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"].startswith("cudaLaunchKernel")]
    kern = {e["args"].get("correlation"): e for e in events if e.get("cat") == "kernel"}
    out = collections.defaultdict(lambda: [0, 0, 0.0, 0.0, 0.0])
    for u in events:
        if u.get("cat") != "user_annotation" or u["name"].startswith("ProfilerStep") or u["name"] == "1F1B":
            continue
        a, b = u["ts"], u["ts"] + u["dur"]
        ls = [r for r in launches if a <= r["ts"] < b]
        ks = [kern[r["args"]["correlation"]] for r in ls if r["args"].get("correlation") in kern]
        g = out[u["name"]]
        g[0] += 1
        g[1] += len(ls)
        g[2] += u["dur"]
        g[3] += sum(k["dur"] for k in ks if k["tid"] == stream)
        g[4] += sum(r["dur"] for r in ls)
    return out


def idle(events, stream):
    """(span, busy, back-to-back gaps [us], waits [us]) of the compute stream."""
    k = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["tid"] == stream),
               key=lambda e: e["ts"])
    span = max(e["ts"] + e["dur"] for e in k) - k[0]["ts"]
    busy = sum(e["dur"] for e in k)
    gaps = [k[i + 1]["ts"] - (k[i]["ts"] + k[i]["dur"]) for i in range(len(k) - 1)]
    return span, busy, [g for g in gaps if 0 <= g < WAIT_US], [g for g in gaps if g >= WAIT_US], len(k)


def tiny_kernels(events, stream):
    """(durations, durations + the back-to-back gap before each) [us] of the kernels on `stream`
    lasting at most TINY_US that ran right behind the previous kernel (gap < WAIT_US): what one
    near-empty kernel costs back to back, the floor `cost_model.serving.constants` KERNEL_MIN_S prices."""
    k = sorted((e for e in events if e.get("cat") == "kernel" and e["tid"] == stream), key=lambda e: e["ts"])
    durs, with_gap = [], []
    for a, b in zip(k, k[1:]):
        gap = b["ts"] - (a["ts"] + a["dur"])
        if b["dur"] <= TINY_US and 0 <= gap < WAIT_US:
            durs.append(b["dur"])
            with_gap.append(b["dur"] + gap)
    return durs, with_gap


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--stream", type=int, default=None, help="compute stream tid (default: the busiest)")
    a = ap.parse_args(argv)
    ev = load(a.trace)
    s = a.stream if a.stream is not None else compute_stream(ev)
    ph = phases(ev, s)
    tot_l = tot_h = tot_a = 0.0
    print(f"{'phase':12s} {'ranges':>6s} {'launches':>9s} {'host us':>9s} {'host us/launch':>15s} "
          f"{'launch call us':>15s} {'gpu us (stream)':>16s}")
    for n, (c, nl, hd, gd, ld) in ph.items():
        print(f"{n:12s} {c:6d} {nl / c:9.1f} {hd / c:9.1f} {hd / max(nl, 1):15.1f} {ld / max(nl, 1):15.1f} {gd / c:16.1f}")
        if gd > 0:  # the compute phases (the communication phases wait on the network)
            tot_l += nl
            tot_h += hd
            tot_a += ld
    if tot_l:
        print(f"compute phases: {tot_h / tot_l:.1f} host us per launched kernel, {tot_a / tot_l:.1f} of it "
              f"inside the launch call")
    span, busy, small, waits, n = idle(ev, s)
    print(f"stream {s}: {n} kernels, span {span / 1e3:.2f} ms, busy {busy / 1e3:.2f} ms, "
          f"idle {(span - busy) / span:.1%} of the span")
    if small:
        print(f"  back-to-back gaps: {len(small)}, median {statistics.median(small):.1f} us, "
              f"sum {sum(small) / 1e3:.2f} ms ({sum(small) / span:.1%})")
    print(f"  waits >= {WAIT_US:.0f} us: {len(waits)}, sum {sum(waits) / 1e3:.2f} ms ({sum(waits) / span:.1%})")
    durs, with_gap = tiny_kernels(ev, s)
    if durs:
        print(f"  kernels <= {TINY_US:.0f} us back to back: {len(durs)}, median {statistics.median(durs):.1f} us, "
              f"with the gap before each {statistics.median(with_gap):.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
