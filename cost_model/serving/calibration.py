"""The serving model's calibration: the one `cost_model.calibration.Calibration` type, read from
the shipped serving fit. One-scale (a multiplicative term on every step time, standing for what the
op tables cannot see in a live server: scheduler and tokenizer work between steps, kernel fusion
differences, real routing skew), or per phase (`SERVE_CLASSES`: factors on prefill and on decode
steps). The shipped file is fitted on cost_model/data/published_serving_reference.csv only (see
`cost_model.serving.fit_calibration`); identity when it is absent.

    step_time = factor(phase) * raw_step_time        (one-scale: factor = scale for both phases)
"""
from __future__ import annotations

from pathlib import Path

from cost_model.calibration import Calibration

DEFAULT_PATH = Path(__file__).resolve().parent / "calibration_default.json"
LABEL = "serving runtime overhead (multiplicative on step time)"
IDENTITY = Calibration(label=LABEL)


def load_default() -> Calibration:
    return Calibration.load(DEFAULT_PATH) if DEFAULT_PATH.exists() else IDENTITY
