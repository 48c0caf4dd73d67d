"""`moetune emit sglang` and `moetune plans --mode serve`: output shape, the 0.5.23 spelling, and
bad input as one line with exit code 2."""
import json

import pytest

from tuner.cli import main

Q = ["--model", "qwen3-30b-a3b", "--cluster", "h200-sxm"]
IO = ["--isl", "1024", "--osl", "1024"]


def test_emit_sglang_one_node(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["emit", "sglang", *Q, *IO, "--gpus", "8", "--plan", "tp=8,attn_dp=8,a2a=deepep,cuda_graph_max_bs=128",
                 "--out", str(tmp_path / "launch.sh")]) == 0
    text = (tmp_path / "launch.sh").read_text()
    assert text.count("python -m sglang.launch_server") == 1
    assert "--attn-dp-size 8" in text and "--moe-a2a-backend deepep" in text
    assert "--cuda-graph-max-bs-decode 128" in text and "--enable-dp-attention" not in text
    assert "--nnodes" not in text and "a2a-forces-ep" in text
    # real weights of the preset's published checkpoint; nothing but the file is written
    assert "--model-path Qwen/Qwen3-30B-A3B" in text and "--load-format" not in text
    assert sorted(x.name for x in tmp_path.iterdir()) == ["launch.sh"]
    assert "python -m sglang.bench_serving" in text and "--max-concurrency 64" in text


def test_emit_sglang_benchmark_writes_a_config_only_beside_out(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny = ["--model", "tiny-moe", "--cluster", "h200-sxm", "--gpus", "8", "--plan", "tp=2", *IO]
    assert main(["emit", "sglang", *tiny]) == 2  # no checkpoint to load: --model-path or --benchmark
    assert main(["emit", "sglang", *tiny, "--benchmark"]) == 2  # the config dir needs --out
    assert list(tmp_path.iterdir()) == []
    assert main(["emit", "sglang", *tiny, "--benchmark", "--out", str(tmp_path / "o" / "l.sh")]) == 0
    text = (tmp_path / "o" / "l.sh").read_text()
    assert "--load-format dummy" in text and "dummy weights" in text
    assert json.loads((tmp_path / "o" / "tiny-moe-config" / "config.json").read_text())["num_experts"] == 4


def test_emit_sglang_multinode_and_pd(capsys):
    assert main(["emit", "sglang", "--model", "deepseek-v3", "--cluster", "h200-sxm", "--gpus", "16", *IO,
                 "--plan", "tp=16,attn_dp=16,a2a=deepep", "--nnodes", "2", "--model-path", "/m"]) == 0
    out = capsys.readouterr().out
    assert out.count("sglang.launch_server") == 2 and "--node-rank 1" in out and "--dist-init-addr" in out
    assert out.count("--quantization fp8") == 2  # DeepSeek-V3's checkpoint is fp8, as priced
    assert main(["emit", "sglang", *Q, *IO, "--gpus", "8", "--plan", "tp=2,pd=1:3", "--pd", "--model-path", "/m"]) == 0
    out = capsys.readouterr().out
    assert out.count("--disaggregation-mode prefill") == 1 and out.count("--disaggregation-mode decode") == 3
    assert out.count("sglang_router.launch_router --pd-disaggregation") == 1


def test_emit_sglang_writes_the_dense_mlp_tp_size(capsys):
    """moe_dense_tp=1 -> `--moe-dense-tp-size 1` on every node's server; SGLang's default writes none."""
    ds = ["--model", "deepseek-v3", "--cluster", "h100-sxm", "--gpus", "16", *IO, "--model-path", "/m", "--plan"]
    assert main(["emit", "sglang", *ds, "tp=16,attn_dp=16,moe_dense_tp=1,a2a=deepep"]) == 0
    out = capsys.readouterr().out
    assert out.count("sglang.launch_server") == 2 and out.count("--moe-dense-tp-size 1 ") == 2
    assert main(["emit", "sglang", *ds, "tp=16,attn_dp=16,a2a=deepep"]) == 0
    assert "--moe-dense-tp-size" not in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["--gpus", "8", "--plan", "tp=8,tbo=1"],                      # unrealizable
    ["--gpus", "8", "--plan", "tp=8,attn_dp=8,moe_dense_tp=4"],   # SGLang takes only None, 1 or tp
    ["--gpus", "8", "--plan", "tp=8,bogus=1"],                    # bad key
    ["--gpus", "8", "--plan", "tp=4,pd=1:1"],                     # pd plan without --pd
    ["--gpus", "16", "--plan", "tp=16,attn_dp=16", "--nnodes", "3"],  # wrong node count
])
def test_emit_sglang_bad_input_one_line(capsys, argv):
    assert main(["emit", "sglang", *Q, *IO, *argv]) == 2
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
    base = ["predict", "--mode", "serve", *Q, "--gpus", "8", "--isl", "4000", "--osl", "1000", "--json",
            "--complete", "defaults"]
    # SGLang cannot run it: exit 2 with the reasons (the error object), as a training plan would
    assert main([*base, "--plan", "tp=8,tbo=1"]) == 2
    out = capsys.readouterr()
    e = json.loads(out.out)
    assert e["ok"] is False and e["error"]["code"] == "unrealizable"
    assert [r["code"] for r in e["error"]["reasons"]] == ["tbo-needs-a2a-or-attn-dp"]
    assert "plan is not realizable on SGLang 0.5.23" in out.err
    # --force prices it as SGLang would resolve it, labelled
    assert main([*base, "--plan", "tp=8,tbo=1", "--force"]) == 0
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


def test_every_path_prices_sglangs_resolution_once(capsys):
    """DeepSeek-V3 tp=8,attn_dp=8,ep=8,a2a=deepep,deepep_mode=normal on 8xH200: SGLang's resolver gives
    mem_fraction_static 0.755 (its decode-graph batch 512 counts in the reserve before deepep normal
    turns the graphs off). Every path prices that value: `predict --mode serve`, the ranking of
    `plans --rank`, the serving study's screening (pinned plans) and the cost model called directly.
    (Before specs/serve_resolve.py the tuner path priced 0.904.)"""
    from clusters import load_cluster
    from cost_model.serving import predict_serve
    from specs.models import load_model
    from specs.serve_plan import ServePlan, ServeWorkload
    from tuner.rank.serve_price import score_plans
    from tuner.space.sglang_rules import realize
    text = "tp=8,attn_dp=8,ep=8,a2a=deepep,deepep_mode=normal"
    m, c = load_model("deepseek-v3"), load_cluster("h200-sxm", 8)
    w = ServeWorkload(isl=1000, osl=1000, concurrency=64)
    assert main(["predict", "--mode", "serve", "--model", "deepseek-v3", "--cluster", "h200-sxm", "--gpus", "8",
                 "--isl", "1000", "--osl", "1000", "--concurrency", "64", "--precision", "fp8", "--plan", text,
                 "--json", "--complete", "defaults"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["extra"]["mem_frac"] == pytest.approx(0.755, abs=1e-9)
    direct = predict_serve(m, c, ServePlan.parse(text), w, precision="fp8")
    assert direct.extra["mem_frac"] == pytest.approx(0.755, abs=1e-9)
    assert direct.effective_plan == d["effective_plan"]
    eff = realize(ServePlan.parse(text), m, c).effective
    assert score_plans([eff], m, c, w, precision="fp8")["mem_frac"][0] == pytest.approx(0.755, abs=1e-9)  # as goodput prices
    assert score_plans([eff.pinned()], m, c, w, precision="fp8")["mem_frac"][0] == pytest.approx(0.755, abs=1e-9)
    # the per-rank chunk is divided once: flag 8192 (H200 tier) -> 1024 per attention-DP rank
    assert ServePlan.parse(d["effective_plan"]).chunked_prefill == 1024 and eff.pinned().chunked_prefill == 8192


LMSYS_DECODE = ["--model", "deepseek-v3", "--cluster", "h100-sxm", "--gpus", "72", "--precision", "fp8",
                "--plan", "tp=72,attn_dp=72,ep=72,a2a=deepep,deepep_mode=low_latency,eplb_redundant=32"]


def test_serving_completion_best_and_defaults(capsys, tmp_path):
    """The LMSYS 72xH100 decode layout: SGLang's auto values (decode graph batch 512 x attention DP 72
    in the memory reserve) leave a negative memory fraction, so `--complete defaults` is infeasible;
    `--complete best` completes the memory fraction, graph batch, chunk, running requests, page size
    and KV dtype to a feasible, better plan; text and JSON show it; `emit sglang` writes the flags."""
    base = ["predict", "--mode", "serve", *LMSYS_DECODE, "--phase", "decode", "--isl", "2000", "--osl", "100",
            "--concurrency", "128", "--json"]
    assert main([*base, "--complete", "defaults"]) == 3  # printed, then exit 3: does not fit
    d = json.loads(capsys.readouterr().out)
    assert not d["feasible"] and d["extra"]["mem_frac"] < 0 and d["completion"]["how"] == "defaults"
    assert main([*base, "--complete", "best"]) == 0
    b = json.loads(capsys.readouterr().out)
    assert b["feasible"] and b["completion"]["how"] == "best" and b["completion"]["candidates"] > 100
    assert set(b["completion"]["completed"]) == {"mem_frac", "cuda_graph_max_bs", "chunked_prefill", "max_running",
                                                 "page_size", "kv_cache_dtype"}
    assert 0 < b["completion"]["completed"]["mem_frac"] < 1 and b["output_tokens_per_s_per_gpu"] > 0
    # a knob the user gives stays as given
    assert main([*base[:-1], "--json", "--plan", LMSYS_DECODE[-1] + ",kv_cache_dtype=auto", "--complete", "best"]) == 0
    g = json.loads(capsys.readouterr().out)
    assert "kv_cache_dtype" in g["completion"]["given"] and g["plan"].endswith("kv_cache_dtype=auto")
    assert main([*base[:-1], "--complete", "best"]) == 0
    assert "completion     best of" in capsys.readouterr().out
    out = tmp_path / "launch.sh"
    assert main(["emit", "sglang", *LMSYS_DECODE, "--isl", "2000", "--osl", "100", "--out", str(out)]) == 0
    text = out.read_text()
    assert "--mem-fraction-static" in text and "--cuda-graph-max-bs-decode" in text
    assert "completion: best of" in capsys.readouterr().err
    assert main(["emit", "sglang", *LMSYS_DECODE, "--isl", "2000", "--osl", "100", "--complete", "defaults",
                 "--out", str(out)]) == 3  # SGLang's auto values do not fit: refused
    assert main(["emit", "sglang", *LMSYS_DECODE, "--isl", "2000", "--osl", "100", "--complete", "defaults",
                 "--force", "--out", str(out)]) == 0
    assert "--mem-fraction-static" not in out.read_text()


def test_predict_serve_megakernel_what_if(capsys):
    base = ["predict", "--mode", "serve", "--isl", "4000", "--osl", "1000", "--json", "--what-if", "megakernel"]
    assert main([*base, *Q, "--gpus", "8", "--plan", "tp=8,attn_dp=8,a2a=deepep"]) == 0
    w = json.loads(capsys.readouterr().out)["what_if"]
    assert w["applicable"] and w["reason_code"] == "megakernel-not-in-stack"
    assert w["prefill_weave_ms"] > 0 and w["decode_weave_ms"] > 0 and w["speedup"] >= 0
    assert w["prefill_tokens_per_gpu"] > w["decode_batch_tokens_per_gpu"] > 0
    # tiny-moe's context is 4,096 tokens: a workload it can serve (4000 + 1000 would be refused)
    tiny = [*base[:3], "--isl", "2000", "--osl", "500", *base[7:]]
    assert main([*tiny, "--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2", "--plan", "tp=2"]) == 0
    assert json.loads(capsys.readouterr().out)["what_if"]["applicable"] is False
    text = [a for a in base if a != "--json"]
    assert main([*text, *Q, "--gpus", "8", "--plan", "tp=8,attn_dp=8,a2a=deepep"]) == 0
    assert "what-if        megakernel what-if:" in capsys.readouterr().out


# goodput under the SLOs (issue 28) -------------------------------------------------------------------

TINY = ["--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2", "--isl", "128", "--osl", "32"]


@pytest.fixture(scope="module")
def tiny_effective():
    from clusters import load_cluster
    from specs.models import load_model
    from tuner.space.serve import default_serve_space, summarize
    m, c = load_model("tiny-moe"), load_cluster("cpu-local", 2)
    s = summarize(default_serve_space(2), m, c, max_examples=0, keep_effective=True)
    return m, c, s.effective


def test_goodput_picks_the_concurrency_of_most_throughput_within_the_slos(tiny_effective):
    """Each row sits at the swept concurrency where the plan's objective is highest among those whose
    steady-state TTFT / TPOT meet the SLOs (checked by pricing every plan at every concurrency), and a
    tighter TPOT SLO never picks a higher concurrency."""
    from dataclasses import replace

    import numpy as np

    from specs.serve_plan import ServeWorkload
    from tuner.rank.serve_price import goodput, score_plans
    m, c, effs = tiny_effective
    conc = [2, 8, 32, 128]
    w = ServeWorkload(isl=128, osl=32, ttft_p90_s=0.5, tpot_p90_s=0.05)
    g = goodput(effs, m, c, w, concurrencies=conc)
    assert g.rows and g.concurrencies == conc
    by_plan = {e.plan.canonical(): e for e in effs}
    sample = g.rows[:5]
    plans = [by_plan[r["effective_plan"]] for r in sample]
    grid = {k: score_plans(plans, m, c, replace(w, concurrency=k)) for k in conc}
    for i, r in enumerate(sample):
        ok = [(grid[k]["objective"][i], k) for k in conc if grid[k]["excluded"][i] == ""]
        best_obj, best_c = max(ok)
        assert r["concurrency"] == best_c and r["objective"] == pytest.approx(best_obj)
        assert r["tpot_p90_s"] <= 0.05 and r["ttft_p90_s"] <= 0.5
        assert r["requests_per_s"] == pytest.approx(r["objective"] * 2 / 32)
    tight = goodput(effs, m, c, replace(w, tpot_p90_s=float(np.median([r["tpot_p90_s"] for r in g.rows]))),
                    concurrencies=conc)
    loose = {r["effective_plan"]: r["concurrency"] for r in g.rows}
    assert any(r["concurrency"] < loose[r["effective_plan"]] for r in tight.rows if r["effective_plan"] in loose)
    assert all(r["concurrency"] <= loose[r["effective_plan"]] for r in tight.rows if r["effective_plan"] in loose)


def test_goodput_collapses_predicted_equal_variants(tiny_effective):
    """Rows of one parallel layout predicted equal at their concurrency are one row (xN), naming the
    flags they differ in; no two rows are equal."""
    from specs.serve_plan import ServeWorkload
    from tuner.rank.serve_price import _key, best_per_layout, goodput
    m, c, effs = tiny_effective
    g = goodput(effs, m, c, ServeWorkload(isl=128, osl=32), concurrencies=[8, 64])
    keys = [_key(r) for r in g.rows]
    assert len(keys) == len(set(keys))
    merged = [r for r in g.rows if r["variants"] > 1]
    assert merged and all(r["varies"] for r in merged)
    layouts = [_key(r)[0] for r in best_per_layout(g.rows)]
    assert len(layouts) == len(set(layouts)) < len(g.rows)


def test_plans_serve_rank_table_and_pareto_only_when_asked(tmp_path, monkeypatch, capsys):
    """The text ranking has a header with every column; --plot DIR writes DIR/pareto.png (a PNG) and
    nothing else; without --plot nothing is written at all."""
    monkeypatch.chdir(tmp_path)
    argv = ["plans", "--mode", "serve", *TINY, "--ttft-slo", "0.5", "--tpot-slo", "0.05", "--rank", "--top", "3",
            "--examples", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("#") and "tok/s/GPU" in line)
    for col in ("tok/s/user", "req/s", "conc", "TTFT p50", "p90", "TPOT p50", "batch", "GiB", "same"):
        assert col in header, col
    assert "aggregated, top" in out and "disaggregated (prefill/decode pools)" in out
    assert list(tmp_path.iterdir()) == []  # printing writes nothing
    assert main([*argv, "--plot", "figs"]) == 0
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["figs", "pareto.png"]
    assert (tmp_path / "figs" / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plans", "--mode", "serve", *TINY, "--plot", "figs2"]) == 2  # no --rank: nothing to plot
    assert "--plot needs --rank" in capsys.readouterr().err and not (tmp_path / "figs2").exists()


def test_plans_serve_rank_concurrency_pins_the_sweep(capsys):
    assert main(["plans", "--mode", "serve", *TINY, "--concurrency", "8", "--rank", "--top", "2", "--examples", "0",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["ranked"]
    assert d["concurrencies"] == [8] and all(r["concurrency"] == 8 for r in d["plans"])


def test_predict_serve_unrealizable_prints_no_numbers_without_force(capsys):
    """As `predict` does for a training plan: a serving plan SGLang cannot run is refused on stderr,
    its first line naming the reason, and stdout stays empty (no throughput for a plan that cannot start)."""
    argv = ["predict", "--mode", "serve", *Q, "--gpus", "8", "--isl", "4000", "--osl", "1000", "--plan", "tp=8,attn_dp=3"]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == ""
    err = out.err.splitlines()
    assert len(err) == 1 and "realizable on SGLang 0.5.23: attn-dp-divides-tp:" in err[0] and "--force" in err[0]
    assert main([*argv, "--force"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("NOT REALIZABLE") and "output tok/s/GPU" in out


def _sglang_context_lengths(configs: list[dict]) -> list[int]:
    """SGLang 0.5.23's own get_context_length on each config (in a child with the oracle's import
    stubs: its module's import path reaches the multimodal loaders)."""
    import subprocess
    import sys
    code = ("import json, sys, types\n"
            "from tuner.space.sglang_oracle import _install_stubs\n"
            "_install_stubs()\n"
            "from sglang.srt.utils.hf_transformers.common import get_context_length\n"
            "print(json.dumps([get_context_length(types.SimpleNamespace(**c)) for c in json.loads(sys.argv[1])]))\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(configs)], capture_output=True, text=True, timeout=600,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.xdist_group("sglang")
def test_a_request_beyond_the_models_context_is_refused_as_sglang_refuses_it(capsys, tmp_path):
    """SGLang refuses a request whose input reaches the context length or whose input + output
    exceeds it (tokenizer_manager._validate_one_request); the context length is SGLang's own
    get_context_length of the model's config (YaRN configs name original_max_position_embeddings,
    so their factor does not multiply it). Every serving command that takes --isl / --osl refuses
    such a workload with one line and exit 2, writing nothing; the longest accepted one is priced."""
    from specs.models import load_model
    from specs.serve_resolve import context_length
    from tuner.space import sglang_oracle
    if not sglang_oracle.available():
        pytest.skip("sglang is not installed (its get_context_length is the oracle)")
    names = ["deepseek-r1", "qwen3-235b-a22b", "gpt-oss-120b", "tiny-moe"]
    specs = [load_model(n) for n in names]
    configs = []
    for m in specs:
        c = {"max_position_embeddings": m.max_position_embeddings}
        if m.yarn_original_max_position:  # as the checkpoints' config.json carry it
            c["rope_scaling"] = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": m.yarn_original_max_position}
        configs.append(c)
    assert [context_length(m) for m in specs] == _sglang_context_lengths(configs) == [163840, 40960, 131072, 4096]
    # a rope factor without original_max_position_embeddings would multiply it: none of the presets has one
    assert _sglang_context_lengths([{"max_position_embeddings": 4096, "rope_scaling": {"factor": 4.0}}]) == [16384]
    q235 = ["--model", "qwen3-235b-a22b", "--cluster", "h200-sxm", "--gpus", "8"]
    for isl, osl in ((40960, 1), (40000, 961), (1, 40960)):  # input at the context length; total one over
        for argv in (["predict", "--mode", "serve", *q235, "--plan", "tp=8"],
                     ["plans", "--mode", "serve", "--rank", *q235],
                     ["emit", "sglang", *q235, "--plan", "tp=8", "--out", str(tmp_path / "x.sh")]):
            assert main([*argv, "--isl", str(isl), "--osl", str(osl)]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "context length of 40,960 tokens" in err[0], err
    # the serving study and a single trial refuse it before any folder or server: tiny-moe's 4,096 tokens
    tiny = ["--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2", "--isl", "4000", "--osl", "200"]
    for argv in (["tune", "--mode", "serve", *tiny, "--trials", "1", "--study-dir", str(tmp_path / "study")],
                 ["serve-trial", "--backend", "vllm", *tiny, "--plan", "tp=2"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "context length of 4,096 tokens" in err[0], err
    assert not list(tmp_path.iterdir())
    assert main(["predict", "--mode", "serve", *q235, "--plan", "tp=8", "--isl", "40000", "--osl", "960",
                 "--concurrency", "8", "--json"]) in (0, 3)
    d = json.loads(capsys.readouterr().out)
    assert d["isl"] + d["osl"] == 40960 and d["output_tokens_per_s_per_gpu"] > 0
