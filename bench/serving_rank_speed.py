"""Ranking speed of the serving cost model: seconds of `rank_arrays` (analytic steady state) for N
plans, Qwen3-30B-A3B on 8 H200, isl 4000 / osl 1000, concurrency 512 (tables read beforehand).

    python bench/serving_rank_speed.py
"""
from __future__ import annotations

import itertools
import time

from clusters import load_cluster
from cost_model.serving import rank_arrays
from cost_model.tables import load_tables, tables_dir_for
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload


def main() -> int:
    m, cl = load_model("qwen3-30b-a3b"), load_cluster("h200-sxm", 8)
    tab = load_tables(tables_dir_for("h200-sxm"))
    grid = itertools.product((1, 2, 4, 8), (1, 2, 4, 8), ("none", "deepep"), (0, 1), (2048, 4096, 8192, 16384),
                             (0, 64, 128, 256, 512, 1024), (0, -1, 64, 256), (0, 8, 16))
    plans = [ServePlan.parse(f"tp={tp},attn_dp={a},a2a={x},tbo={t},chunked_prefill={c},max_running={r},"
                             f"cuda_graph_max_bs={g},eplb_redundant={e}")
             for tp, a, x, t, c, r, g, e in grid if tp % a == 0 and not (e and tp == 1)]
    w = ServeWorkload(isl=4000, osl=1000, concurrency=512)
    for n in (100, 1000, 3000, len(plans)):
        t0 = time.perf_counter()
        rank_arrays(m, cl, plans[:n], w, tables=tab)
        print(f"{n:6d} plans  {time.perf_counter() - t0:6.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
