"""bench/heldout_cpu_shift.py: a uniform host-speed shift is separated from the plans' own errors."""
from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "heldout_cpu_shift.py"


def _load():
    spec = importlib.util.spec_from_file_location("heldout_cpu_shift", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _report(path: Path, pairs):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["plan_short", "seq", "predicted_s", "measured_s"])
        w.writeheader()
        for i, (p, m) in enumerate(pairs):
            w.writerow(dict(plan_short=f"p{i}", seq=256, predicted_s=p, measured_s=m))


def test_uniform_shift_is_removed_and_plan_error_is_kept(tmp_path):
    mod = _load()
    # every plan measured 25% slower than predicted, one plan a further 10%
    pairs = [(1.0, 1.25), (2.0, 2.5), (1.5, 1.875 * 1.1)]
    _report(tmp_path / "run" / "heldout.csv", pairs)
    r = mod.analyse(tmp_path / "run" / "heldout.csv")
    assert r["err"][0] == pytest.approx(1 / 1.25 - 1)
    g = (1.25 * 1.25 * 1.25 * 1.1) ** (1 / 3)
    assert r["g"] == pytest.approx(g)
    assert r["left"][0] == pytest.approx(g / 1.25 - 1)
    assert r["left"][2] == pytest.approx(g / (1.25 * 1.1) - 1)
    assert abs(r["left"][2]) > abs(r["left"][0])


def test_missing_report_is_one_line_and_exit_2(tmp_path, capsys):
    mod = _load()
    assert mod.main([str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such report" in err[0]
