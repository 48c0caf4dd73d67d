"""Counterfactual, never shipped and never fitted: how the attention-DP bursts of SGLang 0.5.3 on
8 H200 (DeepSeek-R1, `--tp 8 --enable-dp-attention`) look if a rank admits fewer tokens than the
model's KV pool holds.

    PYTHONPATH=$PWD python bench/serving_burst_admission.py [CAP ...]

Rows (gpustack docs/performance-lab/deepseek-r1/h200.md, `vllm bench serve`, every prompt sent at
once; the printed prompt counts and token totals): ShareGPT x1000 (r02 of
cost_model/data/published_serving_reference.csv), random 2000/100 x500 (r03), 32000/100 x100
(r04), and the page's two other cases, 4000/200 x500 and 128/4 x1000 (validation rows of
bench/serving_public_rows.py). Beside the total tokens/s it prints the published TTFT mean / p99
and TPOT mean / median of the same runs against the simulated requests' (raw model, identity
calibration), first with the model's own KV pool (~320k tokens per rank for this plan), then with
the pool capped at each CAP tokens per rank (default 80000 and 40000).

Why: with its own pool the model admits a whole burst at once, prefills it first and decodes it at
a large batch; the published runs instead show requests admitted over the whole run (TTFT spread
evenly to the end) and decoding in ~20 s each (TPOT ~100-200 ms), i.e. few requests in flight. A cap
of ~40k tokens per rank reproduces the 2000, 4000 and 32000-token rows' throughput within ~3% and
their TTFT distributions, with the model's prefill step unchanged. Nothing in SGLang's memory
arithmetic we read (server_args reserved memory, profile_max_num_token) gives a pool that small, so
the cap is not priced: a `max_total_num_tokens` line from such a server's log would settle it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cost_model.serving as serving  # noqa: E402
from clusters import load_cluster  # noqa: E402
from cost_model.serving.calibration import IDENTITY  # noqa: E402
from cost_model.serving.lengths import fixed_lengths, sharegpt_lengths  # noqa: E402
from cost_model.serving.sim import request_ttft, simulate  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.serve_plan import ServePlan, ServeWorkload  # noqa: E402

PLAN = "tp=8,attn_dp=8"
# name, prompts, mean input, mean output (printed totals / count), ShareGPT?, published total tok/s,
# published (TTFT mean s, TTFT p99 s, TPOT mean ms, TPOT median ms)
ROWS = [
    ("r02 ShareGPT x1000", 1000, 219171 / 1000, 200752 / 1000, True, 7143.30, (5.992, 9.651, 304.71, 188.40)),
    ("r03 2000/100 x500", 500, 998393 / 500, 50000 / 500, False, 19024.33, (27.249, 49.877, 154.49, 148.01)),
    ("r04 32000/100 x100", 100, 3199900 / 100, 9952 / 100, False, 16091.68, (98.133, 196.094, 198.62, 198.45)),
    ("4000/200 x500", 500, 1997530 / 500, 100000 / 500, False, 16096.80, (62.808, 122.764, 107.91, 105.31)),
    ("128/4 x1000", 1000, 126882 / 1000, 4000 / 1000, False, 20448.42, (3.626, 4.880, 802.48, 940.27)),
]


def run(cap: float | None) -> None:
    runs = []

    def capped(*a, **kw):
        if cap:
            kw["kv_tokens"] = min(kw["kv_tokens"], cap)
        r = simulate(*a, **kw)
        runs.append(r)
        return r

    serving.simulate = capped  # predict_serve's own simulator, with the pool capped
    model, cl = load_model("deepseek-r1"), load_cluster("h200-sxm", 8)
    print(f"KV pool per rank: {'the model' + chr(39) + 's own' if cap is None else f'capped at {cap:,.0f} tokens'}")
    for name, n, i, o, sharegpt, pub, (t_mean, t_p99, tp_mean, tp_med) in ROWS:
        runs.clear()
        reqs = sharegpt_lengths(n, i, o) if sharegpt else fixed_lengths(n, round(i), round(o))
        p = serving.predict_serve(model, cl, ServePlan.parse(PLAN), ServeWorkload(isl=round(i), osl=round(o), concurrency=n),
                                  precision="fp8", calibration=IDENTITY, n_requests=n, burst=True, requests=reqs)
        tot = (p.input_tokens_per_s_per_gpu + p.output_tokens_per_s_per_gpu) * cl.num_devices
        tt = np.concatenate([request_ttft(r["ttft"]) for r in runs])
        tp = np.concatenate([r["tpot"] for r in runs])
        tp = tp[tp > 0] * 1e3
        print(f"  {name:20s} tok/s {tot:7,.0f} vs {pub:7,.0f} ({tot / pub - 1:+6.1%})   TTFT mean/p99 {tt.mean():5.1f}/"
              f"{np.percentile(tt, 99):5.1f} s vs {t_mean:.1f}/{t_p99:.1f}   TPOT mean/median {tp.mean():4.0f}/{np.median(tp):4.0f} ms "
              f"vs {tp_mean:.0f}/{tp_med:.0f}")
    serving.simulate = simulate


def main() -> int:
    caps = [float(x) for x in sys.argv[1:]] or [80000.0, 40000.0]
    for cap in [None, *caps]:
        run(cap)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
