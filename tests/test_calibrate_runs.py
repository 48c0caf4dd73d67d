"""`moetune calibrate` completes partial plans like every other command (tuner.rank.complete.complete_plan
for the cluster's stack profile), not with the GPU dataclass defaults of Plan.parse."""
from __future__ import annotations

import numpy as np

import cost_model
from clusters import load_cluster
from cost_model.calibration import IDENTITY
from specs.models import load_model
from specs.plan import Plan
from specs.stack import profile_for
from specs.workload import Workload
from tuner.rank.complete import complete_plan
from tuner.study.calibrate import raw_predictions


def test_partial_plans_are_completed_for_the_cluster_stack():
    w = Workload(model=load_model("tiny-moe"), cluster=load_cluster("cpu-local", 2), gbs=16, seq=256)
    texts = ["ep=2", "mbs=4", "pp=2"]
    rows = [dict(model="tiny-moe", cluster="cpu-local", gpus=2, gbs=16, seq=256, plan=t) for t in texts]
    raw, used = raw_predictions(rows)
    completed = [complete_plan(t, w, profile_for(w.cluster)) for t in texts]
    assert not completed[0].dist_opt and not completed[0].grouped_gemm  # what the CPU stack runs
    want = cost_model.predict_arrays(w, completed, calibration=IDENTITY)["raw_step_time_s"]
    assert np.allclose(raw, want) and set(used) == {"cpu-local"}
    # Plan.parse would cost ep=2 with the GPU defaults (distributed optimizer, grouped GEMM)
    parsed = cost_model.predict_arrays(w, [Plan.parse(texts[0])], calibration=IDENTITY)["raw_step_time_s"]
    assert Plan.parse(texts[0]) != completed[0] and parsed[0] != raw[0]
