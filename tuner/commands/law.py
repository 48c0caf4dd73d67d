"""`moetune law fit`: fit the G-augmented MoE scaling law (MOSAIC eq. (10)) to training runs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from specs.errors import UsageError
from specs.fileio import write_atomic, write_png
from tuner.commands.common import MAX_COUNT, check_output_file, count, number, positive_int


def add_parser(subparsers):
    p = subparsers.add_parser(
        "law", help="Fit the G-augmented sparse-MoE scaling law to training runs.",
        description="Fit the G-augmented sparse-MoE scaling law (MOSAIC eq. (10)) to training runs.")
    sub = p.add_subparsers(dest="law_command", required=True, metavar="ACTION")
    f = sub.add_parser(
        "fit", help="Fit eq. (10) by Huber loss on log L, with held-out RMSE, BCa intervals and identifiability.",
        description="Fit eq. (10) by Huber loss on log L with L-BFGS-B in log-coefficient space; hold out "
                    "the top 10 percent of runs by n_act within each G stratum; wild-bootstrap BCa intervals; "
                    "mark each coefficient identified or ridge.")
    f.add_argument("--runs", required=True,
                   help="CSV with columns n_tot, n_act, s, g, d, loss (optional e, k, layers, d_model); "
                        "parameter and token counts are raw numbers.")
    f.add_argument("--json", action="store_true", help="Print the fit as JSON.")
    f.add_argument("--out", default=None, help="Write the fitted law as JSON to this file (what `moetune design --law` reads).")
    f.add_argument("--per-g", action="store_true", help="Also fit eq. (9) on each G stratum.")
    f.add_argument("--plot", default=None,
                   help="Write the parity plot (predicted against observed loss) to this PNG; "
                        "default: next to --out as <name>.parity.png when --out is given.")
    f.add_argument("--starts", type=positive_int, default=16, help="Random starts of the point fit (default 16).")
    f.add_argument("--bootstrap", type=count(0, MAX_COUNT), default=200,
                   help="Wild-bootstrap refits for the BCa intervals; 0 skips them (default 200, the paper used 500).")
    f.add_argument("--restarts", type=count(0, MAX_COUNT), default=40,
                   help="Fresh restarts of the identifiability scan; 0 skips it (default 40, the paper used 400).")
    f.add_argument("--rel-tol", type=number(0.0, 1.0, lo_open=True), default=0.05,
                   help="Relative precision a coefficient must be pinned to, to count as identified (default 0.05).")
    f.add_argument("--seed", type=count(0, 2**32 - 1), default=0, help="Random seed of the starts and the bootstrap (default 0).")
    return p


def parity_png(runs, report: dict, path) -> None:
    """Predicted against observed loss, training and held-out runs, coloured by G; per-G fits of
    eq. (9) in a second panel when present. Written via a temporary file and a rename."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from cost_model.law import heldout_mask, predict_loss

    per_g = report.get("per_g") or {}
    panels = 2 if any("coefficients" in v for v in per_g.values()) else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.6), squeeze=False)
    hold = heldout_mask(runs)
    gs = sorted(set(runs.g.tolist()))
    cmap = plt.get_cmap("viridis", max(2, len(gs)))

    def panel(ax, obs, g_of, hold, pred, title):
        for i, g in enumerate(gs):
            m = g_of == g
            if not m.any():
                continue
            ax.scatter(obs[m & ~hold], pred[m & ~hold], s=12, color=cmap(i), alpha=0.7, label=f"G={g:g}")
            ax.scatter(obs[m & hold], pred[m & hold], s=40, color=cmap(i), marker="x")
        lo, hi = float(min(obs.min(), pred.min())), float(max(obs.max(), pred.max()))
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.set_xlabel("observed loss")
        ax.set_ylabel("predicted loss")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, title="x = held out", title_fontsize=7)

    pred = predict_loss(report["coefficients"], runs.n_tot, runs.s, runs.d, runs.g)
    rmse = report.get("heldout_rmse")
    panel(axes[0][0], runs.loss, runs.g, hold, pred, "joint law eq. (10)" + (f", held-out RMSE {rmse:.4f}" if rmse is not None else ""))
    if panels == 2:
        pg = np.full(len(runs), np.nan)
        for key, v in per_g.items():
            if "coefficients" in v:
                m = runs.g == float(key)
                pg[m] = predict_loss(v["coefficients"], runs.n_tot[m], runs.s[m], runs.d[m])
        ok = np.isfinite(pg)
        # per-G fits hold out their own top 10% by n_act, which is the same set within each G
        panel(axes[0][1], runs.loss[ok], runs.g[ok], hold[ok], pg[ok], "per-G law eq. (9)")
    fig.tight_layout()
    write_png(fig, path, dpi=120)


def _summary(rep: dict) -> list[str]:
    from cost_model.law import NAMES
    ci = rep.get("ci", {})
    ident = set(rep.get("identified", []))
    lines = [f"runs           {rep['n_train']} fitted, {rep['n_heldout']} held out (top 10% by n_act per G)"]
    if rep.get("heldout_rmse") is not None:
        lines.append(f"held-out RMSE  {rep['heldout_rmse']:.5f} (train {rep['train_rmse']:.5f}) loss units")
    lines.append("coefficient    value        95% BCa interval          status")
    for k in NAMES:
        v = rep["coefficients"][k]
        c = ci.get(k)
        ci_s = f"[{c[0]:.4g}, {c[1]:.4g}]" if c else "-"
        st = ("identified" if k in ident else "ridge") if "identified" in rep else "-"
        lines.append(f"  {k:12s} {v:<12.5g} {ci_s:25s} {st}")
    for g, v in (rep.get("per_g") or {}).items():
        if "coefficients" in v:
            r = v["heldout_rmse"]
            lines.append(f"per-G G={g:<4s}  eq. (9) held-out RMSE {r:.5f}" if r is not None else f"per-G G={g}: fitted")
        else:
            lines.append(f"per-G G={g:<4s}  skipped: {v['skipped']}")
    return lines


def run(args) -> int:
    from cost_model.law import fit_report, read_runs_csv
    if args.law_command != "fit":
        raise UsageError(f"unknown law action {args.law_command!r}")
    for name in ("starts", "bootstrap", "restarts"):
        if getattr(args, name) < (1 if name == "starts" else 0):
            raise UsageError(f"--{name} must be {'positive' if name == 'starts' else 'zero or more'}")
    if not 0 < args.rel_tol < 1:
        raise UsageError("--rel-tol must be in (0, 1)")
    plot = args.plot or (str(Path(args.out).with_suffix("")) + ".parity.png" if args.out else None)
    # before the fit (minutes) and before the plot is written: no half of the outputs left behind
    if args.out:
        check_output_file(args.out, "--out")
    if plot:
        check_output_file(plot, "--plot")
    runs = read_runs_csv(args.runs)

    def say(stage):
        if not args.json:
            print(f"... {stage}", file=sys.stderr, flush=True)

    rep = fit_report(runs, starts=args.starts, bootstrap=args.bootstrap, restarts=args.restarts,
                     rel_tol=args.rel_tol, per_g=args.per_g, seed=args.seed, progress=say)
    rep.pop("_fit", None)
    rep["runs"] = str(args.runs)
    if plot:
        parity_png(runs, rep, plot)
        rep["parity_plot"] = plot
    text = json.dumps(rep, indent=1) + "\n"
    if args.out:
        write_atomic(args.out, text)
    if args.json:
        print(text, end="")
        return 0
    for line in _summary(rep):
        print(line)
    if plot:
        print(f"parity plot    {plot}")
    if args.out:
        print(f"law            {args.out}")
    return 0
