"""EP communication overlap as it runs (issue 22 item 1): communication kernels hold SMs, each
communication of Megatron's merged forward-backward hides under one node of the other microbatch,
and the unpaired first forward / last backward of a stage are serial."""
import numpy as np
import pytest

import cost_model
from clusters import load_cluster
from cost_model.blocks import paired_exposure
from cost_model.calibration import IDENTITY
from cost_model.constants import (
    DEEPEP_BESIDE_COMPUTE_RATE,
    DEEPEP_SMS,
    STARVED_COMM_CONCURRENCY,
    STARVED_COMM_RATE,
    STARVED_WORK_PER_PAIRED_S,
)
from specs.models import load_model
from specs.plan import Plan
from specs.stack import GPU_FULL, HYBRIDEP_NUM_SMS
from specs.workload import Workload
from tuner.rank.complete import complete_plan

EP_PARTS = ("ep_dispatch_combine", "ep_overlap_beyond", "ep_overlap_sm_share")


def _held_wall(comm, compute, share, rate):
    """Event-by-event wall time of a held pair: comm on its SMs at `rate` of its speed alone while
    the compute runs (the compute at 1 - share), then whichever is left runs alone at full speed."""
    t_comm, t_comp = comm / rate, compute / (1.0 - share)  # each one's duration beside the other
    if t_comm <= t_comp:  # comm ends first: the compute finishes its rest on every SM
        return t_comm + (compute - (1.0 - share) * t_comm)
    return t_comp + (comm - rate * t_comp)  # the compute ends first: comm finishes alone


def test_paired_exposure_is_the_wall_time_of_a_shared_gpu():
    comm = np.linspace(0.0, 3.0, 31)[:, None]
    compute = np.linspace(0.0, 3.0, 31)[None, :]
    for held in (True, False):
        for share in (0.0, 0.15, 0.5):
            for rate in (1.0, DEEPEP_BESIDE_COMPUTE_RATE, 0.6):
                beyond, sm = paired_exposure(comm, compute, share, held, rate)
                wall = compute + beyond + sm
                if held:  # comm on its own SMs at `rate`, the compute on the rest
                    expect = np.vectorize(_held_wall)(comm, compute, share, rate)
                    np.testing.assert_allclose(wall, expect, atol=1e-12)
                    if rate == 1.0:
                        np.testing.assert_allclose(wall, np.maximum(comm, compute + share * comm))
                else:  # the compute at full speed, comm trickling beside it, then alone
                    np.testing.assert_allclose(wall, compute + np.maximum(0.0, comm - STARVED_WORK_PER_PAIRED_S * compute))
                    assert (sm == 0).all()
                # more communication or more compute never shortens the pair
                assert (np.diff(wall, axis=0) >= -1e-15).all() and (np.diff(wall, axis=1) >= -1e-15).all()
                assert (sm >= 0).all() and (beyond >= -1e-15).all()
    # a slower kernel beside the compute never exposes less
    slow, fast = (sum(paired_exposure(comm, compute, 0.15, True, r)) for r in (0.7, 1.0))
    assert (slow >= fast - 1e-15).all() and (slow > fast).any()


def test_a_starved_kernel_hides_less_than_one_holding_its_sms():
    """The same communication beside the same compute: a starved kernel (HybridEP) leaves more
    exposed than one holding its SMs (DeepEP, NCCL) wherever the compute is long enough to hide the
    held one (comm (1 - share) <= compute); alone (no compute) both are the whole comm."""
    comm, compute, share = 1.0, np.array([0.0, 0.5, 1.0, 2.0]), 20 / 132
    held = sum(paired_exposure(comm, compute, share, True))
    starved = sum(paired_exposure(comm, compute, share, False))
    assert held[0] == starved[0] == comm
    assert (starved[2:] > held[2:]).all()


def _w(gbs=1024, kind="h100-sxm"):
    return Workload(load_model("qwen3-30b-a3b"), load_cluster(kind, 16), gbs, 4096)


@pytest.mark.parametrize("backend,sms,kind", [("hybridep", HYBRIDEP_NUM_SMS, "h100-sxm"), ("hybridep", HYBRIDEP_NUM_SMS, "b200"),
                                              ("deepep", DEEPEP_SMS, "h100-sxm"), ("deepep", DEEPEP_SMS, "b200")])
def test_overlapped_comm_pays_its_sm_share_and_the_unpaired_chunks(backend, sms, kind):
    """DeepEP holds its SMs beside Blackwell's GEMMs (they give SMs up to its high-priority stream)
    and is starved beside Hopper's static persistent ones, as HybridEP is on both (constants
    COMM_STARVED, COMM_STARVED_HOPPER)."""
    w = _w(kind=kind)
    base = complete_plan(f"ep=16,dispatcher=flex,flex_backend={backend}", w, GPU_FULL)
    plain, ovl = cost_model.predict_many(w, [base, base.replace(a2a_overlap=True)])
    comm = plain.breakdown_s["ep_dispatch_combine"]  # no overlap: all of it is serial
    assert plain.breakdown_s["ep_overlap_beyond"] == plain.breakdown_s["ep_overlap_sm_share"] == 0.0
    m = 1024 // 16  # microbatches of the one stage: the first forward and last backward are unpaired
    assert ovl.breakdown_s["ep_dispatch_combine"] == pytest.approx(comm / m, rel=1e-9)
    share = sms / w.cluster.sm_count
    exposed = sum(ovl.breakdown_s[k] for k in EP_PARTS)
    if backend == "deepep" and kind == "b200":  # cooperative, prioritised: holds its SMs, the paired
        # compute slows by their share for as long as the communication runs beside it (comm / its rate)
        assert ovl.breakdown_s["ep_overlap_sm_share"] == pytest.approx(
            share * comm / DEEPEP_BESIDE_COMPUTE_RATE * (1 - 1 / m), rel=1e-9)
        assert share * comm < exposed < comm
    else:  # starved: the compute keeps the SMs, the communication is what is left over
        assert ovl.breakdown_s["ep_overlap_sm_share"] == 0.0
        assert ovl.breakdown_s["ep_overlap_beyond"] > share * comm
        assert exposed < comm
    assert ovl.step_time_s < plain.step_time_s


def test_deepep_hides_less_beside_hopper_gemms_than_blackwell_ones():
    """The same DeepEP overlap: on H100 it is priced as HybridEP's measured starvation (the share of
    its communication hidden is HybridEP's own at equal bytes and compute), on B200 as held (more
    hidden); NCCL's all-to-all holds on both."""
    hidden = {}
    for kind in ("h100-sxm", "b200"):
        w = _w(kind=kind)
        for backend in ("deepep", "hybridep", ""):
            disp = f"dispatcher=flex,flex_backend={backend}" if backend else "dispatcher=alltoall"
            base = complete_plan(f"ep=16,{disp}", w, GPU_FULL)
            plain, ovl = cost_model.predict_many(w, [base, base.replace(a2a_overlap=True)], calibration=IDENTITY)
            comm = plain.breakdown_s["ep_dispatch_combine"]
            hidden[kind, backend] = 1.0 - sum(ovl.breakdown_s[k] for k in EP_PARTS) / comm
    assert hidden["b200", "deepep"] > hidden["h100-sxm", "deepep"] + 0.2
    assert hidden["b200", "deepep"] > hidden["b200", "hybridep"]
    assert hidden["h100-sxm", ""] > hidden["h100-sxm", "deepep"]
    # starved on Hopper: hidden work is STARVED_WORK_PER_PAIRED_S per paired second, as HybridEP's
    # (the two differ only by their bytes and per-token costs, not by who gets the SMs)
    assert abs(hidden["h100-sxm", "deepep"] - hidden["h100-sxm", "hybridep"]) < 0.2


def test_fewer_microbatches_leave_more_unpaired():
    a, b = (cost_model.predict(_w(gbs), complete_plan("ep=16,dispatcher=flex,a2a_overlap=1", _w(gbs), GPU_FULL))
            for gbs in (1024, 64))
    share = lambda p: p.breakdown_s["ep_dispatch_combine"] / sum(p.breakdown_s[k] for k in EP_PARTS)  # noqa: E731
    assert share(b) > share(a)


def test_fp8_quantisation_kernels_count_on_the_host():
    """On a launch-bound plan the fp8 recipes' quantisation kernels (TE: amax + cast-transpose for
    current scaling, one fused kernel for delayed scaling) lengthen the host clock: current scaling
    more than delayed, both more than bf16."""
    from tuner.space.megatron_rules import check
    w = Workload(load_model("tiny-moe"), load_cluster("h100-sxm", 8), 8, 256)
    plans = [complete_plan(f"ep=1,precision={p}", w, GPU_FULL) for p in ("bf16", "fp8-delayed", "fp8-tensorwise")]
    assert not any(check(w, p, GPU_FULL) for p in plans)
    floors = [r.breakdown_s["cpu_launch_floor"] for r in cost_model.predict_many(w, plans)]
    assert 0 < floors[0] < floors[1] < floors[2]


# Megatron-Bridge's Nsight A/B (constants STARVED_COMM_RATE): the communication kernels' seconds
# concurrent with GEMM / attention off (9.079 ms = 0.11% of them) and on (3,958.997 ms = 36.55%)
NSIGHT_CONCURRENT_OFF_S, NSIGHT_CONCURRENT_S = 9.079e-3, 3.958997
NSIGHT_ALONE_S = NSIGHT_CONCURRENT_OFF_S / 0.0011  # the communication's work alone (overlap off)
NSIGHT_ON_TOTAL_S = NSIGHT_CONCURRENT_S / 0.3655  # its kernels' seconds with overlap on


def test_the_starved_rate_is_the_nsight_split():
    """STARVED_COMM_RATE is the component split of Megatron-Bridge's Nsight A/B (constants): the
    communication's work alone (overlap off), the part of it the on case ran with no GEMM / attention
    beside it (at full rate), the rest done in the concurrent 3,959 ms."""
    alone_on = NSIGHT_ON_TOTAL_S - NSIGHT_CONCURRENT_S
    rate = (NSIGHT_ALONE_S - alone_on) / NSIGHT_CONCURRENT_S
    assert STARVED_COMM_RATE == pytest.approx(rate, abs=0.01)
    # the rounding of "0.11%" (0.105-0.115%) bounds it; the constant sits inside
    lo, hi = ((NSIGHT_CONCURRENT_OFF_S / f - alone_on) / NSIGHT_CONCURRENT_S for f in (0.00115, 0.00105))
    assert lo < STARVED_COMM_RATE < hi


def test_the_starved_concurrency_is_the_nsight_overlap_over_the_paired_windows(monkeypatch):
    """STARVED_COMM_CONCURRENCY (constants): the Nsight's 3,959 ms of communication beside GEMM /
    attention over the compute the model pairs the communication with on that very workload (the
    first pair of bench/overlap_ab_pairs.py), measured here by what the pairing hides at two rates:
    the windows are the slope. The model then hides what the Nsight says was hidden (the work done
    beside the compute, 1.38 s of 8.25 s: 16.7% of the communication), not the 3.7 s the rate alone
    hid over whole windows."""
    import dataclasses

    import cost_model.blocks as blocks
    w = _w()
    on = Plan(tp=1, pp=1, ep=16, mbs=1, precision="bf16", dispatcher="flex", flex_backend="hybridep",
              grad_reduce_bf16=True, cuda_graph_impl="transformer_engine",
              cuda_graph_scope=("moe_router", "moe_preprocess"), a2a_overlap=True)
    pr = cost_model.predict(w, on, calibration=IDENTITY)  # at the shipped constant, before the patching
    beyond = {}
    for r in (0.05, 0.1):
        monkeypatch.setattr(blocks, "STARVED_WORK_PER_PAIRED_S", r)
        beyond[r] = cost_model.predict(w, on, calibration=IDENTITY).breakdown_s["ep_overlap_beyond"]
    windows = (beyond[0.05] - beyond[0.1]) / 0.05
    assert STARVED_COMM_CONCURRENCY == pytest.approx(NSIGHT_CONCURRENT_S / windows, rel=0.03)
    off = cost_model.predict(w, dataclasses.replace(on, a2a_overlap=False), calibration=IDENTITY)
    comm = off.breakdown_s["ep_dispatch_combine"]
    hidden = comm - pr.breakdown_s["ep_overlap_beyond"] - pr.breakdown_s["ep_dispatch_combine"]
    hidden_nsight = NSIGHT_ALONE_S - (NSIGHT_ON_TOTAL_S - NSIGHT_CONCURRENT_S)
    assert hidden / comm == pytest.approx(hidden_nsight / NSIGHT_ALONE_S, abs=0.02)


def test_wgrad_left_is_what_the_first_communication_has_not_covered():
    """delay_wgrad_compute: the next communication on the stream starts after the data gradients,
    beside the part of the weight-gradient node the first one left (`blocks.wgrad_left`): all of
    it when the first is instantaneous, none once the first outlasts the whole backward node,
    never more as the first grows; held comm lets the compute run on (1 - share) of the SMs, a
    starved one lets it run at full speed while the comm trickles."""
    from cost_model.blocks import Node, wgrad_left
    node = Node(np.float64(1.0), np.float64(2.0), np.float64(0.8))  # dgrad 1.2 s, then wgrad 0.8 s
    first = np.linspace(0.0, 3.0, 61)
    for held in (True, False):
        left = wgrad_left(first, node, 0.15, held)
        assert left[0] == pytest.approx(0.8) and left[-1] == 0.0
        assert (np.diff(left) <= 1e-15).all() and (left >= 0).all() and (left <= 0.8).all()
    # held: the compute did (1 - 0.15) x 1.0 s of the node while a 1.0 s comm ran
    assert wgrad_left(np.float64(1.0), node, 0.15, True) == pytest.approx(0.8)
    assert wgrad_left(np.float64(1.5), node, 0.15, True) == pytest.approx(2.0 - 0.85 * 1.5)
    # starved: STARVED_WORK_PER_PAIRED_S s of comm takes 1 s of compute beside it
    assert wgrad_left(np.float64(STARVED_WORK_PER_PAIRED_S * 1.5), node, 0.15, False) == pytest.approx(0.5)


@pytest.mark.parametrize("dispatch", ["dispatcher=alltoall", "dispatcher=flex,flex_backend=deepep",
                                      "dispatcher=flex,flex_backend=hybridep"])
def test_delay_wgrad_only_widens_the_backward_windows(dispatch):
    """delay_wgrad never lengthens a step, changes only the overlapped-EP parts, and saves at most
    the weight-gradient GEMMs of the attention and MoE nodes it moves (per layer, microbatch and
    direction pair); without a2a overlap it is not realizable (megatron_rules delay-wgrad)."""
    w = _w()
    base = complete_plan(f"ep=16,a2a_overlap=1,{dispatch}", w, GPU_FULL)
    off, on = cost_model.predict_many(w, [base, base.replace(delay_wgrad=True)], calibration=IDENTITY)
    assert on.step_time_s <= off.step_time_s
    moved = {k for k in off.breakdown_s if abs(off.breakdown_s[k] - on.breakdown_s.get(k, 0.0)) > 1e-12}
    assert moved <= set(EP_PARTS) | {"ep_overlap_hbm_share", "cpu_launch_floor"}, moved
    from cost_model.blocks import attention, routed_experts
    from cost_model.model import _inputs
    from cost_model.plans import PlanArrays
    x = _inputs(w, PlanArrays.from_plans([base]), cost_model.resolve_tables(w), 1.0)
    wgrad = attention(x).proj_w + routed_experts(x).w  # Qwen3-30B-A3B: no shared expert
    layers, m = w.model.num_layers, 1024 // 16
    assert off.step_time_s - on.step_time_s <= float(wgrad[0]) * layers * m + 1e-9


@pytest.mark.parametrize("dispatch", ["dispatcher=alltoall", "dispatcher=flex,flex_backend=deepep",
                                      "dispatcher=allgather"])
def test_unfused_permutation_costs_bytes_kernels_and_host_syncs(dispatch):
    """permute_fusion=0 (megatron-core's PyTorch permute / unpermute): more bytes moved
    (router_permutation), more kernels (kernel_latency), three more host syncs per MoE layer
    forward (moe_host_sync); nothing else changes without a2a overlap, and it never shortens a step."""
    w = _w()
    fused = complete_plan(f"ep=16,{dispatch}", w, GPU_FULL)
    assert fused.permute_fusion  # the completion default on a TE stack
    on, off = cost_model.predict_many(w, [fused, fused.replace(permute_fusion=False)], calibration=IDENTITY)
    grew = {k for k in on.breakdown_s if off.breakdown_s.get(k, 0.0) > on.breakdown_s[k] + 1e-12}
    assert {"router_permutation", "kernel_latency", "moe_host_sync"} <= grew
    moved = {k for k in on.breakdown_s if abs(off.breakdown_s.get(k, 0.0) - on.breakdown_s[k]) > 1e-12}
    assert moved <= grew | {"cpu_launch_floor"}, moved
    assert off.step_time_s > on.step_time_s


def test_hybridep_permutes_in_its_own_kernels():
    """HybridEP permutes inside its dispatch and combine: permute_fusion changes nothing there."""
    w = _w()
    base = complete_plan("ep=16,dispatcher=flex,flex_backend=hybridep,a2a_overlap=1", w, GPU_FULL)
    on, off = cost_model.predict_many(w, [base, base.replace(permute_fusion=False)], calibration=IDENTITY)
    assert off.step_time_s == on.step_time_s and off.breakdown_s == on.breakdown_s


def test_unfused_unpermute_serialises_the_forward_combine_under_a2a_overlap():
    """The combine node unpermutes right after the combine (fine_grained_callables.py
    submodule_combine_forward); unfused, its masked_select holds the host until the combine is
    done, so the other microbatch's attention backward is issued only then: the forward combine
    of each paired chunk is exposed whole, and the overlap saves less than with the fused kernels."""
    from cost_model.blocks import ep_dispatch_combine, routed_experts
    from cost_model.model import _inputs
    from cost_model.plans import PlanArrays
    w = _w()
    base = complete_plan("ep=16,dispatcher=alltoall", w, GPU_FULL)
    steps = {}
    for pf in (True, False):
        p0 = base.replace(permute_fusion=pf)
        plain, ovl = cost_model.predict_many(w, [p0, p0.replace(a2a_overlap=True)], calibration=IDENTITY)
        steps[pf] = (plain, ovl)
    saved = {pf: steps[pf][0].step_time_s - steps[pf][1].step_time_s for pf in steps}
    assert 0 < saved[False] < saved[True]
    # the exposed forward combine: at least the combine of every paired chunk
    x = _inputs(w, PlanArrays.from_plans([base]), cost_model.resolve_tables(w), 1.0)
    comb = float(ep_dispatch_combine(x, routed_experts(x)).combine[0])
    m, layers = 1024 // 16, w.model.num_layers
    ovl_off = steps[False][1].breakdown_s
    assert ovl_off["ep_overlap_beyond"] >= comb * layers * (m - 1) * (1 - 1e-9)


def test_an_unfused_permutation_cannot_sit_in_the_moe_preprocess_graph():
    """The moe_preprocess CUDA graph holds dispatch_preprocess, which permutes: unfused, its
    masked_select syncs with the host during capture (megatron_rules cuda-graph-sync); fused, or
    under HybridEP (no permute of its own), the scope is accepted."""
    from tuner.space.megatron_rules import check
    w = _w()
    g = "cuda_graph_impl=transformer_engine,cuda_graph_scope=moe_router+moe_preprocess"
    codes = {}
    for disp in ("dispatcher=alltoall", "dispatcher=flex,flex_backend=hybridep"):
        for pf in (1, 0):
            p = complete_plan(f"ep=16,{disp},{g},permute_fusion={pf}", w, GPU_FULL)
            codes[disp, pf] = {r.code for r in check(w, p, GPU_FULL)}
    assert "cuda-graph-sync" in codes["dispatcher=alltoall", 0]
    assert "cuda-graph-sync" not in codes["dispatcher=alltoall", 1]
    assert "cuda-graph-sync" not in codes["dispatcher=flex,flex_backend=hybridep", 0]


def test_the_deepep_rate_is_the_trace_against_its_benchmark():
    """DEEPEP_BESIDE_COMPUTE_RATE (constants; bench/deepep_overlap_rate.py reads the trace): DeepSeek's
    train.json runs 8 dispatch and 8 combine kernels at 3.876 / 6.181 ms mean beside compute; DeepEP's
    README of that week (46 / 45 GB/s RDMA, internode EP64) over tests/test_internode.py's bytes
    (4,096 tokens x 3.985 destination nodes x 7,168 x 2 B, x (1 + 4/128) / 2 for the FP8 dispatch)
    puts them at 2.62 / 5.20 ms alone."""
    pairs = 4096 * 3.985 * 7168 * 2
    alone = pairs * (1 + 4 / 128) / 2 / 46e9 + pairs / 45e9
    assert DEEPEP_BESIDE_COMPUTE_RATE == pytest.approx(alone / (3.876e-3 + 6.181e-3), abs=0.005)
    # the README's later bandwidths (51 / 50 GB/s, after DeepEP's own speed-ups) would give ~0.70
    later = pairs * (1 + 4 / 128) / 2 / 51e9 + pairs / 50e9
    assert later / (3.876e-3 + 6.181e-3) < DEEPEP_BESIDE_COMPUTE_RATE < 1.0
