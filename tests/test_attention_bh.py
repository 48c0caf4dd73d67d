"""The attention table's bh axis (batch x heads of one call): old tables without the column still
load, the cost model queries the bh of its calls, the CPU profile sweeps it under a memory cap,
and a profile's merge with the shipped grid fills cells only at measured bh values."""
from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest

from clusters import load_cluster
from cost_model import predict_arrays
from cost_model.calibration import IDENTITY
from cost_model.tables import TABLE_ROOT, GridTable, Tables, write_family, write_meta
from specs.models import load_model
from specs.plan import Plan
from specs.workload import Workload
from trials.profile import attention
from trials.profile.common import Ctx
from trials.profile.driver import build_family_rows, merge_with_shipped


def test_a_table_written_before_the_bh_axis_still_loads(tmp_path):
    """A user's tables from before the axis ($MOETUNE_HOME/tables) have no bh column: every row
    takes one default bh, which makes the axis inert, so lookups equal the bh-carrying table's."""
    new = Tables.load(TABLE_ROOT / "h100-sxm")
    old = tmp_path / "old"
    shutil.copytree(TABLE_ROOT / "h100-sxm", old)
    rows = list(csv.DictReader(open(old / "attention.csv")))
    assert "bh" in rows[0]
    with open(old / "attention.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[c for c in rows[0] if c != "bh"], lineterminator="\n")
        w.writeheader()
        w.writerows([{k: v for k, v in r.items() if k != "bh"} for r in rows])
    t = Tables.load(old)
    for bh in (1, 8, 512):
        a = t["attention"].lookup(("bf16", "bwd"), seq=3000, head_dim=100, bh=bh)
        b = new["attention"].lookup(("bf16", "bwd"), seq=3000, head_dim=100, bh=bh)
        assert float(a) == pytest.approx(float(b), rel=1e-12)
    # a CSV missing a required axis is still refused, naming the column (the meta.json's row
    # counts, which would refuse the one-row file first, left out as in tables from before them)
    meta = json.loads((old / "meta.json").read_text())
    meta.pop("rows", None)
    (old / "meta.json").write_text(json.dumps(meta))
    with open(old / "attention.csv", "w") as f:
        f.write("dtype,direction,seq,bh,tflops,source\nbf16,fwd,512,8,1.0,t\n")
    with pytest.raises(Exception, match="head_dim"):
        Tables.load(old)


def _cpu_tables(tmp_path, rate_at_bh: dict[int, float]):
    """cpu-local's shipped tables with a synthetic attention grid: `rate_at_bh` TFLOPS per bh."""
    d = tmp_path / "t"
    shutil.copytree(TABLE_ROOT / "cpu-local", d, dirs_exist_ok=True)
    rows = [dict(dtype=dt, direction=di, seq=s, head_dim=hd, bh=bh, tflops=v, source="synthetic")
            for dt in ("bf16", "fp32") for di in ("fwd", "bwd") for s in (256, 1024, 4096) for hd in (16, 64)
            for bh, v in rate_at_bh.items()]
    write_family(d, "attention", rows)
    write_meta(d, "cpu-local", "test", [])
    return Tables.load(d)


def test_cpu_core_attention_follows_the_bh_of_the_call(tmp_path):
    """tiny-moe (4 heads) at mbs 1 calls attention with bh 4, at mbs 8 with bh 32: same FLOPs per
    step, so core attention scales by the rate ratio of those two bh (2x here), and not at all
    when the table's rate does not depend on bh."""
    spec = load_model("tiny-moe")
    assert spec.num_attention_heads == 4
    w = Workload(spec, load_cluster("cpu-local", 1), 8, 1024)
    plans = [Plan(mbs=1), Plan(mbs=8)]

    def core(rates):
        t = _cpu_tables(tmp_path, rates)
        return predict_arrays(w, plans, tables=t, calibration=IDENTITY, detail=True)["breakdown_s"]["core_attention"]

    c = core({4: 0.01, 32: 0.005})
    assert c[1] / c[0] == pytest.approx(2.0, rel=1e-6)
    flat = core({4: 0.01, 32: 0.01})
    assert flat[1] / flat[0] == pytest.approx(1.0, rel=1e-6)
    assert flat[0] == pytest.approx(c[0], rel=1e-9)  # bh 4 is read at bh 4


def test_cpu_profile_points_sweep_bh_under_the_memory_cap():
    pts = attention.points(Ctx(device="cpu", sweep="full"))
    assert pts and all(p["id"].endswith(f"|{p['bh']}") for p in pts)
    assert len({p["id"] for p in pts}) == len(pts)
    # every bh of tiny-moe's CPU trials (2 or 4 heads per rank x mbs 1..8) is a grid point
    assert {p["bh"] for p in pts} == {2, 4, 8, 16, 32}
    assert all(p["bh"] * p["seq"] ** 2 * 4 <= attention.CPU_SCORE_CAP_BYTES for p in pts)
    cells = {(p["seq"], p["bh"]) for p in pts}
    assert (1024, 8) in cells and (1024, 4) in cells and (2048, 2) in cells and (512, 32) in cells
    # measured before the GEMM refinements: none at a level past CPU_MAX_LEVEL
    assert max(p["level"] for p in pts) <= attention.CPU_MAX_LEVEL
    assert (1024, 32) not in cells and (2048, 8) not in cells  # 128 MiB of scores
    small = attention.points(Ctx(device="cpu", sweep="small"))
    assert {p["bh"] for p in small} == {2, 8, 32} and (2048, 32) not in {(p["seq"], p["bh"]) for p in small}
    # GPU: one bh, the call's heads, so the GPU table's axis is inert
    gpu = attention.points(Ctx(device="cuda", sweep="small", extra={"attn_heads": 16}))
    assert {p["bh"] for p in gpu} == {16} and len(gpu) == 6


def test_cpu_measure_writes_the_bh_it_ran():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = attention.measure(dict(dtype="fp32", seq=64, head_dim=16, bh=2),
                                 Ctx(device="cpu", min_time_s=0.002, reps=1))
    finally:
        torch.set_num_threads(threads)
    assert {(r["dtype"], r["direction"]) for _, r in rows} == {(k, d) for k in ("bf16", "fp32") for d in ("fwd", "bwd")}
    assert all(f == "attention" and r["bh"] == 2 and r["seq"] == 64 and r["tflops"] > 0 for f, r in rows)


def _shipped(bh=32):
    return [dict(dtype="bf16", direction="fwd", seq=s, head_dim=hd, bh=bh, tflops=float(s) / 100, source="shipped-test")
            for s in (256, 1024, 4096) for hd in (64, 128)]


def test_merge_fills_unmeasured_cells_at_each_measured_bh_only():
    shipped = _shipped()
    # measured: (256, 64) at bh 4 at half the shipped rate, at bh 16 at a quarter; (1024, 64) at bh 4
    measured = [dict(dtype="bf16", direction="fwd", seq=256, head_dim=64, bh=4, tflops=1.28, source="measured:m"),
                dict(dtype="bf16", direction="fwd", seq=1024, head_dim=64, bh=4, tflops=5.12, source="measured:m"),
                dict(dtype="bf16", direction="fwd", seq=256, head_dim=64, bh=16, tflops=0.64, source="measured:m")]
    rows, notes = merge_with_shipped("attention", measured, shipped)
    assert {r["bh"] for r in rows} == {4, 16}  # the shipped bh 32 is no grid point
    cells = {(r["seq"], r["head_dim"], r["bh"]): r for r in rows}
    assert len(cells) == len(rows) == 2 * 6  # every (seq, head_dim) once per measured bh
    assert cells[(4096, 128, 4)]["tflops"] == pytest.approx(40.96 * 0.5)
    assert cells[(4096, 128, 16)]["tflops"] == pytest.approx(40.96 * 0.25)
    assert cells[(4096, 128, 16)]["source"].startswith("default x0.25: shipped-test")
    assert cells[(1024, 64, 16)]["source"].startswith("default x0.25")  # measured at bh 4 only
    assert cells[(1024, 64, 4)]["source"] == "measured:m"
    t = GridTable("attention", rows)
    assert np.exp(t.grids[("bf16", "fwd")][0][2]) == pytest.approx([4.0, 16.0])  # log-space bh axis
    assert float(t.lookup(("bf16", "fwd"), seq=4096, head_dim=128, bh=8)) == pytest.approx(40.96 * 0.5 ** 1.5)
    assert any("x0.5 at 4" in n and "x0.25 at 16" in n for n in notes)
    # shipped rows of an old table (no bh column) merge the same way
    old = [{k: v for k, v in r.items() if k != "bh"} for r in shipped]
    rows2, _ = merge_with_shipped("attention", measured, old)
    cells2 = {(r["seq"], r["head_dim"], r["bh"]): r["tflops"] for r in rows2}
    assert cells2 == pytest.approx({c: r["tflops"] for c, r in cells.items()}, rel=1e-9)


def test_profile_rows_from_before_the_bh_axis_are_ignored():
    """A resumed profile directory can hold partial attention rows without bh: they are dropped
    (said so), their points being measured again under bh-carrying ids."""
    stale = dict(dtype="fp32", direction="fwd", seq=256, head_dim=64, tflops=9.0, source="measured:old")
    new = dict(dtype="fp32", direction="fwd", seq=256, head_dim=64, bh=4, tflops=1.0, source="measured:new")
    fam, notes = build_family_rows("cpu-local", {"attention": [stale, new]})
    assert not any(r["source"] == "measured:old" for r in fam["attention"])
    assert any(r["source"] == "measured:new" for r in fam["attention"])
    assert any("1 partial rows without" in n for n in notes)
