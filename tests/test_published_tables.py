"""Shipped tables from published measurements (cost_model/build_default_tables.py PUBLISHED_*):
GB200's EP dispatch/combine scale-up rows come from arXiv 2603.07685 Table 7 and its attention rows
from Table 9, through the one lookup path the model uses (`resolve_tables` -> `TableOps`), and each
published row's own setting priced by that path gives back the published figure."""
from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from clusters import load_cluster
from cost_model import resolve_tables
from cost_model.blocks import distinct_ranks
from cost_model.build_default_tables import TABLE7_EXPERTS, TABLE7_TOKEN_BYTES, TABLE7_TOPK
from cost_model.constants import ATTN_BWD_FLOPS_FACTOR
from cost_model.ops import TableOps
from specs.models import load_model
from specs.workload import Workload

DATA = Path(__file__).resolve().parent.parent / "cost_model" / "data"
BACKEND_CODE = {"nccl-alltoall": 0, "hybridep": 3}  # TableOps.ep_dispatch names (alltoall, alltoall, deepep, hybridep)


def _ops(kind: str, gpus: int) -> TableOps:
    w = Workload(load_model("deepseek-v3"), load_cluster(kind, gpus), 1024, 4096)
    return TableOps(resolve_tables(w, None), w.cluster, np.array([False]))


def _rows(name: str, **match) -> list[dict]:
    with open(DATA / name, newline="") as f:
        return [r for r in csv.DictReader(f) if all(r[k] == v for k, v in match.items())]


def test_gb200_tables_carry_the_published_rows():
    t = _ops("gb200-nvl72", 64).t
    with open(t.directory / "ep_dispatch.csv", newline="") as f:
        ep = [r for r in csv.DictReader(f) if r["scope"] == "scaleup"]
    for backend in ("hybridep", "alltoall"):
        srcs = {r["source"] for r in ep if r["backend"] == backend}
        assert srcs and all("arXiv 2603.07685 Table 7 (GB200" in s for s in srcs), (backend, srcs)
    with open(t.directory / "attention.csv", newline="") as f:
        attn = {(r["direction"], r["seq"], r["head_dim"]): r["source"] for r in csv.DictReader(f)}
    for d in ("fwd", "bwd"):
        for seq in ("4096", "16384"):
            assert "arXiv 2603.07685 Table 9" in attn[(d, seq, "192")]


def test_kinds_without_published_rows_keep_the_derived_ones():
    t = _ops("h100-sxm", 8).t
    with open(t.directory / "ep_dispatch.csv", newline="") as f:
        assert all(r["source"].startswith("derived") for r in csv.DictReader(f))


@pytest.mark.parametrize("row", _rows("ep_dispatch_combine_bandwidth.csv", hw="gb200"),
                         ids=lambda r: f"{r['library']}-ep{r['ep']}")
def test_gb200_ep_rows_reproduce_table7(row):
    """The row's setting (hidden 7168, 4096 tokens per GPU, 256 experts; top-8 uniform and BF16
    tokens assumed), charged as blocks.ep_dispatch_combine charges it, takes the published time."""
    ops = _ops("gb200-nvl72", 64)
    ep, T, h = float(row["ep"]), float(row["tokens"]), float(row["hidden"])
    code = np.array([BACKEND_CODE[row["library"]]])
    e = np.array([ep])
    if row["library"] == "hybridep":
        copies = distinct_ranks(SimpleNamespace(moe_router_num_groups=0, moe_router_group_topk=0), TABLE7_EXPERTS, TABLE7_TOPK, e)
        nb_d, nb_c = (b * T * copies for b in TABLE7_TOKEN_BYTES)
        d, c = ops.ep_dispatch(code, nb_d, nb_c, e, 1, inter=np.zeros(1), intra=np.ones(1),
                               token_bytes=tuple(np.array([b]) for b in TABLE7_TOKEN_BYTES))
    else:
        nb = np.array([2.0 * h * T * TABLE7_TOPK])
        d, c = ops.ep_dispatch(code, nb, nb, e, 1)
    assert d[0] * 1e6 == pytest.approx(float(row["dispatch_us"]), rel=1e-4)
    assert c[0] * 1e6 == pytest.approx(float(row["combine_us"]), rel=1e-4)


@pytest.mark.parametrize("row", _rows("attention_sdpa_tflops.csv", platform="blackwell"), ids=lambda r: r["seq"])
def test_gb200_attention_reproduces_table9(row):
    ops = _ops("gb200-nvl72", 64)
    flops = np.array([1e12])
    f, b = ops.attention(flops, np.array([float(row["seq"])]), int(row["head_dim_qk"]), np.array([32.0]))
    assert flops[0] / f[0] / 1e12 == pytest.approx(float(row["fwd_tflops"]), rel=1e-4)
    assert ATTN_BWD_FLOPS_FACTOR * flops[0] / b[0] / 1e12 == pytest.approx(float(row["bwd_tflops"]), rel=1e-4)


@pytest.mark.parametrize("row", _rows("attention_sdpa_tflops.csv", platform="blackwell-ultra"), ids=lambda r: r["seq"])
def test_gb300_attention_reproduces_cudnns_own_benchmark(row):
    """GB300 has an attention table of its own (issue 22 item 6): cuDNN 9.22's sdpa_benchmark_training
    results on GB300 for DeepSeek-V3's MLA shape (cudnn-frontend), at their own sequence lengths."""
    ops = _ops("gb300-nvl72", 64)
    flops = np.array([1e12])
    f, b = ops.attention(flops, np.array([float(row["seq"])]), int(row["head_dim_qk"]), np.array([32.0]))
    assert flops[0] / f[0] / 1e12 == pytest.approx(float(row["fwd_tflops"]), rel=1e-4)
    assert ATTN_BWD_FLOPS_FACTOR * flops[0] / b[0] / 1e12 == pytest.approx(float(row["bwd_tflops"]), rel=1e-4)


def test_gb300_attention_at_head_dim_128_is_cudnns_other_gb300_shape():
    """Not fitted, a check: the same benchmark's Llama-3.1 shape on GB300 (head dim 128, 64 query / 8 kv
    heads, causal, bf16; cudnn-frontend results/llama3.1/gb300 @fb682ce7) runs 1,703 / 1,248 TFLOPS fwd /
    bwd at seq 4096 and 1,856 / 1,435 at 8192; the table, anchored on the MLA shape only, gives its
    head-dim-128 column within 15%."""
    ops = _ops("gb300-nvl72", 64)
    flops = np.array([1e12])
    for seq, fwd, bwd in ((4096, 1703, 1248), (8192, 1856, 1435)):
        f, b = ops.attention(flops, np.array([float(seq)]), 128, np.array([32.0]))
        assert flops[0] / f[0] / 1e12 == pytest.approx(fwd, rel=0.15)
        assert ATTN_BWD_FLOPS_FACTOR * flops[0] / b[0] / 1e12 == pytest.approx(bwd, rel=0.15)


def test_b300_takes_gb300s_attention_efficiency_at_its_own_peak():
    """HGX B300 is GB300's chip, power-capped (2.25 against 2.5 PF dense bf16): its attention table is
    GB300's measured rows x that ratio (build_default_tables SAME_CHIP_ATTN), not B200's derived curve."""
    gb300, b300 = _ops("gb300-nvl72", 64), _ops("b300", 64)
    flops = np.array([1e12])
    for seq in (2048.0, 4096.0, 16384.0):
        for hd in (128, 192):
            fg, bg = gb300.attention(flops, np.array([seq]), hd, np.array([32.0]))
            fb, bb = b300.attention(flops, np.array([seq]), hd, np.array([32.0]))
            assert fb[0] == pytest.approx(fg[0] * 2500 / 2250, rel=1e-3)
            assert bb[0] == pytest.approx(bg[0] * 2500 / 2250, rel=1e-3)


def test_grace_hosts_launch_at_their_measured_per_op_time():
    """GB200 / GB300 trays drive their GPUs from Grace CPUs: their shipped per-launch host time is the
    x86 figure x TransformerEngine issue 2053's GB200 / H100-DGX host time of the same torch op
    (37.08 / 13.48 us), and a launch-heavy eager plan's host floor grows with it, while x86 kinds keep
    the x86 figure."""
    from cost_model import predict
    from cost_model.build_default_tables import GRACE_HOST_KINDS, GRACE_OVER_X86_HOST, HOST_US_PER_LAUNCH
    from cost_model.calibration import IDENTITY
    from specs.plan import Plan
    assert GRACE_OVER_X86_HOST == pytest.approx(2.751, abs=1e-3)
    for kind in ("gb200-nvl72", "gb300-nvl72", "b200", "h100-sxm"):
        gap = _ops(kind, 8).gap
        want = HOST_US_PER_LAUNCH * (GRACE_OVER_X86_HOST if kind in GRACE_HOST_KINDS else 1.0)
        assert gap * 1e6 == pytest.approx(want, abs=0.01), kind
    # the same small eager plan on a Grace rack and on x86 B200 nodes (the same GPU family): the Grace
    # host's floor is the larger share of its step
    floors = {}
    for kind in ("gb200-nvl72", "b200"):
        w = Workload(load_model("qwen3-30b-a3b"), load_cluster(kind, 8), 16, 512)
        p = predict(w, Plan(tp=1, pp=1, ep=8, mbs=1, precision="bf16"), calibration=IDENTITY)
        floors[kind] = p.breakdown_s.get("cpu_launch_floor", 0.0) + p.breakdown_s.get("moe_host_sync", 0.0)
    assert floors["gb200-nvl72"] > 2.0 * floors["b200"] > 0


def test_a_collective_below_the_tables_smallest_message_costs_its_latency():
    """An 8-byte all-reduce across two nodes costs what the smallest tabled message (1 KiB) costs, not
    the ~0.5 us the bandwidth clamped at the table's edge would give; more bytes never cost less; an
    empty collective costs nothing."""
    ops = _ops("h100-sxm", 16)
    t = [float(np.ravel(ops.collective("all_reduce", float(b), 16, 1))[0]) for b in (0, 8, 512, 1024, 16384)]
    assert t[0] == 0.0
    assert t[1] == pytest.approx(t[3], rel=1e-9) and t[2] == pytest.approx(t[3], rel=1e-9)
    assert 20e-6 < t[1] <= t[4]
    for coll in ("all_gather", "reduce_scatter", "all_to_all"):
        small, edge = (float(np.ravel(ops.collective(coll, b, 16, 1))[0]) for b in (8.0, 1024.0))
        assert small == pytest.approx(edge, rel=1e-9) and small > 1e-6, coll
