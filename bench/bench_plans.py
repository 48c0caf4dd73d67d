"""Time and peak memory of `moetune plans` for DeepSeek-V3 on 1024 H100 (issue target: < 60 s on
one core, < 2 GB). Runs the real CLI in a child process pinned to one core.

    python bench/bench_plans.py [--json]
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

CMD = [sys.executable, "-m", "tuner.cli", "plans", "--model", "deepseek-v3", "--cluster", "h100-sxm",
       "--gpus", "1024", "--gbs", "8192", "--seq", "4096", "--precision", "fp8", "--json"]


def main() -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    pin = ["taskset", "-c", "0"] if subprocess.run(["which", "taskset"], capture_output=True).returncode == 0 else []
    t0 = time.perf_counter()
    out = subprocess.run(pin + CMD, capture_output=True, text=True, env=env, check=True)
    wall = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    d = json.loads(out.stdout)
    row = {"command": " ".join(CMD[1:]), "pinned_to_one_core": bool(pin), "wall_s": round(wall, 2),
           "peak_rss_mib": round(peak_mib, 1), "space_size": d["space_size"],
           "realizable": d["realizable"], "plans_per_s_checked": round(d["space_size"] / wall)}
    print(json.dumps(row, indent=1) if "--json" in sys.argv else
          f"moetune plans deepseek-v3 x1024 h100: {wall:.1f} s wall (one core), peak RSS {peak_mib:.0f} MiB, "
          f"{d['space_size']:,} plans, {d['realizable']:,} realizable")
    return 0 if wall < 60 and peak_mib < 2048 else 1


if __name__ == "__main__":
    sys.exit(main())
