"""The GEMM kernels SGLang runs (cost_model/serving/kernel_path.py): which path each (GPU, precision,
all-to-all backend, DeepGEMM JIT) takes, the measured ratios behind them, and that the prefill step
prices them (Triton fused_moe slower than DeepGEMM's grouped kernel on the same shapes)."""
import csv
from pathlib import Path

import numpy as np
import pytest

from clusters import load_cluster
from cost_model.serving.fused_moe import PREFILL_DATA, PREFILL_MIN_TOKENS, TUNED_CONFIG_SPEEDUP, TUNED_DATA, ships_tuned_config
from cost_model.serving.kernel_path import DATA, PREFILL_MIN_M, dense_path, efficiency, moe_path, path_ratios, step_efficiencies
from cost_model.serving.plans import effective_plans, to_cols
from cost_model.serving.step import StepModel, fused_moe_ceiling_flops, fused_moe_fp8_peak_fraction
from cost_model.tables import load_tables, tables_dir_for
from specs.models import load_model
from specs.serve_plan import ServePlan

DSV3 = load_model("deepseek-v3")
H200 = load_cluster("h200-sxm", 8)
B200 = load_cluster("b200", 8)


@pytest.mark.parametrize("cluster, fp8, a2a, jit, dense, moe", [
    (H200, True, False, True, "deep_gemm", "triton_fused_moe"),   # SGLang defaults, TP MoE on Hopper
    (H200, True, True, True, "deep_gemm", "deep_gemm"),           # DeepEP: the DeepGEMM grouped runner
    (H200, True, False, False, "cutlass", "triton_fused_moe"),    # SGLANG_ENABLE_JIT_DEEPGEMM=0
    (B200, True, False, False, "flashinfer_trtllm", "flashinfer_trtllm"),
    (B200, True, False, True, "deep_gemm", "flashinfer_trtllm"),
    (H200, False, False, True, "cublas", "triton_fused_moe"),
])
def test_each_gpu_precision_and_backend_takes_sglangs_path(cluster, fp8, a2a, jit, dense, moe):
    assert dense_path(cluster, fp8, jit) == dense
    assert moe_path(cluster, fp8, a2a, jit) == moe


def test_qwen3_moe_takes_trtllm_gen_on_blackwell_in_bf16_too():
    """SGLang 0.5.23's Qwen3-MoE override sets the MoE runner to flashinfer_trtllm on sm100 for every
    checkpoint format without an all-to-all (arg_groups/model_overrides/qwen3_moe.py:76-86); other
    architectures' bf16 experts, Hopper and an all-to-all keep Triton fused_moe."""
    q = "Qwen3MoeForCausalLM"
    assert moe_path(B200, False, False, True, q) == "flashinfer_trtllm"
    assert moe_path(B200, False, False, True, "DeepseekV3ForCausalLM") == "triton_fused_moe"
    assert moe_path(H200, False, False, True, q) == "triton_fused_moe"
    assert moe_path(B200, False, True, True, q) == "triton_fused_moe"
    # the step prices the path it names: trtllm-gen's measured weight-read rate, not Triton's
    c = to_cols(effective_plans([ServePlan.parse("tp=8")], QWEN3, B200))
    sm = StepModel(QWEN3, B200, load_tables(tables_dir_for(B200.kind)), c, fp8=False)
    assert list(sm.moe_kernel) == ["flashinfer_trtllm"] and not sm.tuned_moe[0]


def test_ratios_are_the_geometric_mean_of_the_measured_prefill_rows():
    rows = [r for r in csv.DictReader(DATA.open()) if int(r["m"]) >= PREFILL_MIN_M]
    assert len(rows) >= 5 and all(r["source"] for r in rows)
    tri = np.exp(np.mean([np.log(float(r["deep_gemm_us"]) / float(r["triton_us"])) for r in rows]))
    assert path_ratios()["triton"] == pytest.approx(tri)
    # DeepGEMM is the fastest of the three on every prefill-sized row; CUTLASS sits between
    assert 0 < path_ratios()["triton"] < path_ratios()["cutlass"] < 1
    assert efficiency("deep_gemm", True) == 1.0
    # the routed experts' Triton fused_moe: the table's rate under a ceiling of its own (below)
    assert efficiency("triton_fused_moe", True) == 1.0
    assert efficiency("triton_fused_moe", False) == 1.0  # bf16: unmeasured, the table's rate


H100 = load_cluster("h100-sxm", 1)
QWEN3 = load_model("qwen3-30b-a3b")


def _qwen3_call_us(T):
    """The step model's whole fused-MoE call (GEMMs, activation, casts, top-k sum) of the measured
    shape: Qwen3-30B-A3B fp8 TP1 on one H100."""
    c = to_cols(effective_plans([ServePlan.parse("tp=1")], QWEN3, H100))
    sm = StepModel(QWEN3, H100, load_tables(tables_dir_for(H100.kind)), c, fp8=True)
    g, o = sm._expert_parts(np.array([float(T)]))
    return (float(np.ravel(g)[0]) + float(np.ravel(o)[0])) * 1e6


def test_the_fused_moe_ceiling_is_the_measured_kernels_top_rate():
    """Triton fused_moe at fp8 (vLLM PR #24700's H100 timings of the whole call, 1024-4096 tokens):
    on the rows it computes (each expert's padded to the kernel's row tile) its GEMMs' net rate is
    flat, 235-242 TFLOPS, where the table's climbs, so the step prices them at no more than the top
    measured rate, as a fraction of the fp8 peak; with it the step model reproduces every measured
    prefill-sized call within 15% (the 4096-token one, which sets the ceiling, exactly), where
    the old assumption (the dense Triton matmul's ratio to the table at every shape) was 34% fast at
    4096 tokens and 37% slow at 256."""
    rows = [r for r in csv.DictReader(PREFILL_DATA.open())]
    assert rows and all(r["source"] for r in rows)
    frac = fused_moe_fp8_peak_fraction()
    assert 0.10 < frac < 0.14  # ~242 of H100's 1979 dense fp8 TFLOPS
    assert fused_moe_ceiling_flops(H100, True, moe_path(H100, True, False)) == pytest.approx(frac * 1978.9e12, rel=1e-3)
    assert fused_moe_ceiling_flops(H100, True, moe_path(H100, True, True)) == np.inf  # DeepEP: DeepGEMM, the table's rate
    assert fused_moe_ceiling_flops(H100, False, moe_path(H100, False, False)) == np.inf  # bf16: the table's rate
    assert fused_moe_ceiling_flops(B200, True, moe_path(B200, True, False)) == np.inf  # Blackwell fp8: FlashInfer TRT-LLM
    errs = {int(r["batch"]): _qwen3_call_us(int(r["batch"])) / float(r["kernel_us"]) - 1 for r in rows}
    assert errs[4096] == pytest.approx(0.0, abs=0.01), errs
    assert all(abs(e) <= 0.15 for e in errs.values()), errs
    assert all(b >= 1024 for b in errs) and PREFILL_MIN_TOKENS > 1024  # 1024 tokens: weight-read regime, not fitted


def test_deepep_plans_run_experts_at_the_table_rate_and_tp_plans_slower():
    c = to_cols(effective_plans([ServePlan.parse(p) for p in ("tp=8", "tp=8,attn_dp=8,a2a=deepep")], DSV3, H200))
    dense, moe = step_efficiencies(H200, True, [moe_path(H200, True, bool(x)) for x in c.a2a])
    assert dense == 1.0 and moe.tolist() == [1.0, 1.0]
    sm = StepModel(DSV3, H200, load_tables(tables_dir_for(H200.kind)), c, fp8=True)
    assert np.isfinite(sm.moe_ceiling[0]) and sm.moe_ceiling[1] == np.inf  # TP: Triton's ceiling


def test_prefill_prices_the_triton_fused_moe_below_deepgemm():
    c = to_cols(effective_plans([ServePlan.parse("tp=8")], DSV3, H200))
    tables = load_tables(tables_dir_for(H200.kind))
    on = StepModel(DSV3, H200, tables, c, fp8=True)
    off = StepModel(DSV3, H200, tables, c, fp8=True, deepgemm_jit=False)
    T = np.array([8192.0])
    # same Triton fused_moe either way; JIT off moves the dense linears onto CUTLASS
    assert float(off._experts(T)[0]) == pytest.approx(float(on._experts(T)[0]))
    assert float(off.prefill(8192.0, 0.0)[0][0]) > float(on.prefill(8192.0, 0.0)[0][0])
    # the expert GEMMs of an 8k-token prefill are compute-bound at the Triton kernel's ceiling
    # (SGLang's tuned block config for this shape, `fused_moe.ships_tuned_config`, runs it faster),
    # well below the table's (DeepGEMM-grade) rate at 256 rows per expert
    lifted = StepModel(DSV3, H200, tables, c, fp8=True, kernel_rates=(on.dense_eff, 1.0))  # the table, no ceiling
    slow = float(on._experts(T)[0]) / float(lifted._experts(T)[0])
    assert slow > 1.3
    g, _ = on._expert_parts(T)
    # each token's 8 routed rows, and its shared expert's row: SGLang runs DeepSeek's shared expert in
    # the same fused_moe call without EP (`step.shared_expert_fused`)
    assert on.shared_fused[0]
    per_token = DSV3.moe_router_topk + 1
    casts = float(on.ops.fp8_cast(8192.0 * per_token * DSV3.hidden_size)[0]) + float(on.ops.fp8_cast(8192.0 * per_token * 256)[0])
    rate = float(on.expert_flops(T)[0]) / (float(g[0]) - casts)
    assert rate == pytest.approx(fused_moe_ceiling_flops(H200, True, moe_path(H200, True, False)) * TUNED_CONFIG_SPEEDUP, rel=1e-6)


def test_topk_sum_is_priced_only_without_an_all_to_all():
    """The Triton fused_moe runner sums each token's top-k expert outputs in a kernel of its own
    (read [tokens, topk, hidden], write [tokens, hidden], bf16) and casts each routed row to fp8;
    DeepEP's low-latency kernels receive the rows cast and their combine does that sum."""
    from dataclasses import replace
    c = to_cols(effective_plans([ServePlan.parse("tp=8")], DSV3, H200))
    sm = StepModel(DSV3, H200, load_tables(tables_dir_for(H200.kind)), c, fp8=True)
    T = np.array([8192.0])
    with_sum = float(sm._experts(T)[0])
    # the same experts and kernels, only the all-to-all flag (low-latency kernels) differs
    sm.c = replace(c, a2a=np.array([2]), low_latency_prefill=np.array([True]))
    without = float(sm._experts(T)[0])
    # (the shared expert runs in the same kernel here, `step.shared_expert_fused`: one more row a token)
    sf = float(sm.shared_fused[0])
    rows = 8192.0 * (DSV3.moe_router_topk + sf)
    want = 8192 * (DSV3.moe_router_topk + sf + 1) * DSV3.hidden_size * 2.0 / sm.hbm_bw + float(sm.ops.fp8_cast(rows * DSV3.hidden_size)[0])
    assert with_sum - without == pytest.approx(want, rel=1e-6)


def test_a_prediction_reports_the_kernels_it_priced():
    from cost_model.serving import predict_serve
    from cost_model.serving.calibration import IDENTITY
    from specs.serve_plan import ServeWorkload
    w = ServeWorkload(isl=1000, osl=100, concurrency=8, phase="decode")
    tp, ep = (predict_serve(DSV3, H200, ServePlan.parse(p), w, precision="fp8", calibration=IDENTITY).extra["gemm_paths"]
              for p in ("tp=8", "tp=8,attn_dp=8,a2a=deepep"))
    assert tp == {"dense": "deep_gemm", "experts": "triton_fused_moe"}
    assert ep == {"dense": "deep_gemm", "experts": "deep_gemm"}


def test_a_shape_sglang_ships_a_tuned_config_for_runs_faster():
    """DeepSeek-V3 fp8 TP8 on H200 (E=256 / 257 with the shared expert fused, N=256) has a tuned
    config in SGLang; the same shape on a GPU SGLang ships none for (H100) runs the default's
    efficiency; DeepEP plans run DeepGEMM, not the Triton kernel. The device is named as torch
    reports it (`clusters.torch_device_name`), not by the catalog's marketing name."""
    assert ships_tuned_config(load_cluster("h200-sxm", 8), 256, 256, True)[0]
    assert not ships_tuned_config(load_cluster("h200-sxm", 8), 32, 2048, True)[0]  # EP8's local shape: none shipped
    assert not ships_tuned_config(load_cluster("h100-sxm", 8), 256, 256, True)[0]  # none shipped for H100 at this shape
    tables = load_tables(tables_dir_for(H200.kind))
    c = to_cols(effective_plans([ServePlan.parse(p) for p in ("tp=8", "tp=8,ep=8", "tp=8,ep=8,a2a=deepep")], DSV3, H200))
    sm = StepModel(DSV3, H200, tables, c, fp8=True)
    assert sm.tuned_moe.tolist() == [True, False, False]


def test_the_tuned_config_list_is_the_installed_sglangs():
    """cost_model/data/sglang_fused_moe_configs.csv is the installed SGLang's own list: every row is
    a config file of the package, and every NVIDIA config file there is a row (the package is
    located, not imported: its module chain needs GPU-only packages)."""
    import importlib.util
    import re
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is installed by the test command"
    root = Path(list(spec.submodule_search_locations)[0]) / "srt/layers/moe/moe_runner/triton_utils/configs"
    rows = list(csv.DictReader(TUNED_DATA.open()))
    assert len(rows) > 100
    for r in rows:
        f = root / r["source"].split("configs/", 1)[1]
        assert f.exists(), r
        assert f.name.startswith(f"E={r['E']},N={r['N']},device_name={r['device_name']}")
        assert (f",dtype={r['dtype']}" in f.name) == bool(r["dtype"])
    shipped = {(int(m[1]), int(m[2]), m[3]) for f in root.glob("triton_*/E=*.json") if not f.stem.endswith("_down")
               for m in [re.match(r"E=(\d+),N=(\d+),device_name=(NVIDIA[^,.]*)", f.name)] if m}
    assert shipped == {(int(r["E"]), int(r["N"]), r["device_name"]) for r in rows}


def test_every_gpu_kind_is_named_as_sglangs_configs_name_it():
    """`clusters.torch_device_name` of every GPU kind that SGLang ships fused-MoE configs for is a
    device name those configs carry (the catalog's marketing names, "NVIDIA H200 141GB HBM3e", are
    not what torch reports)."""
    from clusters import kind_names, load_cluster, torch_device_name
    names = {r["device_name"] for r in csv.DictReader(TUNED_DATA.open())}
    for kind in ("h100-sxm", "h200-sxm", "h800-sxm", "h20", "b200", "a100-sxm-80g"):
        assert torch_device_name(load_cluster(kind)) in names, kind
    for kind in kind_names():
        cl = load_cluster(kind)
        assert " " not in torch_device_name(cl)
        assert cl.is_gpu or torch_device_name(cl) not in names


def test_fused_moe_computes_its_padded_rows():
    """moe_align_block_size pads each active expert's rows to the row tile: E[ceil(n / BM) | n >= 1] BM
    with n Poisson about the mean. A mean of exactly 64 rows computes about 1.47 tiles of 64 (n
    above 64 half the time), the padding fades as the mean grows (x1.12 at 256 rows), and one row
    per expert computes a whole tile."""
    from cost_model.serving.fused_moe import FUSED_MOE_BLOCK_M, FUSED_MOE_BLOCK_M_SMALL
    c = to_cols(effective_plans([ServePlan.parse("tp=1")], QWEN3, H100))
    sm = StepModel(QWEN3, H100, load_tables(tables_dir_for(H100.kind)), c, fp8=True)
    per_row = 2.0 * QWEN3.hidden_size * 3.0 * QWEN3.moe_ffn_hidden_size  # FLOPs of one routed row
    k = QWEN3.moe_router_topk

    def padding(T):
        return float(sm.expert_flops(np.array([float(T)]))[0]) / (T * k * per_row)
    assert FUSED_MOE_BLOCK_M_SMALL < FUSED_MOE_BLOCK_M
    assert padding(1024) == pytest.approx(1.47, abs=0.02)  # 64 rows per expert, tiles of 64
    assert padding(4096) == pytest.approx(1.12, abs=0.02)
    assert padding(8192) < padding(4096) < padding(2048) < padding(1024)
    # decode sizes: SGLang's default fp8 block config pads to 64 rows at every M (H100: no tuned
    # config for this shape); its tuned configs take 16-row tiles while M <= E (H200 ships one)
    tiny = float(sm.expert_flops(np.array([2.0]))[0]) / per_row  # 16 rows routed to ~16 experts
    assert not sm.tuned_moe[0]
    assert tiny == pytest.approx(float(sm.active_local_experts(np.array([2.0]))[0]) * FUSED_MOE_BLOCK_M, rel=0.01)
    h200 = load_cluster("h200-sxm", 1)
    tuned = StepModel(QWEN3, h200, load_tables(tables_dir_for(h200.kind)),
                      to_cols(effective_plans([ServePlan.parse("tp=1")], QWEN3, h200)), fp8=True)
    assert tuned.tuned_moe[0]
    small = float(tuned.expert_flops(np.array([2.0]))[0]) / per_row
    assert small == pytest.approx(float(tuned.active_local_experts(np.array([2.0]))[0]) * FUSED_MOE_BLOCK_M_SMALL, rel=0.01)


def test_deepep_normal_dispatch_is_fp8_only_with_deepgemm_jit():
    """SGLang quantizes the hidden states before DeepEP's normal-mode dispatch only when DeepGEMM's
    JIT is on (the pinned 0.5.23 source is the oracle); with it off the dispatch moves bf16 tokens,
    so the same plan's dispatch takes longer while the combine (bf16 either way) does not move."""
    import importlib.util

    # read, not imported: the module's imports reach torchvision, which this stack does not install
    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    src = (root / "srt/layers/moe/token_dispatcher/deepep.py").read_text()
    normal = src[src.index("class _DeepEPDispatcherImplNormal"):]
    normal = normal[normal.index("def dispatch_a"):normal.index("def _dispatch_core")]
    assert "if deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM and self.use_fp8:" in normal
    from cost_model.serving.kernel_path import deepep_normal_fp8_wire
    assert deepep_normal_fp8_wire(H200, True, True) and not deepep_normal_fp8_wire(H200, True, False)
    assert not deepep_normal_fp8_wire(H200, False, True)
    c = to_cols(effective_plans([ServePlan.parse("tp=8,attn_dp=8,ep=8,a2a=deepep,deepep_mode=normal")], DSV3, H200))
    legs = {jit: StepModel(DSV3, H200, load_tables(tables_dir_for("h200-sxm")), c, fp8=True, deepgemm_jit=jit)
            ._ep_legs(np.array([8192.0])) for jit in (True, False)}
    (d_on, c_on), (d_off, c_off) = legs[True], legs[False]
    assert float(d_off[0]) > 1.5 * float(d_on[0]) and float(c_off[0]) == pytest.approx(float(c_on[0]))
