"""Plans/s of the vectorised cost model: DeepSeek-V3 on 1024 H100.

    python bench/bench_predict.py   (single core: OMP_NUM_THREADS=1)
"""
from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusters import load_cluster  # noqa: E402
from cost_model import predict_arrays  # noqa: E402
from cost_model.plans import PlanArrays  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.workload import Workload  # noqa: E402


def grid():
    axes = dict(tp=[1, 2, 4, 8], pp=[1, 2, 4, 8, 16], vpp=[1, 2, 4], ep=[8, 16, 32, 64], mbs=[1, 2, 4],
                recompute=[0, 1, 2], dispatch=[0, 2, 3], precision=[0, 3], shared_expert_overlap=[0, 1],
                etp=[1, 2], dist_opt=[0, 1])
    cols = list(zip(*itertools.product(*axes.values())))
    return PlanArrays.from_columns(**{k: np.array(v) for k, v in zip(axes, cols)})


def main() -> int:
    w = Workload(load_model("deepseek-v3"), load_cluster("h100-sxm", 1024), 8192, 4096)
    pa = grid()
    predict_arrays(w, PlanArrays.from_columns(tp=[1]))  # warm the table cache
    t0 = time.perf_counter()
    out = predict_arrays(w, pa)
    dt = time.perf_counter() - t0
    print(f"{pa.n} plans in {dt:.3f} s -> {pa.n / dt:,.0f} plans/s "
          f"(feasible {int(out['fits'].sum())}, best {out['tokens_per_s_per_gpu'][out['fits']].max():,.0f} tok/s/GPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
