"""The ONE labelled correction of the cost model (MOSAIC §5.5): a multiplicative term on step time
standing for what uncontended microbenchmarks cannot see (cross-node straggler and overlap
efficiency, loop-level overheads). Identity by default; stored as JSON with a content hash and
provenance; fitted by robust least squares on log step time.

    step_time = scale * raw_step_time
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specs.errors import InputError
from specs.inputs import read_text

log = logging.getLogger(__name__)

DEFAULT_GPU_CALIBRATION = Path(__file__).resolve().parent / "calibration_default.json"
LABEL = "straggler/overlap efficiency (multiplicative on step time)"


class CalibrationError(InputError):
    """A calibration file that is missing or is not one (names the file; the CLI adds the flag)."""


@dataclass(frozen=True)
class Calibration:
    scale: float = 1.0
    label: str = LABEL
    provenance: dict = field(default_factory=dict)  # data, fit, residuals, tables digest

    @property
    def id(self) -> str:
        blob = json.dumps({"scale": round(self.scale, 12), "label": self.label,
                           "provenance": self.provenance}, sort_keys=True).encode()
        return ("identity" if self.scale == 1.0 and not self.provenance
                else "cal-" + hashlib.sha256(blob).hexdigest()[:16])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["id"] = self.id
        return d

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        """Read a calibration JSON written by `save`. Raises `CalibrationError` naming `path` when the
        file is missing, unreadable, not JSON, or lacks a positive finite `scale`."""
        text = read_text(path, "calibration file", CalibrationError)
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise ValueError(f"a JSON {type(d).__name__}, not an object")
            if "scale" not in d:
                raise ValueError("no 'scale' field")
            scale = float(d["scale"])
            if not (np.isfinite(scale) and scale > 0):
                raise ValueError(f"scale {d['scale']!r} is not a positive number")
            provenance = d.get("provenance", {})
            if not isinstance(provenance, dict):
                raise ValueError("'provenance' is not an object")
        except (ValueError, TypeError) as e:
            # json.JSONDecodeError is a ValueError; float("abc") too
            raise CalibrationError(f"{path}: not a calibration file ({e})") from None
        return cls(scale=scale, label=d.get("label", LABEL), provenance=provenance)


IDENTITY = Calibration()


def default_calibration(cluster) -> Calibration:
    """The shipped fit for GPU clusters, identity for CPU (no published runs to fit on)."""
    if getattr(cluster, "is_gpu", True) and DEFAULT_GPU_CALIBRATION.exists():
        return Calibration.load(DEFAULT_GPU_CALIBRATION)
    return IDENTITY


def user_calibration_path(kind: str) -> Path:
    """Where `moetune calibrate` installs a fit for a cluster kind: $MOETUNE_HOME/calibration/<kind>.json."""
    from specs.home import moetune_home
    return moetune_home() / "calibration" / f"{kind}.json"


def calibration_for(cluster, tables=None) -> Calibration:
    """The lookup rule: the installed fit for this cluster kind when its provenance names the
    digest of `tables` (the tables the model will read; a fit on other tables is not used), else
    `default_calibration(cluster)`."""
    p = user_calibration_path(cluster.kind)
    if p.is_file():
        try:
            cal = Calibration.load(p)
        except CalibrationError as e:
            log.warning("ignoring the installed calibration: %s", e)  # the lookup falls back; say why
            cal = None
        if cal is not None and (tables is None or cal.provenance.get("tables_digest") == tables.digest):
            return cal
    return default_calibration(cluster)


def fit_calibration(pairs, *, provenance: dict | None = None) -> tuple[Calibration, dict]:
    """pairs: iterable of (predicted_raw_step_s, measured_step_s[, label]). Robust (soft-L1) least
    squares on log step time for the single scale; returns (Calibration, report) where report has
    per-pair residuals after the fit and leave-one-out relative errors."""
    from scipy.optimize import least_squares
    pairs = list(pairs)
    pred = np.array([p[0] for p in pairs], float)
    meas = np.array([p[1] for p in pairs], float)
    labels = [p[2] if len(p) > 2 else str(i) for i, p in enumerate(pairs)]

    def fit(idx):
        r = lambda x: x[0] + np.log(pred[idx]) - np.log(meas[idx])  # noqa: E731
        return float(least_squares(r, x0=[0.0], loss="soft_l1", f_scale=0.1).x[0])

    allidx = np.arange(len(pairs))
    theta = fit(allidx)
    scale = float(np.exp(theta))
    resid = scale * pred / meas - 1.0
    loo = []
    for i in allidx:
        if len(pairs) < 2:
            loo.append(float("nan"))
            continue
        s_i = float(np.exp(fit(allidx[allidx != i])))
        loo.append(float(s_i * pred[i] / meas[i] - 1.0))
    report = {"scale": scale, "rows": [
        {"label": lab, "raw_pred_s": float(p), "measured_s": float(mm), "calibrated_rel_err": float(e),
         "loo_rel_err": lo} for lab, p, mm, e, lo in zip(labels, pred, meas, resid, loo)],
        "max_abs_rel_err": float(np.max(np.abs(resid))) if len(pairs) else 0.0,
        "loo_max_abs_rel_err": float(np.nanmax(np.abs(loo))) if len(pairs) > 1 else float("nan")}
    prov = dict(provenance or {})
    prov.update(method="scipy least_squares soft_l1 on log step time", n=len(pairs),
                residuals=report["rows"])
    return Calibration(scale=scale, provenance=prov), report
