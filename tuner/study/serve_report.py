"""`<study dir>/report.md` of a serving study (`moetune tune --mode serve`): trials.csv, PNG plots of
TTFT / TPOT p90 and throughput, measured against predicted, the calibration of the serving model's
one term, failures with reasons, the baseline comparison and the PASS/FAIL adjudication at the
pre-registered bar (tuner.study.report.adjudicate, shared with training), and the winner's server command."""
from __future__ import annotations

from pathlib import Path

from specs.fileio import write_atomic
from tuner.study.report import _fmt, adjudicate, write_csv
from tuner.study.storage import redact_url

SERVE_CSV_COLS = ("number", "state", "plan", "roles", "predicted_tokens_per_s_per_gpu",
                  "measured_tokens_per_s_per_gpu", "predicted_step_time_s", "predicted_raw_step_time_s",
                  "measured_step_time_s", "predicted_raw_ttft_p90_s", "measured_ttft_p90_s",
                  "predicted_raw_tpot_p90_s", "measured_tpot_p90_s", "measured_output_tokens_per_s_per_gpu",
                  "measured_input_tokens_per_s_per_gpu", "startup_s", "calibration_scale", "failure_kind",
                  "failure_message", "claim_lost_to", "owner", "attempt")


def _scatter(ax, rows, xk, yk, label, scale_x=None):
    pts = [(r[xk] * (r.get(scale_x, 1.0) if scale_x else 1.0), r[yk], r["number"]) for r in rows
           if r.get(xk) not in (None, "") and r.get(yk) not in (None, "")]
    if not pts:
        ax.set_title(f"{label}: no data")
        return
    x, y = [p[0] for p in pts], [p[1] for p in pts]
    ax.scatter(x, y)
    for a, b, n in pts:
        ax.annotate(f"#{n}", (a, b), fontsize=7)
    lo, hi = min(x + y) * 0.8, max(x + y) * 1.2
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"predicted {label}")
    ax.set_ylabel(f"measured {label}")
    ax.legend(fontsize=7)


def _plots(d: Path, measured: list[dict], unit: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if not measured:
        return []
    out = []
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    # predictions at the calibration of trial time: raw latency x the scale then
    _scatter(axes[0], measured, "predicted_raw_ttft_p90_s", "measured_ttft_p90_s", "TTFT p90 (s)", "calibration_scale")
    _scatter(axes[1], measured, "predicted_raw_tpot_p90_s", "measured_tpot_p90_s", "TPOT p90 (s)", "calibration_scale")
    fig.suptitle("latency: measured vs predicted (calibration at trial time)")
    fig.tight_layout()
    fig.savefig(d / "ttft_tpot.png", dpi=100)
    plt.close(fig)
    out.append("ttft_tpot.png")
    fig, ax = plt.subplots(figsize=(5, 5))
    _scatter(ax, measured, "predicted_tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu", f"{unit} tok/s/GPU")
    fig.tight_layout()
    fig.savefig(d / "throughput.png", dpi=100)
    plt.close(fig)
    out.append("throughput.png")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    lab = [f"#{r['number']}" for r in measured]
    axes[0].bar(lab, [r.get("measured_ttft_p90_s") or 0 for r in measured])
    axes[0].set_ylabel("measured TTFT p90 (s)")
    axes[1].bar(lab, [r.get("measured_tpot_p90_s") or 0 for r in measured])
    axes[1].set_ylabel("measured TPOT p90 (s)")
    fig.suptitle("latency by trial")
    fig.tight_layout()
    fig.savefig(d / "latency_by_trial.png", dpi=100)
    plt.close(fig)
    out.append("latency_by_trial.png")
    return out


def write_serve_report(study_dir, *, task, prereg: dict, rows: list[dict], calibration=None, cal_report=None,
                       wall_s: float | None = None, storage_url: str = "") -> Path:
    """Write report.md, trials.csv and the plots into `study_dir`; returns report.md's path.
    `storage_url` is shown with its password redacted (tuner.study.storage.redact_url, as training's report)."""
    d = Path(study_dir)
    write_csv(rows, d / "trials.csv", SERVE_CSV_COLS)
    measured = sorted((r for r in rows if r["state"] == "COMPLETE"), key=lambda r: r["number"])
    failures = [r for r in rows if r["state"] == "FAIL"]
    verdict = adjudicate(rows, prereg)
    w = task.workload
    unit = "input" if w.phase == "prefill" else "output"
    plots = _plots(d, measured, unit)
    L = [f"# Serving study `{prereg['study']}`", ""]
    L.append(f"{task.model.name} on {task.world} x {task.cluster.kind}, phase {w.phase}, isl {w.isl}, osl {w.osl}, "
             f"concurrency {w.concurrency}; objective {w.objective}; trial backend `{task.backend}`.")
    if wall_s is not None:
        L.append(f"Wall time of this run: {wall_s:.0f} s. Storage: `{redact_url(storage_url)}`.")
    L += ["", "## Verdict", "", f"**{verdict['line']}**", "",
          f"Pre-registration: `preregistration.json` sha256 {prereg['sha256'][:16]}..., "
          f"{len(prereg['plans'])} plans + baseline `{prereg['baseline']['plan']}` ({prereg['baseline']['source']})."]
    L += ["", "## Trials", "",
          f"| # | roles | plan | pred {unit} tok/s/GPU | meas | pred TTFT p90 | meas | pred TPOT p90 | meas | state |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["number"]):
        s = r.get("calibration_scale") or 1.0
        ttft = r.get("predicted_raw_ttft_p90_s")
        tpot = r.get("predicted_raw_tpot_p90_s")
        L.append(f"| {r['number']} | {r.get('roles', '')} | `{_short(r['plan'])}` | "
                 f"{_fmt(r.get('predicted_tokens_per_s_per_gpu'), '.1f')} | {_fmt(r.get('measured_tokens_per_s_per_gpu'), '.1f')} | "
                 f"{_fmt(ttft * s if ttft else None, '.4f')} | {_fmt(r.get('measured_ttft_p90_s'), '.4f')} | "
                 f"{_fmt(tpot * s if tpot else None, '.4f')} | {_fmt(r.get('measured_tpot_p90_s'), '.4f')} | "
                 f"{r['state']}{(' ' + r.get('failure_kind', '')) if r['state'] == 'FAIL' else ''} |")
    L += ["", "## Calibration", ""]
    if calibration is not None:
        L.append(f"Serving model term: scale {calibration.scale:.4g} ({calibration.label}); id {calibration.id}.")
    if cal_report:
        L.append(f"Fitted on {len(cal_report['rows'])} measured trial(s); max |rel err| after the fit "
                 f"{cal_report['max_abs_rel_err']:.1%}; leave-one-out max {_fmt(cal_report['loo_max_abs_rel_err'], '.1%')}.")
    if failures:
        L += ["", "## Failures", ""]
        for r in failures:
            L.append(f"- #{r['number']} `{_short(r['plan'])}`: {r.get('failure_kind')}: "
                     f"{str(r.get('failure_message', ''))[-300:]}")
    if measured:
        best = max(measured, key=lambda r: r["measured_tokens_per_s_per_gpu"])
        L += ["", "## Winner", "", f"Trial #{best['number']} `{best['plan']}`: "
              f"{best['measured_tokens_per_s_per_gpu']:.1f} {unit} tok/s/GPU measured."]
        if task.backend == "vllm":
            from specs.models import hf_id
            from specs.serve_plan import ServePlan
            from tuner.emit.vllm import vllm_command
            # the published checkpoint when the model has one (real weights); else the config-only
            # directory the trials served, with random weights
            repo = hf_id(task.model)
            cmd, why = vllm_command(ServePlan.parse(best["plan"]), repo or f"{task.model.name}-config",
                                    served_name=task.model.name, max_model_len=w.isl + w.osl,
                                    cpu=not task.cluster.is_gpu, dummy=not repo)
            if cmd:
                L += ["", "```", cmd, "```"]
    if plots:
        L += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    L += ["", "Files: `trials.csv`, `preregistration.json` (+ `.sha256`)" + "".join(f", `{p}`" for p in plots) + "."]
    path = d / "report.md"
    write_atomic(path, "\n".join(L) + "\n")
    return path


def _short(plan: str) -> str:
    """Fields that differ from ServePlan's defaults."""
    from specs.serve_plan import ServePlan
    p, base = ServePlan.parse(plan), ServePlan()
    diff = [kv for kv, dv in zip(p.canonical().split(","), base.canonical().split(",")) if kv != dv]
    return ",".join(diff) or "defaults"
