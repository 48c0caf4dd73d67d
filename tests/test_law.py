"""The MOSAIC scaling law (cost_model.law) and `moetune law fit`.

Synthetic runs are drawn over the paper's scaling grid (App. C.1 ranges) from known coefficients
(the shipped default law: the paper's eta and beta, placeholders elsewhere) with Gaussian noise
near the paper's held-out RMSE; the fit must recover eta and beta and must flag the coefficients
the data cannot separate as ridge.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from cost_model.law import (
    NAMES,
    RunsError,
    bootstrap_ci,
    default_law,
    fit,
    heldout_mask,
    identifiability,
    load_law,
    make_runs,
    predict_loss,
    read_runs_csv,
    synthetic_runs,
)
from tuner.cli import main

TRUE = default_law().coefficients
PER_G_HELDOUT_RMSE = 0.0037  # paper §4.1: per-G held-out RMSE up to 0.0037
JOINT_HELDOUT_RMSE = 0.00779  # paper §4.2


def test_default_law_labels_published_and_placeholder_values():
    law = default_law()
    assert law.coefficients["eta"] == pytest.approx(0.95)
    assert law.coefficients["beta"] == pytest.approx(0.207)
    assert law.provenance["eta"].startswith("published")
    assert law.provenance["beta"].startswith("published")
    for k in set(NAMES) - {"eta", "beta"}:
        assert law.provenance[k].startswith("placeholder"), k
    # anchors the placeholders were set to (paper §4.2 e + c ~ 0.50; §7.3.1 optimum loss 1.3898)
    assert law.coefficients["e"] + law.coefficients["c"] == pytest.approx(0.50, abs=0.01)
    assert float(law.loss(327.2e9, 0.956, 1.23e23 / (6 * 14.5e9), 4)) == pytest.approx(1.3898, abs=2e-3)


def test_law_shape_is_monotone_as_the_paper_states():
    n = np.array([1e9, 1e10, 1e11])
    assert np.all(np.diff(predict_loss(TRUE, n, 0.9, 1e11, 4)) < 0)  # decreasing in N_tot
    assert np.all(np.diff(predict_loss(TRUE, 1e10, 0.9, n * 10, 4)) < 0)  # in D
    assert np.all(np.diff(predict_loss(TRUE, 1e10, 0.9, 1e11, np.array([1, 2, 4, 8]))) < 0)  # in G
    assert np.all(np.diff(predict_loss(TRUE, 1e10, np.array([0.5, 0.9, 0.99]), 1e11, 4)) > 0)  # S penalty


def test_heldout_is_top_tenth_by_n_act_within_each_g():
    runs = synthetic_runs(TRUE, n=120, seed=5)
    hold = heldout_mask(runs)
    for g in np.unique(runs.g):
        m = runs.g == g
        k = int(np.floor(0.1 * m.sum() + 0.5))
        assert hold[m].sum() == k
        if k:
            assert runs.n_act[m & hold].min() >= runs.n_act[m & ~hold].max()


def test_fit_recovers_eta_beta_and_flags_the_ridge():
    runs = synthetic_runs(TRUE, n=150, noise=PER_G_HELDOUT_RMSE, seed=2)
    f = fit(runs, starts=6, seed=2)
    assert f.coefficients["eta"] == pytest.approx(TRUE["eta"], rel=0.03)
    assert f.coefficients["beta"] == pytest.approx(TRUE["beta"], rel=0.03)
    # the held-out extrapolation error is at the noise level
    assert f.heldout_rmse < 2 * PER_G_HELDOUT_RMSE
    ident = identifiability(runs, f, restarts=12, seed=3)
    assert ident["status"]["eta"] == "identified"
    assert ident["status"]["beta"] == "identified"
    # the stand-alone sparsity floor c (1-S)^-lambda trades against e (and lambda) at S <= 0.981:
    # the data fix c + e, not the split (paper App. B.2 'Identifiability caveats')
    for k in ("c", "lambda", "e"):
        assert ident["status"][k] == "ridge", k
    assert ident["n_indistinguishable"] >= 2


def test_fit_at_the_joint_heldout_noise_still_finds_eta_and_beta():
    runs = synthetic_runs(TRUE, n=300, noise=JOINT_HELDOUT_RMSE, seed=0)
    f = fit(runs, starts=4, seed=0)
    assert f.coefficients["eta"] == pytest.approx(TRUE["eta"], rel=0.03)
    assert f.coefficients["beta"] == pytest.approx(TRUE["beta"], rel=0.05)
    assert f.heldout_rmse == pytest.approx(JOINT_HELDOUT_RMSE, rel=0.5)


def test_bootstrap_bca_interval_covers_truth_for_eta():
    runs = synthetic_runs(TRUE, n=150, noise=PER_G_HELDOUT_RMSE, seed=2)
    f = fit(runs, starts=4, seed=2)
    ci = bootstrap_ci(runs, f, reps=40, jackknife=False)
    lo, hi = ci["eta"]
    assert lo <= f.coefficients["eta"] <= hi
    assert lo < TRUE["eta"] * 1.03 and hi > TRUE["eta"] * 0.97
    assert hi - lo < 0.2


def _write_csv(path, rows, header="n_tot,n_act,s,g,d,loss"):
    path.write_text(header + "\n" + "\n".join(",".join(str(x) for x in r) for r in rows) + "\n")


def _good_rows(n=40, seed=1):
    r = synthetic_runs(TRUE, n=n, noise=0.002, seed=seed)
    return [(r.n_tot[i], r.n_act[i], r.s[i], r.g[i], r.d[i], r.loss[i]) for i in range(n)]


@pytest.mark.parametrize("mutate, needle", [
    (lambda rows: rows.__setitem__(3, (-1.0,) + rows[3][1:]), "line 5: n_tot must be a positive"),
    (lambda rows: rows.__setitem__(0, rows[0][:2] + (1.0,) + rows[0][3:]), "line 2: s must be in [0, 1)"),
    (lambda rows: rows.__setitem__(1, rows[1][:2] + (-0.1,) + rows[1][3:]), "line 3: s must be in [0, 1)"),
    (lambda rows: rows.__setitem__(2, rows[2][:4] + (0,) + rows[2][5:]), "line 4: d must be a positive"),
    (lambda rows: rows.__setitem__(6, rows[6][:3] + ("four",) + rows[6][4:]), "line 8: g 'four' is not a number"),
])
def test_bad_rows_are_named_and_refused(tmp_path, capsys, mutate, needle):
    rows = _good_rows()
    mutate(rows)
    csv = tmp_path / "runs.csv"
    _write_csv(csv, rows)
    with pytest.raises(RunsError, match=needle.replace("[", r"\[").replace(")", r"\)").replace("(", r"\(")):
        read_runs_csv(csv)
    out = tmp_path / "law.json"
    rc = main(["law", "fit", "--runs", str(csv), "--out", str(out), "--bootstrap", "0", "--restarts", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and needle in err[0]
    assert not out.exists() and not list(tmp_path.glob("*.png"))


def test_missing_columns_are_named(tmp_path, capsys):
    csv = tmp_path / "runs.csv"
    _write_csv(csv, [r[:4] + r[5:] for r in _good_rows()], header="n_tot,n_act,s,g,loss")
    rc = main(["law", "fit", "--runs", str(csv)])
    assert rc == 2
    assert "missing column(s) d" in capsys.readouterr().err


def test_make_runs_refuses_n_act_above_n_tot():
    with pytest.raises(RunsError, match="row 2: n_act"):
        make_runs([1e9, 1e9], [1e8, 2e9], [0.5, 0.5], [1, 1], [1e10, 1e10], [2.0, 2.0])


def test_cli_fit_writes_a_law_design_can_read(tmp_path, capsys):
    csv = tmp_path / "runs.csv"
    _write_csv(csv, _good_rows(n=60, seed=4))
    out = tmp_path / "law.json"
    rc = main(["law", "fit", "--runs", str(csv), "--json", "--out", str(out), "--per-g",
               "--starts", "2", "--bootstrap", "5", "--restarts", "3"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep["coefficients"]) == set(NAMES)
    assert set(rep["ci"]) == set(NAMES)
    assert set(rep["identified"]) | set(rep["ridge"]) == set(NAMES)
    assert rep["heldout_rmse"] > 0
    assert (tmp_path / "law.parity.png").stat().st_size > 1000
    assert set(rep["per_g"]) == {f"{g:g}" for g in (1, 2, 4, 6, 8)}
    law = load_law(out)
    assert law.coefficients == pytest.approx(rep["coefficients"])


def test_law_file_errors_are_input_errors(tmp_path):
    bad = tmp_path / "law.json"
    bad.write_text('{"coefficients": {"a": 1}}')
    with pytest.raises(RunsError, match="lacks coefficient 'alpha'"):
        load_law(bad)
    bad.write_text("{nope")
    with pytest.raises(RunsError, match="not valid JSON"):
        load_law(bad)
