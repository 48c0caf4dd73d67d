"""`<study dir>/report.md` for `moetune tune`: trials.csv, PNG plots (matplotlib Agg), measured vs
predicted, the winner's predicted breakdown, failures with reasons, baseline comparison and
adjudication, and the winner's Megatron-LM launch script (`tuner.emit.megatron.megatron_script`)."""
from __future__ import annotations

import csv
import io
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specs.fileio import write_atomic
from tuner.rank.whatif import describe, megakernel_training
from tuner.study import plots

CSV_COLS = ("number", "state", "plan", "roles", "predicted_step_time_s", "predicted_raw_step_time_s",
            "measured_step_time_s", "predicted_tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu",
            "predicted_peak_memory_gib", "measured_peak_memory_gib", "failure_kind", "failure_message",
            "claim_lost_to", "owner", "attempt", "nodes")


SLO_CHECKS = (("measured_ttft_p90_s", "ttft_p90_slo_s", "TTFT p90"), ("measured_tpot_p90_s", "tpot_p90_slo_s", "TPOT p90"))


def slo_misses(row: dict, prereg: dict) -> list[str]:
    """The pre-registered serving SLOs (`workload.ttft_p90_slo_s` / `tpot_p90_slo_s`; none for
    training) that the trial's *measured* latencies miss, one phrase each."""
    wl, out = prereg.get("workload", {}), []
    for key, slo_key, name in SLO_CHECKS:
        slo, v = wl.get(slo_key) or 0.0, row.get(key)
        if slo > 0 and v not in (None, "") and float(v) > slo:
            out.append(f"measured {name} {float(v):.3g} s > SLO {slo:g} s")
    return out


def contenders(rows: list[dict], prereg: dict) -> tuple[dict | None, dict | None]:
    """(the baseline's measured trial, the best measured searched trial that meets the SLOs when
    measured), either None if missing. The one definition of the study's winner."""
    base_plan = prereg["baseline"]["plan"]
    done = [r for r in rows if r["state"] == "COMPLETE"]
    base = next((r for r in done if r["plan"] == base_plan), None)
    searched = [r for r in done if "searched" in str(r.get("roles", "")) and not slo_misses(r, prereg)]
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
        missed = [r for r in rows if r["state"] == "COMPLETE" and "searched" in str(r.get("roles", "")) and slo_misses(r, prereg)]
        if missed:  # measured, but none within the SLOs it was tuned for: that cannot pass
            out.update(verdict="FAIL", line=f"FAIL: no searched plan met the SLOs when measured ({len(missed)} measured; "
                                            f"#{missed[0]['number']}: {'; '.join(slo_misses(missed[0], prereg))})")
            return out
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


def _fmt(v, spec=".4f"):
    if v is None or v == "":
        return "-"
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return str(v)


@dataclass
class Mode:
    """What differs between a training and a serving report; everything else is `write`'s.

    unit: the objective's name (tok/s/GPU; serving says input or output). short: a plan's table form.
    final: a row -> its tok/s/GPU predicted at the final calibration (None if it cannot be priced).
    workload_line: the first paragraph. extra_cols: [(header, row -> cell)] of the trials table.
    winner_lines: winner plan -> lines under "Winner" (predicted breakdown, launch command).
    extra_plots: study folder, measured rows -> [(file, caption)] written. next_steps: [(why, command)].
    provenance: lines about the tables and calibrations. csv_cols: trials.csv's columns.
    """
    unit: str
    short: Callable[[str], str]
    final: Callable[[dict], float | None]
    workload_line: str
    extra_cols: list = field(default_factory=list)
    winner_lines: Callable[[str], list] = lambda plan: []
    extra_plots: Callable[[Path, list], list] = lambda d, rows: []
    next_steps: list = field(default_factory=list)
    provenance: list = field(default_factory=list)
    csv_cols: tuple = CSV_COLS


def prereg_predictions(prereg: dict) -> dict[str, float]:
    """plan -> the tok/s/GPU pre-registered for it (the baseline's and every candidate's), at the
    calibration of pre-registration."""
    out = {p["plan"]: p.get("predicted_tokens_per_s_per_gpu") for p in prereg.get("plans", ())}
    if prereg.get("baseline"):
        out[prereg["baseline"]["plan"]] = prereg["baseline"].get("predicted_tokens_per_s_per_gpu")
    return out


def spread(row: dict) -> tuple[float, float] | None:
    """(low, high) tok/s/GPU of a trial's timed steps (the slowest and fastest step, at the median
    step's tokens), or None without per-step times."""
    steps = [float(x) for x in (row.get("measured_step_times_s") or ()) if x]
    med, tok = row.get("measured_step_time_s"), row.get("measured_tokens_per_s_per_gpu")
    if len(steps) < 2 or not med or not tok:
        return None
    return tok * med / max(steps), tok * med / min(steps)


def adjudicate_hint(study: str, study_dir: Path, storage_url: str) -> str:
    """The `moetune adjudicate` command for this study, from any folder it was run in: the study
    folder unless it is the default, and the storage unless it is the default SQLite in that folder
    (a database URL's password is shown as *** and must be filled in)."""
    from tuner.study.storage import default_storage_url, default_study_dir, redact_url
    parts = ["moetune", "adjudicate", study]
    if Path(study_dir) != default_study_dir(study):
        parts += ["--study-dir", str(study_dir)]
    if storage_url and storage_url != default_storage_url(study_dir):
        parts += ["--storage", redact_url(storage_url)]
    return " ".join(shlex.quote(x) for x in parts)


def storage_line(study_dir: Path, storage_url: str) -> str:
    """Where the study is stored, fit to show: the default SQLite file named by its folder (no
    machine path), another storage with its password redacted."""
    from tuner.study.storage import default_storage_url, redact_url
    if not storage_url or storage_url == default_storage_url(study_dir):
        return "Storage: SQLite `study.db` in the study folder (the default)."
    return f"Storage: `{redact_url(storage_url)}`."


def rank_quality(measured: list[dict], key_pred: str) -> str:
    """Spearman's rho and top-3 overlap of the predictions in `key_pred` against the measured
    medians, over the trials that have both; "-" where there are too few."""
    from tuner.study.rank_quality import spearman, top_k_overlap
    pts = [(float(r[key_pred]), float(r["measured_tokens_per_s_per_gpu"])) for r in measured
           if r.get(key_pred) and r.get("measured_tokens_per_s_per_gpu")]
    rho = spearman([a for a, _ in pts], [b for _, b in pts])
    top = top_k_overlap([a for a, _ in pts], [b for _, b in pts], 3)
    err = [abs(a / b - 1) for a, b in pts]
    return (f"Spearman {_fmt(rho, '.2f')}, top-3 overlap {_fmt(top, '.0%')}, "
            f"mean |error| {_fmt(sum(err) / len(err) if err else None, '.0%')} over {len(pts)} measured trials")


def winner_of(prereg: dict, verdict: dict | None, predict_only_winner: str | None = None) -> tuple[str, str]:
    """(the study's one winner plan, why it is the winner): the verdict's best measured searched plan
    (`contenders`), the top predicted plan of a predict-only run, else the top pre-registered plan."""
    if predict_only_winner:
        return predict_only_winner, "the top predicted plan (no trials: --backend predict-only)"
    if verdict and verdict["best"]:
        how = ("the adjudication's re-measurement of the top measured plans chose it"
               if (prereg.get("adjudication") or {}).get("top_k") else "the best measured searched plan")
        return verdict["best"]["plan"], f"trial #{verdict['best']['number']}, {how}"
    if prereg.get("plans"):
        return prereg["plans"][0]["plan"], "no searched plan won: the top pre-registered plan"
    return prereg["baseline"]["plan"], "no searched plan won: the baseline"


def write_study_report(study_dir, mode: Mode, *, title: str, prereg: dict, rows: list[dict], backend: str, cal_report=None,
          wall_s: float | None = None, storage_url: str = "", remeasured: list[dict] | None = None,
          predict_only_winner: str | None = None, top_predicted: list | None = None) -> Path:
    """The study report (both modes): report.md, trials.csv and the plots, into `study_dir`.

    One winner everywhere (`contenders`: the best measured searched trial within the SLOs; the top
    predicted plan with --backend predict-only); the trials table holds, per trial, the prediction
    pre-registered for it, the prediction at the final calibration, and the measured median with
    its spread (slowest..fastest timed step), never a prediction at the calibration of trial time.
    """
    d = Path(study_dir)
    write_csv(rows, d / "trials.csv", mode.csv_cols)
    pre = prereg_predictions(prereg)
    for r in rows:
        r["prereg_tokens_per_s_per_gpu"] = pre.get(r["plan"])
        r["final_tokens_per_s_per_gpu"] = mode.final(r) if r["state"] == "COMPLETE" else None
        lo_hi = spread(r) if r["state"] == "COMPLETE" else None
        r["measured_low"], r["measured_high"] = lo_hi or (None, None)
    measured = sorted((r for r in rows if r["state"] == "COMPLETE"), key=lambda r: -r["measured_tokens_per_s_per_gpu"])
    failures = [r for r in rows if r["state"] == "FAIL"]
    verdict = adjudicate(rows, prereg, remeasured) if backend != "predict-only" else None
    winner, winner_src = winner_of(prereg, verdict, predict_only_winner)
    pngs = []
    if plots.measured_vs_predicted(d / "measured_vs_predicted.png", measured, measured="measured_tokens_per_s_per_gpu",
                                   predictions={"pre-registered prediction": "prereg_tokens_per_s_per_gpu",
                                                "prediction at the final calibration": "final_tokens_per_s_per_gpu"},
                                   unit=mode.unit, low="measured_low", high="measured_high"):
        pngs.append(("measured_vs_predicted.png", "measured (median, bar: slowest..fastest step) against predicted"))
    base = verdict["baseline"] if verdict else None
    if plots.history(d / "history.png", measured, measured="measured_tokens_per_s_per_gpu", unit=mode.unit,
                     baseline_value=base["measured_tokens_per_s_per_gpu"] if base else None):
        pngs.append(("history.png", "measured throughput by trial, best so far"))
    pngs += mode.extra_plots(d, measured)
    wl = prereg.get("workload", {})
    L = [f"# {title}", "", mode.workload_line, "", storage_line(d, storage_url),
         f"Wall time of this run: {wall_s:.0f} s." if wall_s is not None else "", ""]
    L += ["## Verdict", ""]
    if verdict:
        L += [f"**{verdict['line']}**", "",
              f"Baseline ({prereg['baseline']['source']}): `{mode.short(prereg['baseline']['plan'])}`. "
              f"Acceptance bar (pre-registered): {prereg['acceptance'].get('rule', prereg['acceptance']['ratio'])}."]
        slos = [f"{name} <= {wl[k]:g} s" for _, k, name in SLO_CHECKS if wl.get(k)]
        if slos:
            L.append(f"Serving SLOs, enforced on the measured latencies: {', '.join(slos)}.")
        L += [""] + _remeasure_table(prereg, remeasured)
    else:
        L += ["No trial ran (--backend predict-only): nothing to adjudicate.", ""]
    L += ["## Winner", "", f"{winner_src}: `{mode.short(winner)}`", ""]
    wrow = next((r for r in measured if r["plan"] == winner), {})
    L += ["| | pre-registered prediction | at the final calibration | measured median (spread) |", "|---|---|---|---|",
          f"| {mode.unit} | {_fmt(pre.get(winner), '.1f')} | {_fmt(wrow.get('final_tokens_per_s_per_gpu'), '.1f')} | "
          f"{_measured_cell(wrow)} |", ""]
    L += mode.winner_lines(winner)
    if measured or failures:
        L += ["## Trials", "",
              f"Every prediction column is at one calibration: pre-registered (before any trial; `-` for plans "
              f"proposed later) or final (after the last refit). Measured: the median step, and in brackets the "
              f"slowest..fastest timed step. Ranking quality: pre-registered {rank_quality(measured, 'prereg_tokens_per_s_per_gpu')}; "
              f"final {rank_quality(measured, 'final_tokens_per_s_per_gpu')}.", ""]
        head = ["#", "roles", "plan", f"pre-registered {mode.unit}", f"final-calibration {mode.unit}",
                f"measured {mode.unit}", "measured / final"] + [h for h, _ in mode.extra_cols] + ["state"]
        L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in measured + sorted(failures, key=lambda r: r["number"]):
            fin, meas = r.get("final_tokens_per_s_per_gpu"), r.get("measured_tokens_per_s_per_gpu")
            mark = " **winner**" if r["plan"] == winner and r["state"] == "COMPLETE" else ""
            cells = [str(r["number"]), str(r.get("roles", "")) + mark, f"`{mode.short(r['plan'])}`",
                     _fmt(r.get("prereg_tokens_per_s_per_gpu"), ".1f"), _fmt(fin, ".1f"), _measured_cell(r),
                     _fmt(meas / fin if meas and fin else None, ".2f")] + [f(r) for _, f in mode.extra_cols] + \
                    [r["state"] + (f" {r.get('failure_kind', '')}" if r["state"] == "FAIL" else "")]
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
    if failures:
        L += ["## Failures", "", "| # | plan | kind | reason |", "|---|---|---|---|"]
        for r in failures:
            msg = str(r.get("failure_message", "")).replace("\n", " ").replace("|", "/")[-240:]
            L.append(f"| {r['number']} | `{mode.short(r['plan'])}` | {r.get('failure_kind', '')} | {msg} |")
        L.append("")
    if top_predicted:
        L += ["## Top predicted plans", "", f"| plan | predicted {mode.unit} |", "|---|---|"]
        L += [f"| `{mode.short(pl)}` | {v:.1f} |" for pl, v in top_predicted[:15]] + [""]
    h = prereg.get("hashes", {})
    L += ["## Provenance", ""] + [f"- {x}" for x in mode.provenance] + [
        f"- Pre-registration: `preregistration.json` sha256 {prereg.get('sha256', '')[:16]}..., calibration "
        f"{h.get('calibration_id', '-')}, tables digest {str(h.get('tables_digest', '-'))[:16]}.", ""]
    if cal_report:
        L += ["## Calibration after the trials", ""] + calibration_lines(cal_report)
    if pngs:
        L += ["## Plots", ""] + [f"![{cap}]({f})" for f, cap in pngs] + [""]
    steps = ([("verify the pre-registration and recompute the verdict", adjudicate_hint(prereg["study"], d, storage_url))]
             if backend != "predict-only" else []) + mode.next_steps
    L += ["## Next steps", ""]
    for why, cmd in steps:
        L += [f"{why[0].upper()}{why[1:]}:", "", "```bash", cmd, "```", ""]
    L += ["Files: trials.csv, preregistration.json (+ .sha256)" + "".join(f", {f}" for f, _ in pngs), ""]
    return write_atomic(d / "report.md", "\n".join(x for x in L if x is not None) + "\n")


def _measured_cell(r: dict) -> str:
    v = r.get("measured_tokens_per_s_per_gpu")
    if not v:
        return "-"
    lo, hi = r.get("measured_low"), r.get("measured_high")
    return f"{v:.1f} ({lo:.1f}..{hi:.1f})" if lo and hi else f"{v:.1f}"


def write_report(study_dir, *, workload, profile, prereg: dict, rows: list[dict], backend: str,
                 tables=None, calibration=None, cal_report=None, predict_only_pool=None,
                 wall_s: float | None = None, storage_url: str = "", remeasured: list[dict] | None = None) -> Path:
    """The training study's report (`write` with training's `Mode`); returns report.md's path.

    Args:
        study_dir: the study folder. workload, profile: what was tuned, on which stack profile.
        prereg: the verified pre-registration. rows: `tuner.study.storage.trial_rows` of the study.
        backend: the trial backend name, or "predict-only" (then the top predicted plan wins).
        tables, calibration: the cost model's inputs (calibration: the final one, after the last refit).
        cal_report: the last calibration refit's report (tuner.study.sampler.GuidedSampler.refit).
        predict_only_pool: the screened pool, listed when no trial ran.
        wall_s: wall time of the run. storage_url: where the study is stored (shown with its
            password redacted).
        remeasured: the adjudication protocol's interleaved re-measurements (tuner/study/verdict.py).
    """
    import cost_model
    from specs.plan import Plan
    cal = cost_model.resolve_calibration(workload, calibration, tables)

    def final(r):
        try:
            return cost_model.predict(workload, Plan.parse(r["plan"]), tables=tables, calibration=cal).tokens_per_s_per_gpu
        except Exception:  # noqa: BLE001 - a plan the model cannot price any more: no final prediction
            return None

    def winner_lines(plan: str) -> list[str]:
        pl = Plan.parse(plan)
        pred = cost_model.predict(workload, pl, tables=tables, calibration=cal)
        L = [f"Predicted at the final calibration ({pred.calibration_id}): step {pred.step_time_s:.4f} s, "
             f"peak memory {pred.peak_memory_gib:.2f} GiB.", "",
             "What-if (kernel tier, not runnable on the pinned stacks): "
             + describe(megakernel_training(workload, pl, pred)) + ".", ""]
        if plots.bars(Path(study_dir) / "winner_breakdown.png", list(pred.breakdown_s.items()),
                      x_label="seconds per step (predicted, final calibration; `calibration` is the fitted term)",
                      title="winner: predicted step-time breakdown, largest first"):
            L += ["![winner: predicted step-time breakdown](winner_breakdown.png)", ""]
        L += ["Launch script (Megatron-LM pretrain_gpt.py):", ""]
        try:
            from tuner.emit.megatron import megatron_script
            L += ["```bash", megatron_script(workload, pl, profile).rstrip(), "```", ""]
        except Exception as e:  # noqa: BLE001 - the report must still be written
            L += [f"(emit failed: {e})", ""]
        return L

    wl = prereg["workload"]
    flags = (f"--model {wl['model']} --cluster {wl['cluster']} --gpus {wl['devices']} --gbs {wl['gbs']} --seq {wl['seq']}"
             + (f" --precision {wl['precision']}" if wl.get("precision", "bf16") != "bf16" else ""))
    measured_tables = bool(tables is not None and getattr(tables, "meta", {}).get("measured"))
    top = [(s.plan, s.tokens_per_s_per_gpu) for s in predict_only_pool] if predict_only_pool and backend == "predict-only" else None
    winner_po = (predict_only_pool[0].plan if predict_only_pool else prereg["plans"][0]["plan"]) if backend == "predict-only" else None

    winner, _ = winner_of(prereg, adjudicate(rows, prereg, remeasured) if backend != "predict-only" else None, winner_po)

    def winner_cmd(verb):
        return f"moetune {verb} {flags} --plan {shlex.quote(winner)}"  # canonical: it parses back to this plan
    steps = [("the winner's predicted breakdown", winner_cmd("predict") + " --complete defaults"),
             ("its Megatron-LM launch script", winner_cmd("emit megatron") + " --complete defaults --out winner.sh")]
    if not measured_tables:
        steps.append(("measure this cluster's tables (the predictions used the shipped ones)",
                      f"moetune profile --cluster {wl['cluster']}"))
    mode = Mode(
        unit="tok/s/GPU", short=_short, final=final, winner_lines=winner_lines, next_steps=steps,
        workload_line=(f"Workload: {wl['model']} on {wl['devices']} x {wl['cluster']}, gbs {wl['gbs']}, seq {wl['seq']}, "
                       f"{wl['precision']}; stack profile {profile.describe()}; backend {backend}."),
        provenance=[f"Tables: {'measured on this cluster' if measured_tables else 'shipped defaults (not profiled on this cluster)'}.",
                    f"Final calibration: {cal.id} ({'fitted on this study' if cal_report else 'as pre-registered'})."])
    return write_study_report(study_dir, mode, title=f"moetune tune: study `{prereg['study']}`", prereg=prereg, rows=rows,
                 backend=backend, cal_report=cal_report, wall_s=wall_s, storage_url=storage_url,
                 remeasured=remeasured, predict_only_winner=winner_po, top_predicted=top)


def _short(plan: str) -> str:
    """Non-default fields of a canonical training plan as the plan string spells them (so the
    next-step commands parse), for tables; the schedule flags on by default are left out."""
    from specs.plan import Plan
    skip = ("dist_opt", "overlap_grad_reduce", "overlap_param_gather", "grouped_gemm", "permute_fusion", "router_fusion")
    dflt = dict(f.split("=", 1) for f in Plan().canonical().split(","))
    parts = [f for f in Plan.parse(plan).canonical().split(",") if f.split("=", 1)[0] not in skip
             and dflt.get(f.split("=", 1)[0]) != f.split("=", 1)[1]]
    return ",".join(parts) or "defaults"


def _prior_text(cal_report: dict) -> str:
    """The per-component fit's prior as the report states it (cost_model.calibration)."""
    from cost_model.calibration import COMMON_PRIOR_SD, PRIOR_SD
    c = cal_report.get("common_scale")
    common = f"common scale {c:.3g}, " if c else ""
    return f"{common}each class's log factor ~ N(log common scale, {PRIOR_SD}^2), log common scale ~ N(0, {COMMON_PRIOR_SD}^2)"


def calibration_lines(cal_report: dict) -> list[str]:
    """The last refit (`cost_model.calibration.fit_calibration`'s report) as markdown: the one
    scale, or the per-component factors with their 90% intervals, and the errors."""
    n = len(cal_report["rows"])
    err = (f"max |rel err| {_fmt(cal_report.get('max_abs_rel_err'), '.1%')}, leave-one-out max "
           f"{_fmt(cal_report.get('loo_max_abs_rel_err'), '.1%')}.")
    if not cal_report.get("factors"):
        return [f"Fitted scale {_fmt(cal_report.get('scale'), '.4g')} on {n} measured plans; " + err, ""]
    split = sum(1 for r in cal_report["rows"] if r.get("measured_parts_s"))
    L = [f"Per-component factors fitted on {n} measured plans ({split} with their own per-class split, the rest "
         f"on the step total; {_prior_text(cal_report)}); " + err, "",
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
