"""Behaviour kept across refactors: the predictions of 50 fixed plans, the emitted Megatron script
and the plan-space counts equal what `tests/data/make_regression_fixture.py` captured before the
layering refactor, byte for byte (the JSON text of every prediction)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import cost_model
from clusters import load_cluster
from specs.models import load_model
from specs.plan import Plan
from specs.stack import profile_for
from specs.workload import Workload
from tuner.emit import megatron_script
from tuner.space import default_space, summarize

FIXTURE = json.loads((Path(__file__).parent / "data" / "regression_predictions.json").read_text())


def _text(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)


def _workload(entry):
    model, cluster, gpus, gbs, seq, _precision = entry["workload"]
    return Workload(load_model(model), load_cluster(cluster, gpus), gbs, seq)


IDS = [e["workload"][0] for e in FIXTURE]


@pytest.mark.parametrize("entry", FIXTURE, ids=IDS)
def test_predictions_unchanged(entry, monkeypatch, tmp_path):
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))  # shipped tables and calibration only
    w = _workload(entry)
    got = [p.to_dict() for p in cost_model.predict_many(w, [Plan.parse(s) for s in entry["plans"]])]
    assert _text(got) == _text(entry["predictions"])


@pytest.mark.parametrize("entry", FIXTURE, ids=IDS)
def test_emitted_script_unchanged(entry):
    w = _workload(entry)
    plan = Plan.parse(entry["plans"][0])
    assert megatron_script(w, plan, profile_for(w.cluster, "gpu-full")) == entry["emitted"]


@pytest.mark.slow
@pytest.mark.parametrize("entry", [e for e in FIXTURE if "counts" in e], ids=lambda e: e["workload"][0])
def test_plan_counts_unchanged(entry):
    w = _workload(entry)
    prof = profile_for(w.cluster, "gpu-full")
    s = summarize(default_space(w, prof, entry["workload"][5]), w, prof)
    assert {"total": s.total, "realizable": s.realizable,
            "rejections": dict(sorted(s.rejections.items()))} == entry["counts"]
