"""`<study dir>/report.md` for `moetune tune`: trials.csv, PNG plots (matplotlib Agg), measured vs
predicted, the winner's predicted breakdown, failures with reasons, baseline comparison and
adjudication, and the winner's Megatron-LM launch script (`tuner.emit.megatron.megatron_script`)."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from specs.fileio import write_atomic
from tuner.rank.whatif import describe, megakernel_training
from tuner.study.storage import redact_url

CSV_COLS = ("number", "state", "plan", "roles", "predicted_step_time_s", "predicted_raw_step_time_s",
            "measured_step_time_s", "predicted_tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu",
            "predicted_peak_memory_gib", "measured_peak_memory_gib", "failure_kind", "failure_message",
            "claim_lost_to", "owner", "attempt", "nodes")


def contenders(rows: list[dict], prereg: dict) -> tuple[dict | None, dict | None]:
    """(the baseline's measured trial, the best measured searched trial), either None if missing."""
    base_plan = prereg["baseline"]["plan"]
    done = [r for r in rows if r["state"] == "COMPLETE"]
    base = next((r for r in done if r["plan"] == base_plan), None)
    searched = [r for r in done if "searched" in str(r.get("roles", ""))]
    best = max(searched, key=lambda r: r["measured_tokens_per_s_per_gpu"], default=None)
    return base, best


def adjudicate(rows: list[dict], prereg: dict, remeasured: list[dict] | None = None) -> dict:
    """Verdict: {'verdict': PASS|FAIL|INCONCLUSIVE|INCOMPLETE, 'ratio', 'low', 'high', 'baseline',
    'best', 'line'}. With a pre-registered adjudication protocol (tuner/study/verdict.py) the verdict is
    the bootstrap interval's on the interleaved re-measurements `remeasured` (ProtocolError if they
    break the protocol); without one (older studies, serving), the single measurements' ratio."""
    ratio_bar = prereg["acceptance"]["ratio"]
    base_plan = prereg["baseline"]["plan"]
    base, best = contenders(rows, prereg)
    out = {"bar": ratio_bar, "baseline": base, "best": best, "ratio": None, "low": None, "high": None}
    if base is None:
        failed = next((r for r in rows if r["plan"] == base_plan and r.get("failure_kind")), None)
        why = f" (it failed: {failed['failure_kind']})" if failed else ""
        out.update(verdict="INCOMPLETE", line=f"INCOMPLETE: the baseline plan has no measurement{why}")
        return out
    if best is None:
        out.update(verdict="INCOMPLETE", line="INCOMPLETE: no searched plan was measured")
        return out
    b, s = base["measured_tokens_per_s_per_gpu"], best["measured_tokens_per_s_per_gpu"]
    ratio = s / b
    if prereg.get("adjudication"):
        return _noise_aware(out, prereg["adjudication"], remeasured or [], ratio, rows)
    verdict = "PASS" if ratio >= ratio_bar else "FAIL"
    out.update(verdict=verdict, ratio=ratio,
               line=f"{verdict}: searched best {s:.1f} tok/s/GPU / baseline {b:.1f} tok/s/GPU = "
                    f"{ratio:.3f} (bar {ratio_bar}); winner trial #{best['number']}")
    return out


def _noise_aware(out: dict, proto: dict, remeasured: list[dict], single_ratio: float, rows: list[dict]) -> dict:
    from tuner.study import verdict as verdict_mod
    verdict_mod.check_protocol(proto)
    base = out["baseline"]
    cands = verdict_mod.candidates(proto, rows)
    verdict_mod.verify_measurements(proto, remeasured, base["plan"], cands)
    w = verdict_mod.winner(proto, base["plan"], cands, remeasured)
    if w is None:
        out.update(verdict="INCOMPLETE", line=f"INCOMPLETE: the selection re-measurement of the top {len(cands)} "
                                              f"measured plans is not complete; single-measurement ratio {single_ratio:.3f}")
        return out
    # the winner is the re-measurement's choice; its row is its best study measurement
    best = out["best"] = max((r for r in rows if r["state"] == "COMPLETE" and r["plan"] == w),
                             key=lambda r: r["measured_tokens_per_s_per_gpu"])
    chosen = (f" (chosen over {len(cands) - 1} other top measured plan(s) by the selection re-measurement)"
              if len(cands) > 1 else "")
    if best["plan"] == base["plan"]:
        out.update(verdict="PASS", ratio=1.0, low=1.0, high=1.0,
                   line=f"PASS: the best searched plan is the baseline itself (trial #{best['number']}{chosen}); ratio 1")
        return out
    d = verdict_mod.decide(verdict_mod.complete_pairs(remeasured), proto)
    out.update(verdict=d["verdict"], ratio=d["ratio"], low=d["low"], high=d["high"], single_ratio=single_ratio)
    if d["verdict"] == "INCOMPLETE":
        out["line"] = (f"INCOMPLETE: {d['rounds']} of {proto['rounds']} re-measurement rounds complete (>= 2 needed); "
                       f"single-measurement ratio {single_ratio:.3f}; winner trial #{best['number']}{chosen}")
        return out
    out["line"] = (f"{d['verdict']}: winner / baseline = {d['ratio']:.3f}, {proto['interval']:.0%} bootstrap interval "
                   f"[{d['low']:.3f}, {d['high']:.3f}] over {d['rounds']} interleaved rounds (bar {proto['bar']}); "
                   f"winner trial #{best['number']}{chosen}")
    return out


def write_csv(rows: list[dict], path: Path, cols=CSV_COLS) -> None:
    """`rows` (tuner.study.storage.trial_rows) as CSV, the `cols` columns, written atomically."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in cols})
    write_atomic(path, buf.getvalue())


def _plots(d: Path, measured: list[dict], winner_breakdown: dict | None) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out = []
    if measured:
        fig, ax = plt.subplots(figsize=(5, 5))
        x = [r["predicted_step_time_s"] for r in measured]
        y = [r["measured_step_time_s"] for r in measured]
        ax.scatter(x, y)
        for r in measured:
            ax.annotate(f"#{r['number']}", (r["predicted_step_time_s"], r["measured_step_time_s"]),
                        fontsize=7)
        lo, hi = min(x + y) * 0.8, max(x + y) * 1.2
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="y = x")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("predicted step time (s, calibration at trial time)")
        ax.set_ylabel("measured step time (s)")
        ax.legend()
        fig.tight_layout()
        _save_png(fig, d / "measured_vs_predicted.png")
        plt.close(fig)
        out.append("measured_vs_predicted.png")
    if winner_breakdown:
        items = [(k, v) for k, v in winner_breakdown.items() if v and math.isfinite(v)]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.barh([k for k, _ in items], [v for _, v in items])
        ax.set_xlabel("seconds per step (predicted)")
        ax.set_title("winner: predicted step-time breakdown")
        fig.tight_layout()
        _save_png(fig, d / "winner_breakdown.png")
        plt.close(fig)
        out.append("winner_breakdown.png")
    return out


def _save_png(fig, path: Path) -> None:
    """Save a figure through write_atomic: two tuners reporting at once never interleave bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    write_atomic(path, buf.getvalue())


def _fmt(v, spec=".4f"):
    if v is None or v == "":
        return "-"
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return str(v)


def write_report(study_dir, *, workload, profile, prereg: dict, rows: list[dict], backend: str,
                 tables=None, calibration=None, cal_report=None, predict_only_pool=None,
                 wall_s: float | None = None, storage_url: str = "", remeasured: list[dict] | None = None) -> Path:
    """Write report.md, trials.csv and the plots into `study_dir`; returns report.md's path.

    Args:
        study_dir: the study folder. workload, profile: what was tuned, on which stack profile.
        prereg: the verified pre-registration. rows: `tuner.study.storage.trial_rows` of the study.
        backend: the trial backend name, or "predict-only" (then the top predicted plan wins).
        tables, calibration: the cost model's inputs for the winner's predicted breakdown.
        cal_report: the last calibration refit's report (tuner.study.sampler.GuidedSampler.refit).
        predict_only_pool: the screened pool, listed when no trial ran.
        wall_s: wall time of the run. storage_url: where the study is stored (shown with its
            password redacted).
        remeasured: the adjudication protocol's interleaved re-measurements (tuner/study/verdict.py).
    """
    import cost_model
    from specs.plan import Plan
    d = Path(study_dir)
    write_csv(rows, d / "trials.csv")
    measured = [r for r in rows if r["state"] == "COMPLETE"]
    failures = [r for r in rows if r["state"] == "FAIL"]
    verdict = adjudicate(rows, prereg, remeasured) if backend != "predict-only" else None
    if backend == "predict-only":
        winner_plan = (predict_only_pool[0].plan if predict_only_pool else prereg["plans"][0]["plan"])
        winner_src = "top predicted plan (no trials: --backend predict-only)"
    elif verdict and verdict.get("best") and prereg.get("adjudication"):
        w = verdict["best"]  # the re-measurement's choice among the top measured plans (tuner/study/verdict.py)
        winner_plan, winner_src = w["plan"], f"winner by the adjudication's re-measurement, trial #{w['number']}"
    elif measured:
        w = max(measured, key=lambda r: r["measured_tokens_per_s_per_gpu"])
        winner_plan, winner_src = w["plan"], f"best measured trial #{w['number']}"
    else:
        winner_plan, winner_src = prereg["plans"][0]["plan"], "no trial measured: top predicted plan"
    plan = Plan.parse(winner_plan)
    pred = cost_model.predict(workload, plan, tables=tables, calibration=calibration)
    pngs = _plots(d, measured, pred.breakdown_s)
    L = [f"# moetune tune: study `{prereg['study']}`", ""]
    wl = prereg["workload"]
    L += [f"Workload: {wl['model']} on {wl['devices']} x {wl['cluster']}, gbs {wl['gbs']}, seq {wl['seq']}, "
          f"{wl['precision']}; stack profile {profile.describe()}; backend {backend}.",
          f"Storage: `{redact_url(storage_url)}`." if storage_url else "",
          f"Wall time of this run: {wall_s:.0f} s." if wall_s is not None else "", ""]
    L += ["## Winner", "", f"{winner_src}:", "", f"`{winner_plan}`", ""]
    L += [f"Predicted (calibration {pred.calibration_id}): step {pred.step_time_s:.4f} s, "
          f"{pred.tokens_per_s_per_gpu:.1f} tok/s/GPU, peak memory {pred.peak_memory_gib:.2f} GiB.", ""]
    L += ["What-if (kernel tier, not runnable on the pinned stacks): "
          + describe(megakernel_training(workload, plan, pred)) + ".", ""]
    if "winner_breakdown.png" in pngs:
        L += ["![winner breakdown](winner_breakdown.png)", ""]
    if verdict:
        L += ["## Baseline and adjudication", "",
              f"Baseline ({prereg['baseline']['source']}): `{prereg['baseline']['plan']}` - predicted "
              f"{prereg['baseline']['predicted_tokens_per_s_per_gpu']:.1f} tok/s/GPU.", "",
              f"Acceptance bar (pre-registered): {prereg['acceptance']['rule']}.", "",
              f"**{verdict['line']}**", ""] + _remeasure_table(prereg, remeasured) + [
              f"Pre-registration sha256 {prereg['sha256']} (verify with `moetune adjudicate "
              f"{prereg['study']} --study-dir {d}`).", ""]
    if cal_report:
        L += ["## Calibration after the trials", ""] + calibration_lines(cal_report)
    if measured:
        L += ["## Measured vs predicted", "", "![measured vs predicted](measured_vs_predicted.png)", "",
              "| # | roles | plan (non-default fields) | pred step s | meas step s | pred tok/s/GPU | meas tok/s/GPU |",
              "|---|---|---|---|---|---|---|"]
        for r in sorted(measured, key=lambda r: -r["measured_tokens_per_s_per_gpu"]):
            L.append(f"| {r['number']} | {r.get('roles', '')} | `{_short(r['plan'])}` | "
                     f"{_fmt(r.get('predicted_step_time_s'))} | {_fmt(r.get('measured_step_time_s'))} | "
                     f"{_fmt(r.get('predicted_tokens_per_s_per_gpu'), '.1f')} | "
                     f"{_fmt(r.get('measured_tokens_per_s_per_gpu'), '.1f')} |")
        L.append("")
    if failures:
        L += ["## Failures", "", "| # | plan | kind | reason |", "|---|---|---|---|"]
        for r in failures:
            msg = str(r.get("failure_message", "")).replace("\n", " ").replace("|", "/")[-240:]
            L.append(f"| {r['number']} | `{_short(r['plan'])}` | {r.get('failure_kind', '')} | {msg} |")
        L.append("")
    if backend == "predict-only" and predict_only_pool:
        L += ["## Top predicted plans", "", "| plan | pred step s | pred tok/s/GPU | pred peak GiB |",
              "|---|---|---|---|"]
        for s in predict_only_pool[:15]:
            L.append(f"| `{_short(s.plan)}` | {s.step_time_s:.4f} | {s.tokens_per_s_per_gpu:.1f} | "
                     f"{s.peak_memory_gib:.2f} |")
        L.append("")
    L += ["## Winner launch script (Megatron-LM pretrain_gpt.py)", ""]
    try:
        from tuner.emit.megatron import megatron_script
        L += ["```bash", megatron_script(workload, plan, profile).rstrip(), "```", ""]
    except ImportError:
        L += ["(tuner.emit.megatron is not available in this checkout)", ""]
    except Exception as e:  # noqa: BLE001 - the report must still be written
        L += [f"(emit failed: {e})", ""]
    L += ["Files: trials.csv, preregistration.json (+ .sha256)" + "".join(f", {p}" for p in pngs), ""]
    return write_atomic(d / "report.md", "\n".join(x for x in L if x is not None) + "\n")


def _short(plan: str) -> str:
    """Non-default fields of a canonical plan, for tables."""
    from specs.plan import Plan
    p, dflt = Plan.parse(plan), Plan()
    parts = [f"{f}={getattr(p, f)}" for f in p.__dataclass_fields__
             if getattr(p, f) != getattr(dflt, f) and f not in ("dist_opt", "overlap_grad_reduce",
                                                                 "overlap_param_gather", "grouped_gemm")]
    return ",".join(parts) or "defaults"


def calibration_lines(cal_report: dict) -> list[str]:
    """The last refit (`cost_model.calibration.fit_calibration`'s report) as markdown: the one
    scale, or the per-component factors with their 90% intervals, and the errors."""
    n = len(cal_report["rows"])
    err = (f"max |rel err| {cal_report['max_abs_rel_err']:.1%}, leave-one-out max "
           f"{cal_report['loo_max_abs_rel_err']:.1%}.")
    if not cal_report.get("factors"):
        return [f"Fitted scale {cal_report['scale']:.4g} on {n} measured plans; " + err, ""]
    split = sum(1 for r in cal_report["rows"] if r.get("measured_parts_s"))
    L = [f"Per-component factors fitted on {n} measured plans ({split} with their own per-class split, the rest "
         f"on the step total; prior log f ~ N(0, 0.5^2)); " + err, "",
         "| class | factor | 90% interval |", "|---|---|---|"]
    for c, (f, lo, hi) in cal_report["factor_intervals"].items():
        L.append(f"| {c} | {f:.3g} | {lo:.3g} .. {hi:.3g} |")
    return L + [""]


def _remeasure_table(prereg: dict, remeasured: list[dict] | None) -> list[str]:
    """Every re-measurement of the adjudication protocol, in the order it ran."""
    proto = prereg.get("adjudication")
    if not proto:
        return []
    sel = (f"first the top {proto['top_k']} measured plans re-measured in {proto['select_rounds']} selection "
           f"round(s) ({proto['select_rule']}); " if "top_k" in proto else "")
    L = [f"Adjudication protocol (pre-registered): {sel}{proto['rounds']} rounds, {proto['order']}; "
         f"{proto['bootstrap']} bootstrap replicates, seed {proto['seed']}, {proto['interval']:.0%} interval, "
         f"bar {proto['bar']}.", ""]
    if not remeasured:
        return L + ["No re-measurement ran (the winner is the baseline, or one of them has no measurement).", ""]
    L += ["| phase | round | role | plan | median step s | timed steps s | tok/s/GPU |", "|---|---|---|---|---|---|---|"]
    for m in remeasured:
        head = f"| {m.get('phase', 'verdict')} | {m['round'] + 1} | {m['role']} | `{_short(m['plan'])}` |"
        if m.get("ok"):
            steps = " ".join(f"{x:.4f}" for x in m.get("step_times_s", ()))
            L.append(f"{head} {m['step_time_s']:.4f} | {steps} | {m['tokens_per_s_per_gpu']:.1f} |")
        else:
            L.append(f"{head} FAIL {m.get('kind', '')} | - | - |")
    return L + [""]
