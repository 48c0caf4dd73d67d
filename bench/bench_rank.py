"""Time `moetune plans --rank` (issue 10: Mixtral-8x7B on 64 H100 ranks its whole realizable space
in < 60 s; DeepSeek-V3 on 1024 H100 returns the exact top 20 in < 5 min, on this 2-core machine).

Runs the real CLI in child processes and prints, per case: wall time, CPU time (user + sys of the
child: what contention from other processes does not inflate), the load average around the run,
how many plans were scored and skipped by the bounds, and the top rows. `--exhaustive-check` also
ranks Mixtral with `--exhaustive` (every plan scored) and compares the two lists row by row.

    python bench/bench_rank.py [--only mixtral|deepseek] [--exhaustive-check] [--json]
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

CASES = {
    "mixtral": ["--model", "mixtral-8x7b", "--cluster", "h100-sxm", "--gpus", "64", "--gbs", "256", "--seq", "4096"],
    "deepseek": ["--model", "deepseek-v3", "--cluster", "h100-sxm", "--gpus", "1024", "--gbs", "8192", "--seq", "4096",
                 "--precision", "fp8"],
}
TARGET_S = {"mixtral": 60, "deepseek": 300}


def run(args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "tuner.cli", "plans", *args, "--rank", "--top", "20", "--examples", "0", "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    d = json.loads(out.stdout)
    r = d["ranked"]
    return {"command": "moetune " + " ".join(cmd[3:]), "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
            "load_before": round(load0, 1), "load_after": round(os.getloadavg()[0], 1),
            "realizable": r["realizable"], "scored": r["scored"], "pruned": r["pruned"],
            "bound_scored": r["bound_scored"], "exhaustive": r["exhaustive"], "bound_violated": r["bound_violated"],
            "top": [(p["plan"], round(p["tokens_per_s_per_gpu"], 3), p["variants"]) for p in r["plans"]]}


def main() -> int:
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    rows = {}
    for name, args in CASES.items():
        if only and name != only:
            continue
        rows[name] = run(args)
        if name == "mixtral" and "--exhaustive-check" in sys.argv:
            rows["mixtral-exhaustive"] = ex = run(args + ["--exhaustive"])
            ex["same_top_as_pruned"] = ex["top"] == rows[name]["top"]
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=1))
    else:
        for name, r in rows.items():
            print(f"{name}: {r['wall_s']} s wall, {r['cpu_s']} s CPU (load {r['load_before']} -> {r['load_after']}); "
                  f"{r['realizable']:,} realizable, {r['scored']:,} scored, {r['pruned']:,} skipped by bounds "
                  f"({r['bound_scored']:,} optimistic plans scored for them)"
                  + (f"; same top 20 as pruned: {r['same_top_as_pruned']}" if "same_top_as_pruned" in r else ""))
            for plan, tps, n in r["top"][:5]:
                print(f"    {tps:>10,.0f} tok/s/GPU  x{n}  {plan}")
    ok = all(r["wall_s"] < TARGET_S[n.split("-")[0]] for n, r in rows.items() if n in TARGET_S)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
