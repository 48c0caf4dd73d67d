"""The per-phase step-time factors (prefill, decode) that the shared serving rows imply, beside the
one-scale fit: a measurement for the per-phase calibration (the Calibration class with phase
factors is helper i27's; this only reports the values its fit should land near).

    python bench/serving_phase_factors.py

Rows: cost_model/data/published_serving_reference.csv only (as `cost_model.serving.fit_calibration`).
Method: each row's predicted throughput is taken at step-time factors (1, 1), (2, 1) and (1, 2) on
(prefill, decode) steps; its seconds per token are linear in the factors to first order,
t(p, d) ~ a p + b d, with a + b = t(1, 1) (the simulation's time is exactly linear when both scale
together). Then (p, d) minimise the squared log errors over the rows (grid search). The factors are
applied by wrapping StepModel.prefill / decode for the run (no code path of the model changes).
"""
from __future__ import annotations

import csv
import math

import numpy as np

import cost_model.serving.step as step
from cost_model.calibration import Calibration
from cost_model.serving.fit_calibration import DATA, predict_row

_F = {"prefill": 1.0, "decode": 1.0}


def _scaled(fn, phase):
    def run(self, *a, **k):
        t, parts = fn(self, *a, **k)
        return _F[phase] * t, parts
    return run


def main() -> int:
    step.StepModel.prefill = _scaled(step.StepModel.prefill, "prefill")
    step.StepModel.decode = _scaled(step.StepModel.decode, "decode")
    rows = list(csv.DictReader(DATA.open()))
    lin = {}
    for r in rows:
        tput = []
        for p, d in ((1.0, 1.0), (2.0, 1.0), (1.0, 2.0)):
            _F["prefill"], _F["decode"] = p, d
            tput.append(predict_row(r, Calibration()))
        t11, t21, t12 = (1.0 / x for x in tput)
        lin[r["id"]] = (t21 - t11, t12 - t11, tput[0], float(r["value"]))
        print(f"{r['id']} raw {tput[0]:8.0f} tok/s, published {float(r['value']):8.0f}; step-time share: "
              f"prefill {(t21 - t11) / t11:.2f}, decode {(t12 - t11) / t11:.2f}")

    def errors(p, d):
        return [(a + b) / (a * p + b * d) * raw / pub - 1 for a, b, raw, pub in lin.values()]
    one = math.exp(-np.mean([math.log(pub / raw) for _a, _b, raw, pub in lin.values()]))
    best = min(((sum(math.log(1 + e) ** 2 for e in errors(p, d)), p, d)
                for p in np.linspace(0.5, 5.0, 451) for d in np.linspace(0.5, 3.0, 251)))
    _, p, d = best
    for name, (fp, fd) in (("one scale", (one, one)), ("per phase", (p, d))):
        e = errors(fp, fd)
        print(f"{name:9s}: prefill x{fp:.3f}, decode x{fd:.3f}; row errors "
              + " ".join(f"{x:+.1%}" for x in e) + f"; mean |error| {np.mean(np.abs(e)):.1%}, "
              f"rms log error {math.sqrt(np.mean([math.log(1 + x) ** 2 for x in e])):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
