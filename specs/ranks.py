"""Rank layout, as Megatron-core lays it out (parallel_state.RankGenerator, order "tp-cp-ep-dp-pp").

Dense grid:  tp fastest (stride 1), then cp, dp, pp.
Expert grid: etp fastest (stride 1), then ep, expert-dp, pp (cp is folded into expert-dp).
A group of `size` members with `stride` s holds ranks r0, r0+s, ..., and which of its collectives
leave the node follows from that, never from an assumption. Works on numpy arrays of plans too.
`tests/test_megatron_crosscheck.py` checks these against megatron.core.parallel_state.RankGenerator.
"""
from __future__ import annotations

import numpy as np


def group_size_stride(kind: str, tp, cp, pp, ep, etp, world):
    """(size, stride) of one `kind` group; arguments may be ints or numpy arrays."""
    dp = world // (tp * cp * pp)
    edp = world // (etp * ep * pp)
    table = {
        "tp": (tp, 1),
        "cp": (cp, tp),
        "dp": (dp, tp * cp),
        "pp": (pp, tp * cp * dp),
        "etp": (etp, 1),
        "ep": (ep, etp),
        "edp": (edp, etp * ep),
    }
    if kind not in table:
        raise ValueError(f"unknown group kind {kind!r}")
    return table[kind]


def members_per_node(size, stride, per_node):
    """How many members of one group share a node (exact when stride and node size divide)."""
    size, stride = np.asarray(size), np.asarray(stride)
    fit = np.maximum(1, per_node // stride)
    return np.minimum(size, fit)


def nodes_spanned(size, stride, per_node):
    """Number of nodes one group touches; > 1 means its collective crosses the scale-out network."""
    m = members_per_node(size, stride, per_node)
    return -(-np.asarray(size) // m)


def group_ranks(kind: str, tp: int, cp: int, pp: int, ep: int, etp: int, world: int) -> list[list[int]]:
    """All groups of `kind` as explicit rank lists (for checks and small worlds)."""
    dp = world // (tp * cp * pp)
    edp = world // (etp * ep * pp)
    if kind in ("tp", "cp", "dp", "pp"):
        dims = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        order = ["tp", "cp", "dp", "pp"]
    else:
        dims = {"etp": etp, "ep": ep, "edp": edp, "pp": pp}
        order = ["etp", "ep", "edp", "pp"]
    shape = [dims[d] for d in order]
    ranks = np.arange(world).reshape(shape[::-1])  # last dim = fastest = first in order
    axis = len(order) - 1 - order.index(kind)
    moved = np.moveaxis(ranks, axis, -1).reshape(-1, dims[kind])
    return sorted(sorted(int(r) for r in g) for g in moved)
