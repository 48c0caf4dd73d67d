"""The ONE labelled correction of the serving model: a multiplicative term on every step time,
standing for what the op tables cannot see in a live server (scheduler and tokenizer work between
steps, kernel fusion differences, real routing skew). Fitted on
cost_model/data/published_serving_reference.csv only (see `fit_calibration`); identity when the
shipped fit is absent.

    step_time = scale * raw_step_time
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cost_model.calibration import CalibrationError
from specs.inputs import as_float, read_text

DEFAULT_PATH = Path(__file__).resolve().parent / "calibration_default.json"
LABEL = "serving runtime overhead (multiplicative on step time)"


@dataclass(frozen=True)
class ServeCalibration:
    scale: float = 1.0
    label: str = LABEL
    provenance: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        if self.scale == 1.0 and not self.provenance:
            return "identity"
        blob = json.dumps({"scale": round(self.scale, 12), "label": self.label}, sort_keys=True).encode()
        return "serve-" + hashlib.sha256(blob).hexdigest()[:12]

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> "ServeCalibration":
        """Read a serving calibration JSON; a CalibrationError naming the file when it is not one."""
        text = read_text(path, "serving calibration file", CalibrationError)
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or "scale" not in d:
                raise ValueError("expected a JSON object with a 'scale'")
            scale = as_float(d["scale"], "scale", str(path), lo=0.0, lo_open=True, error=CalibrationError)
            if not isinstance(d.get("provenance", {}), dict):
                raise ValueError("'provenance' is not an object")
        except ValueError as e:
            if isinstance(e, CalibrationError):
                raise
            raise CalibrationError(f"{path}: not a serving calibration file ({e})") from None
        return cls(scale=scale, label=str(d.get("label", LABEL)), provenance=d.get("provenance", {}))


def load_default() -> ServeCalibration:
    return ServeCalibration.load(DEFAULT_PATH) if DEFAULT_PATH.exists() else ServeCalibration()
