"""Fit the serving model's per-phase term on cost_model/data/published_serving_reference.csv and
write cost_model/serving/calibration_default.json (with per-row errors, before and after, and
leave-one-out errors in its provenance).

    python -m cost_model.serving.fit_calibration [--check]

The term: one factor on prefill steps and one on decode steps (`SERVE_CLASSES`), fitted by the one
fit of `cost_model.calibration.fit_calibration`. Each row's seconds per token of throughput split
into a prefill and a decode share, a and b: the row is simulated at factors (1, 1), (2, 1) and
(1, 2), and t(p, d) = a p + b d (exact when the simulated time is linear in each step family's
time, as it is here: a + b reproduces t(1, 1) within 1%, see the provenance's `linearity`). Then
measured seconds per token = f_prefill a + f_decode b is fitted in log space; every fitted and
leave-one-out error is then re-checked by simulating the row at the fitted factors.

How each row's benchmark is reproduced. Every row's page (gpustack docs/performance-lab/
deepseek-r1/h200.md and qwen3-235b-a22b/h100.md) prints the client's result block: the client is
`vllm bench serve --backend openai-chat` with all prompts sent at once (no request rate, no max
concurrency: "Peak concurrent requests" equals the prompt count), and the block gives the prompt
count and the total input / output tokens the row was measured on. Those are used as printed:
- ShareGPT: the row's own count and mean lengths (its totals over its count; the tokenizer sets
  them: 219,171 / 200,767 tokens over 1000 prompts for DeepSeek-R1 r01, 219,171 / 200,752 r02;
  214,137 / 193,829 over the 984 prompts Qwen3-235B r05 kept), shaped by `lengths.sharegpt_lengths`
  (exponential, truncated by the sampler's filters; the shape is our assumption, see that module),
  all arriving at t=0 (burst, an open arrival that is never refilled); total throughput = all
  tokens / makespan.
- r03 "random 2000 in / 100 out": 500 prompts (`--num-prompts 500`), 998,393 / 50,000 tokens.
- r04 "random 32000 in / 100 out": 100 prompts, 3,199,900 / 9,952 tokens.
  Random prompts at one length each (vLLM's random dataset at its default range ratio 0).
- DeepSeek-R1: the deepseek-r1 preset (DeepSeek-V3's architecture); fp8 weights.
- `--enable-dp-attention` with tp 8 = attn_dp 8 (SGLang's rewrite); SGLang 0.5.3 / 0.5.5 defaults
  otherwise (no DeepEP: a2a none).
Not modelled: the chat template the openai-chat endpoint adds to every prompt (a few tokens).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
from dataclasses import replace
from pathlib import Path

from clusters import load_cluster
from cost_model.calibration import SERVE_CLASSES, SERVE_COMPONENT_CLASS, Calibration, class_parts, fit_calibration
from cost_model.serving import predict_serve
from cost_model.serving.calibration import DEFAULT_PATH, LABEL
from cost_model.serving.lengths import fixed_lengths, sharegpt_lengths
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload

DATA = Path(__file__).resolve().parent.parent / "data" / "published_serving_reference.csv"

# row id -> (model preset, plan, mean input, mean output tokens, prompts): the printed totals over
# the printed prompt count (module doc)
ROWS = {
    "r01": ("deepseek-r1", "tp=8", 219171 / 1000, 200767 / 1000, 1000),
    "r02": ("deepseek-r1", "tp=8,attn_dp=8", 219171 / 1000, 200752 / 1000, 1000),
    "r03": ("deepseek-r1", "tp=8,attn_dp=8", 998393 / 500, 50000 / 500, 500),
    "r04": ("deepseek-r1", "tp=8,attn_dp=8", 3199900 / 100, 9952 / 100, 100),
    "r05": ("qwen3-235b-a22b", "tp=8", 214137 / 984, 193829 / 984, 984),
}


def burst_prediction(model: str, hw: str, gpus: int, plan: str, n: int, mean_in: float, mean_out: float, *,
                     sharegpt: bool, precision: str, cal: Calibration):
    """The prediction of a published burst (module doc): `n` prompts sent at once, ShareGPT-shaped
    at those mean lengths or all of one length (each rounded to a whole token)."""
    cl = load_cluster(hw, gpus)
    w = ServeWorkload(isl=round(mean_in), osl=round(mean_out), concurrency=n)
    reqs = sharegpt_lengths(n, mean_in, mean_out) if sharegpt else fixed_lengths(n, round(mean_in), round(mean_out))
    return predict_serve(load_model(model), cl, ServePlan.parse(plan), w, precision=precision, calibration=cal,
                         n_requests=n, burst=True, requests=reqs)


def total_tokens_per_s(p, gpus: int) -> float:
    """Input + output tokens/s of the whole deployment, the figure a burst's page prints."""
    return (p.input_tokens_per_s_per_gpu + p.output_tokens_per_s_per_gpu) * gpus


def predict_row(row: dict, cal: Calibration) -> float:
    """Predicted total tokens/s of the whole deployment for one reference row."""
    model, plan, isl, osl, n = ROWS[row["id"]]
    p = burst_prediction(model, row["hw"], int(row["gpus"]), plan, n, isl, osl,
                         sharegpt="sharegpt" in row["workload"].lower(), precision=row["precision"], cal=cal)
    return total_tokens_per_s(p, int(row["gpus"]))


def _phase_cal(p: float, d: float) -> Calibration:
    return Calibration(label=LABEL, factors={"prefill": float(p), "decode": float(d)})


def phase_split(row: dict) -> tuple[dict, float]:
    """({"prefill_step": a, "decode_step": b}, raw throughput): the row's seconds per token by
    phase (see the module doc) and its throughput at factors 1."""
    t11, t21, t12 = (1.0 / predict_row(row, _phase_cal(p, d)) for p, d in ((1, 1), (2, 1), (1, 2)))
    return {"prefill_step": t21 - t11, "decode_step": t12 - t11}, 1.0 / t11


def fit(prior_sd: float | None = None) -> tuple[Calibration, list[dict]]:
    """The per-phase fit on the shared rows. No prior by default: every row informs both phases
    (prefill shares from ~0.1 to ~0.9), so the two factors are identified by the rows alone."""
    rows = list(csv.DictReader(DATA.open()))
    split = {r["id"]: phase_split(r) for r in rows}
    pairs = [(class_parts(split[r["id"]][0], SERVE_COMPONENT_CLASS), 1.0 / float(r["value"]), r["id"])
             for r in rows]
    cal, rep = fit_calibration(pairs, classes=SERVE_CLASSES, prior_sd=prior_sd)
    one = math.exp(-sum(math.log(float(r["value"]) / split[r["id"]][1]) for r in rows) / len(rows))
    out = []
    for i, r in enumerate(rows):
        pub = float(r["value"])
        raw = split[r["id"]][1]
        parts = split[r["id"]][0]
        loo_cal, _ = fit_calibration([q for j, q in enumerate(pairs) if j != i], classes=SERVE_CLASSES,
                                     prior_sd=prior_sd)
        fitted = predict_row(r, _phase_cal(*(cal.factor(k) for k in SERVE_CLASSES)))
        loo = predict_row(r, _phase_cal(*(loo_cal.factor(k) for k in SERVE_CLASSES)))
        out.append({"id": r["id"], "model": r["model"], "hw": r["hw"], "setup": r["setup"],
                    "workload": r["workload"], "published": pub, "predicted_raw": round(raw, 1),
                    "prefill_share": round(parts["prefill_step"] * raw, 3),
                    "linearity": round((parts["prefill_step"] + parts["decode_step"]) * raw, 4),
                    "error_raw": round(raw / pub - 1, 4), "error_one_scale": round(raw / one / pub - 1, 4),
                    "predicted": round(fitted, 1), "error": round(fitted / pub - 1, 4),
                    "loo_factors": {k: round(loo_cal.factor(k), 4) for k in SERVE_CLASSES},
                    "loo_error": round(loo / pub - 1, 4)})
    prov = dict(cal.provenance)
    prov.pop("residuals", None)  # the rows below carry them, re-checked by simulation
    if prior_sd is None:
        prov["method"] = prov["method"].split("; prior")[0] + "; no prior"
    prov.update({"data": "cost_model/data/published_serving_reference.csv",
                 "metric": "total_tokens_per_s (fitted as seconds per token, split by phase)",
                 "one_scale_for_comparison": one, "rows": out})
    return replace(cal, label=LABEL, provenance=prov), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="Print the fit without writing it.")
    a = ap.parse_args(argv)
    cal, rows = fit()
    fi = cal.factor_intervals()
    print("factors: " + ", ".join(f"{k} x{v[0]:.3f} (90% {v[1]:.2f}-{v[2]:.2f})" for k, v in fi.items())
          + f"; one scale would be x{cal.provenance['one_scale_for_comparison']:.3f}")
    for r in rows:
        print(f"{r['id']} {r['model']:16s} {r['setup']:34s} published {r['published']:8.0f}  raw {r['predicted_raw']:8.0f} "
              f"({r['error_raw']:+.1%}; one scale {r['error_one_scale']:+.1%})  per phase {r['predicted']:8.0f} "
              f"({r['error']:+.1%})  leave-one-out {r['loo_error']:+.1%}  [prefill share {r['prefill_share']:.2f}]")
    if not a.check:
        cal.save(DEFAULT_PATH)
        print(f"wrote {DEFAULT_PATH}")
    n = len(rows)
    print(json.dumps({"mean_abs_error": round(sum(abs(r["error"]) for r in rows) / n, 4),
                      "mean_abs_error_one_scale": round(sum(abs(r["error_one_scale"]) for r in rows) / n, 4),
                      "mean_abs_loo_error": round(sum(abs(r["loo_error"]) for r in rows) / n, 4),
                      "resid_sd_log": cal.resid_sd}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
