"""`<study dir>/report.md` of a serving study (`moetune tune --mode serve`): the one study report
(tuner.study.report.write_study_report: verdict, one winner, pre-registered and final-calibration predictions,
rank quality, provenance, next steps, plots) with serving's parts: measured TTFT / TPOT p90 against
the SLOs (which the verdict enforces), a latency plot with the SLO lines, and the winner's server
command."""
from __future__ import annotations

from pathlib import Path

from specs.fileio import write_png
from tuner.rank.serve_price import short_plan
from tuner.study import plots
from tuner.study.report import _fmt, slo_misses, write_study_report

SERVE_CSV_COLS = ("number", "state", "plan", "roles", "predicted_tokens_per_s_per_gpu",
                  "measured_tokens_per_s_per_gpu", "predicted_step_time_s", "predicted_raw_step_time_s",
                  "measured_step_time_s", "predicted_raw_ttft_p90_s", "measured_ttft_p90_s",
                  "predicted_raw_tpot_p90_s", "measured_tpot_p90_s", "measured_output_tokens_per_s_per_gpu",
                  "measured_input_tokens_per_s_per_gpu", "startup_s", "calibration_scale", "failure_kind",
                  "failure_message", "claim_lost_to", "owner", "attempt")


def _latency_plot(d: Path, measured: list[dict], ttft_slo: float, tpot_slo: float) -> list:
    """Measured TTFT and TPOT p90 per trial, bars, with the SLO as a line (a bar above it misses)."""
    if not measured:
        return []
    plt = plots._plt()
    rows = sorted(measured, key=lambda r: r["number"])
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.8))
    for ax, key, slo, name in ((axes[0], "measured_ttft_p90_s", ttft_slo, "TTFT p90"),
                               (axes[1], "measured_tpot_p90_s", tpot_slo, "TPOT p90")):
        vals = [float(r.get(key) or 0) for r in rows]
        colours = [plots.BASELINE["color"] if "baseline" in str(r.get("roles", "")) else plots.SEARCHED["color"] for r in rows]
        ax.bar([f"#{r['number']}" for r in rows], vals, color=colours)
        if slo:
            ax.axhline(slo, color="tab:red", ls="--", lw=1, label=f"SLO {slo:g} s")
            ax.legend(fontsize=7)
        ax.set_ylabel(f"measured {name} (s)")
        ax.set_xlabel("trial (orange: baseline)")
    fig.suptitle("measured latency by trial")
    write_png(fig, d / "latency_by_trial.png")
    return [("latency_by_trial.png", "measured TTFT / TPOT p90 by trial, SLOs dashed")]


def write_serve_report(study_dir, *, task, prereg: dict, rows: list[dict], calibration=None, cal_report=None,
                       wall_s: float | None = None, storage_url: str = "", tables=None) -> Path:
    """The serving study's report (tuner.study.report.write_study_report with serving's Mode); returns report.md's
    path. `calibration`: the final one; `storage_url` is shown with its password redacted."""
    from tuner.study.report import Mode
    w = task.workload
    unit = ("input" if w.phase == "prefill" else "output") + " tok/s/GPU"
    scale = calibration.scale if calibration is not None else 1.0

    def final(r):
        raw = r.get("predicted_raw_step_time_s")
        return 1.0 / (scale * raw) if raw else None

    def latency(key, slo):
        def cell(r):
            v = r.get(key)
            return "-" if v in (None, "") else f"{float(v):.4f}" + (" (miss)" if slo and float(v) > slo else "")
        return cell

    def winner_lines(plan: str) -> list[str]:
        if task.backend != "vllm":
            flags = (f"--model {task.model.name} --cluster {task.cluster.kind} --gpus {task.world} "
                     f"--isl {w.isl} --osl {w.osl}")
            return ["Launch (SGLang):", "", "```bash", f"moetune emit sglang {flags} --plan '{short_plan(plan)}' "
                    "--out launch.sh", "```", ""]
        from specs.models import hf_id
        from specs.serve_plan import ServePlan
        from tuner.emit.vllm import vllm_command
        # the published checkpoint when the model has one (real weights); else the config-only
        # directory the trials served, with random weights
        repo = hf_id(task.model)
        cmd, _ = vllm_command(ServePlan.parse(plan), repo or f"{task.model.name}-config", served_name=task.model.name,
                              max_model_len=w.isl + w.osl, cpu=not task.cluster.is_gpu, dummy=not repo)
        return ["Launch (vLLM):", "", "```bash", cmd, "```", ""] if cmd else []

    flags = f"--model {task.model.name} --cluster {task.cluster.kind} --gpus {task.world} --isl {w.isl} --osl {w.osl}"
    slo_flags = (f" --ttft-slo {w.ttft_p90_s:g}" if w.ttft_p90_s else "") + (f" --tpot-slo {w.tpot_p90_s:g}" if w.tpot_p90_s else "")
    measured_tables = bool(tables is not None and getattr(tables, "meta", {}).get("measured"))
    mode = Mode(
        unit=unit, short=short_plan, final=final, csv_cols=SERVE_CSV_COLS, winner_lines=winner_lines,
        workload_line=(f"{task.model.name} on {task.world} x {task.cluster.kind}, phase {w.phase}, isl {w.isl}, osl {w.osl}, "
                       f"concurrency {w.concurrency}; objective {w.objective}; trial backend `{task.backend}`."),
        extra_cols=[("measured TTFT p90 s", latency("measured_ttft_p90_s", w.ttft_p90_s)),
                    ("measured TPOT p90 s", latency("measured_tpot_p90_s", w.tpot_p90_s)),
                    ("within SLOs", lambda r: "-" if r["state"] != "COMPLETE" else ("no" if slo_misses(r, prereg) else "yes"))],
        extra_plots=lambda d, measured: _latency_plot(d, measured, w.ttft_p90_s, w.tpot_p90_s),
        next_steps=[("rank every plan by goodput under the SLOs, with the Pareto plot",
                     f"moetune plans --mode serve {flags}{slo_flags} --rank --plot pareto")],
        provenance=[f"Tables: {'measured on this cluster' if measured_tables else 'shipped defaults (not profiled on this cluster)'}.",
                    f"Final calibration: serving model term, scale {_fmt(scale, '.4g')} "
                    f"({calibration.id if calibration is not None else 'identity'}; "
                    f"{'fitted on this study' if cal_report else 'as pre-registered'})."])
    return write_study_report(study_dir, mode, title=f"Serving study `{prereg['study']}`", prereg=prereg, rows=rows,
                 backend=task.backend, cal_report=cal_report,
                 wall_s=wall_s, storage_url=storage_url)
