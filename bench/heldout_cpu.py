"""Held-out CPU check of the calibrated cost model: real megatron-core trials of plans, global
batches and sequence lengths that no study or fit used, against `moetune predict`'s numbers.

  PYTHONPATH=. MOETUNE_HOME=... python bench/heldout_cpu.py [--plans bench/heldout_cpu_plans.yaml]
      [--out bench/results/heldout_cpu] [--passes 3] [--iters 5] [--warmup 2] [--report-only]
      [--study quickstart] [--study-dir studies/quickstart] [--calibration study|installed]
      [--references 2]

Run it after the README's main job (profile + quickstart study): the tables are the measured ones
in $MOETUNE_HOME (as `moetune predict` resolves them) and the calibration is what the study's
loop fits, refitted here from the study's measured trials (`tuner.study.calibrate`, the same fit
as `moetune calibrate --study quickstart`) with the current cost model, so a model change is
judged against the same measurements. `--calibration installed` uses the lookup rule of
`moetune predict` instead ($MOETUNE_HOME/calibration/<kind>.json, else identity on CPU).

Measurements: each plan is run `--passes` times in separate passes over the list (a burst of load
from other processes on a shared host then hits one pass, not every run of a plan), each pass a
`trials.get_backend("megatron")` trial of `--warmup` + `--iters` steps whose median step time is
that pass's figure; the reported measurement is the median over all timed steps of all passes.
Rows go to OUT/measurements.csv as they come (a rerun resumes and adds only
missing passes). `--report-only` re-predicts from the stored measurements (for model changes).

Host drift (a diagnostic, not the criterion): each pass also re-runs `--references` of the study's
own measured plans at the study's gbs and seq (its baseline, then its fastest trial), rows
"ref:baseline" / "ref:fastest". Their median step now over the study's measurement of the same
plan is how much faster or slower the host runs than when the calibration's trials ran (on a
shared 2-vCPU VM, 10-35% within minutes). The report prints that drift and each plan's error with
the prediction multiplied by it; the criterion stays the plain error.

Report: OUT/heldout.csv (plan, gbs, seq, predicted, raw prediction, measured median over all timed steps,
min and max over passes, relative error, drift-corrected error) and OUT/heldout.png (predicted vs
measured, bars = the passes' range); stdout: the table, the largest |relative error| and Spearman's rho.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HERE = Path(__file__).resolve().parent
MEAS_COLUMNS = ["plan_short", "gbs", "seq", "plan", "pass", "status", "step_time_s", "step_times_s",
                "wall_s", "date"]


def load_set(path: Path) -> tuple[str, str, list[dict]]:
    import yaml
    d = yaml.safe_load(path.read_text())
    return d["model"], d["cluster"], [dict(plan=str(p["plan"]), gbs=int(p["gbs"]), seq=int(p["seq"]))
                                      for p in d["plans"]]


def workload(model: str, cluster: str, gbs: int, seq: int):
    from clusters import load_cluster
    from specs.models import load_model
    from specs.workload import Workload
    return Workload(model=load_model(model), cluster=load_cluster(cluster), gbs=gbs, seq=seq)


def complete(text: str, w):
    """The plan as `moetune trial/predict --plan TEXT` completes it, refused when unrealizable."""
    from specs.stack import profile_for
    from tuner.rank.complete import complete_plan
    from tuner.space.megatron_rules import check
    prof = profile_for(w.cluster)
    plan = complete_plan(text, w, prof, "bf16")
    reasons = check(w, plan, prof)
    if reasons:
        raise SystemExit(f"held-out plan {text!r} is not realizable: {'; '.join(map(str, reasons))}")
    return plan


def measure(model, cluster, entries, out: Path, passes: int, iters: int, warmup: int, timeout: float):
    from trials import get_backend
    from trials.base import Failure, Resources
    path = out / "measurements.csv"
    rows = []
    if path.exists():
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    have = {(r["plan_short"], r["gbs"], r["seq"], r["pass"]) for r in rows}
    backend = get_backend("megatron")
    for ps in range(1, passes + 1):
        for e in entries:
            key = (e["plan"], str(e["gbs"]), str(e["seq"]), str(ps))
            if key in have:
                continue
            w = workload(model, cluster, e["gbs"], e["seq"])
            plan = complete(e.get("full", e["plan"]), w)
            t0 = time.time()
            r = backend.run(plan, w, Resources(w.world, timeout), iters=iters, warmup=warmup)
            ok = not isinstance(r, Failure)
            row = dict(plan_short=e["plan"], gbs=e["gbs"], seq=e["seq"], plan=plan.canonical(), **{"pass": ps},
                       status="ok" if ok else r.kind,
                       step_time_s=f"{r.step_time_s:.5f}" if ok else "",
                       step_times_s=";".join(f"{t:.5f}" for t in r.step_times_s) if ok else r.message[:200],
                       wall_s=f"{time.time() - t0:.1f}",
                       date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
            new = not path.exists()
            with open(path, "a", newline="") as f:
                wr = csv.DictWriter(f, fieldnames=MEAS_COLUMNS)
                if new:
                    wr.writeheader()
                wr.writerow(row)
            rows.append({k: str(v) for k, v in row.items()})
            print(f"pass {ps}  {e['plan']:<66} gbs {e['gbs']:>3} seq {e['seq']:>4}  "
                  f"{row['status']:<6} {row['step_time_s']:>8} s", flush=True)
    return rows


def references(study_dir: Path, rows: list[dict], n: int) -> list[dict]:
    """Up to n of the study's measured plans (its baseline, then its fastest trial) with the study's
    measurement (`rows`: `tuner.study.calibrate.load_study`), as entries at the study's gbs and seq
    (module docstring, "Host drift")."""
    import json
    if n <= 0:
        return []
    prereg = json.loads((study_dir / "preregistration.json").read_text())
    wl = prereg["workload"]
    by_plan = {r["plan"]: float(r["measured_step_time_s"]) for r in sorted(rows, key=lambda r: r["trial"])}
    picks = [("ref:baseline", prereg["baseline"]["plan"])]
    if by_plan:
        picks.append(("ref:fastest", min(by_plan, key=by_plan.get)))
    out = []
    for label, plan in picks:
        if plan in by_plan and plan not in {e["plan"] for e in out}:
            out.append(dict(label=label, plan=plan, gbs=int(wl["gbs"]), seq=int(wl["seq"]), study_s=by_plan[plan]))
    return out[:n]


def _runs(meas: list[dict], name: str, gbs: int, seq: int) -> list[dict]:
    """The stored passes of one entry (`plan_short` is the held-out plan text or a ref label)."""
    return [r for r in meas if (r["plan_short"], int(r["gbs"]), int(r["seq"])) == (name, gbs, seq)]


def _steps(runs: list[dict]) -> list[float]:
    """Every timed step of those passes."""
    return [float(x) for r in runs for x in (r.get("step_times_s") or r["step_time_s"]).split(";") if x]


def host_drift(refs: list[dict], meas: list[dict]) -> tuple[float, list[str]]:
    """Geometric mean over the references of (median of this run's timed steps) / (the study's
    measurement), and one line per reference; (nan, []) without references or measurements."""
    import math
    logs, lines = [], []
    for e in refs:
        steps = _steps(_runs(meas, e["label"], e["gbs"], e["seq"]))
        if steps:
            now = statistics.median(steps)
            logs.append(math.log(now / e["study_s"]))
            lines.append(f"{e['label']:<13} study {e['study_s']:.3f} s, now {now:.3f} s "
                         f"(x{now / e['study_s']:.3f}): {e['plan']}")
    return (math.exp(sum(logs) / len(logs)) if logs else float("nan")), lines


def spearman(a, b) -> float:
    from scipy.stats import spearmanr
    return float(spearmanr(a, b).statistic)


def study_calibration(study: str, rows: list[dict]):
    """The calibration the study's loop fits on its measured trials (`rows`), refitted with the
    current model."""
    from tuner.study.calibrate import calibrate
    cal, rep = calibrate(rows, source={"study": study}, per_component=True)
    m = rep["metrics"]
    print(f"study {study}: {m['n']} measured trials ({sum(1 for r in rows if r.get('measured_parts_s'))} with their "
          f"per-class split), per-component fit; in-sample MAPE before {m['mape_before']:.1%} after "
          f"{m['mape_after']:.1%}, leave-one-out {m['mape_loo']:.1%}")
    print("factors (90% interval):")
    for c, (f, lo, hi) in cal.factor_intervals().items():
        print(f"  {c:16s} {f:8.3g}  [{lo:.3g} .. {hi:.3g}]")
    return cal


def report(model, cluster, entries, out: Path, cal=None, refs=()) -> int:
    import cost_model
    path = out / "measurements.csv"
    if not path.exists():
        raise SystemExit(f"{path}: no measurements yet (run without --report-only)")
    with open(path, newline="") as f:
        meas = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    table = []
    cal_id = tables_dir = None
    for e in entries:
        runs = _runs(meas, e["plan"], e["gbs"], e["seq"])
        if not runs:
            continue
        ts = [float(r["step_time_s"]) for r in runs]
        w = workload(model, cluster, e["gbs"], e["seq"])
        plan = complete(e["plan"], w)
        tables = cost_model.resolve_tables(w)
        if cal is None:
            cal = cost_model.resolve_calibration(w, tables=tables)
        pred = cost_model.predict(w, plan, tables=tables, calibration=cal)
        cal_id, tables_dir = f"{cal.id} ({cal.kind})", tables.directory
        # the median over every timed step of every pass (a burst of load hits a few steps of one
        # pass; the median of 2-3 pass medians would be their mean); the spread stays per pass
        m = statistics.median(_steps(runs))
        table.append(dict(plan_short=e["plan"], gbs=e["gbs"], seq=e["seq"], predicted_s=pred.step_time_s,
                          raw_predicted_s=pred.extra["raw_step_time_s"], measured_s=m, measured_min_s=min(ts),
                          measured_max_s=max(ts), passes=len(ts), rel_err=pred.step_time_s / m - 1.0,
                          plan=plan.canonical()))
    if not table:
        raise SystemExit("no successful measurements to report")
    drift, drift_lines = host_drift(list(refs), meas)
    for r in table:  # NaN without references
        r["drift_corrected_rel_err"] = r["predicted_s"] * drift / r["measured_s"] - 1.0
    with open(out / "heldout.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(table[0]))
        wr.writeheader()
        for r in table:
            wr.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
    print(f"tables       {tables_dir}\ncalibration  {cal_id}")
    print(f"{'plan':<66} {'gbs':>3} {'seq':>4} {'pred s':>7} {'meas s':>7} {'min..max over passes':>20} {'err':>7}"
          f" {'drift-corr':>10}")
    for r in table:
        print(f"{r['plan_short']:<66} {r['gbs']:>3} {r['seq']:>4} {r['predicted_s']:>7.3f} {r['measured_s']:>7.3f} "
              f"{r['measured_min_s']:>9.3f}..{r['measured_max_s']:<6.3f} n={r['passes']} {r['rel_err']:>+7.1%}"
              f" {_pct(r['drift_corrected_rel_err']):>10}")
    pred = [r["predicted_s"] for r in table]
    meas_m = [r["measured_s"] for r in table]
    rho = spearman(pred, meas_m) if len(table) > 1 else float("nan")
    worst = max(abs(r["rel_err"]) for r in table)
    mape = statistics.mean(abs(r["rel_err"]) for r in table)
    print(f"max |rel err| {worst:.1%}   mean |rel err| {mape:.1%}   Spearman rho {rho:.3f}   "
          f"({len(table)} plans; goal: every plan within 15%, rho >= 0.9)")
    if drift_lines:
        corr = max(abs(r["drift_corrected_rel_err"]) for r in table)
        print(f"host drift since the study (diagnostic, not the criterion): x{drift:.3f}")
        for line in drift_lines:
            print("  " + line)
        print(f"max |error| with the prediction x drift: {corr:.1%}")
    _plot(table, out / "heldout.png", rho, worst)
    return 0


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:+.1%}"  # NaN (no reference measured): "-"


def _plot(table, path: Path, rho: float, worst: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specs.fileio import write_png
    fig, ax = plt.subplots(figsize=(6, 5.5))
    x = [r["measured_s"] for r in table]
    y = [r["predicted_s"] for r in table]
    xerr = [[r["measured_s"] - r["measured_min_s"] for r in table], [r["measured_max_s"] - r["measured_s"] for r in table]]
    ax.errorbar(x, y, xerr=xerr, fmt="o", capsize=3)
    for r in table:
        ax.annotate(f"{r['plan_short']} gbs{r['gbs']} s{r['seq']}", (r["measured_s"], r["predicted_s"]), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
    lo, hi = min(x + y) * 0.8, max(x + y) * 1.2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="0.9", label="±15%")
    ax.set_xlabel("measured step time (s, median over all timed steps; bars: range of pass medians)")
    ax.set_ylabel("predicted step time (s, calibrated)")
    ax.set_title(f"held-out tiny-moe plans on cpu-local: max err {worst:.0%}, Spearman {rho:.2f}", fontsize=9)
    ax.legend(loc="upper left")
    fig.tight_layout()
    write_png(fig, path, dpi=120)


def main(argv=None) -> int:
    from tuner.study import storage as study_mod
    from tuner.study.calibrate import load_study
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=Path, default=HERE / "heldout_cpu_plans.yaml")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "heldout_cpu")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--report-only", action="store_true", help="Predict against the stored measurements only.")
    ap.add_argument("--study", default="quickstart", help="The study whose trials the calibration is fitted on.")
    ap.add_argument("--study-dir", type=Path, default=None, help="Its folder (default studies/<study>).")
    ap.add_argument("--calibration", choices=("study", "installed"), default="study")
    ap.add_argument("--references", type=int, default=2,
                    help="Study plans re-measured in each pass for the host-drift diagnostic (0: none).")
    a = ap.parse_args(argv)
    model, cluster, entries = load_set(a.plans)
    a.out.mkdir(parents=True, exist_ok=True)
    study_dir = a.study_dir or study_mod.default_study_dir(a.study)
    rows = load_study(a.study, None, study_dir)
    refs = references(study_dir, rows, a.references)
    if not a.report_only:
        ref_entries = [dict(plan=e["label"], gbs=e["gbs"], seq=e["seq"], full=e["plan"]) for e in refs]
        measure(model, cluster, entries + ref_entries, a.out, a.passes, a.iters, a.warmup, a.timeout)
    cal = study_calibration(a.study, rows) if a.calibration == "study" else None
    return report(model, cluster, entries, a.out, cal, refs)


if __name__ == "__main__":
    raise SystemExit(main())
