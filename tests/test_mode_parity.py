"""Where the serving path was a copy of the training path, the copies agree (issue 24; each test
failed on 04ad8e3): the serving report hides the storage password, `tune --mode serve` honours
`--ray-no-auth`, kernel measurement starts Ray with the token on loopback, screening uses
`--tables` and the pre-registration hashes the tables the predictions used, the code hash covers
every package that computes a prediction, and `emit sglang` writes the config.json a trial serves."""
from __future__ import annotations

import pytest

from clusters import load_cluster
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload

SECRET = "s3cret-pw-24"
PG_URL = f"postgresql://moetune:{SECRET}@127.0.0.1:5432/studies"


@pytest.fixture(scope="module")
def serve_task():
    from tuner.serve_tune import make_task
    return make_task(load_model("tiny-moe"), load_cluster("cpu-local", 2), ServeWorkload(isl=128, osl=32, concurrency=16),
                     "vllm")


def test_serving_report_never_shows_the_storage_password(tmp_path, serve_task):
    from tuner.serve_report import write_serve_report
    plan = ServePlan(tp=2).canonical()
    prereg = {"study": "s", "sha256": "0" * 64, "acceptance": {"ratio": 0.98},
              "baseline": {"plan": plan, "source": "test"}, "plans": []}
    rows = [{"number": 0, "state": "COMPLETE", "plan": plan, "roles": "baseline", "measured_tokens_per_s_per_gpu": 300.0,
             "predicted_tokens_per_s_per_gpu": 280.0, "predicted_raw_ttft_p90_s": 0.1, "measured_ttft_p90_s": 0.3,
             "predicted_raw_tpot_p90_s": 0.02, "measured_tpot_p90_s": 0.05, "calibration_scale": 1.0}]
    path = write_serve_report(tmp_path, task=serve_task, prereg=prereg, rows=rows, wall_s=1.0, storage_url=PG_URL)
    assert "postgresql://moetune:***@127.0.0.1:5432/studies" in path.read_text()
    for f in tmp_path.iterdir():
        assert SECRET.encode() not in f.read_bytes(), f.name
