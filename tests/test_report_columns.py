"""The training study report (issue 28): one winner, the pre-registered and the final-calibration
predictions in their own columns, each trial's median with its spread, rank quality, provenance and
next steps as commands; labelled plots."""
import pytest

from clusters import load_cluster
from specs.models import load_model
from specs.plan import Plan
from specs.workload import Workload


class Prof:
    def describe(self):
        return "cpu-local"


@pytest.fixture(scope="module")
def workload():
    return Workload(model=load_model("tiny-moe"), cluster=load_cluster("cpu-local", 2), gbs=16, seq=256)


def _rows(plans):
    # (number, plan, roles, median step s, timed steps s); tok/s/GPU = 16 * 256 / 2 / step
    spec = [(0, plans[0], "baseline", 2.0, [1.9, 2.0, 2.4]), (1, plans[1], "searched,preregistered", 1.6, [1.5, 1.6, 1.7]),
            (2, plans[2], "searched,preregistered", 2.5, [2.5, 2.6, 2.4])]
    return [{"number": n, "state": "COMPLETE", "plan": p, "roles": roles, "measured_step_time_s": med,
             "measured_step_times_s": steps, "measured_tokens_per_s_per_gpu": 2048 / med,
             "predicted_step_time_s": 9.9, "predicted_tokens_per_s_per_gpu": 2048 / 9.9}  # trial-time: never shown
            for n, p, roles, med, steps in spec] + [
        {"number": 3, "state": "FAIL", "plan": plans[3], "roles": "searched", "failure_kind": "oom", "failure_message": "x"}]


def test_training_report_columns_and_one_winner(tmp_path, workload):
    from tuner.study.report import write_report
    plans = [Plan.parse(t).canonical() for t in ("ep=2", "ep=2,mbs=4", "mbs=8", "ep=2,mbs=8")]
    prereg = {"study": "r", "sha256": "a" * 64, "acceptance": {"ratio": 0.98, "rule": "bar 0.98"},
              "hashes": {"calibration_id": "identity", "tables_digest": "b" * 64},
              "workload": {"model": "tiny-moe", "cluster": "cpu-local", "devices": 2, "gbs": 16, "seq": 256, "precision": "bf16"},
              "baseline": {"plan": plans[0], "source": "test", "predicted_tokens_per_s_per_gpu": 1111.0},
              "plans": [{"plan": plans[1], "predicted_tokens_per_s_per_gpu": 2222.0},
                        {"plan": plans[2], "predicted_tokens_per_s_per_gpu": 3333.0}]}
    (tmp_path / "r").mkdir()
    path = write_report(tmp_path / "r", workload=workload, profile=Prof(), prereg=prereg, rows=_rows(plans),
                        backend="megatron", storage_url="postgresql://me:hunter2@db/s")
    text = path.read_text()
    assert "hunter2" not in text
    header = next(line for line in text.splitlines() if line.startswith("| # |"))
    for col in ("pre-registered tok/s/GPU", "final-calibration tok/s/GPU", "measured tok/s/GPU", "measured / final"):
        assert col in header, col
    # the pre-registered predictions as registered; the trial-time prediction (9.9 s) nowhere
    assert "| 2222.0 |" in text and "| 3333.0 |" in text and "206.9" not in text
    # one winner: trial #1 (1280 tok/s/GPU > baseline 1024), named by the verdict, the Winner section and the table
    assert "winner trial #1" in text and "trial #1, the best measured searched plan" in text
    assert text.count("**winner**") == 1 and "| 1 | searched,preregistered **winner** |" in text
    assert "1280.0 (1204.7..1365.3)" in text  # median (slowest..fastest step)
    assert "Ranking quality: pre-registered Spearman" in text and "top-3 overlap" in text
    assert "shipped defaults (not profiled on this cluster)" in text and "moetune profile --cluster cpu-local" in text
    assert "moetune adjudicate r --study-dir" in text and "--storage 'postgresql://me:***@db/s'" in text
    assert "moetune emit megatron --model tiny-moe" in text
    for png in ("measured_vs_predicted.png", "history.png", "winner_breakdown.png"):
        assert (tmp_path / "r" / png).read_bytes()[:4] == b"\x89PNG" and f"]({png})" in text
