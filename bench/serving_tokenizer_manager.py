"""Counterfactual, never shipped and never fitted: do the two serial costs of an SGLang server's single
tokenizer-manager process explain the serving fit rows' raw shortfall (r01 +33%)? The process takes in
every request (HTTP, chat template, tokenization: a burst's requests reach the scheduler one after
another) and streams every output token back (sgl-project/sglang issue 6553: "TokenizerManager may
encounter single-core bottlenecks under high-concurrency scenarios"; issue 23393: client ITL 180 ms
against 39 ms at the scheduler at batch 1024).

    PYTHONPATH=$PWD python bench/serving_tokenizer_manager.py [--caps CAP ...] [--intake S ...]

The rows of cost_model/data/published_serving_reference.csv are reproduced as the serving fit does
(`fit_calibration.burst_prediction`, raw model, identity calibration), with `predict_serve`'s own
simulator wrapped:
- output stream: every rank's simulated output (its step trace) is merged into the server's token
  stream, which a FIFO drains at CAP tokens/s (default 12,000, 9,650, 8,000). Why: the published peak
  output of r01 (TP8) and r02 (attention DP 8) is almost the same, 9,699 and 9,601 tok/s (gpustack
  docs/performance-lab/deepseek-r1/h200.md, the runs' result blocks), where the raw model peaks at
  ~14,200 / ~14,800: something the two GPU layouts share may bound it.
- intake: request i of the burst (in the order SGLang's DP controller deals them) reaches its rank
  at i x S seconds instead of all at t=0 (default S = 3.45 and 6.9 ms: half and all of
  `serving.constants.REQUEST_FIXED_S`, the per-request cost outside the GPU measured at concurrency 1).
Printed per row: the raw total tok/s, the peak output in any 1-second window, and the total tok/s
at each cap and each intake spacing.

What it shows (2026-12-07): neither moves any row by more than 2.4 points. A burst's output peak lasts
a few seconds and the backlog it leaves drains while the decode tail (few requests, long steps) still
runs, so a stream cap would bound the peak the pages print, not the throughput the fit uses; a
serial intake of 1-7 s only shifts work the GPU would have queued anyway. Neither is the rows'
shortfall, and nothing is priced for them.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cost_model.serving as serving  # noqa: E402
from cost_model.serving.calibration import IDENTITY  # noqa: E402
from cost_model.serving.constants import REQUEST_FIXED_S  # noqa: E402
from cost_model.serving.fit_calibration import DATA, ROWS, burst_prediction, total_tokens_per_s  # noqa: E402
from specs.serve_plan import ServePlan  # noqa: E402

PUBLISHED_PEAK = {"r01": 9699.0, "r02": 9601.0}  # peak output tok/s (module doc)


def drained_makespan(steps: np.ndarray, cap: float) -> float:
    """When a FIFO draining `cap` tokens/s has streamed every token of `steps` ((time, tokens) per
    GPU step, time-sorted): the latest over the steps of (its time + every token from it on / cap),
    and never before the GPU's own last step."""
    t, d = steps[:, 0], steps[:, 1]
    after = d[::-1].cumsum()[::-1]  # tokens made at or after each step
    return float(max(np.max(t + (after - d) / cap), t[-1]))


def _predict(r: dict, intake_s: float = 0.0):
    """(prediction, every simulated rank's run) of one fit row, its requests reaching the scheduler
    `intake_s` apart (0: all at t=0, as the fit prices it)."""
    model, plan, isl, osl, n = ROWS[r["id"]]
    runs: list = []
    simulate = serving.simulate
    sp = ServePlan.parse(plan)
    ranks = sp.dp * sp.attn_dp  # the ranks `predict_serve` deals the burst over (replicas x attention DP)

    def wrapped(pre, dec, reqs, **kw):
        # rank k's share is requests k, k + ranks, ... (`predict_serve`), simulated in rank order; a share
        # equal to an earlier one is not simulated again, so a fixed-length burst runs rank 0's arrivals
        k = len(runs)
        if intake_s:
            reqs = [(intake_s * (k + j * ranks), a, b) for j, (_t, a, b) in enumerate(reqs)]
        out = simulate(pre, dec, reqs, **kw)
        runs.append(out)
        return out

    serving.simulate = wrapped
    try:
        p = burst_prediction(model, r["hw"], int(r["gpus"]), plan, n, isl, osl,
                             sharegpt="sharegpt" in r["workload"].lower(), precision=r["precision"], cal=IDENTITY)
    finally:
        serving.simulate = simulate
    return p, runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", type=float, nargs="*", default=[12000.0, 9650.0, 8000.0],
                    help="output stream rates to drain at (tokens/s)")
    ap.add_argument("--intake", type=float, nargs="*", default=[REQUEST_FIXED_S / 2, REQUEST_FIXED_S],
                    help="seconds between requests reaching the scheduler")
    a = ap.parse_args(argv)
    for r in csv.DictReader(DATA.open()):
        gpus, pub = int(r["gpus"]), float(r["value"])
        p, runs = _predict(r)
        tot = total_tokens_per_s(p, gpus)
        # every simulated rank's output tokens per step, merged into the server's stream; a share
        # that several ranks hold alike is simulated once (`predict_serve`), so the merged steps
        # are scaled to the server's own output (1 where every rank's share differs, as ShareGPT's)
        steps = []
        for x in runs:
            tr = np.asarray(x["trace"], float)
            steps.append(np.column_stack([tr[:, 0], np.diff(tr[:, 2], prepend=0.0)]))
        s = np.concatenate(steps)
        s = s[np.argsort(s[:, 0], kind="stable")]
        makespan = float(s[-1, 0])
        s[:, 1] *= p.output_tokens_per_s_per_gpu * gpus * makespan / s[:, 1].sum()
        peak = float(np.bincount(s[:, 0].astype(int), weights=s[:, 1]).max())
        pk = PUBLISHED_PEAK.get(r["id"])
        print(f"{r['id']} {ROWS[r['id']][1]:16s} published {pub:7,.0f}  raw {tot:7,.0f} ({tot / pub - 1:+6.1%})  "
              f"peak out/s {peak:7,.0f}" + (f" (published {pk:,.0f})" if pk else ""))
        line = "    stream cap"
        for cap in a.caps:
            capped = tot * makespan / drained_makespan(s, cap)
            line += f" | {cap:,.0f}/s: {capped:7,.0f} ({capped / pub - 1:+6.1%})"
        print(line)
        line = "    intake    "
        for gap in a.intake:
            q, _ = _predict(r, gap)
            t = total_tokens_per_s(q, gpus)
            line += f" | {gap * 1e3:.2f} ms: {t:7,.0f} ({t / pub - 1:+6.1%})"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
