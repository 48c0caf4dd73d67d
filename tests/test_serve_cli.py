"""`moetune emit sglang` and `moetune plans --mode serve`: output shape, the 0.5.23 spelling, and
bad input as one line with exit code 2."""
import json

import pytest

from tuner.cli import main

Q = ["--model", "qwen3-30b-a3b", "--cluster", "h200-sxm"]


def test_emit_sglang_one_node(capsys, tmp_path):
    assert main(["emit", "sglang", *Q, "--gpus", "8", "--plan", "tp=8,attn_dp=8,a2a=deepep,cuda_graph_max_bs=128",
                 "--out", str(tmp_path / "launch.sh")]) == 0
    text = (tmp_path / "launch.sh").read_text()
    assert text.count("python -m sglang.launch_server") == 1
    assert "--attn-dp-size 8" in text and "--moe-a2a-backend deepep" in text
    assert "--cuda-graph-max-bs-decode 128" in text and "--enable-dp-attention" not in text
    assert "--nnodes" not in text and "a2a-forces-ep" in text
    assert json.loads((tmp_path / "qwen3-30b-a3b-config" / "config.json").read_text())["num_experts"] == 128


def test_emit_sglang_multinode_and_pd(capsys):
    assert main(["emit", "sglang", "--model", "deepseek-v3", "--cluster", "h200-sxm", "--gpus", "16",
                 "--plan", "tp=16,attn_dp=16,a2a=deepep", "--nnodes", "2", "--model-path", "/m"]) == 0
    out = capsys.readouterr().out
    assert out.count("sglang.launch_server") == 2 and "--node-rank 1" in out and "--dist-init-addr" in out
    assert main(["emit", "sglang", *Q, "--gpus", "8", "--plan", "tp=2,pd=1:3", "--pd", "--model-path", "/m"]) == 0
    out = capsys.readouterr().out
    assert out.count("--disaggregation-mode prefill") == 1 and out.count("--disaggregation-mode decode") == 3
    assert out.count("sglang_router.launch_router --pd-disaggregation") == 1


@pytest.mark.parametrize("argv", [
    ["--gpus", "8", "--plan", "tp=8,tbo=1"],                      # unrealizable
    ["--gpus", "8", "--plan", "tp=8,bogus=1"],                    # bad key
    ["--gpus", "8", "--plan", "tp=4,pd=1:1"],                     # pd plan without --pd
    ["--gpus", "16", "--plan", "tp=16,attn_dp=16", "--nnodes", "3"],  # wrong node count
])
def test_emit_sglang_bad_input_one_line(capsys, argv):
    assert main(["emit", "sglang", *Q, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err


def test_emit_megatron_still_needs_gbs(capsys):
    assert main(["emit", "megatron", *Q, "--gpus", "8", "--plan", "tp=1"]) == 2


def test_plans_serve_json(capsys):
    assert main(["plans", "--mode", "serve", *Q, "--gpus", "8", "--json", "--examples", "3"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert 0 < d["realizable"] < d["space_size"] and len(d["examples"]) == 3
    assert sum(d["rejections"].values()) >= d["space_size"] - d["realizable"]
    assert "tbo-needs-a2a-or-attn-dp" in d["rejection_examples"]


def test_plans_serve_rank(capsys):
    """Ranked by the objective, effective plans (what SGLang runs), distinct, fast (one vectorised pass)."""
    from specs.serve_plan import ServePlan
    assert main(["plans", "--mode", "serve", *Q, "--gpus", "8", "--isl", "4000", "--osl", "1000",
                 "--concurrency", "256", "--rank", "--top", "10", "--examples", "0", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["ranked"]
    objs = [r["objective"] for r in d["plans"]]
    assert len(objs) == 10 and objs == sorted(objs, reverse=True)
    assert d["objective"] == "output_tokens_per_s_per_gpu" and d["scored"] > 1000
    assert d["elapsed_s"] > 0  # timed (its speed is a benchmark's business, not a test's)
    for r in d["plans"]:
        p = ServePlan.parse(r["plan"])  # the effective plan: ep resolved, defaults filled
        assert p.chunked_prefill > 0 and p.cuda_graph_max_bs != 0
        assert p.a2a == "none" or p.ep == p.tp
    assert len({r["plan"] for r in d["plans"]}) == 10


def test_plans_serve_rank_prefill_objective_and_slo(capsys):
    assert main(["plans", "--mode", "serve", *Q, "--gpus", "8", "--isl", "4000", "--osl", "1000", "--phase",
                 "prefill", "--rank", "--top", "3", "--examples", "0", "--json", "--ttft-slo", "0.5"]) == 0
    d = json.loads(capsys.readouterr().out)["ranked"]
    assert d["objective"] == "input_tokens_per_s_per_gpu"
    assert all(r["ttft_p90_s"] <= 0.5 for r in d["plans"])
    assert any(k.startswith("ttft_p90_above") for k in d["excluded"])


def test_plans_serve_rank_needs_lengths(capsys):
    assert main(["plans", "--mode", "serve", *Q, "--gpus", "8", "--rank"]) == 2
    assert "--isl" in capsys.readouterr().err


def test_predict_serve_reports_our_rules_and_prices_the_effective_plan(capsys):
    base = ["predict", "--mode", "serve", *Q, "--gpus", "8", "--isl", "4000", "--osl", "1000", "--json"]
    assert main([*base, "--plan", "tp=8,tbo=1"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["feasible"] is False and d["realizable"] is False
    assert any(r.startswith("tbo-needs-a2a-or-attn-dp:") for r in d["reasons"])
    assert main([*base, "--plan", "tp=8,attn_dp=8,a2a=deepep"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["feasible"] and "a2a-forces-ep" in d["rewrites"] and "attn-dp-chunk" in d["rewrites"]
    # SGLang's per-rank chunk on H200 (16384 // 8 when unset... the 8192 tier for 141 GB) and ep = tp
    from specs.serve_plan import ServePlan
    eff = ServePlan.parse(d["effective_plan"])
    assert eff.ep == 8 and eff.chunked_prefill == 1024


def test_priced_plan_gives_the_cost_model_sglangs_per_rank_chunk():
    from clusters import load_cluster
    from cost_model.serving.plans import to_cols
    from specs.models import load_model
    from specs.serve_plan import ServePlan
    from tuner.serve_price import priced_plan
    from tuner.serve_realize import realize
    c = load_cluster("h200-sxm", 8)
    for text in ("tp=8,attn_dp=8,a2a=deepep", "tp=8,attn_dp=4,chunked_prefill=4096", "tp=4,dp=2,max_running=128"):
        v = realize(ServePlan.parse(text), load_model("qwen3-30b-a3b"), c)
        cols = to_cols([priced_plan(v.effective)], c.hbm_gib)
        assert int(cols.chunk[0]) == v.effective.plan.chunked_prefill
        assert int(cols.ep[0]) == v.effective.plan.ep
        assert int(cols.graph_bs[0]) == max(v.effective.plan.cuda_graph_max_bs, 0)


def test_predict_serve_megakernel_what_if(capsys):
    base = ["predict", "--mode", "serve", "--isl", "4000", "--osl", "1000", "--json", "--what-if", "megakernel"]
    assert main([*base, *Q, "--gpus", "8", "--plan", "tp=8,attn_dp=8,a2a=deepep"]) == 0
    w = json.loads(capsys.readouterr().out)["what_if"]
    assert w["applicable"] and w["reason_code"] == "megakernel-not-in-stack"
    assert w["prefill_weave_ms"] > 0 and w["decode_weave_ms"] > 0 and w["speedup"] >= 0
    assert w["prefill_tokens_per_gpu"] > w["decode_batch_tokens_per_gpu"] > 0
    assert main([*base, "--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2", "--plan", "tp=2"]) == 0
    assert json.loads(capsys.readouterr().out)["what_if"]["applicable"] is False
    text = [a for a in base if a != "--json"]
    assert main([*text, *Q, "--gpus", "8", "--plan", "tp=8,attn_dp=8,a2a=deepep"]) == 0
    assert "what-if        megakernel what-if:" in capsys.readouterr().out
