"""After bench/gpu_check.sh, on CPU: step 2's measured step time and memory against the cost
model's predictions from the shipped tables and from the tables step 3 measured.

    python bench/gpu_check_compare.py GPU_CHECK_OUT [--json]

Reads GPU_CHECK_OUT/step2_olmoe2.json (the trial's JSON and its workload) and, when present,
GPU_CHECK_OUT/tables/ (step 3); runs `moetune predict --json` once per table set (the shipped
clusters/tables/<kind>, and the measured ones) with the same workload and plan, and prints one
row per table set: predicted raw and calibrated step time, predicted peak memory, and their
ratios to the measured ones. Nothing is written into GPU_CHECK_OUT (the device tool's copy is
read-only); --json prints the comparison as JSON instead of a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def predict(workload: dict, tables: Path) -> dict:
    """`moetune predict --json` for the workload with the given table directory."""
    cmd = [sys.executable, "-m", "tuner.cli", "predict", "--model", workload["model"], "--cluster", workload["cluster"],
           "--gpus", str(workload["gpus"]), "--gbs", str(workload["gbs"]), "--seq", str(workload["seq"]),
           "--stack", workload["stack"], "--plan", workload["plan"], "--tables", str(tables), "--json"]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:]}
    return json.loads(r.stdout)


def compare(out_dir: Path) -> dict:
    """{"measured": {...}, "predictions": {table set: {...}}} for a gpu_check output folder."""
    from clusters import TABLES_ROOT
    meas = json.loads((out_dir / "step2_olmoe2.json").read_text())
    w = meas["workload"]
    res: dict = {"workload": w, "measured": None, "predictions": {}}
    if meas.get("ok"):
        res["measured"] = {"step_time_s": meas["step_time_s"], "peak_memory_gib": max(meas["peak_memory_gib"]),
                           "step_times_s": meas.get("step_times_s")}
    else:
        res["measured_failure"] = {k: meas.get(k) for k in ("kind", "message")}
    sets = {"shipped": TABLES_ROOT / w["cluster"]}
    if (out_dir / "tables" / "meta.json").exists():
        sets["measured (step 3)"] = out_dir / "tables"
    for name, tables in sets.items():
        p = predict(w, tables)
        if "error" in p:
            res["predictions"][name] = p
            continue
        row = {"tables": str(tables), "raw_step_time_s": p["extra"]["raw_step_time_s"], "step_time_s": p["step_time_s"],
               "peak_memory_gib": p["peak_memory_gib"], "tables_digest": p["tables_digest"][:16]}
        if res["measured"]:
            m = res["measured"]
            row.update(raw_over_measured=row["raw_step_time_s"] / m["step_time_s"],
                       calibrated_over_measured=row["step_time_s"] / m["step_time_s"],
                       memory_over_measured=row["peak_memory_gib"] / m["peak_memory_gib"])
        res["predictions"][name] = row
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", help="The folder bench/gpu_check.sh wrote (the device tool's files_at copy).")
    ap.add_argument("--json", action="store_true", help="Print the comparison as JSON.")
    args = ap.parse_args(argv)
    out_dir = Path(args.out_dir)
    if not (out_dir / "step2_olmoe2.json").exists():
        print(f"{out_dir}: no step2_olmoe2.json (step 2 skipped or failed; see summary.txt)", file=sys.stderr)
        return 2
    res = compare(out_dir)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    m = res["measured"]
    print(f"workload  {res['workload']}")
    print("measured  " + (f"step {m['step_time_s']:.4f} s, peak {m['peak_memory_gib']:.2f} GiB" if m
                          else f"no measurement: {res.get('measured_failure')}"))
    for name, row in res["predictions"].items():
        if "error" in row:
            print(f"{name:18s} predict failed: {row['error']}")
            continue
        line = (f"{name:18s} raw {row['raw_step_time_s']:.4f} s, calibrated {row['step_time_s']:.4f} s, "
                f"memory {row['peak_memory_gib']:.2f} GiB")
        if m:
            line += (f"  | raw/meas {row['raw_over_measured']:.2f}, cal/meas {row['calibrated_over_measured']:.2f}, "
                     f"mem/meas {row['memory_over_measured']:.2f}")
        print(line)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
