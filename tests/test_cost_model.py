"""Cost model: closed forms, directions, published anchors, feasibility of published layouts."""
import csv
import itertools
import json
import math
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from clusters import load_cluster
from cost_model import predict, predict_arrays
from cost_model.calibration import IDENTITY, Calibration, fit_calibration
from cost_model.memory import activation_terms, korthikanti_layer_bytes, mlp_terms, optimizer_bytes_per_param
from cost_model.plans import BOOL_FIELDS, CODED_FIELDS, FLOAT_FIELDS, INT_FIELDS, NOT_COSTED, PlanArrays
from cost_model.tables import TABLE_ROOT as TABLES_ROOT
from cost_model.tables import digest_of, load_tables
from specs.model_spec import ModelSpec
from specs.models import load_model
from specs.plan import Plan
from specs.stack import profile_for
from specs.workload import Workload
from tuner.space.train import default_space, iter_realizable

REF = Path(__file__).resolve().parent.parent / "cost_model" / "data"  # public reference rows, with sources


def test_korthikanti_dense_layer_matches_generalised_terms():
    s, b, h, a, t = 2048, 1, 4096, 32, 4
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


def test_model_static_memory_is_optimizer_bytes_per_param():
    """The distributed optimizer saves, per stage, exactly what optimizer_bytes_per_param says:
    dense parameters sharded over DP x CP, experts over expert-DP (activations do not change)."""
    from cost_model.memory import GIB, stage_params
    from cost_model.model import _inputs, _stages
    w = _w(gpus=64, gbs=256)
    plans = [Plan(pp=4, ep=8, cp=2, dist_opt=False), Plan(pp=4, ep=8, cp=2, dist_opt=True)]
    r = predict_arrays(w, plans, calibration=IDENTITY, detail=True)
    saved = (r["memory_by_stage_gib"][0] - r["memory_by_stage_gib"][1]) * GIB
    pa = PlanArrays.from_plans(plans)
    x = _inputs(w, pa, load_tables("h100-sxm"), 1.0)
    params = stage_params(x, _stages(w.model, pa, x.vpp))
    dp, edp = plans[1].dp(64), 64 // (8 * 4)
    expect = (params.dense[1] * (optimizer_bytes_per_param(False) - optimizer_bytes_per_param(True, dp * 2))
              + params.expert[1] * (optimizer_bytes_per_param(False) - optimizer_bytes_per_param(True, edp)))
    assert expect.min() > 0
    assert saved == pytest.approx(expect, rel=1e-9)


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


SOURCE_PREFIXES = ("derived: ", "assumed: ", "measured:", "published: ")


@pytest.mark.parametrize("kind", sorted(p.name for p in TABLES_ROOT.iterdir() if (p / "meta.json").exists()))
def test_shipped_tables_every_row_has_an_explained_source(kind):
    """Every row of every shipped table names its source: a tag explained in meta.json's
    "sources", or a free-text citation after a kind prefix; the digest covers the files."""
    d = TABLES_ROOT / kind
    meta = json.loads((d / "meta.json").read_text())
    explained = meta.get("sources", {})
    assert all(v.strip() for v in explained.values()), kind
    csvs = sorted(d.glob("*.csv"))
    assert {p.stem for p in csvs} >= {"gemm", "grouped_gemm", "attention", "collectives", "ep_dispatch",
                                      "dispatch_gap", "membw"}
    for path in csvs:
        rows = list(csv.DictReader(path.open()))
        assert rows, path
        for r in rows:
            src = (r.get("source") or "").strip()
            assert src in explained or (src.startswith(SOURCE_PREFIXES) and len(src.split(":", 1)[1].strip()) > 10), \
                f"{path.name}: unexplained source {src!r}"
    digest, files = digest_of(d)
    assert meta["digest"] == digest and set(files) == {p.name for p in csvs}


def test_megatron_moe_layer_anchors_within_25pct():
    for r in csv.DictReader(open(REF / "megatron_moe_layer_h100.csv")):
        h, sh = int(r["hidden"]), int(r["shared_expert"])
        # the DeepSeek proxy routes group-limited: 8 groups, top-4 groups (the row's source note;
        # Megatron-LM moe_perf test_cases.py DEEPSEEK_PROXY moe_router_num_groups=8, group_topk=4)
        groups = dict(moe_router_num_groups=8, moe_router_group_topk=4) if r["model_proxy"] == "deepseek" else {}
        spec = ModelSpec(name=r["case"], num_layers=1, hidden_size=h, num_attention_heads=32, vocab_size=32000,
                         ffn_hidden_size=4 * h, num_experts=int(r["experts"]), moe_router_topk=int(r["topk"]),
                         moe_ffn_hidden_size=int(r["ffn_per_expert"]), moe_shared_expert_ffn=sh,
                         moe_layers=(True,), **groups)
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
    assert 0.85 <= cal.scale <= 1.25, cal.scale  # issue 22: the shipped scale stays a correction, not a model
    assert rep["max_abs_rel_err"] <= 0.15, rep["rows"]
    # leave-one-out: GPT-OSS-120B (bf16 alltoall, eager, dropless) is the most under-predicted row
    # (-18.0%); the DeepSeek-V3 B200 row, the one with DeepEP under a2a overlap and MXFP8 GEMMs, is
    # +17.1% since DeepEP runs at its measured rate beside compute and MXFP8 GEMMs at theirs (constants
    # DEEPEP_BESIDE_COMPUTE_RATE, FP8_GEMM_TIME_BLACKWELL; +4.4% before both), and the Qwen3 25.09 row
    # (alltoall EP8 in a node, PP2, drop-and-pad) +14.3%: the eager dropless rows miss host time the
    # graphed and drop-and-pad rows do not (docs/DESIGN.md, "Still unexplained")
    assert rep["loo_max_abs_rel_err"] <= 0.20, rep["rows"]
    assert sorted(abs(r["loo_rel_err"]) for r in rep["rows"])[-2] <= 0.18, rep["rows"]


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


# ---- the step time is the sum of its breakdown -----------------------------------------------------
SUM_CASES = [("mixtral-8x7b", "h100-sxm", 64, 256, 4096, "bf16"),
             ("deepseek-v3", "h100-sxm", 1024, 8192, 4096, "fp8"),
             ("qwen3-30b-a3b", "b200", 16, 512, 4096, "bf16"),
             ("deepseek-v2-lite", "gb200-nvl72", 32, 256, 4096, "bf16"),
             ("tiny-moe-shared", "cpu-local", 4, 16, 256, "bf16"),
             ("tiny-moe", "cpu-local", 2, 8, 128, "bf16")]


@pytest.mark.parametrize("case", SUM_CASES, ids=[f"{c[0]}@{c[1]}" for c in SUM_CASES])
def test_breakdown_sums_to_step_time(case):
    """Over realizable plans of the plan space (GPU clusters and cpu-local), the breakdown's
    components add up to the step time: nothing is costed that the breakdown does not show."""
    model, kind, gpus, gbs, seq, precision = case
    w = Workload(load_model(model), load_cluster(kind, gpus), gbs, seq)
    prof = profile_for(w.cluster, None)
    # GPU spaces: every 8th of the first 2400 realizable plans; cpu-local: its first 48 (it walks
    # many unrealizable points between them)
    start_stop_step = (0, 2400, 8) if w.cluster.is_gpu else (0, 48, 1)
    plans = list(itertools.islice(iter_realizable(default_space(w, prof, precision), w, prof), *start_stop_step))
    assert len(plans) >= 10
    for cal in (IDENTITY, Calibration(scale=1.37)):
        r = predict_arrays(w, plans, calibration=cal, detail=True)
        total = sum(r["breakdown_s"].values())
        assert np.all(np.isfinite(r["step_time_s"])) and np.all(r["step_time_s"] > 0)
        assert np.all(np.abs(total - r["step_time_s"]) <= 1e-12 * r["step_time_s"]), model
        assert all(np.all(v >= 0) for k, v in r["breakdown_s"].items() if k != "calibration")


# ---- every Plan field reaches the cost model ----------------------------------------------------------
# A value other than the default for each field (with the base plan it needs to matter).
ALTERNATIVES = {"capacity_factor": (1.0, {}), "tp": (2, {}), "cp": (2, {}), "pp": (2, {}), "vpp": (2, {}), "ep": (2, {}), "etp": (2, {}),
                "mbs": (2, {}), "recompute": ("full", {}), "recompute_modules": (("mlp",), {"recompute": "selective"}),
                "recompute_method": ("block", {"recompute": "full"}),
                "recompute_layers": (1, {"recompute": "full", "recompute_method": "block"}),
                "pp_first": (1, {"pp": 2}), "pp_last": (1, {"pp": 2}), "pp_layout": ("Et|tL", {"pp": 2}),
                "dispatcher": ("flex", {"flex_backend": "deepep"}),
                "flex_backend": ("hybridep", {"dispatcher": "flex", "flex_backend": "deepep"}),
                "precision": ("fp8-blockwise", {}),
                "cuda_graph_impl": ("transformer_engine", {}),
                "cuda_graph_scope": (("attn",), {"cuda_graph_impl": "transformer_engine"})}


def test_plan_arrays_represent_every_plan_field():
    names = [f.name for f in fields(Plan)]
    covered = set(INT_FIELDS) | set(BOOL_FIELDS) | set(FLOAT_FIELDS) | set(CODED_FIELDS) | set(NOT_COSTED)
    assert set(names) == covered, f"Plan fields the cost model does not know: {set(names) - covered}"
    for name in names:
        if name in NOT_COSTED:
            continue
        if name in BOOL_FIELDS:
            alt, base = not getattr(Plan(), name), {}
        else:
            assert name in ALTERNATIVES, f"give {name} an alternative value in ALTERNATIVES"
            alt, base = ALTERNATIVES[name]
        a, b = Plan(**base), Plan(**{**base, name: alt})
        pa = PlanArrays.from_plans([a, b])
        column = CODED_FIELDS.get(name, name)
        differ = pa.cols[column][0] != pa.cols[column][1]
        if column == "layout":
            differ = pa.layouts[pa.layout[0]] != pa.layouts[pa.layout[1]]
        assert differ, f"{name}={alt!r} does not change PlanArrays column {column}"
