"""Serving physics (cost_model/serving): the kernel minimum at small decode batches, chunked prefill
over a growing prefix, TTFT's fixed request cost and queueing, Blackwell's own all-reduce rows, and
the per-phase calibration (each factor moves only its phase; a foreign calibration raises)."""
import numpy as np
import pytest

from clusters import load_cluster
from cost_model.calibration import Calibration, CalibrationError, class_parts
from cost_model.serving import predict_serve, rank_arrays
from cost_model.serving.calibration import IDENTITY, phase_factors
from cost_model.serving.constants import KERNEL_MIN_S, REQUEST_FIXED_S
from cost_model.serving.plans import effective_plans, to_cols
from cost_model.serving.step import StepModel
from cost_model.tables import load_tables, tables_dir_for
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload

QWEN = load_model("qwen3-30b-a3b")
H200 = load_cluster("h200-sxm", 8)
H200_PEAK = H200.hbm_tbps * 1e12


def step_model(plan="tp=2", cluster=H200, model=QWEN):
    c = to_cols(effective_plans([ServePlan.parse(plan)], model, cluster))
    return StepModel(model, cluster, load_tables(tables_dir_for(cluster.kind)), c, fp8=False)


def test_small_decode_batches_are_floor_bound():
    sm = step_model()
    t1, t2, t64 = (float(sm.decode(b, 1000.0)[0][0]) for b in (1, 2, 64))
    # every kernel of every layer lasts at least the kernel minimum (the layer's own kernels)
    priced, small = sm.kernels.per_step(sm.layers, sm.L_moe, sm.L_dense)
    assert t1 >= float((priced + small)[0]) * KERNEL_MIN_S
    # doubling a batch of one moves the step little (the floor, not the bytes, decides it; the second
    # token's experts add their weight reads: InferenceX's DeepSeek-R1 NVFP4 rows on B300 go +12%
    # from concurrency 1 to 2, bench/serving_public_rows.py)
    assert t2 / t1 < 1.2
    assert t64 > t1


def test_prefill_attention_grows_with_the_prefix_and_prompts_are_superlinear():
    sm = step_model()
    steps = [float(sm.prefill(4096.0, p)[0][0]) for p in (0.0, 16384.0, 65536.0)]
    assert steps[0] < steps[1] < steps[2]

    def prompt(isl, chunk=4096):  # the chunks of one prompt, each attending to those before it
        return sum(float(sm.prefill(chunk, i * chunk)[0][0]) for i in range(isl // chunk))
    assert prompt(65536) > 2.05 * prompt(32768)


def test_each_prefill_chunk_pays_a_fixed_cost():
    sm = step_model()
    one = float(sm.prefill(1.0, 0.0)[0][0])
    priced, small = sm.kernels.per_step(sm.layers, sm.L_moe, sm.L_dense)
    assert one >= float((priced + small)[0]) * KERNEL_MIN_S
    # one 8k prompt in 16 chunks of 512 costs more than in one chunk of 8192
    small = sum(float(sm.prefill(512.0, i * 512.0)[0][0]) for i in range(16))
    assert small > float(sm.prefill(8192.0, 0.0)[0][0])


def test_longer_prompt_longer_ttft_and_ttft_has_its_fixed_cost():
    p = ServePlan.parse("tp=2")
    t = [predict_serve(QWEN, H200, p, ServeWorkload(isl=i, osl=64, concurrency=4), calibration=IDENTITY)
         for i in (256, 2048, 16384)]
    assert t[0].ttft_p90_s < t[1].ttft_p90_s < t[2].ttft_p90_s
    assert t[0].extra["ttft_p50_s"] > REQUEST_FIXED_S
    r = rank_arrays(QWEN, H200, [p], ServeWorkload(isl=256, osl=64, concurrency=1, phase="prefill"),
                    calibration=IDENTITY)
    assert r["ttft_s"][0] > REQUEST_FIXED_S


def test_more_concurrency_no_lower_tpot_and_queueing_raises_ttft():
    p = ServePlan.parse("tp=2,max_running=16")
    preds = [predict_serve(QWEN, H200, p, ServeWorkload(isl=1000, osl=200, concurrency=k), calibration=IDENTITY)
             for k in (1, 8, 256)]
    tpot = [x.tpot_p90_s for x in preds]
    assert tpot[0] <= tpot[1] <= tpot[2] * (1 + 1e-9)
    # 256 requests over 4 replicas of tp=2: 64 per instance for 16 running slots; the rest queue
    assert preds[2].ttft_p90_s > 2 * preds[1].ttft_p90_s


def test_blackwell_uses_its_own_all_reduce_rows():
    b200 = load_cluster("b200", 8)
    h, b = step_model("tp=8"), step_model("tp=8", cluster=b200)
    small, big = np.array([512.0]), np.array([1048576.0])
    # Blackwell: higher small-message latency (NCCL issue #1940), twice the NVLink bandwidth
    assert b.all_reduce(small, 8)[0] > h.all_reduce(small, 8)[0]
    assert b.all_reduce(big, 8)[0] < h.all_reduce(big, 8)[0]


def test_each_phase_factor_moves_only_its_phase():
    p = ServePlan.parse("tp=2")
    dec_w = ServeWorkload(isl=1000, osl=200, concurrency=8, phase="decode")
    pre_w = ServeWorkload(isl=1000, osl=1, concurrency=8, phase="prefill")
    slow_pre = Calibration(factors={"prefill": 2.0, "decode": 1.0})
    base_d, slow_d = (predict_serve(QWEN, H200, p, dec_w, calibration=c).tpot_p90_s for c in (IDENTITY, slow_pre))
    assert slow_d == pytest.approx(base_d, rel=1e-9)
    base_p, slow_p = (rank_arrays(QWEN, H200, [p], pre_w, calibration=c)["input_tokens_per_s_per_gpu"][0]
                      for c in (IDENTITY, slow_pre))
    assert slow_p == pytest.approx(base_p / 2.0, rel=1e-9)


def test_a_calibration_of_other_classes_is_refused():
    train = Calibration(factors={"gemm": 1.2, "ep_comm": 1.5})
    with pytest.raises(CalibrationError, match="not a serving calibration"):
        phase_factors(train)
    with pytest.raises(CalibrationError):
        predict_serve(QWEN, H200, ServePlan.parse("tp=2"), ServeWorkload(isl=100, osl=10, concurrency=1),
                      calibration=train)
    assert phase_factors(Calibration(scale=1.5)) == (1.5, 1.5)  # one-scale: both phases


def test_serving_parts_map_to_phase_classes_and_unknown_parts_raise():
    from cost_model.calibration import SERVE_COMPONENT_CLASS
    assert class_parts({"prefill_step": 1.0, "decode_step": 2.0}, SERVE_COMPONENT_CLASS) == {"prefill": 1.0, "decode": 2.0}
    with pytest.raises(KeyError, match="no calibration class"):
        class_parts({"sampling": 1.0}, SERVE_COMPONENT_CLASS)


def test_fused_moe_bandwidth_rises_with_shard_row_bytes():
    from cost_model.serving.fused_moe import expert_bandwidth_efficiency, fitted_shapes
    shapes = fitted_shapes()
    assert len(shapes) >= 2 and all(0.2 < s["eff"] < 1.0 for s in shapes)
    thin, wide = (float(expert_bandwidth_efficiency(n, 1.0)) for n in (192, 2048))
    assert thin < wide
    # held at the measured ends, never extrapolated
    assert float(expert_bandwidth_efficiency(8, 1.0)) == pytest.approx(shapes[0]["eff"])
    assert float(expert_bandwidth_efficiency(1e6, 2.0)) == pytest.approx(shapes[-1]["eff"])


def test_thin_expert_tp_shards_read_their_weights_slower_than_expert_parallel():
    qwen235 = load_model("qwen3-235b-a22b")
    tp, ep = step_model("tp=8", model=qwen235), step_model("tp=8,ep=8", model=qwen235)
    T = np.array([64.0])
    # the same bytes per GPU (all experts / 8), read at the thin-shard kernel's lower bandwidth
    assert float(tp.expert_weight_bytes(T)[0]) == pytest.approx(float(ep.expert_weight_bytes(T)[0]), rel=0.25)
    # SGLang ships a tuned block config for TP8's E=128 N=192 on H200, none for EP8's E=16 N=1536;
    # even tuned, the thin shard reads below the wide one's default rate, and far below it at the
    # same (default) configuration
    from cost_model.serving.fused_moe import expert_bandwidth_efficiency
    assert (bool(tp.tuned_moe[0]), bool(ep.tuned_moe[0])) == (True, False)
    assert float(tp.expert_bw[0]) < float(ep.expert_bw[0])
    thin_default = float(expert_bandwidth_efficiency(192, 1.0))
    assert thin_default * 1.25 < float(ep.expert_bw[0]) / float(H200_PEAK)
    assert float(tp._experts(T)[0]) * float(expert_bandwidth_efficiency(192, 1.0, True)) / thin_default \
        > 1.15 * float(ep._experts(T)[0])


def test_tuned_fused_moe_decode_reads_at_the_tuned_configs_measured_rate():
    """A tuned block config (16-row tiles, swap-AB) reads a decode call's expert weights at its own
    measured rate, not the default's times the compute-bound speedup: DeepSeek-R1 TP8 on H200 (E=257
    N=256, a shipped tuned config) at the tuned class's figure; an untuned shape keeps the default's;
    the tuned figure is never below the default one at any shard width."""
    from cost_model.serving.fused_moe import TUNED_CONFIG_SPEEDUP, expert_bandwidth_efficiency, fitted_shapes
    tuned = [s for s in fitted_shapes() if s["tuned"]]
    assert tuned and all(0.5 < s["eff"] < 1.0 for s in tuned)
    dsr1 = load_model("deepseek-r1")
    c = to_cols(effective_plans([ServePlan.parse("tp=8")], dsr1, H200))
    sm = StepModel(dsr1, H200, load_tables(tables_dir_for(H200.kind)), c, fp8=True)
    assert bool(sm.tuned_moe[0])
    want = float(expert_bandwidth_efficiency(256, 1.0, True)) * float(H200_PEAK)
    assert float(sm.expert_bw[0]) == pytest.approx(want)
    assert float(expert_bandwidth_efficiency(256, 1.0, True)) > TUNED_CONFIG_SPEEDUP * float(expert_bandwidth_efficiency(256, 1.0))
    for n in (8, 192, 256, 768, 1536, 1e5):
        assert float(expert_bandwidth_efficiency(n, 1.0, True)) >= float(expert_bandwidth_efficiency(n, 1.0))


def test_fused_moe_call_follows_a_measured_sweep_from_decode_to_prefill_sizes():
    """The routed experts' Triton fused_moe call (Qwen3-30B-A3B fp8, TP1, one H100) against the one
    public sweep measured from decode to prefill sizes (vllm PR #24700, 8-4096 tokens;
    bench/fused_moe_mid_batch.py): within 25% at every batch (each GEMM the larger of its weight read
    and its padded row tiles at the fp8 ceiling), and growing with the tokens as the measured call
    does."""
    from bench.fused_moe_mid_batch import rows as sweep_rows
    rows = sweep_rows()
    assert len(rows) >= 10
    assert all(abs(model / us - 1) <= 0.25 for _b, model, us in rows), rows
    model = [m for _b, m, _us in rows]
    assert all(b >= a for a, b in zip(model, model[1:]))


def test_dense_mlp_data_parallel_trades_weight_reads_for_its_collective():
    """--moe-dense-tp-size 1 (moe_dense_tp=1): DeepSeek-V3's 3 dense MLP layers run each rank's own
    tokens with the whole weights: no all-gather / reduce-scatter over the TP group (16 GPUs, two
    nodes: over IB), tp x the dense weights held and read."""
    from cost_model.flops import param_counts
    from cost_model.serving.memory import weight_bytes_per_gpu
    dsv3, h200_16 = load_model("deepseek-v3"), load_cluster("h200-sxm", 16)
    tp_, dp_ = (step_model(f"tp=16,attn_dp=16,a2a=deepep{x}", h200_16, dsv3) for x in ("", ",moe_dense_tp=1"))
    assert (int(tp_.c.dense_tp[0]), int(dp_.c.dense_tp[0])) == (16, 1)
    # decode at one request per rank: the whole dense weights read per rank cost more than the
    # sharded ones; the dense layers' collectives are gone
    (_, p_tp), (_, p_dp) = tp_.decode(1, 1000.0), dp_.decode(1, 1000.0)
    assert float(p_dp["dense_shared"][0]) > float(p_tp["dense_shared"][0])
    assert float(p_dp["communication"][0]) < float(p_tp["communication"][0])
    # the dense layer alone: same FLOPs, so at a prefill chunk it costs about the same; at decode
    # the full weights are read (>= 5x the TP shard's time)
    T = np.array([16 * 4096.0])
    assert float(dp_._dense_mlp(T)[0]) == pytest.approx(float(tp_._dense_mlp(T)[0]), rel=0.5)
    assert float(dp_._dense_mlp(np.array([16.0]))[0]) > 5 * float(tp_._dense_mlp(np.array([16.0]))[0])
    assert float(dp_._comm(T)[1][0]) == 0.0 < float(tp_._comm(T)[1][0])  # attention TP 1: nothing left
    # prefill of a 4096-token chunk per rank: faster without the dense all-gather
    assert float(dp_.prefill(4096.0, 0.0)[0][0]) < float(tp_.prefill(4096.0, 0.0)[0][0])
    # memory: the dense layers whole on every GPU, 15/16 of them more than the TP shard
    pc = param_counts(dsv3)
    extra = pc["per_layer"]["dense_mlp"] * pc["num_dense_layers"] * (1 - 1 / 16) * 1.0
    w_tp, w_dp = (float(weight_bytes_per_gpu(dsv3, m.c, (1.0, 1.0))[0]) for m in (tp_, dp_))
    assert w_dp - w_tp == pytest.approx(extra, rel=1e-9) and extra > 0
    # a model without dense layers (Qwen3-30B-A3B: every layer MoE) prices the same either way
    q_tp, q_dp = (step_model(f"tp=8,attn_dp=8,a2a=deepep{x}") for x in ("", ",moe_dense_tp=1"))
    assert float(q_dp.decode(8, 1000.0)[0][0]) == float(q_tp.decode(8, 1000.0)[0][0])


def test_cli_refuses_a_training_calibration_for_serving(tmp_path):
    import subprocess
    import sys
    f = tmp_path / "train.json"
    f.write_text('{"scale": 1.0, "kind": "per-component", "factors": {"gemm": 1.2}}')
    r = subprocess.run([sys.executable, "-m", "tuner.cli", "predict", "--mode", "serve", "--model", "qwen3-30b-a3b",
                        "--cluster", "h200-sxm", "--gpus", "8", "--plan", "tp=2", "--isl", "100", "--osl", "10",
                        "--concurrency", "1", "--calibration", str(f)], capture_output=True, text=True)
    err = r.stderr.strip()
    assert r.returncode == 2 and "not a serving calibration" in err and "\n" not in err


def test_shared_expert_runs_beside_the_routed_experts_in_a_decode_graph():
    """SGLang 0.5.23 runs DeepSeek's unfused shared expert on a second stream in a CUDA-graph decode
    step (models/deepseek_v2.py forward_normal_dual_stream): the step takes the longer of the two
    streams (both floor-bound at batch 1), never less than both weight reads at the HBM rate; an
    eager step, a plan whose shared expert runs inside the routed kernel, and an all-to-all plan run
    it in line."""
    dsr1 = load_model("deepseek-r1")
    b300 = load_cluster("b300", 8)

    def sm_for(plan, cluster=b300, precision="nvfp4"):
        c = to_cols(effective_plans([ServePlan.parse(plan)], dsr1, cluster))
        return StepModel.for_precision(dsr1, cluster, load_tables(tables_dir_for(cluster.kind)), c, precision)
    ep = sm_for("tp=8,ep=8")
    assert bool(ep.shared_side_stream[0]) and not bool(ep.shared_fused[0])
    comp_g, _, parts_g = ep._decode_gpu(np.array([1.0]), 1000.0, graphs=np.array([True]))
    comp_e, _, parts_e = ep._decode_gpu(np.array([1.0]), 1000.0, graphs=np.array([False]))
    hidden = float(parts_g["shared_hidden"][0])
    assert hidden > 0 and float(parts_e["shared_hidden"][0]) == 0.0
    assert float(comp_e[0]) - float(comp_g[0]) == pytest.approx(hidden)
    # at batch 1 the overlap hides the shorter stream (the shared expert's floor-bound kernels) whole
    assert hidden == pytest.approx(min(float(parts_g["dense_shared"][0]), float(parts_g["experts"][0])), rel=0.05)
    # at a large batch both streams are bandwidth-bound: no less than both reads back to back
    big = np.array([4096.0])
    comp_big, _, parts_big = ep._decode_gpu(big, 1000.0, graphs=np.array([True]))
    reads = (ep.pc["per_layer"]["shared_expert"] / ep.c.tp * ep.wlin / ep.hbm_bw
             + ep.expert_weight_bytes(big) / ep.expert_bw)
    assert float(parts_big["shared_hidden"][0]) <= float(parts_big["dense_shared"][0])
    assert float(comp_big[0]) >= float(np.ravel(ep.L_moe * reads)[0])
    # the shared expert inside the routed Triton kernel (H200 TP8): nothing on a side stream
    assert not bool(sm_for("tp=8", load_cluster("h200-sxm", 8), "fp8").shared_side_stream[0])
    # under DeepEP (forward_deepep) the shared expert runs beside the dispatch, routed experts and
    # combine in every step, eager too; two-batch overlap schedules its own operations
    h200 = load_cluster("h200-sxm", 8)
    dep = sm_for("tp=8,attn_dp=8,ep=8,a2a=deepep", h200, "fp8")
    assert bool(dep.shared_side_stream[0])
    one = np.array([1.0])
    (cg, _, pg), (ce, _, pe) = (dep._decode_gpu(one, 1000.0, graphs=np.array([g])) for g in (True, False))
    hidden = float(pg["shared_hidden"][0])
    assert float(pe["shared_hidden"][0]) == pytest.approx(hidden) and 0 < hidden <= float(pg["dense_shared"][0])
    # what the side stream hides is what the same step in line would add
    dep.shared_side_stream = np.zeros(1, bool)
    c_line, _, p_line = dep._decode_gpu(one, 1000.0, graphs=np.array([True]))
    assert float(p_line["shared_hidden"][0]) == 0.0
    assert float(c_line[0]) - float(cg[0]) == pytest.approx(hidden)
    tbo = sm_for("tp=8,attn_dp=8,ep=8,a2a=deepep,tbo=1", h200, "fp8")
    assert not bool(tbo.shared_side_stream[0])


def test_blackwell_trtllm_moe_reads_at_its_own_measured_rate():
    """Blackwell's flashinfer_trtllm MoE runner reads a decode call's weights at its own measured
    rate (flashinfer PR #5301's DeepSeek-V3 EP8 shard in NVFP4 on B300), not at the Triton
    kernel's default-config figure for the same row bytes."""
    from cost_model.serving.fused_moe import expert_bandwidth_efficiency, fitted_shapes
    trt = [s for s in fitted_shapes() if s["kernel"] == "flashinfer_trtllm"]
    assert trt and all(0.5 < s["eff"] < 1.0 for s in trt)
    dsr1 = load_model("deepseek-r1")
    b300 = load_cluster("b300", 8)
    c = to_cols(effective_plans([ServePlan.parse("tp=8,ep=8")], dsr1, b300))
    sm = StepModel.for_precision(dsr1, b300, load_tables(tables_dir_for(b300.kind)), c, "nvfp4")
    rb_n = dsr1.moe_ffn_hidden_size  # EP8: whole experts
    want = float(expert_bandwidth_efficiency(rb_n, sm.wexp, False, "flashinfer_trtllm")) * b300.hbm_tbps * 1e12
    assert float(sm.expert_bw[0]) == pytest.approx(want)
    assert want != pytest.approx(float(expert_bandwidth_efficiency(rb_n, sm.wexp)) * b300.hbm_tbps * 1e12, rel=0.02)
    assert want / (b300.hbm_tbps * 1e12) == pytest.approx(trt[0]["eff"])
