"""Issue 22 part two: the kernels outside the GEMM tables priced one kernel at a time
(cost_model.nongemm), the dispatcher's metadata preprocess, the wgrad's main-grad accumulation,
the HBM bandwidth overlapped EP communication takes, and the SMs hidden DP collectives hold.
Each test compares predictions that differ in one input, or checks a count against the module walk."""
from __future__ import annotations

import numpy as np
import pytest

from cost_model import predict
from cost_model.calibration import IDENTITY
from cost_model.constants import KERNEL_LATENCY_S, KERNELS_PERMUTE, KERNELS_PREPROCESS, LAUNCH_API_S, TE_GEMM_STREAMS
from cost_model.nongemm import (
    comm_hbm_share,
    expert_gemm_launches,
    hbm_contention,
    host_moe_launches,
    layer_kernels,
)
from specs.models import load_model
from specs.plan import PRECISIONS, Plan
from specs.workload import Workload
from tests.workloads import breakdown as _bd
from tests.workloads import workload as _w

HYBRIDEP, ALLTOALL = 3, 0


def _hybridep(**kw):
    return Plan(tp=1, pp=1, ep=16, mbs=1, dispatcher="flex", flex_backend="hybridep", **kw)


def _kernels(spec, dispatch, precision=0, local=8, blackwell=False):
    return layer_kernels(spec, tp=np.array([1.0]), cp=np.array([1.0]), grouped=np.array([True]),
                         local_experts=np.array([float(local)]), precision=np.array([precision]),
                         dispatch=np.array([dispatch]), blackwell=blackwell)


def test_kernel_count_of_a_qwen3_layer_follows_the_module_walk():
    # Qwen3-30B-A3B, EP16 HybridEP bf16 on Hopper (8 local experts), forward:
    #   attention: input norm, q/k norms (2), RoPE (2), residual; QKV + out GEMMs; core = 9
    #   MoE: pre-MLP norm, router score (5) + aux loss (5), router GEMM, preprocess (3), dispatch +
    #        combine, fc1 + fc2 per local expert (16), SwiGLU, residual = 35
    # x 3 (forward + a backward of twice the launches) = 132 per layer and microbatch (the
    # evidence's Nsight count on this workload: 151; the model's earlier structural count: 99)
    k = _kernels(load_model("qwen3-30b-a3b"), HYBRIDEP)
    assert float(k.attn[0]) == 9 and float(k.moe[0]) == 35
    assert 3 * float(k.attn[0] + k.moe[0]) == 132


def test_hybridep_launches_fewer_kernels_than_alltoall():
    spec = load_model("qwen3-30b-a3b")
    h, a = _kernels(spec, HYBRIDEP), _kernels(spec, ALLTOALL)
    # HybridEP permutes inside its kernels and has its own preprocess
    assert float(a.moe[0] - h.moe[0]) == KERNELS_PERMUTE + KERNELS_PREPROCESS[ALLTOALL] - KERNELS_PREPROCESS[HYBRIDEP]


def test_expert_gemms_launch_per_local_expert_on_hopper_and_for_fp8():
    bf16, mx = PRECISIONS.index("bf16"), PRECISIONS.index("mxfp8")
    assert expert_gemm_launches(False, np.array([bf16]), np.array([True]), np.array([8.0]))[0] == 8
    assert expert_gemm_launches(True, np.array([bf16]), np.array([True]), np.array([8.0]))[0] == 1
    assert expert_gemm_launches(True, np.array([mx]), np.array([True]), np.array([8.0]))[0] == 8
    # the streamed per-expert GEMMs take 1 / TE_GEMM_STREAMS device slot each
    k = _kernels(load_model("qwen3-30b-a3b"), HYBRIDEP)
    _, _, moe_slots = k.device_slots()
    assert float(k.moe[0] - moe_slots[0]) == pytest.approx(16 * (1 - 1 / TE_GEMM_STREAMS))


def test_fp8_recipes_add_quantisation_kernels_per_expert_operand():
    spec = load_model("qwen3-30b-a3b")
    bf = _kernels(spec, HYBRIDEP, PRECISIONS.index("bf16"))
    tw = _kernels(spec, HYBRIDEP, PRECISIONS.index("fp8-tensorwise"))
    # tensorwise: amax + cast-transpose (2) per GEMM input; fc1 and fc2 of 8 local experts
    assert float(tw.moe_fp8[0]) == 2 * 2 * 8 and float(bf.moe_fp8[0]) == 0
    assert float(tw.moe[0] - bf.moe[0]) == float(tw.moe_fp8[0])


def test_kernel_latency_is_charged_on_gpus_only_and_grows_with_layers():
    bd = _bd(_w(), _hybridep())
    assert bd["kernel_latency"] > 0
    more = _bd(_w(num_layers=96, moe_layers=(True,) * 96), _hybridep())
    assert more["kernel_latency"] == pytest.approx(2 * bd["kernel_latency"], rel=0.05)
    cpu = _bd(_w(model="tiny-moe", kind="cpu-local", gpus=2, gbs=4, seq=128), Plan(ep=2))
    assert cpu["kernel_latency"] == 0 and cpu["wgrad_main_grad"] == 0
    # the dispatcher's side exchanges are collectives, on CPU (gloo) as on GPUs
    assert cpu["dispatcher_preprocess"] > 0


def test_kernel_latency_floor_at_one_kernel():
    # one forward kernel costs its slot forward and twice that backward
    from cost_model.nongemm import latency
    f, b = latency(np.array([1.0]))
    assert f[0] == KERNEL_LATENCY_S and b[0] == 2 * KERNEL_LATENCY_S


def test_dispatcher_side_exchanges_grow_with_tokens_and_follow_the_dispatcher():
    short = _bd(_w(seq=2048), _hybridep())["dispatcher_preprocess"]
    long = _bd(_w(seq=8192), _hybridep())["dispatcher_preprocess"]
    assert 0 < short < long
    # token_dispatcher.py: the allgather dispatcher gathers the [tokens, experts] routing map and
    # fp32 probabilities of the whole group (and reduce-scatters their gradient); the alltoall one
    # sends the routed rows' probabilities (topk per token) and the token counts: less
    ag = _bd(_w(), Plan(tp=1, pp=1, ep=16, mbs=1, dispatcher="allgather"))["dispatcher_preprocess"]
    a2a = _bd(_w(), Plan(tp=1, pp=1, ep=16, mbs=1, dispatcher="alltoall"))["dispatcher_preprocess"]
    assert ag > a2a > 0
    assert _bd(_w(), Plan(tp=1, pp=1, ep=1, mbs=1, dispatcher="allgather"))["dispatcher_preprocess"] == 0


def test_wgrad_main_grad_accumulation_costs_more_in_fp32():
    fp32 = _bd(_w(), _hybridep())["wgrad_main_grad"]
    bf16 = _bd(_w(), _hybridep(grad_reduce_bf16=True))["wgrad_main_grad"]
    # read + write of the main grad in place of a 2-byte output: 4 + 4 - 2 = 6 vs 2 + 2 - 2 = 2 B
    assert fp32 == pytest.approx(3 * bf16, rel=1e-9)
    assert bf16 > 0


def test_ep_overlap_hbm_share_only_under_overlap_and_bounded():
    off = _bd(_w(), _hybridep())
    on = _bd(_w(), _hybridep(a2a_overlap=True))
    assert off["ep_overlap_hbm_share"] == 0 and on["ep_overlap_hbm_share"] > 0
    assert on["ep_overlap_hbm_share"] < on["elementwise"] + on["router_permutation"]


def test_hbm_contention_is_monotone_and_capped():
    assert comm_hbm_share(1e9, 1e-3, 3.35e12) == 0.5  # 2 TB/s of 3.35: capped at one half
    s = comm_hbm_share(np.array([1e6, 1e7]), 1e-3, 3.35e12)
    assert s[0] < s[1]
    c = hbm_contention(np.array([1e-3, 1e-3]), 5e-4, np.array([0.1, 0.2]))
    assert 0 < c[0] < c[1]
    # only the memory-bound time under the communication slows
    assert hbm_contention(1e-3, 1e-4, 0.5) == pytest.approx(1e-4)


def test_fp8_is_not_predicted_faster_than_bf16_on_fine_grained_moe():
    # Qwen3-30B-A3B on 16 H100, HybridEP EP16: public reports find fp8 equal or slower than bf16 on
    # fine-grained MoE (verl issue 7232, TransformerEngine issue 761, arXiv 2603.07685 §4.3.5); the
    # model before issue 22 part two said 8.5% faster without overlap, 1.8% with; with the
    # quantisation kernels at the elementwise rate 3.2% faster without overlap. A check of the
    # physics, not a fitted figure: no constant was set from it (with the kernels' own HBM share,
    # `constants` FP8_QUANT_HBM_FRACTION: 5.8% slower without overlap, 16.0% with,
    # bench/qwen3_30b_components.py).
    w = _w(gbs=1024)
    step = {}
    for a2a in (False, True):
        for prec in ("bf16", "fp8-tensorwise"):
            step[a2a, prec] = predict(w, _hybridep(a2a_overlap=a2a, precision=prec), calibration=IDENTITY).step_time_s
    assert step[False, "fp8-tensorwise"] > step[False, "bf16"]
    assert step[True, "fp8-tensorwise"] > step[True, "bf16"]


def test_fp8_quantisation_runs_at_its_own_share_of_hbm(monkeypatch):
    """Training's quantisation kernels move their bytes at FP8_QUANT_HBM_FRACTION of the GPU's HBM
    (a public TE cast-transpose timing), below the elementwise rate, and that rate alone prices
    `fp8_quantize`'s bytes; CPU devices keep the elementwise rate."""
    import cost_model.ops as ops_mod
    from clusters import load_cluster
    from cost_model import resolve_tables
    from cost_model.constants import FP8_QUANT_HBM_FRACTION
    from cost_model.ops import TableOps
    w = _w(gbs=1024)
    ops = TableOps(resolve_tables(w, None), w.cluster, np.array([True]))
    assert ops.bw_fp8_quant == pytest.approx(FP8_QUANT_HBM_FRACTION * w.cluster.hbm_tbps * 1e12)
    assert ops.bw_fp8_quant < 0.6 * ops.bw["elementwise"]
    cpu = load_cluster("cpu-local", 1)
    cpu_ops = TableOps(resolve_tables(Workload(load_model("tiny-moe"), cpu, 8, 256), None), cpu, np.array([True]))
    assert cpu_ops.bw_fp8_quant == cpu_ops.bw["elementwise"]
    # training: fp8_quantize = kernel slots + bytes / rate, so doubling the share halves the bytes part
    plan = _hybridep(precision="fp8-tensorwise")
    q = []
    for f in (1.0, 2.0, 4.0):
        monkeypatch.setattr(ops_mod, "FP8_QUANT_HBM_FRACTION", FP8_QUANT_HBM_FRACTION * f)
        q.append(_bd(w, plan)["fp8_quantize"])
    assert (q[0] - q[1]) / (q[1] - q[2]) == pytest.approx(2.0, rel=1e-9)


def test_qk_norms_move_bytes_only_where_the_model_has_them():
    with_norms = _bd(_w(), _hybridep())["elementwise"]
    without = _bd(_w(qk_layernorm=False), _hybridep())["elementwise"]
    assert with_norms > without
    longer = _bd(_w(seq=8192, gbs=32), _hybridep())["elementwise"]  # same tokens per step, 2x per microbatch
    assert longer == pytest.approx(with_norms, rel=0.05)


def test_te_cpp_loop_launches_cost_the_host_the_launch_call_only():
    # EP16 fp8 on Hopper: 8 local experts, per-expert GEMMs (fc1, fc2) and per-expert quantizers
    # (2 operands x 2 kernels under current scaling) issued from TE's C++ loops: 16 + 32
    spec = load_model("qwen3-30b-a3b")
    lk = _kernels(spec, HYBRIDEP, precision=PRECISIONS.index("fp8-tensorwise"), local=8)
    assert float(lk.looped[0]) == 16 + 32
    gap = 22e-6
    host = host_moe_launches(lk, gap)
    assert float(host[0]) == pytest.approx(float(lk.moe[0]) - 48 * (1 - LAUNCH_API_S / gap))
    # a host slower per PyTorch op makes the C++-looped launches count for less of one
    assert float(host_moe_launches(lk, 44e-6)[0]) < float(host[0]) < float(lk.moe[0])
    # one grouped kernel (Blackwell bf16): nothing looped, every launch a PyTorch-level op
    one = _kernels(spec, HYBRIDEP, precision=0, local=8, blackwell=True)
    assert float(one.looped[0]) == 0 and float(host_moe_launches(one, gap)[0]) == float(one.moe[0])
    # a host whose per-op time is below the launch call's: the loops cost one op each, no more
    assert float(host_moe_launches(lk, 2e-6)[0]) == float(lk.moe[0])


@pytest.mark.parametrize("name,saved", [("qwen3-30b-a3b", 4), ("deepseek-v3", 7)])
def test_router_fusion_fuses_the_router_kernels(name, saved):
    """router_fusion (TE's fused top-k and aux-loss kernels): Qwen3 (softmax top-k + aux loss)
    5 + 5 -> 2 + 4 forward kernels, DeepSeek-V3 (group-limited sigmoid top-k + aux loss) 13 -> 6;
    the graph scope moe_router holds the same fewer kernels. A step never gets longer with it, and
    only the kernel-slot and host-launch terms move."""
    spec = load_model(name)
    args = dict(tp=np.array([1.0]), cp=np.array([1.0]), grouped=np.array([True]), local_experts=np.array([8.0]),
                precision=np.array([0]), dispatch=np.array([ALLTOALL]))
    off, on = layer_kernels(spec, **args), layer_kernels(spec, router_fused=np.array([True]), **args)
    assert float(off.moe[0] - on.moe[0]) == saved and float(off.router[0] - on.router[0]) == saved
    w = _w("qwen3-30b-a3b", "h100-sxm", 16, 1024, 4096)
    p = Plan(tp=1, pp=1, ep=16, mbs=1)
    a, b = (predict(w, p.replace(router_fusion=rf), calibration=IDENTITY) for rf in (False, True))
    assert b.step_time_s <= a.step_time_s
    moved = {k for k in a.breakdown_s if abs(a.breakdown_s[k] - b.breakdown_s.get(k, 0.0)) > 1e-12}
    assert moved <= {"kernel_latency", "cpu_launch_floor", "moe_host_sync"}, moved
