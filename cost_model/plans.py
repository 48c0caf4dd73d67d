"""`PlanArrays`: a struct of numpy arrays over many plans (the cost model's vectorised input).

Build it from a list of `Plan`s (`from_plans`) or straight from columns (`from_columns`, what a
screening shard uses; no Plan objects at all). Categorical fields become small integer codes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specs.plan import CUDA_GRAPH_SCOPES, DISPATCHERS, PRECISIONS, RECOMPUTE, RECOMPUTE_MODULES, Plan

INT_FIELDS = ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "recompute_layers", "pp_first", "pp_last")
BOOL_FIELDS = ("dist_opt", "overlap_grad_reduce", "overlap_param_gather", "grad_reduce_bf16", "shared_expert_overlap",
               "a2a_overlap", "delay_wgrad", "grouped_gemm", "permute_fusion", "router_fusion",
               "pp_embedding", "pp_loss", "fp8_param", "pad_to_capacity", "fsdp")
FLOAT_FIELDS = ("capacity_factor",)  # float64 columns
# Plan fields stored as integer codes, and the PlanArrays column each one lands in
CODED_FIELDS = {"recompute": "recompute", "recompute_modules": "recompute_modules",
                "recompute_method": "recompute_block", "dispatcher": "dispatch", "flex_backend": "dispatch",
                "precision": "precision", "pp_layout": "layout", "cuda_graph_impl": "cuda_graph",
                "cuda_graph_scope": "cuda_graph"}
# Plan fields the cost model deliberately ignores (none today). A new Plan field must be added to
# INT_FIELDS, BOOL_FIELDS, FLOAT_FIELDS or CODED_FIELDS, or listed here with the reason: tests/test_cost_model.py
# fails otherwise, so a field cannot be ignored silently.
NOT_COSTED: dict[str, str] = {}
# dispatcher codes: 0 alltoall, 1 allgather, 2 flex/deepep, 3 flex/hybridep
DISPATCH_CODES = ("alltoall", "allgather", "deepep", "hybridep")
MODULE_BIT = {m: 1 << i for i, m in enumerate(RECOMPUTE_MODULES)}
DEFAULT_SELECTIVE = MODULE_BIT["core_attn"]
# cuda_graph column: a bit per graphed scope (specs.plan.CUDA_GRAPH_SCOPES), WHOLE_LAYER_GRAPH for
# an impl with the empty scope (whole transformer layers); 0 = no CUDA graphs
GRAPH_BIT = {s: 1 << i for i, s in enumerate(CUDA_GRAPH_SCOPES)}
WHOLE_LAYER_GRAPH = 1 << len(CUDA_GRAPH_SCOPES)


def graph_code(impl: str, scope: tuple) -> int:
    """The cuda_graph column's code of a (cuda_graph_impl, cuda_graph_scope) pair."""
    if impl == "none":
        return 0
    code = 0
    for s in scope:
        code |= GRAPH_BIT[s]
    if impl == "local" and GRAPH_BIT["moe_router"] & code:  # transformer_config.py: local adds preprocess
        code |= GRAPH_BIT["moe_preprocess"]
    return code or WHOLE_LAYER_GRAPH


def dispatch_code(dispatcher: str, flex_backend: str) -> int:
    """Integer code of a (dispatcher, flex_backend) pair, see DISPATCH_CODES."""
    if dispatcher == "flex":
        return 3 if flex_backend == "hybridep" else 2
    return DISPATCHERS.index(dispatcher)


@dataclass
class PlanArrays:
    """n plans as columns: `cols[name]` is an int64 array of length n (float64 for FLOAT_FIELDS),
    read as attributes (`pa.tp`). Columns: INT_FIELDS, BOOL_FIELDS and FLOAT_FIELDS by Plan field name, plus the codes recompute,
    recompute_modules (bitmask), recompute_block, dispatch, precision, layout (index into
    `layouts`) and cuda_graph (`graph_code`)."""
    n: int
    cols: dict[str, np.ndarray]
    layouts: list[str] = field(default_factory=lambda: [""])  # pp_layout code -> string

    def __getattr__(self, name):
        try:
            return self.__dict__["cols"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __len__(self) -> int:
        return self.n

    @classmethod
    def from_plans(cls, plans: list[Plan]) -> "PlanArrays":
        cols: dict[str, list] = {f: [] for f in INT_FIELDS + BOOL_FIELDS + FLOAT_FIELDS}
        recompute, modules, method, dispatch, prec, layout, graph = [], [], [], [], [], [], []
        layouts: dict[str, int] = {"": 0}
        for p in plans:
            d = p.__dict__
            for f in INT_FIELDS:
                cols[f].append(d[f])
            for f in BOOL_FIELDS + FLOAT_FIELDS:
                cols[f].append(d[f])
            recompute.append(RECOMPUTE.index(p.recompute))
            mask = 0
            for m in p.recompute_modules:
                mask |= MODULE_BIT[m]
            modules.append(mask or DEFAULT_SELECTIVE)
            method.append(1 if p.recompute_method == "block" else 0)
            dispatch.append(dispatch_code(p.dispatcher, p.flex_backend))
            prec.append(PRECISIONS.index(p.precision))
            layout.append(layouts.setdefault(p.pp_layout, len(layouts)))
            graph.append(graph_code(p.cuda_graph_impl, p.cuda_graph_scope))
        out = {f: np.asarray(v, dtype=np.float64 if f in FLOAT_FIELDS else np.int64) for f, v in cols.items()}
        out.update(recompute=np.asarray(recompute, np.int64), recompute_modules=np.asarray(modules, np.int64),
                   recompute_block=np.asarray(method, np.int64), dispatch=np.asarray(dispatch, np.int64),
                   precision=np.asarray(prec, np.int64), layout=np.asarray(layout, np.int64),
                   cuda_graph=np.asarray(graph, np.int64))
        return cls(len(plans), out, [k for k, _ in sorted(layouts.items(), key=lambda kv: kv[1])])

    @classmethod
    def from_columns(cls, n: int | None = None, layouts: list[str] | None = None, **columns) -> "PlanArrays":
        """Columns by Plan field name (ints / bools / codes); missing ones take Plan defaults.
        Codes: recompute 0 none / 1 selective / 2 full; dispatch see DISPATCH_CODES; precision index
        into specs.plan.PRECISIONS; recompute_modules bitmask (MODULE_BIT); layout index into layouts;
        cuda_graph `graph_code`."""
        if n is None:
            n = len(next(iter(columns.values())))
        d = Plan()
        out = {}
        for f in INT_FIELDS + BOOL_FIELDS + FLOAT_FIELDS:
            dtype = np.float64 if f in FLOAT_FIELDS else np.int64
            out[f] = np.broadcast_to(np.asarray(columns.get(f, getattr(d, f)), dtype), (n,)).copy()
        defaults = dict(recompute=0, recompute_modules=DEFAULT_SELECTIVE, recompute_block=0,
                        dispatch=0, precision=0, layout=0, cuda_graph=0)
        for f, v in defaults.items():
            out[f] = np.broadcast_to(np.asarray(columns.get(f, v), np.int64), (n,)).copy()
        return cls(n, out, layouts or [""])
