"""Fit the cost model's one labelled calibration term to measured runs and report its error
(MOSAIC §5.5, §7.2): `moetune calibrate` is the command-line front end.

Input rows (dicts): model, cluster, gpus, gbs, seq, plan (canonical or partial: it is completed by
`tuner.rank.complete.complete_plan` for the stack profile of the row's cluster, as every command does),
measured step time (`step_time_s` or `measured_step_time_s`); rows whose `status` is not ok or
without a time are skipped. From a CSV (`load_csv`) or an Optuna study of `moetune tune` (`load_study`: COMPLETE
trials whose user attributes hold `plan` and `measured_step_time_s`).

`calibrate(rows)` predicts each row's raw (uncalibrated) step time with the tables the cost model
resolves for the row's cluster kind (or given ones), fits `cost_model.calibration.fit_calibration`
(soft-L1 least squares on log step time, leave-one-out), and reports MAPE and top-k overlap of
the predicted vs measured ranking (by tokens/s per device) before (raw) and after calibration
(in-sample and leave-one-out). One-scale by default: a single multiplicative term cannot reorder
plans, so top-k overlap is the same before and after the in-sample fit (the leave-one-out scales
may swap near ties). `per_component=True` fits a factor per breakdown class (the fit the tuner's
loop makes), on each row's measured per-class split (`measured_parts_s`, recorded by profiled
trials) where it has one, else on its step total; that one can reorder.
"""
from __future__ import annotations

import csv
import dataclasses
import datetime
import hashlib
import io
import json
from pathlib import Path

import numpy as np

from specs.errors import InputError
from specs.fileio import write_png
from specs.inputs import read_text
from tuner.study import storage as study_mod

TIME_KEYS = ("measured_step_time_s", "step_time_s")


class CalibrateError(InputError):
    pass


def _measured(r: dict, keys=TIME_KEYS):
    for k in keys:
        v = r.get(k)
        if v not in (None, ""):
            try:
                return float(v)
            except ValueError:
                return None
    return None


def clean_rows(rows: list[dict], keys=TIME_KEYS) -> list[dict]:
    out = []
    for r in rows:
        if str(r.get("status", "ok")).strip() not in ("ok", "COMPLETE", ""):
            continue
        t = _measured(r, keys)
        if t is None or not (0 < t < float("inf")) or not r.get("plan"):  # NaN and inf are no times
            continue
        out.append(dict(r, measured_step_time_s=t))
    return out


def load_csv(path: str | Path, time_column: str | None = None) -> list[dict]:
    keys = (time_column,) if time_column else TIME_KEYS
    text = read_text(path, "measurements CSV", CalibrateError)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = list(reader)
    except csv.Error as e:
        raise CalibrateError(f"{path}: not a CSV file ({e})") from None
    # the header decides, rows or not: a file of the wrong kind (JSON, a header of other columns)
    # names what it lacks instead of counting zero usable runs
    cols = reader.fieldnames or []
    if not cols:
        raise CalibrateError(f"{path}: empty (a CSV with a 'plan' column and a measured step time column)")
    if "plan" not in cols:
        raise CalibrateError(f"{path}: no 'plan' column (have {', '.join(cols)})")
    if not any(k in cols for k in keys):
        raise CalibrateError(f"{path}: no measured step time column ({' or '.join(keys)})")
    return clean_rows(rows, keys)


def load_study(name: str, storage: str | None, study_dir: str | Path | None = None,
               workload: dict | None = None) -> list[dict]:
    """COMPLETE trials with `plan` and `measured_step_time_s`; the workload (model, cluster, gpus,
    gbs, seq) from `workload`, else the study's preregistration.json, else trial attributes.

    Args:
        name: the study name. storage: its storage URL (None: the default in the study folder).
        study_dir: the study folder (None: `tuner.study.storage.default_study_dir(name)`).
        workload: fields that fill or override the workload of every row.
    """
    study_dir = Path(study_dir) if study_dir else study_mod.default_study_dir(name)
    url = storage or study_mod.default_storage_url(study_dir)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        raise CalibrateError(f"no study database {url[len('sqlite:///'):]} (give --storage or --study-dir)")
    try:
        study = study_mod.load_study(name, study_mod.open_storage(url, study_dir, heartbeat_interval=None))
    except KeyError:
        raise CalibrateError(f"no study named {name!r} in {study_mod.redact_url(url)}") from None
    wl = dict(workload or {})
    pre = study_dir / "preregistration.json"
    if pre.exists():
        w = json.loads(pre.read_text()).get("workload", {})
        for k, src in (("model", "model"), ("cluster", "cluster"), ("gpus", "devices"), ("gbs", "gbs"), ("seq", "seq")):
            if wl.get(k) in (None, "") and w.get(src) not in (None, ""):
                wl[k] = w[src]
    again = remeasured_steps(study)
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        if t.state.name != "COMPLETE" or "plan" not in a or "measured_step_time_s" not in a:
            continue
        r = {k: a.get(k, wl.get(k)) for k in ("model", "cluster", "gpus", "gbs", "seq")}
        r.update({k: v for k, v in wl.items() if v not in (None, "")})
        r.update(plan=a["plan"], measured_step_time_s=a["measured_step_time_s"], trial=t.number,
                 predicted_step_time_s=a.get("predicted_step_time_s"), measured_parts_s=a.get("measured_parts_s"))
        rows.append(with_remeasurements(r, again.get(a["plan"], [])))
    return clean_rows(rows)


def remeasured_steps(study) -> dict[str, list[float]]:
    """{plan: [step s of each successful re-measurement]} of the study's adjudication
    (`storage.REMEASURED`: the top plans and the baseline re-run at the end of the study)."""
    out: dict[str, list[float]] = {}
    for m in study.user_attrs.get(study_mod.REMEASURED) or ():
        t = m.get("step_time_s") if m.get("ok") else None
        if m.get("plan") and t and 0 < float(t) < float("inf"):
            out.setdefault(m["plan"], []).append(float(t))
    return out


def with_remeasurements(row: dict, again: list[float]) -> dict:
    """The row with its plan's step time as the fastest of every run of it: the trial's own and the
    adjudication's re-measurements. On a shared host the load only ever slows a run (the profile
    keeps each point's fastest sample for the same reason), and a single run is off by its
    moment's load: the quickstart's first trial (the baseline) ran x1.09-1.32 slower than the
    median of its four re-measurements in three held-out CPU runs (issue 27), and the fit read
    that as slow EP communication. The measured split keeps its shares, scaled to that time."""
    if not again:
        return row
    t0 = float(row["measured_step_time_s"])
    t = min(t0, *again)
    parts = row.get("measured_parts_s")
    return dict(row, measured_step_time_s=t, measured_runs=1 + len(again), measured_first_s=t0,
                measured_parts_s={c: v * t / t0 for c, v in parts.items()} if parts and t0 > 0 else parts)


def _workload(r: dict):
    from clusters import load_cluster
    from specs.models import load_model
    from specs.workload import Workload
    missing = [k for k in ("model", "cluster", "gbs") if r.get(k) in (None, "")]
    if missing:
        raise CalibrateError(f"row for plan {str(r.get('plan'))[:60]} lacks {', '.join(missing)} "
                             "(give --model/--cluster/--gbs/--seq)")
    model = load_model(str(r["model"]))
    gpus = int(r["gpus"]) if r.get("gpus") not in (None, "") else None
    cluster = load_cluster(str(r["cluster"]), gpus)
    seq = int(r["seq"]) if r.get("seq") not in (None, "") else model.seq_length
    return Workload(model=model, cluster=cluster, gbs=int(r["gbs"]), seq=seq)


def raw_predictions(rows: list[dict], tables=None, stack: str = "auto", complete: str = "defaults",
                    parts: bool = False) -> tuple[np.ndarray, dict]:
    """Uncalibrated predicted step time per row; {cluster kind: Tables used}. With `parts`, each
    row also gets `_parts` (its raw seconds per calibration class).

    Args:
        rows: measured runs (see the module docstring).
        tables: Tables or a table directory; None: the cost model's lookup rule per cluster kind.
        stack: the stack profile plans are completed for (`specs.stack.profile_for`).
        complete: how partial plans are completed (`tuner.rank.complete.complete`: best or defaults).
    """
    import cost_model
    from cost_model.calibration import IDENTITY
    from specs.stack import profile_for
    from tuner.rank.complete import complete as complete_as
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(str(r.get(k, "")) for k in ("model", "cluster", "gpus", "gbs", "seq")), []).append(i)
    pred = np.full(len(rows), np.nan)
    used = {}
    for _, idx in groups.items():
        w = _workload(rows[idx[0]])
        t = cost_model.resolve_tables(w, tables)
        used[w.cluster.kind] = t
        profile = profile_for(w.cluster, stack)
        plans = [complete_as(rows[i]["plan"], w, profile, mode=complete, tables=t, calibration=IDENTITY).plan for i in idx]
        out = cost_model.predict_arrays(w, plans, tables=t, calibration=IDENTITY)
        pred[idx] = out["raw_step_time_s"]
        if parts:
            for i, p in zip(idx, cost_model.raw_class_parts(w, plans, tables=t)):
                rows[i]["_parts"] = p
        for i in idx:
            rows[i]["_tokens"] = w.gbs * w.seq / w.world
    return pred, used


def mape(pred, meas) -> float:
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.mean(np.abs(pred / meas - 1.0)))


def topk_overlap(pred_time, meas_time, k: int, tokens=None) -> float:
    """|top-k by predicted throughput ∩ top-k by measured throughput| / k (throughput = tokens per
    device / step time; with one workload that is the step-time order)."""
    pred_time, meas_time = np.asarray(pred_time, float), np.asarray(meas_time, float)
    tok = np.ones_like(pred_time) if tokens is None else np.asarray(tokens, float)
    k = min(k, len(pred_time))
    if k == 0:
        return float("nan")
    a = set(np.argsort(-tok / pred_time, kind="stable")[:k])
    b = set(np.argsort(-tok / meas_time, kind="stable")[:k])
    return len(a & b) / k


def calibrate(rows: list[dict], *, tables=None, stack: str = "auto", source: dict | None = None, ks=(3, 5),
              complete: str = "defaults", per_component: bool = False):
    """Fit and evaluate. Returns (Calibration, report dict).

    Args:
        rows: measured runs of one cluster kind, at least 2.
        tables, stack, complete: as for `raw_predictions`.
        source: where the runs came from, kept in the calibration's provenance.
        ks: the k of the top-k overlap metrics.
        per_component: fit a factor per breakdown class instead of one scale.
    """
    from cost_model.calibration import TRAIN_CLASSES, fit_calibration
    if len(rows) < 2:
        raise CalibrateError(f"need at least 2 measured runs to fit and leave one out, got {len(rows)}")
    kinds = {str(r["cluster"]) for r in rows}
    if len(kinds) != 1:
        raise CalibrateError(f"measurements span several cluster kinds ({', '.join(sorted(kinds))}); "
                             "choose one with --cluster")
    raw, used = raw_predictions(rows, tables, stack, complete, parts=per_component)
    bad = [r["plan"] for r, p in zip(rows, raw) if not np.isfinite(p) or p <= 0]
    if bad:
        raise CalibrateError(f"the cost model gave no finite prediction for {len(bad)} plan(s), e.g. {bad[0][:80]}")
    meas = np.array([r["measured_step_time_s"] for r in rows], float)
    tok = np.array([r["_tokens"] for r in rows], float)
    (kind, t), = used.items()
    prov = {"cluster_kind": kind, "tables_digest": t.digest, "tables_dir": str(t.directory),
            "tables_measured": bool(t.meta.get("measured")), "measurements": source or {},
            "fitted": datetime.datetime.now().isoformat(timespec="seconds")}
    if per_component:
        cal, rep = fit_calibration([(r["_parts"], m, r["plan"], r.get("measured_parts_s")) for m, r in zip(meas, rows)],
                                   classes=TRAIN_CLASSES, provenance=prov)
        cal_pred = np.array([cal.apply(r["_parts"]) for r in rows])
    else:
        cal, rep = fit_calibration([(p, m, r["plan"]) for p, m, r in zip(raw, meas, rows)], provenance=prov)
        cal_pred = cal.scale * raw
    loo_pred = np.array([m * (1.0 + row["loo_rel_err"]) for m, row in zip(meas, rep["rows"])])
    metrics = {
        "n": len(rows), "distinct_plans": len({r["plan"] for r in rows}), "scale": cal.scale,
        "kind": cal.kind, "factors": dict(cal.factors),
        "factor_intervals": {c: list(v) for c, v in cal.factor_intervals().items()},
        "mape_before": mape(raw, meas), "mape_after": mape(cal_pred, meas), "mape_loo": mape(loo_pred, meas),
    }
    for k in ks:
        metrics[f"top{k}_before"] = topk_overlap(raw, meas, k, tok)
        metrics[f"top{k}_after"] = topk_overlap(cal_pred, meas, k, tok)
        metrics[f"top{k}_loo"] = topk_overlap(loo_pred, meas, k, tok)
    # store metrics in the provenance too (the calibration JSON is self-describing)
    prov = dict(cal.provenance, metrics=metrics)
    cal = dataclasses.replace(cal, provenance=prov)
    per_row = [dict(plan=r["plan"], measured_s=float(m), raw_pred_s=float(p), calibrated_pred_s=float(c),
                    loo_pred_s=float(lp)) for r, m, p, c, lp in zip(rows, meas, raw, cal_pred, loo_pred)]
    return cal, {"metrics": metrics, "rows": per_row, "tables": {"kind": kind, "dir": str(t.directory),
                                                                   "digest": t.digest,
                                                                   "measured": bool(t.meta.get("measured"))}}


def metrics_table(m: dict, ks=(3, 5)) -> str:
    lines = ["| model error           | MAPE   | " + " | ".join(f"top-{k} overlap" for k in ks) + " |",
             "|-----------------------|--------|" + "|".join("-" * 15 for _ in ks) + "|"]
    for lab, key in (("before (raw)", "before"), ("after (in-sample)", "after"), ("after (leave-one-out)", "loo")):
        lines.append(f"| {lab:<21} | {m['mape_' + key]:6.1%} | " +
                     " | ".join(f"{m[f'top{k}_{key}']:13.0%}" for k in ks) + " |")
    return "\n".join(lines)


def scatter_png(report: dict, path: str | Path, title: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = report["rows"]
    meas = np.array([r["measured_s"] for r in rows])
    raw = np.array([r["raw_pred_s"] for r in rows])
    loo = np.array([r["loo_pred_s"] for r in rows])
    m = report["metrics"]
    fig, ax = plt.subplots(figsize=(5.5, 5.0), dpi=120)
    ax.scatter(meas, raw, marker="o", facecolors="none", edgecolors="tab:gray",
               label=f"before (raw): MAPE {m['mape_before']:.1%}")
    ax.scatter(meas, loo, marker="o", color="tab:blue", label=f"after (leave-one-out): MAPE {m['mape_loo']:.1%}")
    lo = min(meas.min(), raw.min(), loo.min()) * 0.8
    hi = max(meas.max(), raw.max(), loo.max()) * 1.25
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="identity")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title or f"{report['tables']['kind']}: {m['n']} runs, scale {m['scale']:.3f}", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return write_png(fig, path, dpi=120)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
