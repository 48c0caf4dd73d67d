"""The serving model's calibration: the one `cost_model.calibration.Calibration` type, read from
the shipped serving fit. Per phase (`SERVE_CLASSES`: one factor on prefill steps, one on decode
steps: what the op tables cannot see in a live server, labelled by the phase it lands in), or
one-scale (the same factor on both). The shipped file is fitted on
cost_model/data/published_serving_reference.csv only (`cost_model.serving.fit_calibration`);
identity when it is absent.

    prefill_step = factor("prefill") * raw_prefill_step
    decode_step  = factor("decode")  * raw_decode_step
"""
from __future__ import annotations

from pathlib import Path

from cost_model.calibration import SERVE_CLASSES, Calibration, CalibrationError

DEFAULT_PATH = Path(__file__).resolve().parent / "calibration_default.json"
LABEL = "serving runtime overhead per phase (multiplicative on prefill / decode step time)"
IDENTITY = Calibration(label=LABEL)


def load_default() -> Calibration:
    return Calibration.load(DEFAULT_PATH) if DEFAULT_PATH.exists() else IDENTITY


def phase_factors(cal: Calibration) -> tuple[float, float]:
    """(prefill, decode) factors of a serving calibration. A per-component calibration of other
    classes (a training fit's gemm, ep_comm, ...) has no meaning for serving steps: it raises."""
    unknown = sorted(set(cal.factors) - set(SERVE_CLASSES))
    if unknown:
        raise CalibrationError(f"not a serving calibration: classes {unknown} are not among {list(SERVE_CLASSES)}")
    return cal.factor("prefill"), cal.factor("decode")
