"""How well predictions rank what was measured: Spearman's rank correlation and top-k overlap, one
definition for the study report (both modes)."""
from __future__ import annotations

import numpy as np


def spearman(pred: list[float], meas: list[float]) -> float | None:
    """Spearman's rho of two equal-length lists (average ranks for ties); None below 3 points or
    when either side is constant."""
    if len(pred) < 3:
        return None
    from scipy.stats import spearmanr
    a, b = np.asarray(pred, float), np.asarray(meas, float)
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b).statistic)


def top_k_overlap(pred: list[float], meas: list[float], k: int) -> float | None:
    """The share of the k best measured throughputs that are among the k best predicted
    (tuner.study.calibrate.topk_overlap, the one definition); None when there are fewer than k + 1
    points (the overlap of everything says nothing)."""
    from tuner.study.calibrate import topk_overlap
    if len(pred) <= k:
        return None
    return topk_overlap(1.0 / np.asarray(pred, float), 1.0 / np.asarray(meas, float), k)
