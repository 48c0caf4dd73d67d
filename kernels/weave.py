"""Weave's (c, K) SM-partition model (Huang et al. 2026, "Weave: Fine-Grained Dynamic SM Scheduling
in an MoE Megakernel", section 3, eqs. (1)-(16)).

One MoE layer on one GPU under expert parallelism is priced as

    W_dispatch = X_in_uniq * B,  W_combine = X_in * B,  W_comp = (X_local + X_in) * 6 H I   (1)-(3)
    T_comp(c, K) = W_comp / (TFLOPS(N - c) * eff_chunk(K))                                  (9)
    T_comm(c)    = (W_dispatch + W_combine) / BW(c)                                         (5)
    T_tail(c, K) = (1 - alpha) * W_combine / (BW(c) * K)                                    (10)
    T_total      = max(T_comp + T_tail, T_comm)                                             (15)

and `(c*, K*) = argmin T_total` over the communication-SM counts the hardware allows and
K in (1, 2, 4, 8, 16); `n_steal` follows from eqs. (11)-(14).

The curves `TFLOPS(n)`, `BW(c)`, `eff_chunk(K)` and `alpha` are a `Curves` object: parametric
forms whose defaults live in `kernels/data/weave_curves_default.json` (each value with its source)
and which `kernels.calibrate` refits to measured (c, K) grids. Everything here is numpy and
vectorises over tokens / skew arrays so a cost model can price many layers at once.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from specs.errors import SpecError, UsageError

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).parent / "data"
DEFAULT_CURVES_FILE = DATA_DIR / "weave_curves_default.json"
K_CHOICES = (1, 2, 4, 8, 16)
BYTES_PER_ELEMENT = 2  # BF16 tokens: B = 2H bytes per token (paper section 3.1)


# --------------------------------------------------------------------------------------------
# Layer shape and routed volumes
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerShape:
    """The routed-expert part of one MoE layer: E experts, top-k, hidden H, expert FFN width I."""
    num_experts: int
    topk: int
    hidden: int
    inter: int
    name: str = ""

    def __post_init__(self):
        if self.num_experts <= 0 or not 0 < self.topk <= self.num_experts:
            raise SpecError(f"bad MoE shape: {self.num_experts} experts, top-{self.topk}")
        if self.hidden <= 0 or self.inter <= 0:
            raise SpecError(f"bad MoE shape: hidden {self.hidden}, expert FFN {self.inter}")

    @classmethod
    def from_model(cls, model) -> LayerShape:
        """The routed-expert shape of a `specs.model_spec.ModelSpec` (shared experts are not routed
        and are not part of Weave's megakernel)."""
        if not model.num_experts:
            raise SpecError(f"model {model.name} has no routed experts")
        return cls(model.num_experts, model.moe_router_topk, model.hidden_size,
                   model.moe_ffn_hidden_size, model.name)


def _uniq_fraction(num_experts: int, topk: int, frac) -> np.ndarray:
    """P(a token picks at least one of the experts on this GPU) when a fraction `frac` of the
    experts' routing mass sits here. For frac = 1/ep it is the exact hypergeometric
    1 - C(E - E/ep, k) / C(E, k) of top-k without replacement; skew scales that mass up."""
    frac = np.clip(np.asarray(frac, dtype=float), 0.0, 1.0)
    miss = np.ones_like(frac)
    for i in range(topk):
        miss = miss * np.clip((num_experts * (1.0 - frac) - i) / (num_experts - i), 0.0, 1.0)
    return 1.0 - miss


def volumes(shape: LayerShape, tokens, ep: int, skew=1.0) -> dict:
    """Routed volumes on the most loaded GPU (paper eqs. (1)-(3)).

    Args:
        shape: the routed-expert layer shape.
        tokens: tokens held by each GPU before dispatch (scalar or array).
        ep: expert-parallel size (GPUs sharing the experts).
        skew: routing skew, the ratio of the pairs this GPU receives to the balanced share
            (1.0 = uniform routing; the same meaning as the cost model's `--imbalance`).
    Returns:
        dict of arrays: X_local, X_in, X_in_uniq (token-expert pairs / unique tokens),
        W_dispatch, W_combine (bytes), W_comp (FLOPs).
    """
    if ep < 1 or shape.num_experts % ep:
        raise UsageError(f"--ep {ep} must divide the {shape.num_experts} experts")
    t = np.asarray(tokens, dtype=float)
    s = np.asarray(skew, dtype=float)
    if np.any(t < 0) or np.any(s < 1.0):
        raise UsageError("tokens must be >= 0 and skew >= 1.0")
    frac = np.minimum(1.0, s / ep)  # share of each token's top-k choices landing on this GPU
    pairs_per_src = t * shape.topk * frac
    x_local = pairs_per_src
    x_in = (ep - 1) * pairs_per_src
    x_in_uniq = (ep - 1) * t * _uniq_fraction(shape.num_experts, shape.topk, frac)
    b = BYTES_PER_ELEMENT * shape.hidden
    return {
        "X_local": x_local, "X_in": x_in, "X_in_uniq": x_in_uniq,
        "W_dispatch": x_in_uniq * b, "W_combine": x_in * b,
        "W_comp": (x_local + x_in) * 6.0 * shape.hidden * shape.inter,
    }


def tile_flops(shape: LayerShape, block_m: int, block_n: int) -> float:
    """Mean FLOPs of one GEMM output tile over gemm0 (H -> 2I) and gemm1 (I -> H): per block of
    `block_m` rows gemm0 has 2I/BN tiles of 2*BM*BN*H FLOPs and gemm1 H/BN tiles of 2*BM*BN*I."""
    h, i = shape.hidden, shape.inter
    return 6.0 * block_m * block_n * h * i / (2 * i + h)


# --------------------------------------------------------------------------------------------
# Hardware curves
# --------------------------------------------------------------------------------------------
PARAM_NAMES = ("tflops_max", "tflops_beta", "bw_max", "bw_c0", "eff_g", "eff_p", "alpha")


@dataclass(frozen=True)
class Curves:
    """Per-hardware-kind throughput curves (units: TFLOPS, GB/s).

    TFLOPS(n)    = tflops_max * (n / N) ** tflops_beta      sub-linear in the compute SMs n (Fig. 4b)
    BW(c)        = bw_max * (1 - exp(-c / bw_c0))           near-linear, then saturating (Fig. 4a)
    eff_chunk(K) = 1 / (1 + eff_g * (K - 1) ** eff_p)       chunked / unchunked GEMM throughput (Fig. 9a)
    alpha        tile-level overlap fraction of combine, in [0, 1) (section 3.1)
    """
    kind: str
    sm_count: int
    tflops_max: float
    tflops_beta: float
    bw_max: float
    bw_c0: float
    eff_g: float
    eff_p: float
    alpha: float
    c_step: int = 8
    block_m: int = 128
    block_n: int = 128
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def tflops(self, n):
        n = np.asarray(n, dtype=float)
        return self.tflops_max * np.power(np.clip(n, 0.0, None) / self.sm_count, self.tflops_beta)

    def bw(self, c):
        c = np.asarray(c, dtype=float)
        return self.bw_max * (1.0 - np.exp(-c / self.bw_c0))

    def eff_chunk(self, k):
        k = np.asarray(k, dtype=float)
        return 1.0 / (1.0 + self.eff_g * np.power(k - 1.0, self.eff_p))

    def c_grid(self) -> np.ndarray:
        """Communication-SM counts searched: multiples of `c_step`, leaving at least one step of
        compute SMs."""
        return np.arange(self.c_step, self.sm_count - self.c_step + 1, self.c_step)

    def params(self) -> dict:
        return {k: getattr(self, k) for k in PARAM_NAMES}

    def with_params(self, sources: dict | None = None, **kw) -> Curves:
        return replace(self, sources=dict(sources if sources is not None else self.sources), **kw)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("kind", "sm_count", *PARAM_NAMES, "c_step", "block_m", "block_n")}
        d["sources"] = self.sources
        return d


def _curve_file(path: Path | None = None) -> dict:
    p = Path(path) if path else DEFAULT_CURVES_FILE
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"cannot read Weave curves {p}: {e}") from None


def default_curves(kind: str, path: Path | None = None) -> Curves:
    """The shipped default curves for a hardware kind.

    The reference kind of the data file (h100-sxm, the paper's hardware) carries values derived
    from the paper's figures; any other GPU kind of the catalog is scaled from it by the catalog's
    peak BF16 TFLOPS and NVLink bandwidth ratios and its own SM count (recorded in `sources`).
    """
    from clusters import load_cluster
    data = _curve_file(path)
    ref_kind = data["reference_kind"]
    kinds = data["kinds"]
    entry = kinds.get(kind)
    cl = load_cluster(kind)
    if not cl.is_gpu:
        raise SpecError(f"cluster {kind!r} is not a GPU: the Weave megakernel model needs SMs")
    if entry is None:
        entry = kinds[ref_kind]
        ref = load_cluster(ref_kind)
        t_ratio = cl.peak_tflops.get("bf16", 0.0) / ref.peak_tflops["bf16"]
        link = cl.nvlink_gbps or cl.pcie_gbps
        b_ratio = link / ref.nvlink_gbps
        vals = {k: entry[k]["value"] for k in PARAM_NAMES}
        srcs = {k: entry[k]["source"] for k in PARAM_NAMES}
        vals["tflops_max"] *= t_ratio
        vals["bw_max"] *= b_ratio
        # bw_c0 is in SMs: keep the per-SM copy rate of the reference kind, so the SMs needed
        # to saturate the link grow with the link bandwidth.
        vals["bw_c0"] *= b_ratio
        srcs["tflops_max"] = f"{ref_kind} value x catalog bf16 peak ratio {t_ratio:.3f} ({srcs['tflops_max']})"
        srcs["bw_max"] = f"{ref_kind} value x catalog link GB/s ratio {b_ratio:.3f} ({srcs['bw_max']})"
        srcs["bw_c0"] = f"{ref_kind} value x link ratio {b_ratio:.3f} (same per-SM copy rate)"
        for k in ("tflops_beta", "eff_g", "eff_p", "alpha"):
            srcs[k] = f"assumed equal to {ref_kind}: {srcs[k]}"
        extra = {k: entry[k]["value"] for k in ("c_step", "block_m", "block_n")}
    else:
        vals = {k: entry[k]["value"] for k in PARAM_NAMES}
        srcs = {k: entry[k]["source"] for k in PARAM_NAMES}
        extra = {k: entry[k]["value"] for k in ("c_step", "block_m", "block_n")}
    srcs["sm_count"] = cl.sources.get("sm_count", "catalog")
    for k in ("c_step", "block_m", "block_n"):
        srcs[k] = kinds.get(kind, kinds[ref_kind])[k]["source"]
    return Curves(kind=kind, sm_count=int(cl.sm_count), sources=srcs, **vals, **extra)


def load_curves(kind: str) -> Curves:
    """Curves in use for a kind: the fit to the measured grid under $MOETUNE_HOME/kernels/<kind>/
    when one was made (`kernels.calibrate`), else the shipped defaults."""
    from kernels import store
    fitted = store.fitted_curves_path(kind)
    if fitted.is_file():
        d = json.loads(fitted.read_text())
        return curves_from_dict(d["curves"])
    return default_curves(kind)


def curves_from_dict(d: dict) -> Curves:
    return Curves(**{k: d[k] for k in ("kind", "sm_count", *PARAM_NAMES, "c_step", "block_m", "block_n")},
                  sources=d.get("sources", {}))


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------
def layer_times(vol: dict, curves: Curves, c, k) -> dict:
    """T_comp, T_comm, T_tail, T_total in seconds for communication SMs `c` and chunks `k`
    (arrays broadcast against the volume arrays)."""
    n = curves.sm_count
    c = np.asarray(c, dtype=float)
    k = np.asarray(k, dtype=float)
    tfl = curves.tflops(n - c) * 1e12
    bw = curves.bw(c) * 1e9
    t_comp = vol["W_comp"] / (tfl * curves.eff_chunk(k))
    t_comm = (vol["W_dispatch"] + vol["W_combine"]) / bw
    t_tail = (1.0 - curves.alpha) * vol["W_combine"] / (bw * k)
    return {"T_comp": t_comp, "T_comm": t_comm, "T_tail": t_tail,
            "T_total": np.maximum(t_comp + t_tail, t_comm)}


def n_steal(vol: dict, curves: Curves, shape: LayerShape, c) -> np.ndarray:
    """GEMM tiles each SM steals after dispatch, eqs. (11)-(14): the comp SMs do
    W_partial = t_comm(c) * TFLOPS(N - c) while communication runs; the rest,
    W_steal = max(0, W_comp - W_partial), is shared by all N SMs in tiles of W_tile FLOPs
    (rounded down: a late comm SM would delay the combine it owns)."""
    c = np.asarray(c, dtype=float)
    t_comm = (vol["W_dispatch"] + vol["W_combine"]) / (curves.bw(c) * 1e9)
    w_partial = t_comm * curves.tflops(curves.sm_count - c) * 1e12
    w_steal = np.maximum(0.0, vol["W_comp"] - w_partial)
    return np.floor(w_steal / (curves.sm_count * tile_flops(shape, curves.block_m, curves.block_n)))


def grid(shape: LayerShape, tokens: float, ep: int, skew: float, curves: Curves) -> list[dict]:
    """Every (c, K) of the search grid with its n_steal and predicted layer time (ms)."""
    vol = volumes(shape, tokens, ep, skew)
    cs = curves.c_grid()
    out = []
    for c in cs:
        ns = int(n_steal(vol, curves, shape, c))
        for k in K_CHOICES:
            t = float(layer_times(vol, curves, c, k)["T_total"])
            out.append({"c": int(c), "K": int(k), "n_steal": ns, "predicted_ms": t * 1e3})
    return out


def moe_layer_time(shape: LayerShape, tokens, ep: int, skew=1.0, hw: Curves | str = "h100-sxm"):
    """Weave's choice and predicted time for one MoE layer, vectorised over tokens and skew.

    Args:
        shape: routed-expert layer shape (`LayerShape.from_model(model)`).
        tokens: tokens per GPU before dispatch (scalar or numpy array).
        ep: expert-parallel size.
        skew: routing skew (>= 1, scalar or array broadcastable against tokens).
        hw: a `Curves` object or a hardware kind (then `load_curves(kind)`, which reads files: a
            cost model pricing many layers should load the curves once and pass them).
    Returns:
        (c_star, k_star, n_steal, ms): numpy arrays of the broadcast shape of tokens and skew
        (0-d for scalars); ms is the predicted MoE-layer time of the slowest (skewed) GPU.
    """
    curves = load_curves(hw) if isinstance(hw, str) else hw
    t, s = np.broadcast_arrays(np.asarray(tokens, dtype=float), np.asarray(skew, dtype=float))
    vol = volumes(shape, t, ep, s)
    cs = curves.c_grid().astype(float)
    ks = np.asarray(K_CHOICES, dtype=float)
    v = {k: a[..., None, None] for k, a in vol.items()}
    tot = layer_times(v, curves, cs[:, None], ks[None, :])["T_total"]  # (..., nc, nK)
    flat = tot.reshape(*tot.shape[:-2], -1)
    idx = np.argmin(flat, axis=-1)
    ci, ki = np.divmod(idx, len(ks))
    c_star = cs[ci]
    k_star = ks[ki]
    ms = np.take_along_axis(flat, idx[..., None], axis=-1)[..., 0] * 1e3
    ns = n_steal(vol, curves, shape, c_star)
    return c_star.astype(int), k_star.astype(int), ns.astype(int), ms


def serial_layer_time(shape: LayerShape, tokens, ep: int, skew=1.0, hw: Curves | str = "h100-sxm"):
    """Predicted ms of the same layer without overlap ("Weave w/o S+T", section 5.6): all N SMs run
    dispatch, then the GEMMs, then combine. A reference point for the megakernel's gain when no
    cost-model baseline is at hand; vectorised like `moe_layer_time`."""
    curves = load_curves(hw) if isinstance(hw, str) else hw
    vol = volumes(shape, tokens, ep, skew)
    n = curves.sm_count
    bw = curves.bw(n) * 1e9
    return (vol["W_dispatch"] / bw + vol["W_comp"] / (curves.tflops(n) * 1e12) + vol["W_combine"] / bw) * 1e3


def megakernel_whatif(shape: LayerShape, tokens, ep: int, skew, baseline_ms, hw: Curves | str = "h100-sxm") -> dict:
    """What-if for a cost model: its own MoE-layer time (dispatch + experts + combine, forward) vs
    the Weave-style megakernel's predicted time for the same layer.

    Args:
        shape, tokens, ep, skew, hw: as for `moe_layer_time`.
        baseline_ms: the caller's predicted time of the same forward MoE layer (scalar or array).
    Returns:
        dict of arrays: c, K, n_steal, weave_ms, baseline_ms, saving (fraction of baseline_ms
        saved, >= 0: a plan never gets slower by choosing the megakernel, it would not be chosen).
    """
    c, k, ns, ms = moe_layer_time(shape, tokens, ep, skew, hw)
    base = np.asarray(baseline_ms, dtype=float)
    saving = np.clip(1.0 - ms / np.where(base > 0, base, np.inf), 0.0, 1.0)
    return {"c": c, "K": k, "n_steal": ns, "weave_ms": ms, "baseline_ms": base, "saving": saving}


def select(shape: LayerShape, tokens: float, ep: int, skew: float, curves: Curves) -> dict:
    """The chosen (c*, K*, n_steal) and predicted ms for one layer, plus the time components."""
    c, k, ns, ms = moe_layer_time(shape, tokens, ep, skew, curves)
    vol = volumes(shape, tokens, ep, skew)
    parts = layer_times(vol, curves, float(c), float(k))
    return {"c": int(c), "K": int(k), "n_steal": int(ns), "predicted_ms": float(ms),
            **{f"{k_}_ms": float(v_) * 1e3 for k_, v_ in parts.items() if k_ != "T_total"},
            "regime": "compute+tail" if parts["T_comp"] + parts["T_tail"] >= parts["T_comm"] else "communication"}
