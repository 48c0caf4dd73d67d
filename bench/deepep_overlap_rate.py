"""The rate DeepEP's normal dispatch / combine kernels progress at while compute runs beside them,
as a share of their rate alone: the component figure behind `cost_model.constants`
HELD_COMM_RATE (issue 22, "overlap as it runs"). Measured, not fitted to any step time.

    python bench/deepep_overlap_rate.py TRACE.json

TRACE.json: DeepSeek's public training trace (github.com/deepseek-ai/profile-data, train.json:
one DualPipe forward + backward chunk pair of 4 MoE layers each, H800, EP64 over 8 nodes, TP1,
4,096 tokens per micro-batch, balanced routing, DeepEP normal kernels on 20 SMs, FP8 dispatch and
BF16 combine, the dispatch of the backward also FP8 (DeepSeek-V3 report §3.3.2)). Every
dispatch / combine kernel in it runs beside compute-stream kernels (printed: the share of its
duration the compute stream is busy).

Alone: DeepEP's own benchmark of the same setting, published the same week as the trace
(deepseek-ai/DeepEP README at ebfe47e, 2025-02-24, "Normal kernels with NVLink and RDMA forwarding":
H800, CX7 400 Gb/s, 4,096 tokens, hidden 7,168, top-4 groups, top-8 experts, FP8 dispatch, BF16
combine, 24 SMs; internode EP64: dispatch 46 GB/s, combine 45 GB/s bottleneck RDMA bandwidth; the
README's later figures, 51 / 50 GB/s from 2025-04-22 on, follow DeepEP's own speed-ups and are
printed beside), whose bytes are tests/test_internode.py's: every (token,
destination node) pair sends the token once over RDMA (`num_rdma_token_sent`), hidden x 2 bytes,
x (1 + 4/128) / 2 in FP8. The pairs per token are simulated here with the test's own routing
(random scores, top-4 node groups, top-8 experts).

Rate = (time alone) / (time in the trace), summed over the trace's dispatch and combine kernels
(notify kernels excluded: their benchmark time is not published). Also printed: the CTAs the
trace's GEMMs launch against the GPU's SMs (DeepSeek's GEMMs leave DeepEP's SMs free; TE's GEMMs
under megatron-core reserve none).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.trace_host_idle import load  # noqa: E402

TOKENS, HIDDEN, EXPERTS, NODES, TOPK, TOPK_GROUPS = 4096, 7168, 256, 8, 8, 4
DISPATCH_GBPS, COMBINE_GBPS = 46.0, 45.0  # DeepEP README @ebfe47e, internode EP64 (RDMA bottleneck)
LATER_GBPS = (51.0, 50.0)  # the same table from 2025-04-22 (@3b1045d)
FP8_FACTOR = (1 + 4 / 128) / 2  # tests/test_internode.py fp8_factor


def rdma_pairs_per_token(seed: int = 0) -> float:
    """Mean destination nodes per token under tests/test_internode.py's routing."""
    rng = np.random.default_rng(seed)
    scores = np.abs(rng.standard_normal((TOKENS, EXPERTS))) + 1
    per = EXPERTS // NODES
    groups = scores.reshape(TOKENS, NODES, per).max(axis=2)
    top_groups = np.argsort(-groups, axis=1)[:, :TOPK_GROUPS]
    mask = np.zeros((TOKENS, NODES), bool)
    np.put_along_axis(mask, top_groups, True, axis=1)
    masked = np.where(np.repeat(mask, per, axis=1), scores, 0.0)
    top = np.argsort(-masked, axis=1)[:, :TOPK]
    nodes = top // per
    return float(np.mean([len(set(r)) for r in nodes]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="DeepSeek profile-data train.json")
    args = ap.parse_args()
    ev, gpu = load(args.trace, "deepep_overlap_rate", device=True)
    kernels = [e for e in ev if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") == "kernel"]
    comm = [e for e in kernels if "::internode::dispatch<" in e["name"] or "::internode::combine<" in e["name"]]
    if not comm:
        print(f"deepep_overlap_rate: {args.trace} has no DeepEP internode dispatch / combine kernels", file=sys.stderr)
        return 2
    comm_tid = comm[0]["tid"]
    compute = []  # the union of the other streams' kernel intervals
    for a, b in sorted((e["ts"], e["ts"] + e["dur"]) for e in kernels if e["tid"] != comm_tid):
        if compute and a <= compute[-1][1]:
            compute[-1][1] = max(compute[-1][1], b)
        else:
            compute.append([a, b])

    def busy(a, b):
        return sum(max(0.0, min(e, b) - max(s, a)) for s, e in compute)

    pairs = rdma_pairs_per_token()
    alone_d = TOKENS * pairs * HIDDEN * 2 * FP8_FACTOR / (DISPATCH_GBPS * 1e9)
    alone_c = TOKENS * pairs * HIDDEN * 2 / (COMBINE_GBPS * 1e9)
    print(f"destination nodes per token (test routing): {pairs:.3f}; alone: dispatch {alone_d * 1e3:.3f} ms, "
          f"combine {alone_c * 1e3:.3f} ms")
    tot_alone = tot_trace = tot_later = 0.0
    for kind, alone, later in (("dispatch", alone_d, alone_d * DISPATCH_GBPS / LATER_GBPS[0]),
                               ("combine", alone_c, alone_c * COMBINE_GBPS / LATER_GBPS[1])):
        ks = [e for e in comm if f"::internode::{kind}<" in e["name"]]
        durs = [e["dur"] * 1e-6 for e in ks]
        share = [busy(e["ts"], e["ts"] + e["dur"]) / e["dur"] for e in ks]
        tot_alone += alone * len(ks)
        tot_later += later * len(ks)
        tot_trace += sum(durs)
        print(f"{kind:8s} x{len(ks)}: trace {np.mean(durs) * 1e3:.3f} ms mean ({min(durs) * 1e3:.2f}-{max(durs) * 1e3:.2f}), "
              f"alone {alone * 1e3:.3f} ms, rate {alone / np.mean(durs):.3f}; compute busy beside it "
              f"{min(share):.0%}-{max(share):.0%}")
    print(f"rate beside compute (dispatch + combine, time alone / time in trace): {tot_alone / tot_trace:.3f} "
          f"({tot_later / tot_trace:.3f} against the README's later {LATER_GBPS[0]:.0f} / {LATER_GBPS[1]:.0f} GB/s)")
    # the SMs the compute beside them left free: the CTA counts of the trace's GEMMs (DeepSeek's own
    # persistent CUTLASS grouped GEMMs, one CTA per SM they use) against the GPU's SMs
    sms = int(gpu.get("numSms") or 0)
    grids = sorted({int(np.prod(e["args"]["grid"])) for e in kernels
                    if "grouped_gemm" in e["name"] and "device_kernel" in e["name"]
                    and isinstance(e.get("args", {}).get("grid"), list)})
    if sms and grids:
        print(f"the GEMMs beside them launch {', '.join(map(str, grids))} CTAs (persistent) on the "
              f"{gpu.get('name', 'GPU')}'s {sms} SMs: {sms - max(grids)} SMs left to DeepEP, so the rate above "
              f"is measured with the GEMMs kept off its SMs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
