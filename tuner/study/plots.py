"""The PNG plots of moetune, one place for both modes: the study report's (measured against
predicted with the pre-registered and final-calibration predictions, throughput over trials) and
the serving ranking's Pareto frontier. matplotlib's Agg backend; files written atomically."""
from __future__ import annotations

from pathlib import Path

from specs.fileio import write_png

# one colour / marker per role, the same in every plot
BASELINE = {"color": "tab:orange", "marker": "s", "label": "baseline"}
SEARCHED = {"color": "tab:blue", "marker": "o", "label": "searched"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def measured_vs_predicted(path: Path, rows: list[dict], *, measured: str, predictions: dict[str, str],
                          unit: str, low: str | None = None, high: str | None = None, band: float = 0.15) -> bool:
    """Predicted (y) against measured (x, as `moetune calibrate`'s scatter) for every row with both:
    one panel per prediction column of `predictions` ({title: key}, e.g. the pre-registered and the
    final-calibration predictions) on the same log axes, one marker per role (baseline, searched),
    y = x with a +-`band` region, the measured spread (`low`..`high`) as horizontal bars, and each
    panel's Spearman rank correlation in its title. False (nothing written) when no row has both."""
    from tuner.study.rank_quality import spearman
    panels = [(t, k) for t, k in predictions.items() if any(_num(r.get(k)) and _num(r.get(measured)) for r in rows)]
    if not panels:
        return False
    plt = _plt()
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
    vals = [float(r[k]) for r in rows for _, k in panels if _num(r.get(k))] + \
           [float(r[x]) for r in rows for x in (measured, low, high) if x and _num(r.get(x))]
    lo, hi = min(vals) / 1.25, max(vals) * 1.25
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 5.2), squeeze=False)
    for ax, (title, key) in zip(axes[0], panels):
        pts = [r for r in rows if _num(r.get(key)) and _num(r.get(measured))]
        ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)],
                        color="0.9", label=f"within +-{band:.0%}")
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="predicted = measured")
        for style, keep in ((SEARCHED, lambda r: "baseline" not in str(r.get("roles", ""))),
                            (BASELINE, lambda r: "baseline" in str(r.get("roles", "")))):
            sel = [r for r in pts if keep(r)]
            if not sel:
                continue
            x = [float(r[measured]) for r in sel]
            xerr = None
            if low and high:
                xerr = [[max(v - float(r.get(low) or v), 0) for v, r in zip(x, sel)],
                        [max(float(r.get(high) or v) - v, 0) for v, r in zip(x, sel)]]
            ax.errorbar(x, [float(r[key]) for r in sel], xerr=xerr, ls="none", ms=6, capsize=2, **style)
        for r in pts:
            ax.annotate(f"#{r['number']}", (float(r[measured]), float(r[key])), xytext=(4, 3),
                        textcoords="offset points", fontsize=7)
        rho = spearman([float(r[key]) for r in pts], [float(r[measured]) for r in pts])
        ax.set_title(f"{title}\nSpearman {rho:.2f} over {len(pts)} trials" if rho is not None else
                     f"{title}\n{len(pts)} trials", fontsize=10)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        for axis in (ax.xaxis, ax.yaxis):  # a few plain labels: log minor labels overlap on narrow ranges
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"measured {unit} (median; bar: slowest..fastest step)" if low else f"measured {unit}")
        ax.set_ylabel(f"predicted {unit}")
        ax.legend(fontsize=7, loc="lower right")  # the corner a model that over-predicts leaves empty
    write_png(fig, path)
    return True


def history(path: Path, rows: list[dict], *, measured: str, unit: str, baseline_value: float | None) -> bool:
    """Measured throughput by trial number, the best so far as a step line and the baseline as a
    horizontal line (Optuna's history plot). False when nothing was measured."""
    pts = sorted((r for r in rows if _num(r.get(measured))), key=lambda r: r["number"])
    if not pts:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for style, keep in ((SEARCHED, lambda r: "baseline" not in str(r.get("roles", ""))),
                        (BASELINE, lambda r: "baseline" in str(r.get("roles", "")))):
        sel = [r for r in pts if keep(r)]
        if sel:
            ax.scatter([r["number"] for r in sel], [float(r[measured]) for r in sel], zorder=3, **style)
    best, run = [], float("-inf")
    for r in pts:
        run = max(run, float(r[measured]))
        best.append(run)
    ax.step([r["number"] for r in pts], best, where="post", color="tab:green", label="best so far")
    if baseline_value:
        ax.axhline(baseline_value, color=BASELINE["color"], ls=":", lw=1, label="baseline (measured)")
    ax.set_xlabel("trial number")
    ax.set_ylabel(f"measured {unit}")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("throughput by trial")
    write_png(fig, path)
    return True


def pareto(path: Path, points: dict, frontier: dict, *, title: str, x_label: str, y_label: str) -> None:
    """Serving Pareto plot: every (plan, concurrency) within the SLOs as a faint point, one colour
    per deployment kind (aggregated, disaggregated), and each kind's frontier as a line."""
    plt = _plt()
    colours = {"aggregated": "tab:blue", "disaggregated": "tab:red"}
    fig, ax = plt.subplots(figsize=(7, 5))
    for kind, (user, gpu) in points.items():
        if len(user):
            ax.scatter(user, gpu, s=4, alpha=0.15, color=colours[kind], rasterized=True, linewidths=0)
    for kind, front in frontier.items():
        if front:
            ax.plot([u for u, _ in front], [g for _, g in front], "-o", ms=3, color=colours[kind],
                    label=f"{kind} frontier ({sum(1 for _ in front)} points)")
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(title, fontsize=10)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if any(frontier.values()):
        ax.legend(fontsize=8, loc="upper right")
    write_png(fig, path)


def bars(path: Path, items: list[tuple[str, float]], *, x_label: str, title: str) -> bool:
    """Horizontal bars, largest at the top (the winner's predicted breakdown)."""
    items = sorted(((k, v) for k, v in items if _num(v) and v > 0), key=lambda kv: kv[1])
    if not items:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 0.35 * len(items) + 1.2))
    ax.barh([k for k, _ in items], [v for _, v in items])
    total = sum(v for _, v in items)
    for i, (_, v) in enumerate(items):
        ax.annotate(f"{v / total:.0%}", (v, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_xlabel(x_label)
    ax.set_title(title, fontsize=10)
    write_png(fig, path)
    return True


def _num(v) -> bool:
    try:
        import math
        return v is not None and v != "" and math.isfinite(float(v)) and float(v) > 0
    except (TypeError, ValueError):
        return False
