"""Counterfactual, never shipped and never fitted: would a cap on how fast one SGLang server streams
output tokens (its single tokenizer-manager / detokenizer processes: sgl-project/sglang issue 23393,
client ITL 180 ms against 39 ms at the scheduler at batch 1024) explain the serving fit rows' raw
shortfall (r01 +33%)?

    PYTHONPATH=$PWD python bench/serving_stream_cap.py [CAP ...]

Why it was a candidate: the published peak output of r01 (TP8) and r02 (attention DP 8) is almost the
same, 9,699 and 9,601 tok/s (gpustack docs/performance-lab/deepseek-r1/h200.md, the runs' result
blocks), where the raw model peaks at ~14,200 / ~14,800: something the two GPU layouts share may bound
it. The rows of cost_model/data/published_serving_reference.csv are reproduced as the serving fit
does (`fit_calibration.burst_prediction`, raw model, identity calibration); every rank's simulated
output (the step trace of `predict_serve`'s own simulator) is merged into the server's token stream,
which a FIFO drains at CAP tokens/s (default 12,000, 9,650 and 8,000). Printed per row: the raw
total tok/s, the peak output in any 1-second window, and the total tok/s once the last token has
been streamed at each cap.

What it shows (2026-12-07): no cap moves any row's makespan. A burst's peak lasts a few seconds and
the backlog it leaves drains while the decode tail (few requests, long steps) still runs, so such a
cap would bound the peak the pages print, not the throughput the fit uses: it is not the rows'
shortfall, and nothing is priced for it.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cost_model.serving as serving  # noqa: E402
from cost_model.serving.calibration import IDENTITY  # noqa: E402
from cost_model.serving.fit_calibration import DATA, ROWS, burst_prediction, total_tokens_per_s  # noqa: E402

PUBLISHED_PEAK = {"r01": 9699.0, "r02": 9601.0}  # peak output tok/s (module doc)


def drained_makespan(steps: np.ndarray, cap: float) -> float:
    """When a FIFO draining `cap` tokens/s has streamed every token of `steps` ((time, tokens) per
    GPU step, time-sorted): the latest over the steps of (its time + every token from it on / cap),
    and never before the GPU's own last step."""
    t, d = steps[:, 0], steps[:, 1]
    after = d[::-1].cumsum()[::-1]  # tokens made at or after each step
    return float(max(np.max(t + (after - d) / cap), t[-1]))


def main() -> int:
    caps = [float(x) for x in sys.argv[1:]] or [12000.0, 9650.0, 8000.0]
    runs: list = []
    simulate = serving.simulate

    def recorded(*a, **kw):
        r = simulate(*a, **kw)
        runs.append(r)
        return r

    serving.simulate = recorded  # predict_serve's own simulator, its traces kept
    try:
        for r in csv.DictReader(DATA.open()):
            model, plan, isl, osl, n = ROWS[r["id"]]
            runs.clear()
            p = burst_prediction(model, r["hw"], int(r["gpus"]), plan, n, isl, osl,
                                 sharegpt="sharegpt" in r["workload"].lower(), precision=r["precision"], cal=IDENTITY)
            gpus, pub = int(r["gpus"]), float(r["value"])
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
            s[:, 1] *= p.output_tokens_per_s_per_gpu * gpus * float(s[-1, 0]) / s[:, 1].sum()
            makespan = float(s[-1, 0])
            peak = float(np.bincount(s[:, 0].astype(int), weights=s[:, 1]).max())
            pk = PUBLISHED_PEAK.get(r["id"])
            line = (f"{r['id']} {plan:16s} published {pub:7,.0f}  raw {tot:7,.0f} ({tot / pub - 1:+6.1%})  peak out/s "
                    f"{peak:7,.0f}" + (f" (published {pk:,.0f})" if pk else "                    "))
            for cap in caps:
                capped = tot * makespan / drained_makespan(s, cap)
                line += f" | cap {cap:,.0f}: {capped:7,.0f} ({capped / pub - 1:+6.1%})"
            print(line)
    finally:
        serving.simulate = simulate
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
