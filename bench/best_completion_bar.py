"""Validation only (never fitted on): issue 22's "the best completion of a tuned NVIDIA layout never
predicted more than 1/0.85 of that recipe's measured speed", on the shared calibration rows
(cost_model/data/published_training_calibration.csv, the only throughputs we may look at).

    PYTHONPATH=$PWD python bench/best_completion_bar.py

Per row: the layout as a partial plan (tp, pp, vpp, ep, mbs and the precision family), completed
to its best (`tuner.rank.complete.best_completion`, shipped calibration, on the stack profile the
recipe needs), beside the recipe as it
runs (`cost_model.fit_default_calibration.row_case`, pinned) and the measured tokens/s/GPU; the
bar is measured / 0.85; the fields the completion switched away from the recipe are listed.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_model import predict  # noqa: E402
from cost_model.fit_default_calibration import row_case, rows  # noqa: E402
from specs.stack import GPU_FULL, GPU_FULL_TE211  # noqa: E402
from tuner.rank.complete import best_completion  # noqa: E402
from tuner.space.megatron_rules import check  # noqa: E402


def main() -> int:
    print(f"{'row':60s} {'measured':>9s} {'bar':>7s} {'recipe':>7s} {'best':>7s} {'best/meas':>9s}  verdict / switched from the recipe")
    worst = 0.0
    for r in rows():
        w, recipe, _meas_s, label, opts = row_case(r)
        measured = float(r["tokens_per_s_per_gpu"])
        pinned = predict(w, recipe, **opts).tokens_per_s_per_gpu
        partial = f"tp={r['tp']},pp={r['pp']},vpp={r['vpp']},ep={r['ep']},mbs={r['mbs']}"
        # the stack the recipe needs: TE CUDA graphs with delay_wgrad need TE >= 2.10 (gpu-full-te2.11)
        profile = GPU_FULL_TE211 if "delay-wgrad" in {x.code for x in check(w, recipe, GPU_FULL)} else GPU_FULL
        c = best_completion(partial, w, profile, r["precision"])  # the column is a --precision family
        best = c.tokens_per_s_per_gpu if c.plan is not None else float("nan")
        ratio = best / measured
        worst = max(worst, ratio)
        switched = {k: getattr(c.plan, k) for k in c.plan.__dataclass_fields__
                    if getattr(c.plan, k) != getattr(recipe, k)} if c.plan is not None else {}
        verdict = "ok" if ratio <= 1 / 0.85 else "OVER"
        print(f"{label:60s} {measured:9.0f} {measured / 0.85:7.0f} {pinned:7.0f} {best:7.0f} {ratio:9.3f}  {verdict}: "
              + ", ".join(f"{k}={v}" for k, v in switched.items()))
    print(f"worst best/measured {worst:.3f} (bar {1 / 0.85:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
