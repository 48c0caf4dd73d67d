"""`moetune calibrate`: fit the cost model's calibration term to measured runs and report the
model's error before and after (MAPE, leave-one-out MAPE, top-3/top-5 overlap), as a table and a
scatter plot; install the fit for the cluster kind.

  moetune calibrate --measurements runs.csv [--cluster KIND] [--out DIR]
  moetune calibrate --study NAME [--storage URL | --study-dir DIR] [--out DIR]
      [--model M --cluster C --gpus N --gbs B --seq S]   (fill or override the workload)
      [--stack PROFILE] [--tables DIR] [--no-install] [--json]

CSV columns: model, cluster, gpus, gbs, seq, plan (canonical or partial, completed like every
command's --plan), step_time_s (or measured_step_time_s); a `status` column other than ok skips the row. A study is read from
`moetune tune`'s storage (default sqlite:///<study dir>/study.db, study dir studies/<NAME>).
The fit is installed at $MOETUNE_HOME/calibration/<kind>.json with its provenance (measurements
and their hash, the tables digest); the cost model uses it whenever it reads those same tables.
"""
from __future__ import annotations

import csv
import datetime
import io
import json
from pathlib import Path

from specs.errors import UsageError
from specs.fileio import write_atomic
from tuner.commands.common import (
    add_complete_arg,
    add_stack_arg,
    batch,
    check_home,
    check_output_dir,
    devices,
    tokens,
)

DESCRIPTION = ("Fit the cost model's calibration term to measured runs, report the model's error before "
               "and after as a table and a scatter plot, and install the fit for the cluster kind.")


def add_parser(subparsers):
    p = subparsers.add_parser("calibrate", help="Fit the cost model to measured runs and report its error.",
                              description=DESCRIPTION)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--study", help="Name of an Optuna study made by `moetune tune` to read measured trials from.")
    src.add_argument("--measurements", help="CSV file of measured runs (columns in the command's documentation).")
    p.add_argument("--storage", default=None,
                   help="Optuna storage of --study: an SQLAlchemy URL or journal:<path> "
                        "(default: SQLite in the study folder).")
    p.add_argument("--study-dir", default=None, help="Folder of --study (default: studies/<study>).")
    p.add_argument("--model", default=None, help="Model for rows that lack one, or to override theirs.")
    p.add_argument("--cluster", default=None,
                   help="Cluster kind: only rows of this kind are used, and rows lacking one get it.")
    p.add_argument("--gpus", type=devices, default=None, help="Number of devices for rows that lack one.")
    p.add_argument("--gbs", type=batch, default=None, help="Global batch size for rows that lack one.")
    p.add_argument("--seq", type=tokens, default=None, help="Sequence length for rows that lack one.")
    p.add_argument("--time-column", default=None,
                   help="CSV column holding the measured step time (default: measured_step_time_s or "
                        "step_time_s); e.g. min_step_time_s for the least-interfered iteration on a shared host.")
    add_stack_arg(p)
    add_complete_arg(p, "a partial plan of a measured run")
    p.add_argument("--tables", default=None,
                   help="Table directory to predict with (default: the cost model's lookup rule for the cluster kind).")
    p.add_argument("--out", default=None, help="Folder for the report (default: runs/calibrate-<kind>-<time>).")
    p.add_argument("--no-install", action="store_true",
                   help="Do not install the fit as $MOETUNE_HOME/calibration/<kind>.json.")
    p.add_argument("--per-component", action="store_true",
                   help="Fit one factor per breakdown class (GEMM, grouped GEMM, attention, EP communication, "
                        "...), regularised toward 1, instead of one scale (the fit `moetune tune` makes).")
    p.add_argument("--json", action="store_true", help="Print the metrics as JSON instead of a table.")
    return p


def _fill(rows, args):
    over = {"model": args.model, "gpus": args.gpus, "gbs": args.gbs, "seq": args.seq}
    out = []
    for r in rows:
        r = dict(r)
        for k, v in over.items():
            if v is not None and r.get(k) in (None, ""):
                r[k] = v
        if args.cluster:
            if r.get("cluster") in (None, ""):
                r["cluster"] = args.cluster
            elif str(r["cluster"]) != args.cluster:
                continue
        out.append(r)
    return out


def run(args) -> int:
    from cost_model.calibration import user_calibration_path
    from tuner.study import calibrate as runs
    from tuner.study import storage as study_mod
    if args.out:  # before any work: a folder that cannot be written is one line, nothing made
        check_output_dir(args.out, "--out")
    if not args.no_install:
        check_home()
    try:
        if args.measurements:
            if not Path(args.measurements).is_file():
                raise UsageError(f"no measurements file {args.measurements}")
            rows = runs.load_csv(args.measurements, args.time_column)
            source = {"file": str(Path(args.measurements).resolve()), "sha256": runs.file_sha256(args.measurements),
                      "time_column": args.time_column or "measured_step_time_s|step_time_s"}
        else:
            from specs.inputs import safe_name
            safe_name(args.study, "--study", "study name", UsageError)
            study_mod.check_storage(args.storage, args.study_dir or study_mod.default_study_dir(args.study))
            wl = {"model": args.model, "cluster": args.cluster, "gpus": args.gpus, "gbs": args.gbs, "seq": args.seq}
            rows = runs.load_study(args.study, args.storage, args.study_dir, wl)
            study_dir = Path(args.study_dir) if args.study_dir else study_mod.default_study_dir(args.study)
            source = {"study": args.study, "storage": study_mod.redact_url(args.storage or study_mod.default_storage_url(study_dir)),
                      "trials": [r.get("trial") for r in rows]}
        rows = _fill(rows, args)
        if len(rows) < 2:
            raise UsageError(f"{len(rows)} usable measured run(s) (need >= 2 with plan and a step time"
                             + (f" on cluster {args.cluster}" if args.cluster else "") + ")")
        cal, rep = runs.calibrate(rows, tables=args.tables, stack=args.stack, source=dict(source, n=len(rows)),
                                  complete=args.complete, per_component=args.per_component)
    except runs.CalibrateError as e:
        raise UsageError(str(e)) from None
    kind = rep["tables"]["kind"]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs") / f"calibrate-{kind}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    cal.save(out / "calibration.json")  # a fresh report folder: nobody reads it yet
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rep["rows"][0]))
    w.writeheader()
    w.writerows(rep["rows"])
    write_atomic(out / "calibration_rows.csv", buf.getvalue())
    png = runs.scatter_png(rep, out / "scatter.png")
    m = rep["metrics"]
    table = runs.metrics_table(m)
    installed = None
    if not args.no_install:
        # the cost model of another command may be reading the installed file: replace it atomically
        installed = write_atomic(user_calibration_path(kind), (out / "calibration.json").read_text())
    t = rep["tables"]
    md = [f"# Calibration of the cost model on {kind}", "",
          f"- measurements: {json.dumps(source)[:300]}",
          f"- runs: {m['n']} ({m['distinct_plans']} distinct plans); partial plans completed with --complete {args.complete}",
          f"- tables: {t['dir']} ({'measured' if t['measured'] else 'shipped defaults'}), sha256 {t['digest']}",
          f"- fitted term: {cal.label}: {_factors(cal)}; calibration id {cal.id}",
          f"- installed: {installed or 'no (--no-install)'}", "", table, "",
          ("Per-component factors can reorder plans." if cal.factors else
           "A single multiplicative term cannot reorder plans: in-sample top-k overlap equals the raw model's."), "",
          f"![predicted vs measured]({png.name})", "", "| plan | measured s | raw s | calibrated s | LOO s |",
          "|---|---|---|---|---|"]
    md += [f"| `{r['plan']}` | {r['measured_s']:.4f} | {r['raw_pred_s']:.4f} | {r['calibrated_pred_s']:.4f} | "
           f"{r['loo_pred_s']:.4f} |" for r in rep["rows"]]
    write_atomic(out / "report.md", "\n".join(md) + "\n")
    if args.json:
        print(json.dumps({"metrics": m, "calibration_id": cal.id, "scale": cal.scale, "kind": cal.kind,
                          "factors": cal.factors, "tables": t,
                          "installed": str(installed) if installed else None, "out": str(out),
                          "png": str(png), "completion": args.complete}, indent=1))
        return 0
    print(f"calibrated {kind}: {m['n']} runs ({m['distinct_plans']} distinct plans); tables {t['dir']} "
          f"sha256 {t['digest'][:16]} ({'measured' if t['measured'] else 'shipped defaults'})")
    print(table)
    print(f"completion     --complete {args.complete} (for partial plans of the runs)")
    print(f"{'factors' if cal.factors else 'scale':14s} {_factors(cal)} ({cal.label})")
    print(f"calibration    {cal.id} -> {out / 'calibration.json'}")
    if installed:
        print(f"installed      {installed} (used by the cost model for {kind} with these tables)")
    print(f"plot           {png}")
    print(f"report         {out / 'report.md'}")
    return 0


def _factors(cal) -> str:
    """The fitted term in one line: the scale, or each class's factor with its 90% interval."""
    if not cal.factors:
        return f"scale {cal.scale:.4f}"
    return ", ".join(f"{c} {f:.3g} [{lo:.3g}..{hi:.3g}]" for c, (f, lo, hi) in cal.factor_intervals().items())
