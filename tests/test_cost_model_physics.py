"""The step components issue 10 added: fp8 quantization per recipe, MTP layers, sliding-window
attention, the dropless dispatcher's host sync, bf16 gradient reduction, and the published rows'
memory. Each test compares two predictions that differ in one input."""
from __future__ import annotations

import dataclasses
import math

import pytest

from clusters import load_cluster
from cost_model import predict, predict_arrays
from cost_model.blocks import window_fraction, window_tiles
from cost_model.calibration import IDENTITY
from cost_model.constants import (
    FP8_QUANT_BYTES_PER_ELEMENT,
    KERNELS_FP8_PER_OPERAND,
    ROPE_EAGER_BWD_BYTES_PER_ELEMENT,
    ROPE_EAGER_FWD_BYTES_PER_ELEMENT,
)
from cost_model.nongemm import rope_eager, yarn_concentration
from specs.models import load_model
from specs.plan import PRECISIONS, Plan
from specs.workload import Workload
from tests.workloads import workload as _w


def _bd(w, plans, **kw):
    return predict_arrays(w, plans, calibration=IDENTITY, detail=True, **kw)


def test_fp8_recipes_price_their_quantization_distinctly():
    w = _w()
    precs = ["bf16", "fp8-tensorwise", "fp8-delayed", "fp8-blockwise"]
    q = _bd(w, [Plan(ep=16, precision=p) for p in precs])["breakdown_s"]["fp8_quantize"]
    assert q[0] == 0.0
    # tensorwise (amax pass + cast) > blockwise (one fused pass + scales) > delayed (amax fused)
    assert q[1] > q[3] > q[2] > 0
    ratio = FP8_QUANT_BYTES_PER_ELEMENT[PRECISIONS.index("fp8-tensorwise")] / FP8_QUANT_BYTES_PER_ELEMENT[
        PRECISIONS.index("fp8-delayed")]
    # bytes / bandwidth plus each quantisation kernel's fixed slot (issue 22 part two): the ratio
    # lies between the bytes ratio and the kernels-per-operand ratio of the two recipes
    kratio = KERNELS_FP8_PER_OPERAND[PRECISIONS.index("fp8-tensorwise")] / KERNELS_FP8_PER_OPERAND[
        PRECISIONS.index("fp8-delayed")]
    assert min(ratio, kratio) < q[1] / q[2] < max(ratio, kratio)
    mx = _bd(_w(kind="b200"), [Plan(ep=16, precision="mxfp8")])["breakdown_s"]["fp8_quantize"][0]
    assert mx > 0


def test_block_scaled_fp8_gemms_run_slower_than_per_tensor_ones():
    """TransformerEngine's GEMM benchmark (constants FP8_GEMM_TIME_*): on Hopper the blockwise recipe's
    GEMMs take 1.23x the per-tensor ones (its autocast time less one fused quantisation pass, against
    the pre-quantized per-tensor GEMMs); on Blackwell MXFP8 (and blockwise, emulated on it) 1.05x.
    Only the GEMM terms move; the recipes' quantisation is priced apart."""
    from cost_model.constants import FP8_GEMM_TIME_BLACKWELL, FP8_GEMM_TIME_HOPPER
    for kind, table, recipes in (("h100-sxm", FP8_GEMM_TIME_HOPPER, ("fp8-tensorwise", "fp8-delayed", "fp8-blockwise")),
                                 ("b200", FP8_GEMM_TIME_BLACKWELL, ("fp8-tensorwise", "fp8-blockwise", "mxfp8"))):
        bd = _bd(_w(kind=kind), [Plan(ep=16, precision=p) for p in recipes])["breakdown_s"]
        for i, p in enumerate(recipes):
            f = table[PRECISIONS.index(p)]
            # the attention block's projections are all fp8 TE GEMMs: exactly the factor
            assert bd["attention_proj"][i] == pytest.approx(bd["attention_proj"][0] * f, rel=1e-9), (kind, p)
            # the expert term also holds work that is no fp8 GEMM (its epilogues): at most the factor
            assert bd["expert_gemm"][0] <= bd["expert_gemm"][i] <= bd["expert_gemm"][0] * f * (1 + 1e-9), (kind, p)
        assert (bd["expert_gemm"][2] > bd["expert_gemm"][0]) == (table[PRECISIONS.index(recipes[2])] > 1.0)
    assert FP8_GEMM_TIME_HOPPER[PRECISIONS.index("fp8-blockwise")] > 1.2
    # the derivation from the benchmark's H200 table (fprop + dgrad + wgrad ms per layer): the
    # blockwise autocast time less delayed scaling's quantisation (same fused pass, 4.06 vs 4 B)
    per_tensor, delayed, block = 16.785, 18.978, 22.882
    q_block = (delayed - per_tensor) * FP8_QUANT_BYTES_PER_ELEMENT[PRECISIONS.index("fp8-blockwise")] / \
        FP8_QUANT_BYTES_PER_ELEMENT[PRECISIONS.index("fp8-delayed")]
    assert FP8_GEMM_TIME_HOPPER[PRECISIONS.index("fp8-blockwise")] == pytest.approx((block - q_block) / per_tensor, abs=0.01)
    assert FP8_GEMM_TIME_BLACKWELL[PRECISIONS.index("mxfp8")] == pytest.approx(7.161 / 6.812, abs=0.01)


def test_mtp_layers_cost_time_and_memory_on_the_loss_stage():
    plan = Plan(pp=8, vpp=2, ep=32, precision="mxfp8", dispatcher="flex", flex_backend="deepep",
                pp_layout="Et*4|(t*4|)*14tL")
    base, mtp = (predict(_w("deepseek-v3", "b200", 256, 4096, mtp_num_layers=n), plan, calibration=IDENTITY)
                 for n in (0, 1))
    assert base.breakdown_s.get("mtp", 0.0) == 0.0
    assert mtp.memory_by_stage_gib[-1] > base.memory_by_stage_gib[-1] + 1.0  # an MoE layer + logits
    assert mtp.memory_by_stage_gib[0] == pytest.approx(base.memory_by_stage_gib[0])
    # with an even layout the loss stage becomes the slowest: the MTP layer shows in the step
    even = Plan(pp=8, ep=32, precision="mxfp8", dispatcher="flex", flex_backend="deepep")
    b2, m2 = (predict(_w("deepseek-v3", "b200", 256, 4096, mtp_num_layers=n), even, calibration=IDENTITY)
              for n in (0, 1))
    assert m2.breakdown_s["mtp"] > 0 and m2.step_time_s > b2.step_time_s


def test_sliding_window_attention_cuts_core_attention():
    # the preset carries GPT-OSS's real window (128, every other layer full); start from full attention
    assert load_model("gpt-oss-120b").window_size == 128
    spec = dataclasses.replace(load_model("gpt-oss-120b"), window_size=0, window_attn_skip_freq=0)
    assert window_fraction(spec, 4096) == 1.0
    swa = dataclasses.replace(spec, window_size=128, window_attn_skip_freq=2)
    f = window_fraction(swa, 4096)
    # the kernel's 128 x 128 tiles: a windowed layer visits 63 of the causal layer's 528, twice its
    # FLOP share (128 - 128^2 / 8192) / 2048 = 0.0615
    assert (window_tiles(4096, 128), window_tiles(4096, 4096)) == (63, 528)
    assert f == pytest.approx(0.5 + 0.5 * 63 / 528)
    assert f > 0.5 + 0.5 * (128 - 128 * 128 / 8192) / 2048 + 0.02
    plan = [Plan(pp=4, ep=8)]
    a = _bd(_w("gpt-oss-120b", gpus=64, gbs=256, window_size=0, window_attn_skip_freq=0),
            plan)["breakdown_s"]["core_attention"][0]
    b = _bd(_w("gpt-oss-120b", gpus=64, gbs=256, window_size=128, window_attn_skip_freq=2),
            plan)["breakdown_s"]["core_attention"][0]
    assert b == pytest.approx(a * f, rel=1e-9)


def test_windowed_attention_cost_never_falls_with_seq():
    # the tile count is kept continuous in seq: a sequence one token longer (across a tile
    # boundary too) never prices less attention (causal FLOPs ~ seq^2 x the window share)
    spec = load_model("gpt-oss-120b")
    cost = [s * s * window_fraction(spec, s) for s in range(64, 9000)]
    assert all(b >= a for a, b in zip(cost, cost[1:]))


def test_window_tiles_follow_cudnn_sliding_window_timings():
    # cuDNN SDPA backward, S4096 H16 D64 (cudnn-frontend PR 505, the cuDNN column): causal 558.2 us,
    # window 511 (512 keys) 171.0 us, window 1023 276.6 us; the tile share is within 8%, the FLOP
    # share 15-24% low
    causal = window_tiles(4096, 4096)
    for w, us in ((512, 171.0), (1024, 276.6)):
        assert window_tiles(4096, w) / causal == pytest.approx(us / 558.2, rel=0.08)
        assert (w - w * w / 8192) / 2048 < 0.9 * us / 558.2


def _window_rows():
    import csv
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "cost_model" / "data" / "attention_window_cudnn.csv"
    return list(csv.DictReader(path.open()))


def test_windowed_attention_matches_cudnn_on_gpt_oss_heads():
    """cuDNN's own timing of GPT-OSS's heads (64 q / 8 kv, head_dim 64) under a causal window on
    H200 (cost_model/data/attention_window_cudnn.csv): the table's causal rate times the tiles the
    window visits gives the kernel's forward and backward within 10% (the FLOP share: 16% / 10% low)."""
    import numpy as np

    from cost_model import resolve_tables
    from cost_model.ops import TableOps
    rows = [r for r in _window_rows() if r["gpu"] == "h200"]
    assert rows
    for r in rows:
        b, s, nh, d, win = (int(r[k]) for k in ("batch", "seq", "num_q_heads", "head_dim", "window"))
        w = _w("gpt-oss-120b", "h200-sxm", 8, 8, seq=s, window_size=win, window_attn_skip_freq=0)
        ops = TableOps(resolve_tables(w, None), w.cluster, np.array([False]))
        causal_flops = b * s * s * nh * 2 * d  # the model's causal count: T x seq x heads x (dq + dv)
        f, bw = ops.attention(causal_flops * window_fraction(w.model, s), s, d, np.array([b * nh]))
        assert f[0] * 1e3 == pytest.approx(float(r["fwd_ms"]), rel=0.10), r
        assert bw[0] * 1e3 == pytest.approx(float(r["bwd_ms"]), rel=0.10), r


def test_yarn_concentration_keeps_rope_out_of_te():
    # GPT-OSS: YaRN factor 32, neither mscale set -> 0.1 ln 32 + 1; DeepSeek-V3: mscale = mscale_all_dim
    # = 1 -> 1 (fused); Qwen3: no YaRN
    assert yarn_concentration(load_model("gpt-oss-120b")) == pytest.approx(0.1 * math.log(32) + 1)
    assert rope_eager(load_model("gpt-oss-120b"))
    assert yarn_concentration(load_model("deepseek-v3")) == 1.0 and not rope_eager(load_model("deepseek-v3"))
    assert not rope_eager(load_model("qwen3-30b-a3b"))


def test_eager_rope_prices_its_passes_on_q_and_k():
    import numpy as np

    from cost_model import resolve_tables
    from cost_model.ops import TableOps
    plan = [Plan(pp=4, ep=8, mbs=1)]
    yarn = _w("gpt-oss-120b", gpus=64, gbs=256)
    plain = _w("gpt-oss-120b", gpus=64, gbs=256, rope_scaling_factor=1.0, yarn_original_max_position=0)
    a, b = (_bd(w, plan)["breakdown_s"] for w in (plain, yarn))
    spec = yarn.model
    T, nh, ng, d = 4096, spec.num_attention_heads, spec.query_groups, spec.head_dim
    bw = TableOps(resolve_tables(yarn, None), yarn.cluster, np.array([True])).bw["elementwise"]
    # eager q and k passes (fwd + bwd) less the fused kernel's charge already in the model (q read
    # and written, backward twice the forward)
    extra = ((ROPE_EAGER_FWD_BYTES_PER_ELEMENT + ROPE_EAGER_BWD_BYTES_PER_ELEMENT) * T * (nh + ng) * d
             - 3 * 4.0 * T * nh * d) / bw
    # the breakdown: the slowest stage's 9 layers over 256 / 16 (DP) = 16 microbatches
    assert b["elementwise"][0] - a["elementwise"][0] == pytest.approx(16 * 9 * extra, rel=1e-6)
    assert b["kernel_latency"][0] > a["kernel_latency"][0]  # 24 eager kernels instead of 2 fused
    ds = _w("deepseek-v3", "b200", 256, 4096)
    ds_plain = _w("deepseek-v3", "b200", 256, 4096, rope_scaling_factor=1.0, yarn_original_max_position=0)
    p = [Plan(pp=8, ep=32, precision="mxfp8", dispatcher="flex", flex_backend="deepep")]
    assert _bd(ds, p)["breakdown_s"]["elementwise"][0] == _bd(ds_plain, p)["breakdown_s"]["elementwise"][0]


def test_expert_fc2_bias_launches_per_local_expert():
    # megatron-core TEGroupedMLP._apply_bias: t + b * p per local expert (2 launches) and a cat;
    # GPT-OSS EP8: 128 / 8 = 16 local experts -> 33 forward kernels, backward twice that
    from cost_model.constants import KERNEL_LATENCY_S
    from cost_model.nongemm import expert_bias_kernels
    spec = load_model("gpt-oss-120b")
    assert expert_bias_kernels(spec, 16) == 33
    assert expert_bias_kernels(load_model("qwen3-30b-a3b"), 16) == 0.0
    plan = [Plan(pp=4, ep=8, mbs=1)]
    a, b = (_bd(_w("gpt-oss-120b", gpus=64, gbs=256, moe_expert_bias=bias), plan)["breakdown_s"]["kernel_latency"][0]
            for bias in (False, True))
    # the slowest stage's 9 layers over 16 microbatches, each kernel's fixed slot fwd + 2x bwd
    assert b - a == pytest.approx(16 * 9 * 3 * 33 * KERNEL_LATENCY_S, rel=1e-6)


def test_lm_head_wgrad_accumulates_into_the_main_grad():
    # megatron-core's output_layer (ColumnParallelLinear, gradient_accumulation_fusion) reads and
    # writes its main grad per microbatch like a layer's wgrad: on the last stage, per vocab row
    import numpy as np

    from cost_model import resolve_tables
    from cost_model.ops import TableOps
    plan = [Plan(pp=4, ep=8, mbs=1, grad_reduce_bf16=True)]
    small, big = (_w("gpt-oss-120b", gpus=64, gbs=256, vocab_size=v) for v in (100_000, 201_088))
    a, b = (_bd(w, plan)["breakdown_s"]["wgrad_main_grad"][0] for w in (small, big))
    bw = TableOps(resolve_tables(big, None), big.cluster, np.array([True])).bw["elementwise"]
    # 16 microbatches on the loss stage (the slowest: it holds the LM head); bf16 main grads:
    # read 2 + write 2 in place of the GEMM's 2-byte output
    assert b - a == pytest.approx(16 * (201_088 - 100_000) * 2880 * (2 * 2.0 - 2.0) / bw, rel=1e-6)


def test_host_sync_for_dropless_dispatchers_only():
    w = _w()
    s = _bd(w, [Plan(ep=16), Plan(ep=16, dispatcher="allgather"),
                Plan(ep=16, dispatcher="flex", flex_backend="hybridep")])["breakdown_s"]["moe_host_sync"]
    assert s[0] > 0 and s[2] > 0 and s[1] == 0.0
    cpu = _bd(Workload(load_model("qwen3-30b-a3b"), load_cluster("cpu-local", 1), 8, 256),
              [Plan()])["breakdown_s"]["moe_host_sync"]
    assert cpu[0] == 0.0  # synchronous CPU execution: no queue to drain


def test_the_drain_idles_the_measured_host_time_without_overlap():
    """After the dropless dispatcher's host sync the GPU idles at least the Nsight A/B's 616 us per
    MoE forward (constants.POST_SYNC_IDLE_S), host work counted in the kind's launch time: x2.75 on
    a Grace host; none of that floor under a2a overlap, whose other microbatch fills the drain; and
    none where the token counts stay on the device (drop-and-pad)."""
    from cost_model.build_default_tables import GRACE_OVER_X86_HOST
    from cost_model.constants import POST_SYNC_IDLE_S
    plans = [Plan(ep=8, dispatcher="alltoall"), Plan(ep=8, dispatcher="alltoall", a2a_overlap=True),
             Plan(ep=8, dispatcher="alltoall", capacity_factor=1.0, pad_to_capacity=True)]
    per_fwd = {}
    for kind in ("h100-sxm", "gb200-nvl72"):
        w = _w(kind=kind, gpus=8, gbs=64)
        s = _bd(w, plans)["breakdown_s"]["moe_host_sync"]
        forwards = w.model.num_layers * 64 / 8  # MoE layers (every one of Qwen3-30B's) x microbatches (mbs 1, dp 8)
        per_fwd[kind] = s[0] / forwards
        assert s[1] < s[0] and s[2] == 0.0
    assert per_fwd["h100-sxm"] == pytest.approx(POST_SYNC_IDLE_S, rel=1e-6)
    assert per_fwd["gb200-nvl72"] == pytest.approx(POST_SYNC_IDLE_S * GRACE_OVER_X86_HOST, rel=1e-3)


def test_bf16_gradient_reduction_saves_two_bytes_per_parameter():
    w = _w(gpus=16, gbs=512)
    plan = Plan(pp=2, vpp=24, ep=8, mbs=2, precision="fp8-delayed")
    a = predict(w, plan, calibration=IDENTITY)
    b = predict(w, plan.replace(grad_reduce_bf16=True), calibration=IDENTITY)
    assert b.peak_memory_gib < a.peak_memory_gib - 2.0
    assert b.breakdown_s["dp_grad_reduce_scatter"] <= a.breakdown_s["dp_grad_reduce_scatter"]


def test_fp8_param_drops_the_bf16_weights_and_gathers_in_fp8():
    from cost_model.flops import param_counts
    w = _w(gpus=16, gbs=512)
    plan = Plan(ep=8, mbs=1, precision="fp8-tensorwise", grad_reduce_bf16=True, overlap_param_gather=False)
    a = predict(w, plan, calibration=IDENTITY)
    b = predict(w, plan.replace(fp8_param=True), calibration=IDENTITY)
    # 2 bytes fewer for every parameter this GPU holds (dense whole, experts / ep), nothing else
    pc = param_counts(w.model)
    held = pc["total"] - pc["routed_experts"] * (1 - 1 / 8)
    assert a.peak_memory_gib - b.peak_memory_gib == pytest.approx(2.0 * held / 2**30, rel=0.02)
    # the exposed (not overlapped) parameter all-gather moves half the bytes
    assert 0 < b.breakdown_s["dp_param_all_gather"] < 0.75 * a.breakdown_s["dp_param_all_gather"]


def test_published_calibration_rows_fit_in_memory():
    from cost_model.fit_default_calibration import row_case, rows
    for r in rows():
        w, p, _m, label, opts = row_case(r)
        pr = predict(w, p, calibration=IDENTITY, **opts)
        assert pr.feasible, (label, pr.reasons)


def test_deepseek_v3_gb200_published_layout_fits():
    w = _w("deepseek-v3", "gb200-nvl72", 256, 4096, mtp_num_layers=1)
    p = Plan(pp=4, vpp=4, ep=64, precision="fp8-tensorwise", dispatcher="flex", flex_backend="hybridep",
             recompute="selective", recompute_modules=("mlp",), grad_reduce_bf16=True)
    pr = predict(w, p, calibration=IDENTITY)
    assert pr.feasible, pr.reasons


@pytest.mark.parametrize("kind", ["gb300-nvl72", "b300", "h20"])
def test_new_clusters_predict(kind):
    c = load_cluster(kind)
    pr = predict(_w(kind=kind, gpus=16), Plan(ep=16, precision="fp8-tensorwise"), calibration=IDENTITY)
    assert pr.step_time_s > 0 and pr.tables_digest
    assert sum(pr.breakdown_s.values()) == pytest.approx(pr.step_time_s, rel=1e-12)
    assert c.hbm_gib in (288, 96)


def test_activation_offloading_trades_memory_for_pcie_time():
    w = _w("gpt-oss-120b", gpus=64, gbs=1280, window_size=128, window_attn_skip_freq=2)
    p = Plan(pp=4, ep=8, mbs=4, recompute="selective", recompute_modules=("layernorm", "moe_act"))
    a = predict(w, p, calibration=IDENTITY)
    b = predict(w, p, calibration=IDENTITY, offload_modules=("expert_fc1", "moe_act"))
    assert not a.feasible and b.feasible  # 101 GiB -> 63 GiB on stage 0
    assert b.breakdown_s["activation_offload"] > 0 and a.breakdown_s["activation_offload"] == 0.0
    assert sum(b.breakdown_s.values()) == pytest.approx(b.step_time_s, rel=1e-12)
    # offloading what recompute already dropped changes nothing
    c = predict(w, Plan(pp=4, ep=8, mbs=1, recompute="selective", recompute_modules=("layernorm",)),
                calibration=IDENTITY, offload_modules=("qkv_linear",))
    d = predict(w, Plan(pp=4, ep=8, mbs=1, recompute="selective", recompute_modules=("layernorm",)),
                calibration=IDENTITY)
    assert c.peak_memory_gib == pytest.approx(d.peak_memory_gib)
    with pytest.raises(ValueError, match="offload_modules"):
        predict(w, p, calibration=IDENTITY, offload_modules=("bogus",))


def test_flex_rdma_leg_counts_the_tokens_own_node_and_small_tokens_cost_more():
    """DeepEP / HybridEP rows count one copy per node a token reaches, its own included
    (constants "DeepEP / HybridEP"): on two nodes that doubles the RDMA bytes of the remote copies
    alone. The per-token cost is zero at the rows' token size and positive below it."""
    import numpy as np

    from cost_model import resolve_tables
    from cost_model.constants import FLEX_REF_TOKEN_BYTES
    from cost_model.ops import TableOps
    w = _w(gpus=16)
    ops = TableOps(resolve_tables(w, None), w.cluster, np.array([False]))
    ep, code = np.array([16.0]), np.array([3])
    nb = np.array([1e8])
    remote_only = ops.ep_dispatch(code, nb, nb, ep, 1, inter=np.array([0.5]), intra=np.array([0.0]))[0]
    both_nodes = ops.ep_dispatch(code, nb, nb, ep, 1, inter=np.array([1.0]), intra=np.array([0.0]))[0]
    lat = ops.ep_dispatch(code, 0 * nb, 0 * nb, ep, 1)[0]
    assert (both_nodes - lat)[0] == pytest.approx(2 * (remote_only - lat)[0], rel=1e-9)
    ref = [np.array([b]) for b in FLEX_REF_TOKEN_BYTES]
    at_ref = ops.ep_dispatch(code, nb, nb, ep, 1, token_bytes=ref)
    plain = ops.ep_dispatch(code, nb, nb, ep, 1)
    assert at_ref[0][0] == pytest.approx(plain[0][0], rel=1e-12) and at_ref[1][0] == pytest.approx(plain[1][0], rel=1e-12)
    small = ops.ep_dispatch(code, nb, nb, ep, 1, token_bytes=[r / 4 for r in ref])
    assert small[0][0] > plain[0][0] and small[1][0] > plain[1][0]


def test_hybridep_permutes_inside_its_kernels():
    w = _w(gpus=16)
    r = _bd(w, [Plan(ep=16, dispatcher="flex", flex_backend=b) for b in ("deepep", "hybridep")])["breakdown_s"]
    assert r["router_permutation"][1] < r["router_permutation"][0]


def test_fp8_gemm_carries_no_cast_of_its_own():
    # the cast is charged once, in fp8_quantize: the fp8 GEMM time is FLOPs at the fp8 table rate
    import numpy as np

    from cost_model import resolve_tables
    from cost_model.ops import TableOps
    w = _w()
    ops = TableOps(resolve_tables(w, None), w.cluster, np.array([True]))
    m, n, k = (np.array([float(v)]) for v in (4096, 2048, 2048))
    f8, _ = ops.gemm(m, n, k)
    f16, _ = ops.gemm(m, n, k, bf16=True)
    assert f8[0] < f16[0]
    rate = ops.t["gemm"].lookup("fp8", m=m, n=n, k=k)
    assert f8[0] == pytest.approx(float(2.0 * 4096 * 2048 * 2048 / (np.ravel(rate)[0] * 1e12)), rel=1e-12)


def test_alltoall_regroup_by_local_expert_only_with_several_local_experts():
    w = _w()
    rp = _bd(w, [Plan(ep=8), Plan(ep=8, dispatcher="flex", flex_backend="deepep")])["breakdown_s"]["router_permutation"]
    assert rp[0] > rp[1]  # alltoall pays the two sort_chunks passes; DeepEP does not
    one = _w(num_experts=16)  # EP16 of 16 experts: one local expert, no regroup
    r1 = _bd(one, [Plan(ep=16), Plan(ep=16, dispatcher="flex", flex_backend="deepep")])["breakdown_s"]["router_permutation"]
    assert r1[0] == pytest.approx(r1[1], rel=1e-12)


def test_gpt_oss_clamp_and_expert_bias_are_priced_and_the_head_stays_bf16():
    plan = Plan(pp=4, ep=8, recompute="selective", recompute_modules=("layernorm", "moe_act"))
    kw = dict(model="gpt-oss-120b", gpus=64, gbs=64)
    full = _bd(_w(**kw), [plan])["breakdown_s"]
    plain = _bd(_w(**kw, activation_clamp=0.0, moe_expert_bias=False), [plan])["breakdown_s"]
    assert full["expert_gemm"][0] > plain["expert_gemm"][0]
    assert full["recompute"][0] > plain["recompute"][0]  # the clamp re-runs inside moe_act's checkpoint
    head = [_bd(_w(), [Plan(ep=16, precision=p)])["breakdown_s"]["lm_head_ce"][0] for p in ("bf16", "fp8-tensorwise")]
    assert head[1] == pytest.approx(head[0], rel=1e-12)


def test_training_flex_dispatch_moves_bf16_under_every_fp8_recipe():
    """megatron-core hands DeepEP / HybridEP the bf16 hidden states whatever the fp8 recipe (the
    experts quantize after the dispatch): HybridEP's own buffer refuses fp8 dispatch, so the
    dispatch bytes and seconds are those of bf16 for every precision; serving (SGLang's fp8 DeepEP
    dispatch) is the caller that sends fp8 (`blocks.ep_wire_seconds(fp8_wire=...)`)."""
    from megatron.core.transformer.moe import fused_a2a
    with pytest.raises(AssertionError, match="does not support fp8 dispatch"):
        fused_a2a.init_hybrid_ep_buffer(None, 2048, 4096, 8, 32, 32, True)
    w = _w("qwen3-30b-a3b", gpus=16, gbs=64)
    for backend in ("deepep", "hybridep"):
        plans = [Plan(ep=16, dispatcher="flex", flex_backend=backend, precision=p)
                 for p in ("bf16", "fp8-tensorwise", "fp8-blockwise", "fp8-delayed")]
        ep = _bd(w, plans)["breakdown_s"]["ep_dispatch_combine"]
        assert ep[0] > 0 and all(e == pytest.approx(ep[0], rel=1e-12) for e in ep), (backend, ep)
