"""Counterfactual, never shipped and never fitted: how the attention-DP bursts of SGLang 0.5.3 on
8 H200 (DeepSeek-R1, `--tp 8 --enable-dp-attention`) look if a rank admits fewer tokens than the
model's KV pool holds.

    PYTHONPATH=$PWD python bench/serving_burst_admission.py [CAP ...]

Rows (gpustack docs/performance-lab/deepseek-r1/h200.md, `vllm bench serve`, every prompt sent at
once): r02-r04 of cost_model/data/published_serving_reference.csv as the serving fit reproduces them
(`fit_calibration.ROWS`) and the page's two other cases, the validation bursts of
bench/serving_public_rows.py (`BURSTS`), priced the same way (`fit_calibration.burst_prediction`).
Beside the total tokens/s it prints the published TTFT mean / median and TPOT median of the same runs
against the prediction's own (raw model, identity calibration; mean over every request, medians),
first with the model's own KV pool (~320k tokens per rank for this plan), then with the pool capped
at each CAP tokens per rank (default 80000 and 40000).

Why: with its own pool the model admits a whole burst at once, prefills it first and decodes it at
a large batch; the published runs instead show requests admitted over the whole run (TTFT spread
evenly to the end) and decoding in ~20 s each (TPOT ~100-200 ms), i.e. few requests in flight. A cap
of ~40k tokens per rank reproduces the 2000, 4000 and 32000-token rows' throughput within ~3% and
their mean and median TTFT, with the model's prefill step unchanged. Nothing in SGLang's memory
arithmetic we read (server_args reserved memory, profile_max_num_token) gives a pool that small, so
the cap is not priced: a `max_total_num_tokens` line from such a server's log would settle it.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cost_model.serving as serving  # noqa: E402
from bench.serving_public_rows import BURSTS  # noqa: E402
from cost_model.serving.calibration import IDENTITY  # noqa: E402
from cost_model.serving.fit_calibration import DATA, ROWS, burst_prediction, total_tokens_per_s  # noqa: E402
from cost_model.serving.sim import simulate  # noqa: E402

FIT_ROWS = ("r02", "r03", "r04")
# the page's published latencies of the same runs: TTFT mean, median (s), TPOT median (ms), per row
PUBLISHED_LATENCY = {"r02": (5.992, 5.976, 188.40), "r03": (27.249, 25.137, 148.01), "r04": (98.133, 97.539, 198.45),
                     500: (62.808, 61.114, 105.31), 1000: (3.626, 3.413, 940.27)}  # BURSTS by prompt count


def rows():
    """(label, plan, prompts, mean input, mean output, ShareGPT?, published tok/s, published latencies)."""
    csv_rows = {r["id"]: r for r in csv.DictReader(DATA.open())}
    for rid in FIT_ROWS:
        _model, plan, mean_in, mean_out, n = ROWS[rid]
        r = csv_rows[rid]
        yield (f"{rid} {round(mean_in)}/{round(mean_out)} x{n}", plan, n, mean_in, mean_out, "sharegpt" in r["workload"].lower(),
               float(r["value"]), PUBLISHED_LATENCY[rid])
    for _src, plan, n, tin, tout, pub in BURSTS:
        yield f"{round(tin / n)}/{round(tout / n)} x{n}", plan, n, tin / n, tout / n, False, pub, PUBLISHED_LATENCY[n]


def run(cap: float | None) -> None:
    def capped(*a, **kw):
        if cap:
            kw["kv_tokens"] = min(kw["kv_tokens"], cap)
        return simulate(*a, **kw)

    serving.simulate = capped  # predict_serve's own simulator, with the pool capped
    print(f"KV pool per rank: {'the model' + chr(39) + 's own' if cap is None else f'capped at {cap:,.0f} tokens'}")
    for label, plan, n, mean_in, mean_out, sharegpt, pub, (t_mean, t_med, tp_med) in rows():
        p = burst_prediction("deepseek-r1", "h200-sxm", 8, plan, n, mean_in, mean_out, sharegpt=sharegpt,
                             precision="fp8", cal=IDENTITY)
        tot = total_tokens_per_s(p, 8)
        print(f"  {label:24s} tok/s {tot:7,.0f} vs {pub:7,.0f} ({tot / pub - 1:+6.1%})   TTFT mean/median "
              f"{p.extra['ttft_mean_with_warmup_s']:5.1f}/{p.extra['ttft_p50_s']:5.1f} s vs {t_mean:.1f}/{t_med:.1f}   "
              f"TPOT median {p.extra['tpot_p50_s'] * 1e3:4.0f} ms vs {tp_med:.0f}")
    serving.simulate = simulate


def main() -> int:
    caps = [float(x) for x in sys.argv[1:]] or [80000.0, 40000.0]
    for cap in [None, *caps]:
        run(cap)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
