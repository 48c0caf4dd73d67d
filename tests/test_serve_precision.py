"""Serving precision as its own noun (tuner/space/serve_precision.py, specs/quantization.py): the weight
format comes from the checkpoint's quantization_config unless --weight-dtype says otherwise, is
shown, and when nothing fits the output says what would."""
import pytest

from tuner.cli import main

DS = ["--model", "deepseek-v3", "--cluster", "h200-sxm", "--gpus", "8", "--isl", "1024", "--osl", "1024"]


@pytest.mark.parametrize("model,want", [("deepseek-v3", "fp8"), ("kimi-k2", "fp8"), ("gpt-oss-120b", "mxfp4"),
                                        ("qwen3-30b-a3b", None), ("tiny-moe", None)])
def test_published_quantization_of_the_presets(model, want):
    from specs.quantization import checkpoint_quantization
    q = checkpoint_quantization(model, model)
    assert (q.method if q else None) == want
    if q:
        assert q.source.startswith("huggingface.co/")


def test_serve_ranking_prices_the_checkpoints_weights_and_says_what_would_fit(capsys):
    """DeepSeek-V3 on 8 H200: its fp8 checkpoint fits (the reference SGLang deployment); bf16 weights
    do not, and the ranking says so with what would."""
    assert main(["plans", "--mode", "serve", *DS, "--rank", "--top", "3", "--examples", "0"]) == 0
    out = capsys.readouterr().out
    assert "weights fp8 (checkpoint quantization_config" in out and "aggregated, top 3" in out
    assert main(["plans", "--mode", "serve", *DS, "--rank", "--top", "3", "--examples", "0", "--weight-dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "aggregated: none" in out and "nothing fits: 1,250 GiB of bf16 weights" in out and "--weight-dtype fp8" in out


def test_subbyte_checkpoints_are_priced_at_their_own_bytes():
    """gpt-oss's MXFP4 experts (4.25 bits; attention bf16) and an NVFP4 export (4.5 bits for every
    transformer linear) are priced at their own bytes per weight, not at fp8's byte."""
    from clusters import load_cluster
    from cost_model.serving import predict_serve
    from specs.models import load_model
    from specs.serve_plan import ServePlan, ServeWorkload
    oss, h200 = load_model("gpt-oss-120b"), load_cluster("h200-sxm", 1)
    w = ServeWorkload(isl=1000, osl=1000, concurrency=64)
    mx, f8 = (predict_serve(oss, h200, ServePlan(tp=1), w, precision=p) for p in ("mxfp4", "fp8"))
    # the published checkpoint is ~65 GB of safetensors (huggingface.co/openai/gpt-oss-120b: fits one
    # 80 GB GPU); at fp8's byte it would be ~109 GiB
    assert 55 < mx.extra["weights_gib"] < 66 < 100 < f8.extra["weights_gib"]
    # decode reads fewer weight bytes: a faster step and a larger KV pool
    assert mx.tpot_p90_s < f8.tpot_p90_s and mx.max_batch > f8.max_batch
    r1, b200 = load_model("deepseek-r1"), load_cluster("b200", 4)
    nv = predict_serve(r1, b200, ServePlan(tp=4, mem_frac=0.85, kv_cache_dtype="fp8_e4m3"), w, precision="nvfp4")
    fp = predict_serve(r1, b200, ServePlan(tp=4, mem_frac=0.85, kv_cache_dtype="fp8_e4m3"), w, precision="fp8")
    # InferenceX serves the NVFP4 export of DeepSeek-R1 on 4 B200 (TP4); its fp8 weights do not fit there
    assert nv.feasible and not fp.feasible
    assert nv.extra["weights_gib"] == pytest.approx(fp.extra["weights_gib"] * 0.5625, rel=0.03)


def test_nvfp4_weights_need_blackwell_and_an_nvfp4_checkpoint_to_emit(capsys):
    base = ["--model", "deepseek-r1", "--isl", "1024", "--osl", "1024", "--weight-dtype", "nvfp4", "--plan", "tp=8"]
    assert main(["predict", "--mode", "serve", "--cluster", "h200-sxm", "--gpus", "8", *base]) == 2
    assert "Blackwell" in capsys.readouterr().err
    assert main(["emit", "sglang", "--cluster", "b200", "--gpus", "8", *base]) == 2
    assert "not an NVFP4 checkpoint" in capsys.readouterr().err
    assert main(["emit", "sglang", "--cluster", "b200", "--gpus", "8", *base,
                 "--model-path", "nvidia/DeepSeek-R1-0528-FP4"]) == 0
    out = capsys.readouterr().out
    assert "--model-path nvidia/DeepSeek-R1-0528-FP4" in out and "--quantization modelopt_fp4" in out


def test_sglang_accepts_the_emitted_quantization_values():
    server_args = pytest.importorskip("sglang.srt.server_args", reason="sglang not installed (pip install --no-deps sglang==0.5.23)")
    import argparse
    p = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(p)
    for q in ("fp8", "mxfp4", "modelopt_fp4"):
        assert p.parse_args(["--model-path", "/x", "--quantization", q]).quantization == q


def test_a_modelopt_nvfp4_config_json_is_read_as_nvfp4(tmp_path):
    """An NVIDIA ModelOpt export's config.json (quant_method modelopt, quant_algo NVFP4) prices and
    serves as NVFP4 with no flag; its FP8 sibling as fp8."""
    import json
    from types import SimpleNamespace

    from clusters import load_cluster
    from specs.models import load_model
    from tuner.space.serve_precision import resolve
    base = json.loads((__import__("pathlib").Path(__file__).parent / "fixtures" / "hf" / "deepseek-v3.json").read_text())
    for algo, want in (("NVFP4", "nvfp4"), ("FP8", "fp8")):
        cfg = dict(base, quantization_config={"quant_method": "modelopt", "quant_algo": algo})
        d = tmp_path / algo
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        args = SimpleNamespace(model=str(d), weight_dtype="auto", precision="bf16")
        got = resolve(args, load_model(str(d)), load_cluster("b200", 8))
        assert got["dtype"] == want and got["precision"] == want


def test_one_rule_from_a_serving_precision_to_the_step_model():
    """cost_model.serving.constants.weight_format is the rule both the serving model and the
    megakernel what-if build their step model with (the what-if had its own copy, which priced
    gpt-oss's MXFP4 checkpoint as bf16)."""
    from cost_model.serving.constants import weight_format
    assert [weight_format(p) for p in ("bf16", "fp8", "fp8-tensorwise", "mxfp8", "mxfp4", "nvfp4")] == \
        ["bf16", "fp8", "fp8", "fp8", "mxfp4", "nvfp4"]
    with pytest.raises(ValueError):
        weight_format("int4")


def test_the_megakernel_whatif_floors_at_the_checkpoints_weight_bytes(capsys):
    """The what-if's HBM floor reads the experts at the bytes the prediction priced: gpt-oss-120b's
    MXFP4 experts (4.25 bits), not the bf16 the what-if's own precision rule gave them (the same
    batch at fp8's byte for comparison)."""
    import json
    base = ["predict", "--mode", "serve", "--model", "gpt-oss-120b", "--cluster", "h200-sxm", "--gpus", "1",
            "--phase", "decode", "--isl", "1024", "--osl", "1024", "--concurrency", "16", "--plan", "tp=1",
            "--what-if", "megakernel", "--json"]
    assert main(base) == 0
    mx = json.loads(capsys.readouterr().out)["what_if"]
    assert main([*base, "--weight-dtype", "fp8"]) == 0
    f8 = json.loads(capsys.readouterr().out)["what_if"]
    assert mx["decode_hbm_floor_ms"] == pytest.approx(f8["decode_hbm_floor_ms"] * 0.53125, rel=1e-6)


def test_nvfp4_gemms_run_at_blackwells_fp4_rate_from_te_benchmark():
    """NVFP4 GEMMs: compute-bound time = the fp8 tables' x fp8 peak / fp4 peak / the share of its peak
    NVFP4 reaches against FP8's (TransformerEngine's B300 GEMM benchmark, pre-quantized: per-tensor
    FP8 6.812 ms, NVFP4 3.764 ms per layer). On B300 that reproduces the benchmark's own ratio; the
    decode GEMMs (weight-bound) and the bf16 LM head keep their time; no FP4 path, no change."""
    import numpy as np

    from clusters import load_cluster
    from cost_model.serving.constants import NVFP4_PEAK_SHARE_VS_FP8, nvfp4_gemm_time
    from cost_model.serving.plans import effective_plans, to_cols
    from cost_model.serving.step import StepModel
    from cost_model.tables import load_tables, tables_dir_for
    from specs.models import load_model
    from specs.serve_plan import ServePlan
    assert NVFP4_PEAK_SHARE_VS_FP8 == pytest.approx(0.603, abs=1e-3)
    assert nvfp4_gemm_time(load_cluster("b300", 8)) == pytest.approx(3.764 / 6.812, rel=1e-9)
    assert nvfp4_gemm_time(load_cluster("gb300-nvl72", 8)) == pytest.approx(3.764 / 6.812, rel=1e-9)
    assert nvfp4_gemm_time(load_cluster("b200", 8)) == pytest.approx(0.829, abs=1e-3)
    assert nvfp4_gemm_time(load_cluster("h200-sxm", 8)) == 1.0
    r1, b200 = load_model("deepseek-r1"), load_cluster("b200", 8)
    cols = to_cols(effective_plans([ServePlan(tp=8)], r1, b200))
    tables = load_tables(tables_dir_for("b200"))
    nv, f8 = (StepModel.for_precision(r1, b200, tables, cols, p) for p in ("nvfp4", "fp8"))
    params = r1.hidden_size * 20000.0
    big, small = 16384.0, 1.0  # prefill rows (compute-bound), one decode row (weight-bound)
    cast = nv.ops.fp8_cast(big * r1.hidden_size)  # the activation cast, the same in both
    assert np.ravel(nv._gemm(big, params) - cast)[0] == pytest.approx(np.ravel(f8._gemm(big, params) - cast)[0]
                                                                      * nvfp4_gemm_time(b200), rel=1e-9)
    # the LM head stays bf16 in the checkpoint: no FP4 rate for it
    assert np.ravel(nv._gemm(big, params, ops=nv.head_ops))[0] == pytest.approx(np.ravel(f8._gemm(big, params))[0], rel=1e-9)
    # one decode row: the weight bytes bind (0.5625 B against 1 B per weight)
    assert np.ravel(nv._gemm(small, params))[0] == pytest.approx(np.ravel(f8._gemm(small, params))[0] * 0.5625, rel=1e-6)


def test_gpt_oss_mxfp4_runs_bf16_linears_and_w4a16_experts_on_hopper():
    """gpt-oss's MXFP4 checkpoint keeps attention / router in bf16 and SGLang runs its experts as W4A16
    on Hopper (bf16 tensor cores on upcast weights) but with MXFP8 activations on Blackwell: the
    linears price as the bf16 checkpoint's on both; Hopper's experts take the bf16 table's
    compute-bound rate on their padded FLOPs and read 4.25-bit weights (a prefill-sized call far below
    the bf16 checkpoint's, which reads 2 B weights; a decode step at the MXFP4 weight floor), while
    Blackwell's experts run at the fp8 rate."""
    import numpy as np

    from clusters import load_cluster
    from cost_model.serving.plans import effective_plans, to_cols
    from cost_model.serving.step import StepModel
    from cost_model.tables import load_tables, tables_dir_for
    from specs.models import load_model
    from specs.serve_plan import ServePlan
    oss = load_model("gpt-oss-120b")
    for kind, experts_fp8 in (("h200-sxm", False), ("b200", True)):
        cl = load_cluster(kind, 1)
        cols = to_cols(effective_plans([ServePlan(tp=1)], oss, cl))
        t = load_tables(tables_dir_for(kind))
        mx, bf = (StepModel.for_precision(oss, cl, t, cols, p) for p in ("mxfp4", "bf16"))
        assert (mx.fp8, mx.lin_fp8, mx.w4a16) == (experts_fp8, False, not experts_fp8), kind
        from cost_model.serving import predict_serve
        from specs.serve_plan import ServeWorkload
        paths = predict_serve(oss, cl, ServePlan(tp=1), ServeWorkload(isl=256, osl=8, concurrency=1),
                              precision="mxfp4").extra["gemm_paths"]
        assert paths["dense"] == "cublas", (kind, paths)  # the bf16 linears, what the prediction reports
        params = oss.hidden_size * 8000.0
        assert np.ravel(mx._gemm(8192.0, params))[0] == pytest.approx(np.ravel(bf._gemm(8192.0, params))[0], rel=1e-9)
        if experts_fp8:
            continue
        big = np.array([8192.0])
        g_mx, _ = mx._expert_parts(big)
        g_bf, _ = bf._expert_parts(big)
        f_loc, h = oss.moe_ffn_hidden_size, oss.hidden_size
        up, _ = mx.ops.grouped(128.0, 4096.0, 2 * f_loc, h, True)
        dn, _ = mx.ops.grouped(128.0, 4096.0, h, f_loc, True)
        rate = 2.0 * 128 * 4096 * 3 * f_loc * h / (up + dn)
        want = max(float(np.ravel(mx.expert_flops(big))[0] / rate) / float(np.ravel(mx.moe_eff)[0]),
                   float(np.ravel(mx.expert_weight_bytes(big) / mx.expert_bw)[0]))
        assert float(np.ravel(g_mx)[0]) == pytest.approx(want, rel=1e-6)
        # a prefill-sized call (32 rows per expert) is weight-bound in the bf16 checkpoint, not in MXFP4
        mid = np.array([1024.0])
        assert float(np.ravel(mx._expert_parts(mid)[0])[0]) < 0.5 * float(np.ravel(bf._expert_parts(mid)[0])[0])
        one = np.array([1.0])
        assert float(np.ravel(mx._expert_parts(one, decode=True)[0])[0]) == pytest.approx(
            float(np.ravel(mx.expert_weight_bytes(one) / mx.expert_bw)[0]), rel=0.25)
