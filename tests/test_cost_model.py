"""Cost model: closed forms, directions, published anchors, feasibility of published layouts."""
import csv
import math
from pathlib import Path

import numpy as np
import pytest

from clusters import load_cluster
from cost_model import predict, predict_arrays
from cost_model.calibration import IDENTITY, Calibration, fit_calibration
from cost_model.memory import activation_terms, korthikanti_layer_bytes, mlp_terms, optimizer_bytes_per_param
from cost_model.tables import load_tables
from specs.model_spec import ModelSpec
from specs.models import load_model
from specs.plan import Plan
from specs.workload import Workload

REF = Path(__file__).resolve().parent.parent / "cost_model" / "data"  # public reference rows, with sources


def test_korthikanti_dense_layer_matches_generalised_terms():
    s, b, h, a, t = 2048, 1, 4096, 32, 4
    assert korthikanti_layer_bytes(s, b, h, a, t) == s * b * h * (34 + 5 * a * s / h) / t
    spec = ModelSpec(name="gpt", num_layers=1, hidden_size=h, num_attention_heads=a, vocab_size=1000,
                     ffn_hidden_size=4 * h, gated_linear_unit=False, moe_layers=(False,))
    terms = activation_terms(spec, s * b, t, s, flash=False, dropout=True)
    terms.update(mlp_terms(s * b, h, 4 * h, False, t))
    # MLP dropout mask (sbh) is counted in the attention dict's 2*sbh dropout term
    assert sum(terms.values()) == pytest.approx(korthikanti_layer_bytes(s, b, h, a, t))


def test_optimizer_bytes():
    assert optimizer_bytes_per_param(False) == 18
    assert optimizer_bytes_per_param(True, 8) == 6 + 12 / 8
    assert optimizer_bytes_per_param(True, 8, fp8=True) == 7 + 12 / 8


def _w(model="mixtral-8x7b", kind="h100-sxm", gpus=64, gbs=256, seq=4096):
    return Workload(load_model(model), load_cluster(kind, gpus), gbs, seq)


def test_deeper_pp_larger_bubble():
    w = _w(gpus=64, gbs=64)
    a, b = predict_arrays(w, [Plan(pp=2, ep=8, mbs=1), Plan(pp=8, ep=8, mbs=1)], calibration=IDENTITY,
                          detail=True)["breakdown_s"]["pipeline_bubble"]
    assert b > a


def test_full_recompute_slower_and_smaller():
    w = _w()
    r = predict_arrays(w, [Plan(pp=4, ep=8), Plan(pp=4, ep=8, recompute="full")], calibration=IDENTITY)
    assert r["step_time_s"][1] > r["step_time_s"][0]
    assert r["peak_memory_gib"][1] < r["peak_memory_gib"][0]


def test_ep_leaving_node_is_slower():
    w = _w("qwen3-30b-a3b", gpus=16, gbs=64)
    r = predict_arrays(w, [Plan(ep=8), Plan(ep=16)], calibration=IDENTITY, detail=True)
    a2a = r["breakdown_s"]["ep_dispatch_combine"]
    assert a2a[1] > a2a[0]


def test_smaller_m_expert_lower_grouped_efficiency():
    t = load_tables("h100-sxm")["grouped_gemm"]
    # same tokens: 4 experts x 1024 rows vs 32 experts x 128 rows
    assert t.lookup("bf16", groups=32, m=128, n=4096, k=4096)[()] < t.lookup("bf16", groups=4, m=1024, n=4096, k=4096)[()]
    w = _w("qwen3-30b-a3b", gpus=16, gbs=64)
    r = predict_arrays(w, [Plan(ep=16), Plan(ep=2)], calibration=IDENTITY, detail=True)
    assert r["m_expert"][0] > r["m_expert"][1]


def test_tables_digest_and_sources():
    t = load_tables("h100-sxm")
    assert len(t.digest) == 64
    assert all(fam in t.families for fam in ("gemm", "grouped_gemm", "attention", "collectives", "ep_dispatch"))


def test_megatron_moe_layer_anchors_within_25pct():
    for r in csv.DictReader(open(REF / "megatron_moe_layer_h100.csv")):
        h, sh = int(r["hidden"]), int(r["shared_expert"])
        spec = ModelSpec(name=r["case"], num_layers=1, hidden_size=h, num_attention_heads=32, vocab_size=32000,
                         ffn_hidden_size=4 * h, num_experts=int(r["experts"]), moe_router_topk=int(r["topk"]),
                         moe_ffn_hidden_size=int(r["ffn_per_expert"]), moe_shared_expert_ffn=sh,
                         moe_layers=(True,))
        w = Workload(spec, load_cluster("h100-sxm", int(r["ep"])), int(r["ep"]), int(r["seq"]))
        d = r["dispatcher"]
        disp, fb = ("flex", d.split("-")[1]) if d.startswith("flex") else (d, "")
        p = Plan(tp=int(r["tp"]), ep=int(r["ep"]), dispatcher=disp, flex_backend=fb, precision=r["precision"])
        o = predict_arrays(w, [p], calibration=IDENTITY, detail=True)
        assert o["moe_block_fwd_s"][0] * 1e3 == pytest.approx(float(r["fwd_ms"]), rel=0.25), r["case"]
        assert o["moe_block_bwd_s"][0] * 1e3 == pytest.approx(float(r["bwd_ms"]), rel=0.25), r["case"]


def test_published_rows_within_20pct_after_calibration():
    from cost_model.fit_default_calibration import fit
    cal, rep = fit()
    assert rep["max_abs_rel_err"] <= 0.20, rep["rows"]
    assert rep["loo_max_abs_rel_err"] <= 0.20, rep["rows"]


def test_flex_sends_once_per_remote_domain():
    from cost_model.blocks import distinct_domains
    spec = load_model("qwen3-30b-a3b")  # 128 experts top-8, EP16 over two 8-GPU nodes
    assert distinct_domains(spec, 128, 8, np.array([16.0]), np.array([8.0]))[0] == pytest.approx(
        1 - math.comb(64, 8) / math.comb(128, 8))
    assert distinct_domains(spec, 128, 8, np.array([8.0]), np.array([8.0]))[0] == 0.0
    w = _w("qwen3-30b-a3b", gpus=16, gbs=64)
    r = predict_arrays(w, [Plan(ep=16), Plan(ep=16, dispatcher="flex", flex_backend="deepep")],
                       calibration=IDENTITY, detail=True)["breakdown_s"]["ep_dispatch_combine"]
    assert r[1] < r[0]  # NCCL alltoall ships all 8 copies, half across the NIC


def test_fit_calibration_recovers_scale():
    cal, rep = fit_calibration([(1.0, 1.3, "a"), (2.0, 2.6, "b"), (3.0, 3.9, "c")])
    assert cal.scale == pytest.approx(1.3, rel=1e-6)
    assert rep["loo_max_abs_rel_err"] == pytest.approx(0.0, abs=1e-6)
    assert Calibration().id == "identity"


@pytest.mark.parametrize("model,gpus,gbs,plan", [
    ("deepseek-v3", 1024, 8192, Plan(tp=2, pp=8, vpp=4, ep=64, mbs=1, precision="fp8-blockwise",
                                     recompute="selective", recompute_modules=("mla_up_proj", "mlp"))),
    ("qwen3-235b-a22b", 256, 8192, Plan(tp=2, pp=8, vpp=4, ep=32, mbs=1)),
    ("qwen3-30b-a3b", 16, 1024, Plan(tp=1, pp=1, ep=16, mbs=1)),
    ("mixtral-8x7b", 64, 256, Plan(tp=1, ep=8, pp=4, vpp=8, mbs=1)),
])
def test_published_layouts_fit(model, gpus, gbs, plan):
    p = predict(_w(model, gpus=gpus, gbs=gbs), plan)
    assert p.feasible, p.reasons
    assert p.to_dict()["tables_digest"]


def test_cli_predict_json(capsys):
    from tuner.cli import main
    rc = main(["predict", "--model", "qwen3-30b-a3b", "--cluster", "h100-sxm", "--gpus", "16", "--gbs", "64",
               "--seq", "4096", "--plan", "ep=8", "--json"])
    assert rc == 0
    import json
    d = json.loads(capsys.readouterr().out)
    assert d["step_time_s"] > 0 and "breakdown_s" in d
