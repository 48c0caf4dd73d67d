"""Weave's (c, K) model, its sourced defaults, tables and calibration (kernels/weave.py,
kernels/calibrate.py, kernels/tables.py, kernels/store.py)."""
import json
from pathlib import Path

import numpy as np
import pytest

from kernels import calibrate, store, tables
from kernels.weave import (
    DEFAULT_CURVES_FILE,
    K_CHOICES,
    LayerShape,
    default_curves,
    grid,
    layer_times,
    moe_layer_time,
    n_steal,
    select,
    tile_flops,
    volumes,
)
from specs.errors import InputError
from specs.models import load_model

DSV2_LITE = LayerShape.from_model(load_model("deepseek-v2-lite"))


def test_paper_case_deepseek_v2_lite_on_4_h100():
    """Weave section 3.3 / Figure 9(b): DSv2-Lite, 8192 tokens, 4x H100, EP 4 -> c* = 40, K* = 4,
    1.365 ms measured. Our defaults are only values derived from the paper's figures and the
    catalog (kernels/data/weave_curves_default.json)."""
    cu = default_curves("h100-sxm")
    assert cu.sm_count == 132
    s = select(DSV2_LITE, 8192, 4, 1.0, cu)
    assert (s["c"], s["K"]) == (40, 4)
    # The paper's own model-vs-measured selection gap is 8.2% (section 5.5); ours is ~5%.
    assert abs(s["predicted_ms"] - 1.365) / 1.365 < 0.082, s


def test_shipped_defaults_are_rederived_from_the_paper_figures():
    """The default curve file is the output of `kernels.calibrate.derive_defaults()` on the
    transcribed figures: nothing in it was hand-tuned."""
    shipped = json.loads(DEFAULT_CURVES_FILE.read_text())
    derived = calibrate.derive_defaults()
    for name, entry in derived["kinds"]["h100-sxm"].items():
        assert shipped["kinds"]["h100-sxm"][name]["value"] == pytest.approx(entry["value"], rel=2e-2, abs=1e-3), name
        assert shipped["kinds"]["h100-sxm"][name]["source"]


def test_selection_gap_against_the_paper_grid():
    """Measured latency at the model's choice vs the measured optimum of the Figure 9(b) grid."""
    case = calibrate.paper_grid_case()
    cu = default_curves("h100-sxm")
    pred = calibrate.predict_case(case, cu)
    meas = np.array([p["ms"] for p in case.points])
    chosen = int(np.argmin(pred))
    gap = meas[chosen] / meas.min() - 1
    assert gap == 0.0  # the model's argmin over the measured points is the measured optimum
    assert np.sqrt(np.mean(np.log(pred / meas) ** 2)) < 0.1


def test_volumes_follow_eqs_1_to_3():
    v = volumes(DSV2_LITE, 8192, 4, 1.0)
    assert v["X_local"] == pytest.approx(8192 * 6 / 4)
    assert v["X_in"] == pytest.approx(3 * 8192 * 6 / 4)
    # Hypergeometric: P(no pick among 16 of 64 experts with 6 picks) = C(48,6)/C(64,6).
    from math import comb
    assert v["X_in_uniq"] == pytest.approx(3 * 8192 * (1 - comb(48, 6) / comb(64, 6)))
    assert v["W_dispatch"] == pytest.approx(v["X_in_uniq"] * 2 * 2048)
    assert v["W_combine"] == pytest.approx(v["X_in"] * 2 * 2048)
    assert v["W_comp"] == pytest.approx((v["X_local"] + v["X_in"]) * 6 * 2048 * 1408)
    hot = volumes(DSV2_LITE, 8192, 4, 1.5)
    assert hot["W_comp"] == pytest.approx(1.5 * v["W_comp"])
    assert v["X_in_uniq"] < hot["X_in_uniq"] < 1.5 * v["X_in_uniq"] + 1e-6


def test_grid_and_vectorised_choice_agree():
    cu = default_curves("h100-sxm")
    g = grid(DSV2_LITE, 4096, 4, 1.2, cu)
    assert {r["K"] for r in g} == set(K_CHOICES)
    assert all(r["c"] % cu.c_step == 0 and 0 < r["c"] < 132 for r in g)
    best = min(g, key=lambda r: r["predicted_ms"])
    c, k, ns, ms = moe_layer_time(DSV2_LITE, np.array([4096.0, 8192.0]), 4, np.array([1.2, 1.0]), cu)
    assert (c[0], k[0], ns[0]) == (best["c"], best["K"], best["n_steal"])
    assert ms[0] == pytest.approx(best["predicted_ms"])
    assert (c[1], k[1]) == (40, 4)
    # T_total is max(T_comp + T_tail, T_comm) at every point
    vol = volumes(DSV2_LITE, 4096, 4, 1.2)
    t = layer_times(vol, cu, 56.0, 2.0)
    assert t["T_total"] == pytest.approx(max(t["T_comp"] + t["T_tail"], t["T_comm"]))


def test_n_steal_follows_eqs_13_14():
    cu = default_curves("a100-sxm-80g")  # compute-bound there: tiles are left to steal
    vol = volumes(DSV2_LITE, 8192, 4, 1.0)
    c = 24.0
    t_comm = (vol["W_dispatch"] + vol["W_combine"]) / (cu.bw(c) * 1e9)
    w_steal = max(0.0, vol["W_comp"] - t_comm * cu.tflops(cu.sm_count - c) * 1e12)
    expect = int(w_steal // (cu.sm_count * tile_flops(DSV2_LITE, cu.block_m, cu.block_n)))
    assert expect > 0
    assert int(n_steal(vol, cu, DSV2_LITE, c)) == expect
    assert "catalog bf16 peak ratio" in cu.sources["tflops_max"]


def test_bad_input_is_an_input_error():
    with pytest.raises(InputError):
        volumes(DSV2_LITE, 8192, 3, 1.0)
    with pytest.raises(InputError):
        volumes(DSV2_LITE, 8192, 4, 0.5)
    with pytest.raises(InputError):
        default_curves("cpu-local")


def _truth(cu):
    return cu.with_params(tflops_max=560.0, tflops_beta=0.7, bw_max=300.0, bw_c0=30.0, eff_g=0.06,
                          eff_p=1.0, alpha=0.4)


def _synthetic_cases(truth):
    qwen = LayerShape(128, 8, 2048, 768, "qwen3-30b-like")
    cases = []
    for shape, tokens, ep, skew in ((DSV2_LITE, 8192, 4, 1.0), (DSV2_LITE, 4096, 4, 1.3), (qwen, 8192, 8, 1.0)):
        case = calibrate.GridCase(shape, tokens, ep, skew, [])
        pts = [{"c": c, "K": k} for c in range(8, 132, 8) for k in K_CHOICES]
        case = calibrate.GridCase(shape, tokens, ep, skew, pts)
        ms = calibrate.predict_case(case, truth)
        cases.append(calibrate.GridCase(shape, tokens, ep, skew,
                                        [dict(p, ms=float(m)) for p, m in zip(pts, ms)]))
    return cases


def test_calibration_recovers_a_known_curve_set_and_tables_follow(monkeypatch, tmp_path):
    # its grids, fitted curves and tables go to a home of its own, never the run's shared one
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    default = default_curves("h100-sxm")
    truth = _truth(default)
    cases = _synthetic_cases(truth)
    for case in cases:
        store.save_grid("h100-sxm", calibrate.case_to_dict(case), case.points, source="synthetic ground truth")
    before = tables.build_weave_table(DSV2_LITE, 4, 1.0, default)
    rep = calibrate.refit_kind("h100-sxm")
    assert rep["fit"]["rms_log_error"] < 1e-3
    fitted = rep["fit"]["fitted"]
    for name, v in truth.params().items():
        assert fitted[name] == pytest.approx(v, rel=0.03, abs=0.01), name
    # load_curves now prefers the fit, and the regenerated tables follow the new curves.
    from kernels.weave import load_curves
    assert load_curves("h100-sxm").bw_max == pytest.approx(300.0, rel=0.03)
    name = tables.weave_table_name(DSV2_LITE, 4, 1.0, tables.device_name("h100-sxm"))
    assert any(p.endswith(name) for p in rep["tables"])
    after = tables.read_table(store.tables_dir("h100-sxm") / name)
    expect = tables.build_weave_table(DSV2_LITE, 4, 1.0, truth)
    assert (after["8192"]["c"], after["8192"]["K"]) == (expect["8192"]["c"], expect["8192"]["K"])
    assert (after["8192"]["c"], after["8192"]["K"]) != (before["8192"]["c"], before["8192"]["K"])
    assert tables.lookup_weave("h100-sxm", DSV2_LITE, 4, 1.0, 7000) == after["8192"]
    store.fitted_curves_path("h100-sxm").unlink()


def test_tampered_grid_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    case = _synthetic_cases(_truth(default_curves("h100-sxm")))[0]
    p = store.save_grid("h100-sxm", calibrate.case_to_dict(case), case.points, source="synthetic")
    d = json.loads(p.read_text())
    d["points"][0]["ms"] *= 2
    p.write_text(json.dumps(d))
    assert [g["intact"] for g in store.load_grids("h100-sxm")] == [False]
    with pytest.raises(InputError):
        calibrate.refit_kind("h100-sxm")


def test_table_names_and_nearest_lookup():
    dev = tables.device_name("h100-sxm")
    assert dev == "NVIDIA_H100_80GB_HBM3"
    assert tables.weave_table_name(DSV2_LITE, 4, 1.0, dev) == \
        "E=64,N=1408,device_name=NVIDIA_H100_80GB_HBM3,weave_ep=4,skew=1.json"
    t = {"256": {"c": 1}, "4096": {"c": 2}, "_meta": {}}
    assert tables.nearest(t, 100)["c"] == 1 and tables.nearest(t, 3000)["c"] == 2


def test_block_table_name_and_folder_are_sglangs(tmp_path):
    """The block table's file name is what SGLang 0.5.23's own `get_config_file_name` builds, and
    its folder is the configs/triton_X_Y_Z one `get_moe_configs` reads. The installed sglang cannot
    be imported here (no transformers), so its function is taken from its source file."""
    import ast
    import importlib.util
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang is not installed")
    src_path = Path(spec.origin).parent / "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"
    src = src_path.read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "get_config_file_name")
    from typing import Optional
    ns = {"Optional": Optional, "get_device_name": lambda: "NVIDIA H100 80GB HBM3"}
    fn.decorator_list = []
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(src_path), "exec"), ns)  # noqa: S102
    ours = tables.sglang_config_path(tmp_path, 64, 1408, "NVIDIA_H100_80GB_HBM3", "3.9.0")
    assert ours.name == ns["get_config_file_name"](64, 1408, None)
    assert 'version_dir = f"triton_{triton_version.replace(\'.\', \'_\')}"' in src
    assert '"configs",\n        version_dir,' in src
    assert ours.parent == tmp_path / "configs" / "triton_3_9_0"
    tables.write_block_table(ours, {1: tables.default_block_config(1, 64, 6)})
    # SGLang's loader: {int(key): val for key, val in json.load(f).items()}
    assert {int(k): v for k, v in json.loads(ours.read_text()).items()} == {1: tables.default_block_config(1, 64, 6)}

@pytest.mark.slow
def test_measurement_job_end_to_end_with_a_stand_in_timer(tmp_path, monkeypatch):
    """Real Ray, two actors sharing the sweep, a stand-in timer following known curves (with 1%
    noise): grids kept with provenance, the refit lands near the truth, tables regenerated."""
    from kernels import measure
    from trials.ray_runtime import ray_session
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    truth = _truth(default_curves("h100-sxm"))
    cases = measure.cases_for(DSV2_LITE, [4096, 8192], 4, skews=(1.0, 1.3))
    with ray_session(num_cpus=1):
        rep = measure.run_job("h100-sxm", cases, timer="stand-in", workers=2,
                              timer_args={"truth": truth.to_dict(), "noise": 0.01})
    assert rep["workers"] == 2 and len(rep["grids"]) == 4
    grids = store.load_grids("h100-sxm")
    assert all(g["intact"] for g in grids)
    assert all(len(g["points"]) == 15 * len(K_CHOICES) for g in grids)
    assert "stand-in" in grids[0]["provenance"]["source"]
    fitted = rep["refit"]["fit"]["fitted"]
    for name in ("tflops_max", "bw_max", "bw_c0", "alpha"):
        assert fitted[name] == pytest.approx(truth.params()[name], rel=0.15, abs=0.05), name
    c, k, _, _ = moe_layer_time(DSV2_LITE, 8192, 4, 1.0, truth)
    table = tables.read_table(rep["refit"]["tables"][0])
    assert (table["8192"]["c"], table["8192"]["K"]) == (int(c), int(k))


def _cli(capsys, *argv):
    from tuner.cli import main
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_grid_select_tables(capsys):
    base = ("--model", "deepseek-v2-lite", "--cluster", "h100-sxm", "--ep", "4", "--tokens", "8192")
    rc, out, _ = _cli(capsys, "kernels", "grid", *base, "--json")
    rows = json.loads(out)
    assert rc == 0 and set(rows[0]) == {"c", "K", "n_steal", "predicted_ms"}
    assert len(rows) == len(default_curves("h100-sxm").c_grid()) * len(K_CHOICES)
    rc, out, _ = _cli(capsys, "kernels", "select", *base, "--json")
    s = json.loads(out)
    assert rc == 0 and min(rows, key=lambda r: r["predicted_ms"])["c"] == s["c"]
    rc, out, _ = _cli(capsys, "kernels", "tables", "--cluster", "h100-sxm", "--json")
    assert rc == 0 and json.loads(out)[0]["kind"] == "h100-sxm"


@pytest.mark.parametrize("argv", [
    ("kernels", "grid", "--model", "deepseek-v2-lite", "--cluster", "h100-sxm", "--ep", "3", "--tokens", "8"),
    ("kernels", "select", "--model", "deepseek-v2-lite", "--cluster", "cpu-local", "--ep", "4", "--tokens", "8"),
    ("kernels", "select", "--model", "no-such-model", "--cluster", "h100-sxm", "--ep", "4", "--tokens", "8"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, argv):
    rc, out, err = _cli(capsys, *argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1


def test_cli_tune_without_gpu_exits_2(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    rc, _, err = _cli(capsys, "kernels", "tune", "--cluster", "h100-sxm")
    assert rc == 2 and "--stand-in" in err and len(err.strip().splitlines()) == 1


def test_one_gpu_grids_calibrate_the_compute_side_only(tmp_path, monkeypatch):
    """EP 1 grids (what the one-GPU timer measures) have no cross-GPU traffic: the refit moves
    TFLOPS(n) and eff_chunk(K) to the truth and leaves BW(c) and alpha at their defaults."""
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    default = default_curves("h100-sxm")
    truth = _truth(default)
    pts = [{"c": c, "K": k} for c in range(8, 132, 8) for k in K_CHOICES]
    for tokens in (2048, 8192):
        case = calibrate.GridCase(DSV2_LITE, tokens, 1, 1.0, pts)
        ms = calibrate.predict_case(case, truth)
        store.save_grid("h100-sxm", calibrate.case_to_dict(case), [dict(p, ms=float(m)) for p, m in zip(pts, ms)],
                        source="synthetic one-GPU ground truth")
    rep = calibrate.refit_kind("h100-sxm", write_tables=False)
    fitted = rep["fit"]["fitted"]
    assert set(rep["fit"]["free"]) == set(calibrate.COMPUTE_PARAMS)
    for name in calibrate.COMPUTE_PARAMS:
        assert fitted[name] == pytest.approx(truth.params()[name], rel=0.03), name
    for name in ("bw_max", "bw_c0", "alpha"):
        assert fitted[name] == default.params()[name]


def test_whatif_against_a_baseline_and_the_serial_schedule():
    from kernels.weave import megakernel_whatif, serial_layer_time
    cu = default_curves("h100-sxm")
    serial = serial_layer_time(DSV2_LITE, np.array([2048.0, 8192.0]), 4, 1.0, cu)
    w = megakernel_whatif(DSV2_LITE, np.array([2048.0, 8192.0]), 4, 1.0, serial, cu)
    assert np.all(w["weave_ms"] < serial) and np.all((w["saving"] > 0) & (w["saving"] < 1))
    # A baseline already faster than the megakernel gets no saving, never a negative one.
    w = megakernel_whatif(DSV2_LITE, 8192, 4, 1.0, 0.5, cu)
    assert float(w["saving"]) == 0.0


def test_paper_optimum_is_predicted_without_being_fitted():
    """Less circular than the defaults test: refit the Figure 9(b) grid *without* its optimum
    (c 40, K 4, 1.365 ms); the model still selects c* = 40, K* = 4 over the full search grid."""
    case = calibrate.paper_grid_case()
    held_out = [p for p in case.points if (p["c"], p["K"]) != (40, 4)]
    start = default_curves("h100-sxm").with_params(tflops_max=700.0, tflops_beta=0.8, bw_max=360.0, bw_c0=40.0,
                                                   alpha=0.5)
    fitted, _ = calibrate.fit_curves([calibrate.GridCase(case.shape, case.tokens, case.ep, case.skew, held_out)],
                                     start, free=("tflops_max", "tflops_beta", "bw_max", "bw_c0", "alpha"),
                                     caps={"tflops_max": 989.0, "bw_max": 450.0})
    s = select(DSV2_LITE, 8192, 4, 1.0, fitted)
    assert (s["c"], s["K"]) == (40, 4)
    assert abs(s["predicted_ms"] - 1.365) / 1.365 < 0.1


def test_sglang_block_table_for_a_serving_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    rel, table, src = tables.sglang_block_table_for(DSV2_LITE, "h100-sxm", tp=4, ep=4, triton_version="3.9.0")
    assert rel == "configs/triton_3_9_0/E=16,N=1408,device_name=NVIDIA_H100_80GB_HBM3.json"
    assert "default" in src and set(table[4096]) == set(tables.BLOCK_KEYS)
    measured = {1: tables.default_block_config(1, 16, 6), 4096: dict(tables.default_block_config(4096, 16, 6), num_warps=8)}
    tables.write_block_table(store.kind_dir("h100-sxm") / "sglang" / rel, measured)
    rel2, table2, src2 = tables.sglang_block_table_for(DSV2_LITE, "h100-sxm", tp=4, ep=4, triton_version="3.9.0")
    assert rel2 == rel and src2.startswith("measured") and table2[4096]["num_warps"] == 8
    with pytest.raises(InputError):
        tables.sglang_block_table_for(DSV2_LITE, "h100-sxm", tp=2, ep=4)
