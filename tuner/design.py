"""MOSAIC co-design: pick the MoE geometry, token budget and parallel layout that minimise the
predicted loss for a cluster and a training window.

The search is the single-stage enumeration of the MOSAIC paper (its §7 and App. D.2):

1. The geometry ladder (`ladder_model`): seed q -> layers 4q, heads 4q, d = 128 heads, reference
   dense FFN width d_ff = 2.5 d; on each rung the MoE axes (E, K, G) are enumerated. G splits the
   reference FFN, d_expert = d_ff / G; every MoE layer has one shared expert of width d_expert; the
   first layer is dense. N_tot and N_act are the non-embedding parameter counts of that model
   (`cost_model.flops.param_counts` minus the embedding and the LM head) and S = 1 - N_act / N_tot.
2. For every geometry, the best realizable layout by the cost model (`best_layout`): the core plan
   space (`tuner.space.train.default_space(level="core")`) restricted to TP = CP = 1 by default as in the
   paper, walked once per (layers, heads, E) and reused for every K and G of that rung, scored in
   two vectorised stages (every parallel point with three probe options, then every option of the
   best points); the fastest plan whose memory fits wins.
3. Deliverable model FLOPs and tokens (`token_budget`): the layout processes tokens_per_s x GPUs x
   T tokens in the window, i.e. C_model = MFU_6N * peak * N_GPU * T with MFU_6N the model-FLOPs
   utilisation in the paper's C_model = 6 N_act D convention, and App. D's closed form
   D* = C_model / (6 N_act). D is read on the TPP grid [40, 150] (App. D.2): capped at 150 N_act,
   and a geometry whose window affords fewer than 40 tokens per active parameter is dropped.
4. The law (`cost_model.law`, eq. (10)) scores L(N_tot, S, D, G); the loss-optimal candidate and
   ranked runner-ups are returned, with the loss-vs-C_model frontier (the paper's Fig. 10).
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

import cost_model
from clusters import load_cluster
from cost_model.flops import param_counts
from cost_model.law import Law, default_law
from cost_model.plans import PlanArrays
from specs.errors import UsageError
from specs.fileio import write_atomic, write_png
from specs.model_spec import ModelSpec, from_dict
from specs.plan import Plan
from specs.stack import profile_for
from specs.workload import Workload
from tuner.emit.megatron import megatron_script
from tuner.space.megatron_rules import check, check_schedule_kernels
from tuner.space.train import default_space, iter_realizable

log = logging.getLogger(__name__)

DEFAULTS_PATH = Path(cost_model.__file__).parent / "data" / "mosaic_law_default.json"
SECONDS_PER_DAY = 86400.0


def _published_design_defaults() -> dict:
    raw = json.loads(DEFAULTS_PATH.read_text())
    return {k: v["value"] for k, v in raw["design"].items()}


def paper_optimum() -> tuple[tuple, str]:
    """(q, E, K, G) of the paper's Table 4 loss optimum and its source, from the data file: the
    geometry `moetune design` scores alongside its own for comparison."""
    ref = json.loads(DEFAULTS_PATH.read_text())["reference"]["b200_256gpu_20d"]
    v = ref["value"]
    return (v["q"], v["e"], v["k"], v["g"]), ref["source"]


@dataclass
class Envelope:
    """The search envelope: MoE grid, law-calibrated sparsity range, TPP grid and layout limits.
    Defaults come from `cost_model/data/mosaic_law_default.json` (each value with its source)."""
    q: tuple = ()
    e: tuple = ()
    k: tuple = ()
    g: tuple = ()
    s_min: float = 0.0
    s_max: float = 1.0
    tpp_min: float = 40.0
    tpp_max: float = 150.0
    gbs: int = 1024
    seq: int = 2048
    tp: tuple = (1,)
    cp: tuple = (1,)
    vocab: int = 50257
    query_groups: int = 8
    precision: str = "bf16"
    refine: int = 6  # parallel points per geometry whose every schedule/kernel option is scored

    @classmethod
    def default(cls) -> "Envelope":
        d = _published_design_defaults()
        return cls(q=tuple(d["q"]), e=tuple(d["e"]), k=tuple(d["k"]), g=tuple(d["g"]),
                   s_min=float(d["s_range"][0]), s_max=float(d["s_range"][1]),
                   tpp_min=float(d["tpp"][0]), tpp_max=float(d["tpp"][1]), gbs=int(d["gbs"]),
                   seq=int(d["seq"]), vocab=int(d["vocab"]), query_groups=int(d["query_groups"]))

    def to_dict(self) -> dict:
        return asdict(self)


_INT_LISTS = ("q", "e", "k", "g", "tp", "cp")
_SCALARS = {"gbs": int, "seq": int, "vocab": int, "query_groups": int, "refine": int,
            "tpp_min": float, "tpp_max": float, "s_min": float, "s_max": float, "precision": str}


def _int_list(key: str, text) -> tuple:
    if isinstance(text, (list, tuple)):
        vals = list(text)
    elif isinstance(text, int):
        vals = [text]
    else:
        vals = []
        for part in str(text).split(","):
            part = part.strip()
            if ".." in part:
                lo, hi = part.split("..", 1)
                try:
                    vals.extend(range(int(lo), int(hi) + 1))
                except ValueError:
                    raise UsageError(f"--envelope {key}: bad range {part!r} (write e.g. 4..12)") from None
            elif part:
                vals.append(part)
    try:
        out = tuple(sorted({int(v) for v in vals}))
    except (TypeError, ValueError):
        raise UsageError(f"--envelope {key}: expected whole numbers, got {text!r}") from None
    if not out or min(out) <= 0:
        raise UsageError(f"--envelope {key}: expected positive whole numbers, got {text!r}")
    return out


def parse_envelope(text: str | None, base: Envelope | None = None) -> Envelope:
    """An envelope from `--envelope`: a JSON/YAML file of key: value, or inline
    "q=4..12;e=8,16,32;k=1,2;g=1,2,4,8;s=0.5..0.98;tp=1;cp=1;tpp=40..150;gbs=1024;seq=2048".
    Unset keys keep `base` (default: the published envelope). Raises UsageError on bad input."""
    env = base or Envelope.default()
    if not text:
        return env
    path = Path(text)
    if path.suffix in (".json", ".yaml", ".yml"):
        try:
            raw = yaml.safe_load(path.read_text())
        except OSError as e:
            raise UsageError(f"cannot read envelope file {path}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise UsageError(f"malformed envelope file {path}: {str(e).splitlines()[0]}") from None
        if not isinstance(raw, dict):
            raise UsageError(f"envelope file {path} must be a mapping of key: value")
        items = list(raw.items())
    else:
        items = []
        for part in text.replace(" ", ";").split(";"):
            if not part.strip():
                continue
            if "=" not in part:
                raise UsageError(f"--envelope: {part!r} is not key=value")
            k, v = part.split("=", 1)
            items.append((k.strip(), v.strip()))
    changes: dict = {}
    for key, val in items:
        if key in _INT_LISTS:
            changes[key] = _int_list(key, val)
        elif key in ("s", "tpp"):
            lo, hi = _range(key, val)
            changes.update({f"{key}_min": lo, f"{key}_max": hi})
        elif key in _SCALARS:
            try:
                changes[key] = _SCALARS[key](val)
            except (TypeError, ValueError):
                raise UsageError(f"--envelope {key}: bad value {val!r}") from None
        else:
            raise UsageError(f"--envelope: unknown key {key!r} (known: {', '.join(_INT_LISTS + ('s', 'tpp') + tuple(_SCALARS))})")
    env = replace(env, **changes)
    if not (0.0 <= env.s_min < env.s_max <= 1.0):
        raise UsageError(f"--envelope s: need 0 <= min < max <= 1, got {env.s_min}..{env.s_max}")
    if not (0 < env.tpp_min <= env.tpp_max):
        raise UsageError(f"--envelope tpp: need 0 < min <= max, got {env.tpp_min}..{env.tpp_max}")
    if env.gbs <= 0 or env.seq <= 0 or env.refine <= 0:
        raise UsageError("--envelope gbs, seq and refine must be positive")
    return env


def _range(key: str, val) -> tuple[float, float]:
    if isinstance(val, (list, tuple)) and len(val) == 2:
        lo, hi = val
    elif isinstance(val, str) and ".." in val:
        lo, hi = val.split("..", 1)
    else:
        raise UsageError(f"--envelope {key}: expected a range lo..hi, got {val!r}")
    try:
        return float(lo), float(hi)
    except ValueError:
        raise UsageError(f"--envelope {key}: expected numbers in {val!r}") from None


# ---- geometry ladder ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    q: int
    e: int
    k: int
    g: int
    layers: int
    d_model: int
    d_ff: int
    d_expert: int
    n_tot: float  # non-embedding parameters
    n_act: float
    s: float

    @property
    def name(self) -> str:
        return f"mosaic-q{self.q}-e{self.e}-k{self.k}-g{self.g}"


def ladder_model(q: int, e: int, k: int, g: int, *, vocab: int = 50257, query_groups: int = 8,
                 seq: int = 2048) -> ModelSpec | None:
    """The ladder model of seed q with E experts, top-K and split factor G, or None when
    d_ff / G is not a whole width. KV heads: `query_groups`, reduced to gcd(heads, query_groups)
    when the head count is not a multiple of it (odd q).

    Args:
        q: ladder seed.  e, k, g: experts, top-K, split factor.  vocab: vocabulary size.
        query_groups: KV heads.  seq: sequence length written into the spec.
    """
    heads = 4 * q
    d = 128 * heads
    d_ff = int(2.5 * d)
    if d_ff % g or k > e:
        return None
    d_e = d_ff // g
    return from_dict(dict(
        name=f"mosaic-q{q}-e{e}-k{k}-g{g}", num_layers=4 * q, hidden_size=d, num_attention_heads=heads,
        num_query_groups=math.gcd(heads, query_groups), kv_channels=128, vocab_size=vocab,
        ffn_hidden_size=d_ff, num_experts=e, moe_router_topk=k, moe_ffn_hidden_size=d_e,
        moe_shared_expert_count=1, moe_shared_expert_ffn=d_e, first_k_dense=1, moe_layer_freq=1,
        moe_router_score_function="sigmoid", tie_embeddings=False, seq_length=seq,
        source="MOSAIC geometry ladder (paper §7.1, Table 9): layers 4q, heads 4q, d 128 heads, "
               "d_ff 2.5 d, d_expert d_ff/G, one shared expert, first layer dense"))


def geometry_of(spec: ModelSpec, q: int, e: int, k: int, g: int) -> Geometry:
    pc = param_counts(spec)
    emb = pc["embedding"] + pc["output_layer"]
    n_tot = float(pc["total"] - emb)
    n_act = float(pc["active"] - emb)
    return Geometry(q, e, k, g, spec.num_layers, spec.hidden_size, spec.ffn_hidden_size,
                    spec.moe_ffn_hidden_size, n_tot, n_act, 1.0 - n_act / n_tot)


def enumerate_geometries(env: Envelope) -> list[tuple[Geometry, ModelSpec]]:
    """Every ladder geometry of the envelope whose sparsity lies in [s_min, s_max]."""
    out = []
    for q in env.q:
        for e in env.e:
            for k in env.k:
                for g in env.g:
                    spec = ladder_model(q, e, k, g, vocab=env.vocab, query_groups=env.query_groups, seq=env.seq)
                    if spec is None:
                        continue
                    geo = geometry_of(spec, q, e, k, g)
                    if env.s_min <= geo.s <= env.s_max:
                        out.append((geo, spec))
    return out


# ---- layouts -----------------------------------------------------------------------------------

PAR_FIELDS = ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "pp_first", "pp_last", "pp_layout", "pp_embedding", "pp_loss")


def _probe(opt: dict) -> bool:
    """The first-pass options: every dispatcher (which one is fastest depends on whether EP leaves
    the node), all-to-all overlap on, shared-expert overlap off, at each recompute level of the
    core space (none, selective, full, so a point keeps its least-memory option). A point with no
    such realizable option is probed with all of its options."""
    return bool(opt.get("a2a_overlap", True)) and not opt.get("shared_expert_overlap")


class _PlanSet:
    """The core-space plans of one rung (layers, heads, KV heads, E): the realizable parallel
    points with their probe options as PlanArrays (walked once, shared by every K and G of the
    rung), and, built on demand per point, every realizable schedule x kernel option."""

    def __init__(self, workload: Workload, profile, env: "Envelope"):
        space = default_space(workload, profile, env.precision, level="core")
        tp = tuple(t for t in space.tp if t in env.tp) or (1,)
        cp = tuple(c for c in space.cp if c in env.cp) or (1,)
        self.space = replace(space, tp=tp, cp=cp, etp=tuple(t for t in space.etp if t <= max(tp)))
        probe_space = replace(self.space, schedules=tuple(x for x in self.space.schedules if _probe(x)))
        self.plans = list(iter_realizable(probe_space, workload, profile))
        self.arrays = PlanArrays.from_plans(self.plans) if self.plans else None
        keys: dict = {}
        point = []
        for p in self.plans:
            point.append(keys.setdefault(tuple(getattr(p, f) for f in PAR_FIELDS), len(keys)))
        self.point = np.asarray(point, dtype=np.int64)
        self.points = list(keys)
        self.workload, self.profile = workload, profile
        self._full: dict = {}

    def options(self, pt: int) -> list:
        """Every realizable core option of parallel point `pt` (cached)."""
        hit = self._full.get(pt)
        if hit is None:
            base = Plan(**dict(zip(PAR_FIELDS, self.points[pt])))
            hit = []
            for sch in self.space.schedules:
                for ker in self.space.kernels:
                    p = base.replace(**sch, **ker)
                    if not check_schedule_kernels(self.workload, p, self.profile):
                        hit.append(p)
            self._full[pt] = hit
        return hit


def _space_key(spec: ModelSpec, env: Envelope) -> tuple:
    key = (spec.num_layers, spec.num_attention_heads, spec.num_query_groups, spec.num_experts)
    if max(env.tp) > 1:  # TP divisibility reads the FFN widths too
        key += (spec.ffn_hidden_size, spec.moe_ffn_hidden_size, spec.moe_shared_expert_ffn)
    return key


@dataclass
class Layout:
    plan: object  # specs.plan.Plan
    tokens_per_s_per_gpu: float
    mfu: float  # cost model's MFU (Megatron FLOPs accounting, of the bf16 peak)
    peak_memory_gib: float
    step_time_s: float
    scored: int  # plans scored for this geometry


def best_layout(workload: Workload, plans: _PlanSet, *, tables=None, calibration=None,
                refine: int = 6, hbm_reserve: float = 0.1) -> Layout | None:
    """Fastest plan whose memory fits: every parallel point scored with its probe options, then
    every core option of the `refine` fastest points. None when nothing fits.

    Args:
        workload: the geometry on the cluster.  plans: the `_PlanSet` of its rung.
        tables, calibration: resolved once by the caller (reused across geometries).
        refine: parallel points refined in the second stage.  hbm_reserve: HBM fraction kept free.
    """
    if not plans.plans:
        return None
    r1 = cost_model.predict_arrays(workload, plans.arrays, tables=tables, calibration=calibration,
                                   hbm_reserve=hbm_reserve)
    tps1 = np.where(r1["fits"], r1["tokens_per_s_per_gpu"], -np.inf)
    best_pt = np.full(len(plans.points), -np.inf)
    np.maximum.at(best_pt, plans.point, tps1)
    order = np.argsort(-best_pt)
    top = [int(p) for p in order[:refine] if np.isfinite(best_pt[p])]
    if not top:
        return None
    cand = [p for pt in top for p in plans.options(pt)]
    r2 = cost_model.predict_arrays(workload, PlanArrays.from_plans(cand), tables=tables,
                                   calibration=calibration, hbm_reserve=hbm_reserve)
    tps2 = np.where(r2["fits"], r2["tokens_per_s_per_gpu"], -np.inf)
    i = int(np.argmax(tps2))
    if not np.isfinite(tps2[i]):
        return None
    return Layout(cand[i], float(r2["tokens_per_s_per_gpu"][i]), float(r2["mfu"][i]),
                  float(r2["peak_memory_gib"][i]), float(r2["step_time_s"][i]), len(plans.plans) + len(cand))


# ---- budget and loss ---------------------------------------------------------------------------

def token_budget(mfu_6n: float, peak_flops: float, n_devices: int, seconds: float, n_act: float) -> float:
    """App. D's closed form: the tokens that saturate the window, D* = C_model / (6 N_act) with
    C_model = MFU * F_peak * N_dev * T (MFU in the 6 N_act model-FLOPs convention).

    Args:
        mfu_6n: model-FLOPs utilisation (6 N_act per token).  peak_flops: per-device peak FLOP/s.
        n_devices: devices.  seconds: training window.  n_act: active parameters.
    """
    return mfu_6n * peak_flops * n_devices * seconds / (6.0 * n_act)


@dataclass
class Candidate:
    geometry: Geometry
    plan: str
    tokens_per_s_per_gpu: float
    mfu: float  # cost model (Megatron FLOPs accounting)
    mfu_6n: float  # 6 N_act convention, the one C_model uses
    peak_memory_gib: float
    d_star: float  # tokens that saturate the window
    d: float  # tokens on the TPP grid (capped at tpp_max N_act)
    tpp: float
    c_model: float
    loss: float
    feasible: bool
    note: str = ""
    plan_obj: object = field(default=None, repr=False, compare=False)  # the Plan, for the launch script

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("plan_obj")
        d["geometry"] = asdict(self.geometry)
        d["geometry"]["name"] = self.geometry.name
        return d


@dataclass
class DesignResult:
    cluster: str
    gpus: int
    days: float
    c_peak: float
    envelope: Envelope
    law: Law
    candidates: list  # every geometry with a fitting layout, best loss first (infeasible last)
    optimum: Candidate | None
    runner_ups: list
    max_c_model: Candidate | None
    stats: dict = field(default_factory=dict)
    forced: dict = field(default_factory=dict)  # name -> Candidate for the `always` geometries
    workload: Workload | None = None
    profile: object = None
    plan: object = None

    def rank(self, cand) -> int | None:
        """1-based rank of a scored candidate among the feasible scored ones (exact while the
        candidate is within the ranked list; beyond it, skipped geometries could sit above it)."""
        feas = [c for c in self.candidates if c.feasible]
        return next((i + 1 for i, c in enumerate(feas) if c is cand), None)

    def to_dict(self, top: int | None = None) -> dict:
        cands = [c for c in self.candidates if c.feasible]
        return {"cluster": self.cluster, "gpus": self.gpus, "days": self.days, "c_peak": self.c_peak,
                "envelope": self.envelope.to_dict(), "law": self.law.to_dict(),
                "optimum": self.optimum.to_dict() if self.optimum else None,
                "runner_ups": [c.to_dict() for c in self.runner_ups],
                "max_c_model": self.max_c_model.to_dict() if self.max_c_model else None,
                "candidates": [c.to_dict() for c in (cands if top is None else cands[:top])],
                "compared": {k: dict(c.to_dict(), rank=self.rank(c)) for k, c in self.forced.items()},
                "stats": self.stats}


def design(cluster: str, gpus: int, days: float, *, law: Law | None = None, envelope: Envelope | None = None,
           stack: str = "auto", runner_ups: int = 10, progress=None, tables=None, calibration=None,
           exhaustive: bool = False, hbm_reserve: float = 0.1, always: tuple = (),
           frontier: int = 0) -> DesignResult:
    """Run the MOSAIC search.

    Args:
        cluster: hardware kind (clusters/*.yaml) or a cluster YAML.  gpus: devices.  days: window.
        law: eq. (10) law (default: the shipped published/placeholder law).
        envelope: search envelope (default: `Envelope.default()`).  stack: stack profile name.
        runner_ups: how many ranked runner-ups to return.
        progress: optional callable(done, total) after each geometry.
        tables, calibration: cost-model inputs (default: the lookup rules of `cost_model`).
        exhaustive: score every geometry (no branch-and-bound pruning), for the full frontier.
        hbm_reserve: fraction of HBM kept free.
        frontier: score at least the `frontier` lowest-loss geometries (the plotted cloud), not
            only the ranked list.
        always: (q, E, K, G) tuples scored even when the bound would skip them (e.g. a published
            optimum to compare against).
    """
    if days <= 0:
        raise UsageError(f"--days must be positive, got {days:g}")
    law = law or default_law()
    env = envelope or Envelope.default()
    cl = load_cluster(cluster, gpus)
    profile = profile_for(cl, stack)
    peak = float(cl.peak_tflops.get(env.precision) or cl.peak_tflops.get("bf16")) * 1e12
    seconds = days * SECONDS_PER_DAY
    c_peak = peak * cl.num_devices * seconds
    geos = enumerate_geometries(env)
    if not geos:
        raise UsageError("the envelope holds no geometry in its sparsity range; widen --envelope")
    t0 = time.perf_counter()
    first = Workload(geos[0][1], cl, env.gbs, env.seq)
    tabs = cost_model.resolve_tables(first, tables)
    cal = cost_model.resolve_calibration(first, calibration, tabs)
    usable = cl.hbm_gib * (1.0 - hbm_reserve) * 2**30
    # Branch and bound, exact for the ranked list: D never exceeds tpp_max N_act, so the law at
    # that D bounds a geometry's loss from below whatever its layout. Geometries are scored in
    # order of that bound, and one whose bound cannot beat the current (runner_ups + 1)-th best
    # loss is skipped (unless exhaustive, e.g. for the full Fig. 10 cloud).
    bound = [float(law.loss(geo.n_tot, geo.s, env.tpp_max * geo.n_act, geo.g)) for geo, _ in geos]
    order = sorted(range(len(geos)), key=lambda i: bound[i])
    cache: dict = {}
    cands, scored, no_fit, too_big, pruned = [], 0, 0, 0, 0
    t_plans = 0.0
    keep = max(runner_ups + 1, frontier)
    best: list = []  # the `keep` lowest feasible losses so far, sorted
    for n, i in enumerate(order):
        geo, spec = geos[i]
        if progress:
            progress(n + 1, len(geos))
        if (not exhaustive and len(best) >= keep and bound[i] >= best[-1]
                and (geo.q, geo.e, geo.k, geo.g) not in always):
            pruned += 1
            continue
        # Every weight lives on some GPU with its bf16 copy and gradient and its fp32 Adam state
        # (>= 16 bytes per parameter however it is sharded): more than the cluster's usable HBM
        # can never fit, so the cost model is not asked.
        pc = param_counts(spec)
        if 16.0 * pc["total"] > usable * cl.num_devices:
            too_big += 1
            continue
        w = Workload(spec, cl, env.gbs, env.seq)
        key = _space_key(spec, env)
        if key not in cache:
            t = time.perf_counter()
            cache[key] = _PlanSet(w, profile, env)
            t_plans += time.perf_counter() - t
        lay = best_layout(w, cache[key], tables=tabs, calibration=cal, refine=env.refine, hbm_reserve=hbm_reserve)
        if lay is None:
            no_fit += 1
            continue
        scored += lay.scored
        mfu_6n = 6.0 * geo.n_act * lay.tokens_per_s_per_gpu / peak
        d_star = token_budget(mfu_6n, peak, cl.num_devices, seconds, geo.n_act)
        d = min(d_star, env.tpp_max * geo.n_act)
        tpp_star = d_star / geo.n_act
        feasible = tpp_star >= env.tpp_min
        note = "" if feasible else f"window affords TPP {tpp_star:.1f} < {env.tpp_min:g}"
        loss = float(law.loss(geo.n_tot, geo.s, d, geo.g))
        cands.append(Candidate(geo, lay.plan.canonical(), lay.tokens_per_s_per_gpu, lay.mfu, mfu_6n,
                               lay.peak_memory_gib, d_star, d, d / geo.n_act, 6.0 * geo.n_act * d, loss,
                               feasible, note, lay.plan))
        if feasible:
            best = sorted(best + [loss])[:keep]
    cands.sort(key=lambda c: (not c.feasible, c.loss))
    feas = [c for c in cands if c.feasible]
    opt = feas[0] if feas else None
    maxc = max(feas, key=lambda c: c.c_model) if feas else None
    stats = {"geometries": len(geos), "scored": len(cands) + no_fit, "pruned_by_bound": pruned,
             "over_cluster_memory": too_big, "rungs_walked": len(cache), "plans_scored": scored,
             "no_fitting_layout": no_fit, "below_tpp_min": len(cands) - len(feas),
             "seconds": round(time.perf_counter() - t0, 2), "seconds_plan_walk": round(t_plans, 2)}
    res_always = {c.geometry.name: c for c in cands if (c.geometry.q, c.geometry.e, c.geometry.k, c.geometry.g) in always}
    res = DesignResult(cl.kind, cl.num_devices, days, c_peak, env, law, cands, opt, feas[1:1 + runner_ups],
                       maxc, stats, forced=res_always)
    if opt is not None:
        spec = ladder_model(opt.geometry.q, opt.geometry.e, opt.geometry.k, opt.geometry.g, vocab=env.vocab,
                            query_groups=env.query_groups, seq=env.seq)
        res.workload = Workload(spec, cl, env.gbs, env.seq)
        res.profile = profile
        res.plan = opt.plan_obj
        reasons = check(res.workload, res.plan, profile)
        if reasons:  # the rung's plan set was walked for this very shape; this would be a bug
            raise RuntimeError(f"chosen plan is not realizable: {reasons[0]}")
    return res


# ---- outputs -----------------------------------------------------------------------------------

def model_yaml(spec: ModelSpec, geo: Geometry, note: str = "") -> str:
    """The spec as a YAML model file `specs.models.load_model` reads (first_k_dense form)."""
    d = spec.to_dict()
    d.pop("moe_layers")
    d["first_k_dense"] = spec.num_layers - spec.num_moe_layers
    d["moe_layer_freq"] = 1
    d = {k: v for k, v in d.items() if not (v in (0, "", False) and k not in ("tie_embeddings",))}
    head = (f"# {geo.name}: MOSAIC ladder geometry q={geo.q} (layers {geo.layers}, d {geo.d_model}), "
            f"E={geo.e}, K={geo.k}, G={geo.g}\n"
            f"# non-embedding N_tot {geo.n_tot / 1e9:.2f}B, N_act {geo.n_act / 1e9:.2f}B, S {geo.s:.3f}\n")
    if note:
        head += "".join(f"# {line}\n" for line in note.splitlines())
    return head + yaml.safe_dump(d, sort_keys=False)


def frontier_png(res: DesignResult, path) -> None:
    """Loss against deliverable model FLOPs for every feasible candidate, coloured by G, star on
    the loss optimum (the paper's Fig. 10). Written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    feas = [c for c in res.candidates if c.feasible]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    gs = sorted({c.geometry.g for c in feas})
    cmap = plt.get_cmap("viridis", max(2, len(gs)))
    for i, g in enumerate(gs):
        pts = [c for c in feas if c.geometry.g == g]
        ax.scatter([c.c_model for c in pts], [c.loss for c in pts], s=10, alpha=0.7, color=cmap(i), label=f"G={g}")
    if res.optimum:
        o = res.optimum
        ax.scatter([o.c_model], [o.loss], marker="*", s=260, color="gold", edgecolor="black", zorder=5,
                   label=f"optimum q={o.geometry.q} E={o.geometry.e} K={o.geometry.k} G={o.geometry.g}")
    ax.set_xscale("log")
    ax.set_xlabel("deliverable model FLOPs C_model = 6 N_act D")
    ax.set_ylabel("predicted loss (eq. 10)")
    ax.set_title(f"MOSAIC frontier: {res.gpus}x {res.cluster}, {res.days:g} days "
                 f"(C_peak {res.c_peak:.2e})", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    write_png(fig, path, dpi=120)


def write_outputs(res: DesignResult, out_dir) -> dict:
    """design.json, frontier.png, <name>.yaml and <name>.launch.sh under `out_dir`. Every text is
    composed before the first write, and every write is atomic. Returns name -> path."""
    out = Path(out_dir)
    texts = {"design.json": json.dumps(res.to_dict(), indent=1) + "\n"}
    if res.optimum is not None:
        o = res.optimum
        note = (f"chosen by `moetune design` for {res.gpus}x {res.cluster} over {res.days:g} days: "
                f"layout {o.plan}\n"
                f"predicted loss {o.loss:.4f}, D {o.d:.3e} tokens (TPP {o.tpp:.1f}), C_model {o.c_model:.3e}")
        texts[f"{o.geometry.name}.yaml"] = model_yaml(res.workload.model, o.geometry, note)
        texts[f"{o.geometry.name}.launch.sh"] = megatron_script(res.workload, res.plan, res.profile)
    paths = {}
    for name, text in texts.items():
        write_atomic(out / name, text)
        paths[name] = str(out / name)
    frontier_png(res, out / "frontier.png")
    paths["frontier.png"] = str(out / "frontier.png")
    return paths
