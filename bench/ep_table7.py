"""The model's per-call EP dispatch/combine times against arXiv 2603.07685 Table 7 (HybridEP and
NCCL all-to-all, GB200 and H100, EP 8-64; hidden 7168, 4096 tokens per GPU, 256 experts).

    PYTHONPATH=$PWD python bench/ep_table7.py

Each row is priced as `cost_model.blocks.ep_dispatch_combine` charges it, through the shipped
tables (`resolve_tables` -> `TableOps.ep_dispatch`), with what the paper does not state taken as
`cost_model.build_default_tables` takes it (top-8 uniform routing, BF16 tokens both ways). GB200's
scale-up rows are solved from these times, so its lines reproduce them; the H100 lines are held out.
"""
from __future__ import annotations

import csv
from types import SimpleNamespace

import numpy as np

from clusters import load_cluster
from cost_model import resolve_tables
from cost_model.blocks import distinct_domains, distinct_ranks
from cost_model.build_default_tables import DATA_DIR, TABLE7_EXPERTS, TABLE7_TOKEN_BYTES, TABLE7_TOPK
from cost_model.ops import TableOps
from specs.models import load_model
from specs.workload import Workload

KINDS = {"h100": "h100-sxm", "gb200": "gb200-nvl72"}
UNIFORM = SimpleNamespace(moe_router_num_groups=0, moe_router_group_topk=0)


def priced(kind: str, library: str, ep: float, tokens: float, experts: int = TABLE7_EXPERTS) -> tuple[float, float]:
    """(dispatch, combine) seconds of one call at the Table 7 setting on `kind`."""
    w = Workload(load_model("deepseek-v3"), load_cluster(kind, int(max(ep, 8))), 1024, 4096)
    ops = TableOps(resolve_tables(w, None), w.cluster, np.array([False]))
    e = np.array([ep])
    if library == "hybridep":
        _, per = ops.scope(e, 1)
        copies = distinct_ranks(UNIFORM, experts, TABLE7_TOPK, e)
        nd = np.maximum(ep / np.minimum(per, ep), 1.0)
        reached = distinct_domains(UNIFORM, experts, TABLE7_TOPK, e, per) * nd / np.maximum(nd - 1.0, 1e-9)
        tb = tuple(np.array([b]) for b in TABLE7_TOKEN_BYTES)
        d, c = ops.ep_dispatch(np.array([3]), TABLE7_TOKEN_BYTES[0] * tokens * copies,
                               TABLE7_TOKEN_BYTES[1] * tokens * copies, e, 1,
                               inter=reached / copies, intra=np.ones(1), token_bytes=tb)
    else:
        nb = np.array([TABLE7_TOKEN_BYTES[0] * tokens * TABLE7_TOPK])
        d, c = ops.ep_dispatch(np.array([0]), nb, nb, e, 1)
    return float(d[0]), float(c[0])


def main() -> int:
    with open(DATA_DIR / "ep_dispatch_combine_bandwidth.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if "2603.07685 Table 7" in r["source"]]
    for r in rows:
        d, c = priced(KINDS[r["hw"]], r["library"], float(r["ep"]), float(r["tokens"]))
        pd, pc = float(r["dispatch_us"]), float(r["combine_us"])
        print(f"{r['hw']:6s} {r['library']:14s} EP{int(r['ep']):3d}  dispatch {d * 1e6:6.0f} us (paper {pd:5.0f}, "
              f"{d * 1e6 / pd - 1:+.0%})  combine {c * 1e6:6.0f} us (paper {pc:5.0f}, {c * 1e6 / pc - 1:+.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
