"""Issue 22: the cost of communication that runs hidden beside compute, each its own breakdown
component: the SMs the interleaved schedule's overlapped PP send/recv holds (`pp_p2p_sm_share`),
the HBM bandwidth it takes (`pp_p2p_hbm_share`) and the HBM bandwidth the hidden DP collectives
take (`dp_overlap_hbm_share`). Each test compares predictions that differ in one input."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cost_model import predict
from cost_model.calibration import COMPONENT_CLASS, IDENTITY
from cost_model.constants import P2P_CHANNELS_PER_PEER, P2P_PEERS
from cost_model.nongemm import hidden_comm_hbm
from specs.plan import Plan
from tests.workloads import breakdown as _bd
from tests.workloads import workload as _w

PARTS = ("pp_p2p_sm_share", "pp_p2p_hbm_share", "dp_overlap_hbm_share")


def _interleaved(**kw):
    return Plan(tp=1, pp=2, vpp=4, ep=8, mbs=1, **kw)


def test_each_part_has_a_calibration_class_and_sums_into_the_step():
    w = _w(gbs=256)
    pr = predict(w, _interleaved(), calibration=IDENTITY)
    assert all(COMPONENT_CLASS[k] == "other_comm" for k in PARTS)
    assert sum(pr.breakdown_s.values()) == pytest.approx(pr.step_time_s, rel=1e-12)


def test_p2p_sm_share_is_the_channels_share_of_the_hidden_p2p():
    w = _w(gbs=256)
    inter = _bd(w, _interleaved())
    # 2 peers x 2 channels of H100's 132 SMs, for the hidden send/recv: 3% of it
    share = P2P_CHANNELS_PER_PEER * P2P_PEERS / w.cluster.sm_count
    # gbs 256 on dp 8: m = 32; exposed are the 2 (pp - 1) vpp = 8 warm-up / cool-down transfers of
    # the 2 m vpp = 256, the other 248 run beside compute
    one = inter["pp_p2p"] / 8
    assert inter["pp_p2p_sm_share"] == pytest.approx(share * 248 * one, rel=1e-9)
    # without interleaving Megatron does not overlap the p2p: nothing hidden, nothing charged
    plain = _bd(w, Plan(tp=1, pp=2, ep=8, mbs=1))
    assert plain["pp_p2p_sm_share"] == 0 and plain["pp_p2p_hbm_share"] == 0 and plain["pp_p2p"] > 0
    assert _bd(w, Plan(tp=1, pp=1, ep=8, mbs=1))["pp_p2p_sm_share"] == 0


def test_p2p_shares_grow_with_the_microbatches_that_hide_them():
    small, big = _bd(_w(gbs=128), _interleaved()), _bd(_w(gbs=512), _interleaved())
    for k in ("pp_p2p_sm_share", "pp_p2p_hbm_share"):
        assert big[k] > small[k] > 0


def test_dp_sm_and_hbm_shares_only_for_hidden_collectives():
    w = _w(gbs=256)
    plan = Plan(tp=1, pp=1, ep=8, mbs=1)
    on = _bd(w, plan)
    off = _bd(w, dataclasses.replace(plan, overlap_grad_reduce=False, overlap_param_gather=False))
    for k in ("dp_overlap_sm_share", "dp_overlap_hbm_share"):
        assert on[k] > 0 and off[k] == 0
    # at most half the hidden collectives' own seconds (the share caps at one half)
    hidden = (off["dp_grad_reduce_scatter"] + off["dp_param_all_gather"]
              - on["dp_grad_reduce_scatter"] - on["dp_param_all_gather"])
    assert on["dp_overlap_hbm_share"] <= 0.5 * hidden


def test_none_of_it_on_cpu_devices():
    bd = _bd(_w(kind="cpu-local", gpus=16, gbs=64, seq=256), _interleaved())
    assert all(bd[k] == 0 for k in PARTS)


def test_hidden_comm_hbm_direction_and_size():
    hbm = 3.35e12
    # 1 GB in 1 ms reads + writes 2 TB/s: the share caps at one half; the 0.5 ms of memory-bound
    # compute under the hidden millisecond waits half its time: +0.25 ms
    assert hidden_comm_hbm(1e9, 1e-3, 1e-3, 0.5e-3, hbm) == pytest.approx(0.25e-3)
    # 10 MB in 1 ms: 20 GB/s of 3.35 TB/s, 0.6% of the bandwidth: 0.6% of the 0.5 ms
    assert hidden_comm_hbm(1e7, 1e-3, 1e-3, 0.5e-3, hbm) == pytest.approx(0.5e-3 * 2e10 / hbm)
    # the same bytes hidden over a longer time: no less lost (first order in the share)
    assert hidden_comm_hbm(1e8, 2e-3, 2e-3, 1.0, hbm) == pytest.approx(hidden_comm_hbm(1e8, 1e-3, 1e-3, 1.0, hbm))
    # more payload in the same time, more memory-bound compute under it: more lost
    a = hidden_comm_hbm(np.array([1e7, 1e8]), 1e-3, 1e-3, 0.5e-3, hbm)
    assert 0 < a[0] < a[1]
    b = hidden_comm_hbm(1e8, 1e-3, 1e-3, np.array([0.1e-3, 0.6e-3]), hbm)
    assert 0 < b[0] < b[1]
    # only the memory-bound seconds under the communication slow: at most its hidden duration
    assert hidden_comm_hbm(1e9, 1e-3, 1e-4, 0.5e-3, hbm) == pytest.approx(0.5e-4)
    # nothing hidden, or no memory-bound compute under it: nothing lost
    assert hidden_comm_hbm(1e8, 1e-3, 0.0, 0.5e-3, hbm) == 0
    assert hidden_comm_hbm(1e8, 1e-3, 1e-3, 0.0, hbm) == 0
