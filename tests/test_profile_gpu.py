"""The GPU side of `moetune profile` and bench/gpu_check.sh: the device-independent logic runs
here on CPU (merging into the shipped grid, fp8 rows kept, grouped-GEMM table coordinates, the
collective world cap, the family report, the dry run of gpu_check.sh); the GPU timing paths run
only where CUDA is present and skip with the reason otherwise."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cost_model.tables import FAMILIES, TABLE_ROOT, Tables, read_rows, write_family, write_meta
from trials.profile import attention, collectives, grouped_mlp
from trials.profile.common import Ctx, timeit
from trials.profile.driver import build_family_rows, family_report, family_statistics, merge_with_shipped

REPO = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (runs on the GPU machine)")


def _grid(dtype, scale, ms=(16, 64, 256), nks=(64, 256)):
    return [dict(dtype=dtype, m=m, n=n, k=k, tflops=scale * m, source="shipped-test")
            for m in ms for n in nks for k in nks]


def test_merge_keeps_the_shipped_grid_and_scales_it_to_the_measured_level():
    shipped = _grid("bf16", 1.0) + _grid("fp8", 3.0)
    measured = [dict(dtype="bf16", m=m, n=64, k=64, tflops=0.5 * m, source="measured:gemm") for m in (16, 64)]
    rows, notes = merge_with_shipped("gemm", measured, shipped)
    bf = {(r["m"], r["n"], r["k"]): r for r in rows if r["dtype"] == "bf16"}
    # no shipped point is lost, measured points are as measured, the rest scaled by measured/shipped = 0.5
    assert {(r["m"], r["n"], r["k"]) for r in shipped if r["dtype"] == "bf16"} <= set(bf)
    assert bf[(16, 64, 64)]["source"] == "measured:gemm" and bf[(16, 64, 64)]["tflops"] == 8.0
    assert bf[(256, 256, 256)]["tflops"] == pytest.approx(128.0) and bf[(256, 256, 256)]["source"].startswith("default x0.5")
    # the fp8 key was not measured: its shipped rows stay as they are, and the notes say so
    f8 = [r for r in rows if r["dtype"] == "fp8"]
    assert len(f8) == len(_grid("fp8", 3.0)) and all(r["source"] == "default: shipped-test" for r in f8)
    assert any(n.startswith("gemm fp8: not measured here") for n in notes)


def test_merge_scales_each_unmeasured_cell_by_the_measurements_around_it_not_one_median():
    """Issue 27: the CPU runs its tiny GEMMs far below the shipped grid's shape and its wide ones
    above it; one median ratio over the points a budget reached set the level of the cells the
    model reads (the quickstart's 2048x256x256 GEMMs 0.4-1.0x apart over nine profiles). Each
    unmeasured cell now takes the ratio interpolated from the measured points around it."""
    shipped = _grid("bf16", 1.0, ms=(16, 64, 256, 1024, 4096), nks=(64, 256, 1024))
    # measured: ratio 0.25 at m 16 and 64 (three points, the median), 2.0 at m 4096 (two points)
    measured = ([dict(dtype="bf16", m=m, n=64, k=64, tflops=0.25 * m, source="measured:gemm") for m in (16, 64)]
                + [dict(dtype="bf16", m=64, n=1024, k=64, tflops=0.25 * 64, source="measured:gemm")]
                + [dict(dtype="bf16", m=4096, n=n, k=64, tflops=2.0 * 4096, source="measured:gemm") for n in (64, 1024)])
    rows, notes = merge_with_shipped("gemm", measured, shipped)
    bf = {(r["m"], r["n"], r["k"]): r for r in rows}
    # next to the wide measurements the cell takes their ratio, next to the narrow ones theirs
    assert bf[(4096, 256, 256)]["tflops"] == pytest.approx(2.0 * 4096)
    assert bf[(16, 256, 1024)]["tflops"] == pytest.approx(0.25 * 16)
    # between them, the log-space interpolation of the two (m 1024 is 2/3 of the way, in log m, from 64 to 4096)
    assert bf[(1024, 256, 256)]["tflops"] == pytest.approx(1024 * 0.25 * 8.0 ** (2 / 3), rel=1e-6)
    assert bf[(1024, 256, 256)]["source"].startswith("default x1")
    assert any("scaled x0.25..2" in n for n in notes)


def test_gpu_profile_without_fp8_keeps_shipped_fp8_rows_so_fp8_plans_keep_fp8_speed(tmp_path):
    """A GPU profile measuring bf16 only must not drop the shipped fp8 rows (the cost model then
    silently predicts fp8 plans at bf16 speed: `_Ops.any_fp8` needs gemm fp8 rows)."""
    shipped = read_rows(TABLE_ROOT / "h200-sxm" / "gemm.csv", "gemm")
    bf = [dict(r, source="measured:gemm", tflops=0.8 * float(r["tflops"])) for r in shipped
          if r["dtype"] == "bf16" and int(r["m"]) in (256, 4096) and int(r["n"]) == int(r["k"]) == 4096]
    gbf = [dict(dtype="bf16", groups=8, m=256, n=2048, k=2048, tflops=300.0, source="measured:grouped-mm/fwd")]
    fam, notes = build_family_rows("h200-sxm", {"gemm": bf, "grouped_gemm": gbf})
    for f in FAMILIES:
        write_family(tmp_path, f, fam[f])
    write_meta(tmp_path, "h200-sxm", "test", notes)
    t = Tables.load(tmp_path)
    assert t["gemm"].has("fp8") and t["grouped_gemm"].has("fp8")
    s_fp8 = [r for r in shipped if r["dtype"] == "fp8"]
    assert len([r for r in fam["gemm"] if r["dtype"] == "fp8"]) == len(s_fp8)
    assert t["gemm"].lookup("fp8", m=4096, n=4096, k=4096) == pytest.approx(
        next(float(r["tflops"]) for r in s_fp8 if (int(r["m"]), int(r["n"]), int(r["k"])) == (4096, 4096, 4096)), rel=1e-5)
    # the grouped grid keeps its shipped range (groups to 256, m from 16) around the one measured point
    g = fam["grouped_gemm"]
    assert max(int(r["groups"]) for r in g) == 256 and min(int(r["m"]) for r in g) == 16
    assert any("grouped_gemm fp8: not measured here" in n for n in notes)


def test_grouped_rows_land_where_the_cost_model_looks_them_up():
    ctx = Ctx(device="cpu", min_time_s=0.001, reps=1)
    rows = grouped_mlp.measure(dict(dtype="fp32", groups=2, m=16, n=32, k=64), ctx)
    by_op = {r["source"].split("/")[1]: r for f, r in rows if r["dtype"] == "bf16"}
    assert set(by_op) == {"fwd", "dgrad", "wgrad"} and all(f == "grouped_gemm" for f, _ in rows)
    assert all(r["source"].startswith("measured:sequential-mlp/") for _, r in rows)
    # fwd (m, n, k); dgrad (m, k, n); wgrad (k, n, m): tokens on the k axis of weight gradients
    assert [(by_op[o]["m"], by_op[o]["n"], by_op[o]["k"]) for o in ("fwd", "dgrad", "wgrad")] == \
        [(16, 32, 64), (16, 64, 32), (64, 32, 16)]
    assert all(r["tflops"] > 0 and r["groups"] == 2 for r in by_op.values())


def test_gpu_grouped_sweep_covers_the_lookup_range():
    full = grouped_mlp.GPU["full"]
    assert max(full["groups"]) == 256 and min(full["m"]) <= 16
    # weight gradients put the per-expert tokens on k: the smallest swept m becomes a measured k
    assert grouped_mlp.table_coords("wgrad", min(full["m"]), 1024, 2048)[2] == min(full["m"])
    assert grouped_mlp._fits(256, 16, 2048, 2048, True) and not grouped_mlp._fits(256, 8192, 8192, 8192, True)


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")
def test_grouped_mm_backend_layouts_compute_fwd_dgrad_wgrad():
    """The GPU stand-in backend's operand layouts, run through torch._grouped_mm on this device
    (its CPU kernel takes the same arguments): equal to the per-expert loop."""
    torch.manual_seed(0)
    a = grouped_mlp._torch_calls("grouped-mm", 3, 16, 32, 48, torch.float32, "cpu")
    torch.manual_seed(0)
    b = grouped_mlp._torch_calls("sequential-loop", 3, 16, 32, 48, torch.float32, "cpu")
    assert torch.allclose(a["fwd"](), b["fwd"]()) and a["fwd"]().shape == (48, 32)
    assert torch.allclose(a["dgrad"](), b["dgrad"]()) and a["dgrad"]().shape == (48, 48)
    assert torch.allclose(a["wgrad"](), torch.stack(b["wgrad"]()).transpose(-2, -1), atol=1e-5)


def test_fp8_gemm_call_and_sdpa_backend_choice_on_this_device():
    from trials.profile.gemm import fp8_call
    # torch 2.13's CPU build has the fp8 _scaled_mm kernel: a RuntimeError here is our call's bug,
    # not a missing feature, so it fails (it was a skip, which hid one)
    y = fp8_call(32, 64, 48, "cpu")()
    assert y.shape == (32, 64) and y.dtype == torch.bfloat16
    name, _ = attention.pick_sdpa_backend((2, 4, 64, 32), torch.float32, "cpu", ("cudnn", "math"))
    assert name == "math"  # cudnn cannot run on CPU: the next one, named
    with pytest.raises(RuntimeError, match="no SDPA backend runs this shape: cudnn"):
        attention.pick_sdpa_backend((2, 4, 64, 32), torch.float32, "cpu", ("cudnn",))


def test_attention_gpu_shape_uses_micro_batch_batch_and_heads():
    ctx = Ctx(device="cuda", extra={"attn_heads": 16})
    assert attention.gpu_shape(512, 128, ctx) == (16, 16, 512, 128)
    assert attention.gpu_shape(16384, 128, ctx) == (1, 16, 16384, 128)
    assert attention.gpu_shape(2048, 64, Ctx(device="cuda")) == (4, attention.GPU_HEADS, 2048, 64)


def test_collectives_never_put_two_ranks_on_one_gpu():
    gpu = Ctx(device="cuda")
    assert collectives.world_for(gpu, 4, visible_gpus=1) == 1
    why = collectives.skip_reason(gpu, 2, visible_gpus=1)
    assert why and "NCCL" in why and "one rank per GPU" in why
    assert collectives.world_for(gpu, 4, visible_gpus=2) == 2 and collectives.skip_reason(gpu, 4, visible_gpus=2) is None
    assert "2 devices" in collectives.skip_reason(Ctx(device="cpu"), 1)


def test_family_report_names_why_each_family_is_missing():
    fam = {f: [dict(source="default: x")] for f in FAMILIES}
    fam["gemm"] = [dict(source="measured:gemm")]
    info = {"skipped": ["collectives: world size 1: ...", "gemm fp8: sm80 ..."], "errors": ["attention a|1: boom"],
            "points_by_runner": {"gemm": [3, 9], "attention": [0, 4], "grouped_mlp": [0, 5], "elementwise": [0, 2],
                                 "cross_entropy": [0, 1], "dispatch_gap": [0, 2]}}
    rep = family_report(fam, info)
    nm = rep["not_measured"]
    assert rep["measured"] == ["gemm"] and set(nm) == set(FAMILIES) - {"gemm"}
    assert nm["collectives"].startswith("skipped: collectives:") and nm["ep_dispatch"].startswith("skipped: collectives:")
    assert "boom" in nm["attention"] and nm["grouped_gemm"].startswith("budget reached")
    st = family_statistics(Ctx(device="cpu").statistic)
    assert set(st) == set(FAMILIES) and "minimum" in st["gemm"]
    assert "median" in Ctx(device="cuda").statistic and "L2 flushed" in Ctx(device="cuda").statistic


def test_cpu_timeit_keeps_the_minimum_batch(monkeypatch):
    """A scripted clock (no dependence on this host's speed): warm-up and sizing calls take 1 s,
    then three 1-call batches take 3, 1 and 2 s: the minimum (1 s) is kept, not the median."""
    from trials.profile import common
    clock = [0.0]
    costs = iter([1.0, 1.0, 3.0, 1.0, 2.0])

    def fn():
        clock[0] += next(costs)
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock[0])
    assert timeit(fn, Ctx(device="cpu", min_time_s=0.5, reps=3)) == 1.0


@pytest.mark.slow
def test_gpu_check_dry_run_reports_every_step(tmp_path):
    out = tmp_path / "gc"
    env = dict(os.environ, GPU_CHECK_TOTAL_S="300", GPU_CHECK_PROFILE_MIN="0.5")
    r = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    env_json = json.loads((out / "env.json").read_text())
    assert "torch" in env_json and "modules" in env_json
    lines = summary.splitlines()
    assert any(x.startswith("RAN step0 environment: rc=0") for x in lines)
    for step in ("step1", "step2", "step3", "step4", "step5", "step6", "step7"):
        ran = [x for x in lines if x.startswith(f"RAN {step}")]
        skip = [x for x in lines if x.startswith(f"SKIP {step}")]
        assert ran or skip, (step, summary)
        assert all(len(x.split(":", 1)[1].strip()) > 5 for x in skip), skip  # a skip gives its reason
        if not CUDA:
            assert skip and not ran and "no CUDA" in skip[0]
    assert set(os.listdir(out)) >= {"summary.txt", "env.json", "step0_env.log"}


@pytest.mark.slow
def test_compare_script_reads_the_gpu_check_folder(tmp_path):
    """Plumbing of bench/gpu_check_compare.py on a hand-made gpu_check folder: the measured tables
    here are a copy of the shipped ones, so both predictions must agree."""
    out = tmp_path / "gc"
    out.mkdir()
    shutil.copytree(TABLE_ROOT / "h200-sxm", out / "tables")
    w = dict(model="bench/gpu_check_olmoe2.yaml", cluster="h200-sxm", gpus=1, gbs=8, seq=2048, stack="gpu-plain",
             plan="gg=0")
    (out / "step2_olmoe2.json").write_text(json.dumps(dict(ok=True, step_time_s=0.2, peak_memory_gib=[20.0],
                                                           workload=w)))
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import gpu_check_compare
    finally:
        sys.path.remove(str(REPO / "bench"))
    res = gpu_check_compare.compare(out)
    p = res["predictions"]
    assert set(p) == {"shipped", "measured (step 3)"}, p
    a, b = p["shipped"], p["measured (step 3)"]
    assert a["raw_step_time_s"] == b["raw_step_time_s"] and a["tables_digest"] == b["tables_digest"]
    assert a["raw_over_measured"] == pytest.approx(a["raw_step_time_s"] / 0.2)
    assert a["memory_over_measured"] == pytest.approx(a["peak_memory_gib"] / 20.0)


# ---- on a GPU ----------------------------------------------------------------------------------
@needs_cuda
def test_gpu_events_timing_flush_and_fp8_rows():
    from trials.profile import gemm
    from trials.profile.common import fp8_skip_reason, l2_bytes
    ctx = Ctx(device="cuda", min_time_s=0.005, reps=2, sustain_s=0.2)
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    t_flush = timeit(lambda: a @ a, ctx)
    t_hot = timeit(lambda: a @ a, ctx, flush=False)
    assert 0 < t_hot and 0 < t_flush and l2_bytes("cuda") > 2 ** 20
    rows = gemm.measure(dict(dtype="bf16", m=256, n=1024, k=1024), ctx)
    assert rows[0][1]["source"] == "measured:gemm" and rows[0][1]["tflops"] > 0
    if fp8_skip_reason(ctx) is None:
        rows = gemm.measure(dict(dtype="fp8", m=256, n=1024, k=1024), ctx)
        assert rows[0][1]["dtype"] == "fp8" and rows[0][1]["source"] == "measured:scaled-mm-fp8"


@needs_cuda
def test_gpu_grouped_and_attention_record_their_backend():
    ctx = Ctx(device="cuda", min_time_s=0.005, reps=2, extra={"attn_heads": 16})
    be = grouped_mlp.backend(ctx)
    rows = grouped_mlp.measure(dict(dtype="bf16", groups=4, m=64, n=512, k=256), ctx)
    assert {r["source"] for _, r in rows} == {f"measured:{be}/{op}" for op in grouped_mlp.OPS}
    rows = attention.measure(dict(dtype="bf16", seq=1024, head_dim=128), ctx)
    assert all(r["source"].startswith("measured:sdpa-") and "b8xh16" in r["source"] for _, r in rows)


def test_collectives_the_profile_did_not_reach_keep_their_shipped_rows():
    # a budget that ran out after all_reduce: send_recv (pipeline P2P) must still be priceable
    from cost_model.tables import TABLE_ROOT, read_rows
    shipped = read_rows(TABLE_ROOT / "cpu-local" / "collectives.csv", "collectives")
    measured = [dict(r, source="measured:collectives (test)", layout="contiguous")
                for r in shipped if r["collective"] == "all_reduce" and r["scope"] == "scaleup"]
    fam, notes = build_family_rows("cpu-local", {"collectives": measured})
    kinds = {(r["collective"], r["scope"]) for r in fam["collectives"]}
    assert ("send_recv", "scaleup") in kinds and ("all_to_all", "scaleout") in kinds
    sr = [r for r in fam["collectives"] if r["collective"] == "send_recv"]
    assert sr and all(str(r["source"]).startswith("default:") for r in sr)
    ar = [r for r in fam["collectives"] if r["collective"] == "all_reduce" and r["scope"] == "scaleup"]
    assert ar and all(str(r["source"]).startswith("measured") for r in ar)
    assert any("send_recv/scaleup: not measured" in n for n in notes)


def test_attention_backward_is_timed_alone_on_cpu():
    """The backward row is timed on its own (retained graph), so its rate is that of the backward
    kernels: within a small factor of the forward's, never the 100-1000x a difference of two
    noisy timings gave on a loaded host."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the profile's runners do (trials.profile.common.pin_to_core)
    try:
        rows = attention.measure(dict(dtype="fp32", seq=128, head_dim=16, bh=8), Ctx(device="cpu", min_time_s=0.02))
    finally:
        torch.set_num_threads(threads)
    rate = {r["direction"]: r["tflops"] for fam, r in rows if r["dtype"] == "fp32"}
    assert set(rate) == {"fwd", "bwd"} and all(v > 0 for v in rate.values())
    assert 0.05 < rate["bwd"] / rate["fwd"] < 20, rate  # the difference-of-timings bug gave ~1000
