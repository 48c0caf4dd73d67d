"""Side by side: moetune's serving cost model and aiconfigurator 0.12.0 on the same model, GPUs,
workload and SLOs (SGLang backend, H200).

    python bench/serving_vs_aiconfigurator.py [--aic /tmp/aic/bin/aiconfigurator] [--reuse DIR]

For each case it runs `aiconfigurator cli default` (CPU only, offline: HF_HUB_OFFLINE=1), reads
its best aggregated and disaggregated rows, then searches our own plan grid for the best
aggregated plan under the same SLOs (analytic ranking, then the simulation on the top plans),
and also prices aiconfigurator's chosen aggregated config with our model. Writes
bench/results/serving_vs_aiconfigurator.{md,json}. aiconfigurator must be installed in its own
virtual environment (`python -m venv /tmp/aic && /tmp/aic/bin/pip install aiconfigurator==0.12.0`);
without it the table has only our side and says why.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np

from clusters import load_cluster
from cost_model.serving import predict_serve, rank_arrays
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload

OUT = Path(__file__).resolve().parent / "results"
CASES = [
    # name, our preset, HF id for aiconfigurator, gpus, isl, osl, ttft_s, tpot_s, precision
    ("qwen3-30b-a3b_8xh200", "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", 8, 4000, 1000, 2.0, 0.050, "bf16"),
    ("deepseek-v3_16xh200", "deepseek-v3", "deepseek-ai/DeepSeek-V3", 16, 4000, 1000, 2.0, 0.050, "fp8"),
]


def our_grid(gpus: int) -> list[ServePlan]:
    out = []
    for tp in (1, 2, 4, 8, 16):
        if tp > gpus:
            continue
        for a in (1, 2, 4, 8, 16):
            if a > tp or tp % a:
                continue
            for a2a in ("none", "deepep"):
                for tbo in (0, 1):
                    if tbo and a2a == "none" and a == 1:
                        continue  # SGLang rejects TBO without an a2a backend and without attention-DP
                    for mr in (0, 64, 128, 256, 512):
                        out.append(ServePlan.parse(f"tp={tp},dp={gpus // tp},attn_dp={a},a2a={a2a},tbo={tbo},max_running={mr}"))
    return out


def our_best(model, cluster, isl, osl, ttft, tpot, precision):
    """Best aggregated plan under the SLOs: analytic ranking over plans x concurrency, then the
    simulation of the 6 best; returns (row, seconds, plans ranked)."""
    t0 = time.perf_counter()
    plans = our_grid(cluster.num_devices)
    cands = []
    n_ranked = 0
    for per_gpu in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        w = ServeWorkload(isl=isl, osl=osl, concurrency=per_gpu * cluster.num_devices)
        r = rank_arrays(model, cluster, plans, w, precision=precision)
        n_ranked += len(plans)
        ok = r["fits"] & (r["ttft_s"] <= ttft) & (r["tpot_s"] <= tpot)
        for i in np.flatnonzero(ok):
            cands.append((float(r["output_tokens_per_s_per_gpu"][i]), per_gpu, plans[i]))
    rank_s = time.perf_counter() - t0
    cands.sort(key=lambda x: -x[0])
    best = None
    for est, per_gpu, p in cands[:6]:
        w = ServeWorkload(isl=isl, osl=osl, concurrency=per_gpu * cluster.num_devices)
        pr = predict_serve(model, cluster, p, w, precision=precision)
        meets = pr.ttft_p90_s <= ttft and pr.tpot_p90_s <= tpot
        row = {"plan": _short(p), "concurrency": per_gpu * cluster.num_devices, "est": est,
               "tok_s_gpu": pr.output_tokens_per_s_per_gpu, "ttft_p90_s": pr.ttft_p90_s,
               "tpot_p90_s": pr.tpot_p90_s, "meets_slo_in_sim": meets}
        if best is None or (meets and (not best["meets_slo_in_sim"] or row["tok_s_gpu"] > best["tok_s_gpu"])):
            best = row
    return best, time.perf_counter() - t0, rank_s, n_ranked


def _short(p: ServePlan) -> str:
    d = ServePlan()
    return ",".join(f"{k}={v}" for k, v in (kv.split("=") for kv in p.canonical().split(","))
                    if getattr(d, k) != getattr(p, k))


def run_aic(aic: str, hf: str, gpus: int, isl: int, osl: int, ttft: float, tpot: float, save: Path) -> dict:
    save.mkdir(parents=True, exist_ok=True)
    cmd = [aic, "cli", "default", "--model-path", hf, "--total-gpus", str(gpus), "--system", "h200_sxm",
           "--backend", "sglang", "--isl", str(isl), "--osl", str(osl), "--ttft", str(int(ttft * 1000)),
           "--tpot", str(int(tpot * 1000)), "--save-dir", str(save)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    (save / "stdout.log").write_text(p.stdout + "\n--- stderr ---\n" + p.stderr)
    # recorded without this machine's paths (the results are committed): the tool by name, the
    # save folder by its own name
    shown = [Path(aic).name, *cmd[1:-1], save.name]
    return {"cmd": " ".join(shown), "rc": p.returncode, "wall_s": time.perf_counter() - t0}


def read_aic(save: Path) -> dict:
    """aiconfigurator's best agg and disagg rows from the CSVs it saved."""
    out = {}
    for f in sorted(save.rglob("*.csv")):
        name = f.as_posix()
        if "best_config_topn" not in name:
            continue
        mode = "disagg" if "disagg" in name else "agg"
        rows = list(csv.DictReader(f.open()))
        if rows and mode not in out:
            out[mode] = rows[0]
    return out


def aic_plan_to_ours(row: dict, gpus: int) -> ServePlan | None:
    """aiconfigurator's agg parallel string (e.g. tp1pp1dp2etp2ep1) as our plan: its dp is
    attention-DP, tp*dp GPUs per instance, moe ep -> our ep (no a2a backend in its SGLang agg)."""
    par = row.get("parallel", "")
    m = re.match(r"tp(\d+)pp(\d+)dp(\d+)etp(\d+)ep(\d+)", par)
    if not m:
        return None
    tp, pp, dp, etp, ep = map(int, m.groups())
    inst = tp * dp
    return ServePlan(tp=inst, pp=pp, dp=max(gpus // (inst * pp), 1), attn_dp=dp, ep=ep)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aic", default="/tmp/aic/bin/aiconfigurator", help="aiconfigurator executable (its own venv).")
    ap.add_argument("--reuse", default="", help="Directory of earlier aiconfigurator runs (<case>/...) to read instead of running; "
                    "cases without saved CSVs there take aiconfigurator's rows from bench/results/serving_vs_aiconfigurator.json.")
    ap.add_argument("--work", default="/tmp/moetune-aic", help="Where aiconfigurator saves its runs.")
    a = ap.parse_args(argv)
    results = []
    prev_path = OUT / "serving_vs_aiconfigurator.json"
    prev = {r["case"]: r.get("aic", {}) for r in json.loads(prev_path.read_text())} if prev_path.exists() else {}
    for name, preset, hf, gpus, isl, osl, ttft, tpot, prec in CASES:
        model, cl = load_model(preset), load_cluster("h200-sxm", gpus)
        ours, our_s, rank_s, n_ranked = our_best(model, cl, isl, osl, ttft, tpot, prec)
        res = {"case": name, "gpus": gpus, "isl": isl, "osl": osl, "ttft_slo_s": ttft, "tpot_slo_s": tpot,
               "precision": prec, "ours": ours, "ours_wall_s": round(our_s, 2), "ours_rank_s": round(rank_s, 2),
               "ours_plans_ranked": n_ranked}
        save = Path(a.reuse) / name if a.reuse else Path(a.work) / name
        if not a.reuse:
            if not Path(a.aic).exists():
                res["aic_error"] = f"aiconfigurator not found at {a.aic}"
            else:
                res["aic_run"] = run_aic(a.aic, hf, gpus, isl, osl, ttft, tpot, save)
        aic = read_aic(save) if save.exists() else {}
        if not aic and a.reuse and name in prev:
            aic = prev[name]  # the rows of the earlier real run, kept in the JSON (its CSVs were not kept)
        res["aic"] = {k: {c: v.get(c) for c in ("parallel", "bs", "concurrency", "tokens/s/gpu", "tokens/s/user", "ttft", "tpot",
                                                "(p)parallel", "(d)parallel", "(d)bs", "num_total_gpus")}
                      for k, v in aic.items()}
        if "agg" in aic:
            p = aic_plan_to_ours(aic["agg"], gpus)
            if p is not None:
                try:  # its CSV concurrency is per replica (bs: per attention-DP rank of one replica)
                    conc = int(float(aic["agg"]["concurrency"])) * p.dp
                except (KeyError, TypeError, ValueError):
                    conc = int(float(aic["agg"].get("bs") or 1) * p.attn_dp * p.dp)
                pr = predict_serve(model, cl, p, ServeWorkload(isl=isl, osl=osl, concurrency=conc), precision=prec)
                res["ours_on_aic_agg"] = {"plan": _short(p), "concurrency": conc,
                                          "tok_s_gpu": pr.output_tokens_per_s_per_gpu, "ttft_p90_s": pr.ttft_p90_s,
                                          "tpot_p90_s": pr.tpot_p90_s, "feasible": pr.feasible, "reasons": pr.reasons}
        results.append(res)
    OUT.mkdir(exist_ok=True)
    (OUT / "serving_vs_aiconfigurator.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    lines = ["# moetune serving model vs aiconfigurator 0.12.0 (SGLang, H200)", "",
             "Output tokens/s per GPU under TTFT p90 <= 2 s and TPOT p90 <= 50 ms, isl 4000 / osl 1000. "
             "aiconfigurator: `cli default` (op-level perf DB for SGLang <= 0.5.16); ours: "
             "`bench/serving_vs_aiconfigurator.py` (aggregated plans only).", "",
             "| case | who | config | concurrency / bs | tok/s/GPU | TTFT | TPOT |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for mode, row in r["aic"].items():
            par = row.get("parallel") or f"P {row.get('(p)parallel')} + D {row.get('(d)parallel')}"
            lines.append(f"| {r['case']} | aiconfigurator {mode} | {par} | {row.get('bs') or row.get('(d)bs')} | "
                         f"{row.get('tokens/s/gpu')} | {row.get('ttft')} ms | {row.get('tpot')} ms |")
        o = r["ours"]
        if o:
            lines.append(f"| {r['case']} | moetune best agg | {o['plan']} | {o['concurrency']} | {o['tok_s_gpu']:.0f} | "
                         f"{o['ttft_p90_s'] * 1e3:.0f} ms | {o['tpot_p90_s'] * 1e3:.1f} ms |"
                         + ("" if o["meets_slo_in_sim"] else " (misses the SLO in the simulation)"))
        q = r.get("ours_on_aic_agg")
        if q:
            lines.append(f"| {r['case']} | moetune on aic's agg config | {q['plan']} | {q['concurrency']} | "
                         f"{q['tok_s_gpu']:.0f} | {q['ttft_p90_s'] * 1e3:.0f} ms | {q['tpot_p90_s'] * 1e3:.1f} ms |")
        if r.get("aic_error"):
            lines.append(f"| {r['case']} | aiconfigurator | {r['aic_error']} | | | | |")
    lines += ["", "Our search: " + "; ".join(f"{r['case']}: {r['ours_plans_ranked']} plan x concurrency points ranked "
                                            f"in {r['ours_rank_s']} s, {r['ours_wall_s']} s with the simulations"
                                            for r in results)]
    (OUT / "serving_vs_aiconfigurator.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
