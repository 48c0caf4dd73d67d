"""The Weave-megakernel what-if of the training cost model (tuner/rank/whatif.py) and its CLI/report."""
import json
import subprocess
import sys

import numpy as np
import pytest

import cost_model
from clusters import load_cluster
from kernels.weave import LayerShape, load_curves, moe_layer_time
from specs.models import load_model
from specs.plan import Plan
from specs.workload import Workload
from tuner.rank.whatif import REASON_CODE, describe, megakernel_training


def _case(model="deepseek-v2-lite", kind="h100-sxm", gpus=8, plan="tp=1,pp=1,ep=8,mbs=2", gbs=64, seq=4096):
    w = Workload(load_model(model), load_cluster(kind, gpus), gbs, seq)
    p = Plan.parse(plan)
    return w, p, cost_model.predict(w, p)


def test_whatif_replaces_the_forward_moe_part_by_weaves_time():
    w, p, pred = _case()
    r = megakernel_training(w, p, pred)
    assert r["applicable"] and r["reason_code"] == REASON_CODE
    tokens = p.mbs * w.seq / (p.cp * p.tp)
    c, k, ns, ms = moe_layer_time(LayerShape.from_model(w.model), tokens, p.ep, 1.0, load_curves("h100-sxm"))
    assert (r["c"], r["K"], r["n_steal"]) == (int(c), int(k), int(ns))
    assert r["weave_ms"] == pytest.approx(float(ms))
    # the saving is exactly (baseline - weave) per MoE layer and microbatch, times the calibration
    scale = pred.step_time_s / pred.extra["raw_step_time_s"]
    expect = pred.extra["microbatches"] * r["moe_layers"] * max(0.0, r["baseline_ms"] - r["weave_ms"]) / 1e3 * scale
    assert r["saving_s"] == pytest.approx(expect, rel=1e-9)
    assert r["step_time_s"] == pytest.approx(pred.step_time_s - expect, rel=1e-12)
    assert r["speedup"] == pytest.approx(pred.step_time_s / r["step_time_s"] - 1)
    assert r["moe_layers"] == w.model.num_moe_layers  # pp=1: every MoE layer is on the slowest stage
    assert "faster with a Weave-style megakernel" in describe(r)


def test_whatif_never_makes_a_plan_slower():
    # a slow link makes Weave worse than the cost model's own layer: then it would not be chosen
    w, p, pred = _case()
    slow = load_curves("h100-sxm").with_params(bw_max=1.0)
    r = megakernel_training(w, p, pred, curves=slow)
    assert r["weave_ms"] > r["baseline_ms"]
    assert r["saving_s"] == 0.0 and r["speedup"] == 0.0


@pytest.mark.parametrize("model,kind,gpus,plan,why", [
    ("qwen3-30b-a3b", "h100-sxm", 16, "tp=1,pp=1,ep=16,mbs=1", "NVLink domain"),
    ("tiny-moe", "cpu-local", 2, "tp=1,pp=1,ep=2,mbs=1", "not a GPU"),
])
def test_whatif_not_applicable(model, kind, gpus, plan, why):
    w, p, pred = _case(model, kind, gpus, plan, gbs=32, seq=256 if kind == "cpu-local" else 4096)
    r = megakernel_training(w, p, pred)
    assert not r["applicable"] and why in r["why"]
    assert "not applicable" in describe(r)


def test_predict_cli_prints_the_whatif():
    args = [sys.executable, "-m", "tuner.cli", "predict", "--model", "deepseek-v2-lite", "--cluster", "h100-sxm",
            "--gpus", "8", "--gbs", "64", "--seq", "4096", "--plan", "tp=1,pp=1,ep=8,mbs=1", "--complete", "defaults", "--what-if", "megakernel"]
    out = subprocess.run(args + ["--json"], capture_output=True, text=True, check=True).stdout
    d = json.loads(out)
    assert d["what_if"]["applicable"] and d["what_if"]["step_time_s"] < d["step_time_s"]
    text = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    assert "what-if" in text and REASON_CODE in text
    bad = subprocess.run(args[:-1] + ["weave"], capture_output=True, text=True)
    assert bad.returncode == 2


def test_report_shows_the_whatif(tmp_path):
    from tuner.study.report import write_report
    w, p, pred = _case()
    prereg = {"study": "s", "workload": {"model": w.model.name, "devices": 8, "cluster": "h100-sxm", "gbs": 64,
                                         "seq": 4096, "precision": "bf16"},
              "plans": [{"plan": p.canonical()}]}

    class Prof:
        def describe(self):
            return "gpu-full"
    path = write_report(tmp_path, workload=w, profile=Prof(), prereg=prereg, rows=[], backend="predict-only")
    text = path.read_text()
    assert "What-if" in text and "faster with a Weave-style megakernel" in text
    assert np.isfinite(pred.step_time_s)


def test_serving_whatif_never_beats_the_hbm_roofline_of_the_experts_it_reads(capsys):
    """DeepSeek-V3 decode on 8 H200 (fp8 checkpoint), 16 requests per GPU: 128 tokens pick top-8 of 256
    experts, ~31 local experts x 3 x 7168 x 2048 fp8 bytes = 1.39 GB per layer per GPU, >= 0.29 ms at
    4.8 TB/s. Weave's model alone says 0.018 ms; the what-if must not claim less than the floor."""
    from tuner.cli import main
    assert main(["predict", "--mode", "serve", "--model", "deepseek-v3", "--cluster", "h200-sxm", "--gpus", "8",
                 "--phase", "decode", "--isl", "1024", "--osl", "1024", "--plan", "tp=8,attn_dp=8,ep=8,a2a=deepep",
                 "--what-if", "megakernel", "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["what_if"]
    active = 256 * (1 - (1 - 8 / 256) ** (16 * 8)) / 8
    floor_ms = active * 3 * 7168 * 2048 * 1.0 / 4.8e12 * 1e3
    assert floor_ms == pytest.approx(0.2886, abs=1e-3)
    assert w["decode_weave_ms"] >= floor_ms * (1 - 1e-9) and w["floored"]
    assert w["decode_weave_model_ms"] < floor_ms  # what the kernel model alone claims
    # the gain is bounded by replacing the layer with its floor: no +294%
    assert w["speedup"] <= w["decode_baseline_ms"] / floor_ms - 1
    assert w["speedup"] < 0.5


def test_training_whatif_is_floored_too():
    w, p, pred = _case()
    r = megakernel_training(w, p, pred)
    assert r["weave_ms"] >= r["hbm_floor_ms"] > 0 and r["weave_ms"] == max(r["weave_model_ms"], r["hbm_floor_ms"])
