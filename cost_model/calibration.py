"""The labelled correction of the cost model (MOSAIC §5.5): multiplicative factors on the model's
predicted time standing for what uncontended microbenchmarks cannot see (cross-node straggler and
overlap efficiency, loop-level overheads, a component the physics gets wrong). One type for training
and serving, in two kinds (the file's `kind` says which):

- one-scale: one factor on the whole step (the special case with one class, `step`):
      step_time = scale * raw_step_time
- per-component: one factor per breakdown class the model reports (TRAIN_CLASSES for training,
  SERVE_CLASSES for serving: prefill and decode steps), each regularised toward a common scale:
      step_time = scale * sum_k factor_k * raw_k          (scale 1 in a per-component fit)
      log factor_k = log c + d_k,   d_k ~ N(0, prior_sd^2)

A part key "F@M" (`factor_class`, `measured_class`) is time priced with class F's factor that a
trial's split measures in class M (the CPU floor's launches inside the modules a trial times whole).

Identity by default; stored as JSON with a content hash and provenance. `fit_calibration` fits
either kind by robust (soft-L1) least squares in log space. A per-component fit weighs every
trial's measured step total (measured = sum_k f_k * predicted_k) and, where the trial recorded its
own per-class split, each class's time too (at SPLIT_WEIGHT: a profiled step's attribution is
less sure than its total). The prior is hierarchical: the factors share a common scale c, fitted
freely (weak prior sd COMMON_PRIOR_SD around 1), and each class's deviation d_k from it has the
Gaussian prior of sd `prior_sd`. So a class no trial informs follows the common scale, not 1: on
a host where every class runs 25% slower than its microbenchmark, one well-measured class cannot
pull the rest back to 1 (what a ridge toward 1 did on the CPU quickstart: eight classes from nine
plans, the host-launch factor fitted at 0.58 and both pipeline plans of the held-out set
predicted 24-35% too fast). With every d_k held at 0 it is the one-scale fit. Old one-scale files
(no `kind`, as the shipped GPU default) load as one-scale.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specs.errors import InputError
from specs.inputs import read_text

log = logging.getLogger(__name__)

DEFAULT_GPU_CALIBRATION = Path(__file__).resolve().parent / "calibration_default.json"
LABEL = "straggler/overlap efficiency (multiplicative on step time)"
ONE_SCALE, PER_COMPONENT = "one-scale", "per-component"
STEP = "step"  # the one class of a one-scale calibration

# The breakdown classes of the training model, and which class each `breakdown_s` component of
# cost_model.model belongs to (a component not listed here raises: a new component must be placed).
TRAIN_CLASSES = ("gemm", "grouped_gemm", "attention", "ep_comm", "etp_comm", "other_comm", "host_launch",
                 "elementwise", "pipeline_bubble", "stack_floor")
# the classes a CPU trial's split measures (trials/megatron/components.py): the bubble is measured
# inside host_launch, expert TP's collectives inside ep_comm (both run in the MoE layer), and
# stack_floor is a factor only (its time is measured in the others)
SPLIT_CLASSES = tuple(c for c in TRAIN_CLASSES if c not in ("pipeline_bubble", "stack_floor", "etp_comm"))
SERVE_CLASSES = ("prefill", "decode")
COMPONENT_CLASS = {
    "attention_proj": "gemm", "dense_mlp": "gemm", "shared_expert": "gemm", "lm_head_ce": "gemm", "mtp": "gemm",
    # the extra forward of recompute re-runs the layer's modules, dominated by their GEMMs
    "recompute": "gemm",
    # ... except its core attention and routed experts, which are those modules' time again
    "recompute_core_attention": "attention", "recompute_experts": "grouped_gemm",
    "expert_gemm": "grouped_gemm",
    "core_attention": "attention",
    "ep_dispatch_combine": "ep_comm",  # what the model leaves exposed (after any a2a overlap)
    # expert TP's all-gather / reduce-scatter of the routed rows: another collective than the
    # dispatcher's exchange, with a factor of its own, measured where the split sees it (inside
    # the MoE layer, ep_comm). Sharing ep_comm's factor, the CPU studies' etp=2 plans (their
    # gather / scatter measured at 2-2.8x its price) set the factor of every EP plan's all-to-all
    # (measured at 1.2-1.3x): issue 27
    "etp_gather_scatter": "etp_comm@ep_comm",
    # a2a overlap as it runs: the communication a paired compute node cannot hide, and the compute
    # slowed by the SMs the communication kernels hold: both are the EP communication's cost
    "ep_overlap_beyond": "ep_comm", "ep_overlap_sm_share": "ep_comm",
    # issue 22 part two: the HBM bandwidth overlapped EP communication takes from memory-bound
    # compute, and the dispatcher's metadata exchange, are the EP communication's cost too
    "ep_overlap_hbm_share": "ep_comm", "dispatcher_preprocess": "ep_comm",
    # the hidden DP collectives' SMs taken from the compute they hide under
    "dp_overlap_sm_share": "other_comm",
    # the HBM bandwidth the hidden DP collectives take from the memory-bound compute under them, and
    # the hidden PP send/recv's SMs and HBM bandwidth (issue 22): the communication's cost
    "dp_overlap_hbm_share": "other_comm", "pp_p2p_sm_share": "other_comm", "pp_p2p_hbm_share": "other_comm",
    # fp32 main-grad accumulation of the weight-gradient GEMMs
    "wgrad_main_grad": "gemm",
    # the fixed per-kernel slot of the non-GEMM kernels
    "kernel_latency": "elementwise",
    "tp_comm": "other_comm", "cp_comm": "other_comm", "pp_p2p": "other_comm",
    "dp_grad_reduce_scatter": "other_comm", "dp_param_all_gather": "other_comm", "activation_offload": "other_comm",
    "moe_host_sync": "host_launch", "cpu_launch_floor": "host_launch",
    # CPU: the dispatch floor of the trial stack (`trials/profile/stack_floor.py`), a class of its
    # own (IN_SITU_PRIOR_SD). Its launches inside the modules a trial times whole are measured in
    # those modules' classes, the rest in host_launch; all of it takes the floor's factor (a
    # module's factor, fitted where its compute dominates, scaled a launch-bound plan's floor with
    # it: the router's launches at elementwise's x1.9-2.1; pp=2 mbs=1 predicted 40-46% slow, issue 27)
    "cpu_launch_core_attention": "stack_floor@attention", "cpu_launch_experts": "stack_floor@grouped_gemm",
    "cpu_launch_router": "stack_floor@elementwise", "cpu_stack_floor": "stack_floor@host_launch",
    # ... or, where the profile measured how a trial's split sees the floor, by that split
    # (SPLIT_CLASSES; trials/profile/stack_floor.py)
    **{f"cpu_floor_in_{c}": f"stack_floor@{c}" for c in SPLIT_CLASSES},
    "elementwise": "elementwise", "router_permutation": "elementwise", "fp8_quantize": "elementwise",
    "embedding": "elementwise", "optimizer_step": "elementwise",
    # a pipeline rank waiting for its peer is time between ops, which a profiled CPU step records as
    # host_launch (trials/megatron/components.py): the bubble is measured inside host_launch
    "pipeline_bubble": "pipeline_bubble@host_launch",
}
# The serving model's parts and their classes: a step's time belongs to its phase.
SERVE_COMPONENT_CLASS = {"prefill_step": "prefill", "decode_step": "decode"}
NOT_A_CLASS = ("calibration",)  # the breakdown's own calibration term is the output, not an input
PRIOR_SD = 0.5  # prior sd of d_k = log f_k - log c: a class within x0.61..x1.65 of the common scale at one sd
COMMON_PRIOR_SD = 1.0  # prior sd of log c: weak (x0.37..x2.7 at one sd), only keeps a fit without rows finite
SPLIT_WEIGHT = 0.5  # weight of a class's measured time beside the step total (module docstring)
# Classes measured in situ, not by an uncontended microbenchmark: their factor is not drawn toward
# the common scale (the host's contention the trials see and the microbenchmarks do not) but has a
# prior of its own around 1, of this sd. The CPU stack floor is the trial stack itself timed as the
# trials run it; its per-kernel gap varied 39.7-52.7 us (sd 7.7% of the mean) over nine profiles on
# the 2-core host (issue 27): sd 0.15, about twice that. Without it the floor took the common
# scale's 1.2-1.4 (or a noisy host_launch split's 1.8) and a launch-bound plan was predicted
# 25-46% slow.
IN_SITU_PRIOR_SD = {"stack_floor": 0.15}
# A part key "F@M": time with class F's factor that a trial's split measures in class M (time a
# split cannot tell apart from M's, compared in sum with it).
MEASURED_IN = "@"
OBS_SD = 0.1  # the soft-L1 scale of a log-time residual (host noise of a step, ~10%)
Z90 = 1.645  # two-sided 90% normal quantile: the intervals of `interval`


def factor_class(key: str) -> str:
    """The class whose factor a part key takes ("F@M" -> F)."""
    return key.split(MEASURED_IN, 1)[0]


def measured_class(key: str) -> str:
    """The class a trial's split measures a part key in ("F@M" -> M)."""
    return key.rsplit(MEASURED_IN, 1)[-1]


def fold_parts(parts: dict) -> dict:
    """{class: seconds} with every "F@M" part added to its factor class F."""
    return class_parts(parts, {k: factor_class(k) for k in parts})


def class_parts(breakdown: dict, component_class: dict | None = None) -> dict:
    """{class: seconds} (floats or arrays) from a prediction's breakdown: a training prediction's
    `breakdown_s` (COMPONENT_CLASS), or a serving one's step seconds (SERVE_COMPONENT_CLASS)."""
    component_class = COMPONENT_CLASS if component_class is None else component_class
    out: dict = {}
    for comp, v in breakdown.items():
        if comp in NOT_A_CLASS:
            continue
        if comp not in component_class:
            raise KeyError(f"breakdown component {comp!r} has no calibration class (cost_model.calibration)")
        c = component_class[comp]
        out[c] = out[c] + v if c in out else v
    return out


class CalibrationError(InputError):
    """A calibration file that is missing or is not one (names the file; the CLI adds the flag)."""


@dataclass(frozen=True)
class Calibration:
    """scale: the factor on the whole step (the one-scale term; 1 in a per-component fit).
    factors: {class: factor} of a per-component calibration (empty: one-scale). log_cov: the fit's
    covariance of log factors (classes in `factors` order), resid_sd: its leave-one-out log-time
    error; both give predictions their interval (`interval`)."""
    scale: float = 1.0
    label: str = LABEL
    provenance: dict = field(default_factory=dict)  # data, fit, residuals, tables digest
    factors: dict = field(default_factory=dict)
    log_cov: tuple = ()
    resid_sd: float | None = None

    @property
    def kind(self) -> str:
        return PER_COMPONENT if self.factors else ONE_SCALE

    @property
    def classes(self) -> tuple:
        return tuple(self.factors) if self.factors else (STEP,)

    def factor(self, cls: str) -> float:
        """The factor on class `cls`'s raw time (a class the fit did not hold: the scale alone)."""
        return self.scale * float(self.factors.get(factor_class(cls), 1.0))

    def apply(self, parts):
        """Calibrated time from a raw total (one-scale) or {class: raw seconds} (floats or arrays)."""
        if not isinstance(parts, dict):
            return self.scale * parts
        return sum(self.factor(c) * v for c, v in parts.items())

    def log_sd(self, parts) -> float:
        """sd of the log of a calibrated prediction: the factors' uncertainty (delta method: the
        prediction's class shares through log_cov) and the fit's leave-one-out error."""
        rs = self.resid_sd
        if rs is None:  # an old file: the leave-one-out errors in its provenance, if any
            loo = [r.get("loo_rel_err") for r in self.provenance.get("residuals", ())]
            loo = [math.log1p(e) for e in loo if e is not None and np.isfinite(e) and e > -1]
            rs = math.sqrt(sum(e * e for e in loo) / len(loo)) if len(loo) >= 2 else None
        if rs is None:
            return float("nan")
        var = rs * rs
        if self.log_cov and isinstance(parts, dict):
            parts = fold_parts(parts)
            tot = self.apply(parts)
            g = np.array([self.factor(c) * float(parts.get(c, 0.0)) / tot for c in self.classes])
            var += float(g @ np.asarray(self.log_cov, float) @ g)
        return math.sqrt(var)

    def interval(self, parts, z: float = Z90) -> tuple[float, float]:
        """(low, high) of a calibrated prediction: exp(+-z sd) around it; (nan, nan) without a fit."""
        t, sd = float(self.apply(parts)), self.log_sd(parts)
        return (t * math.exp(-z * sd), t * math.exp(z * sd)) if np.isfinite(sd) else (float("nan"), float("nan"))

    def factor_intervals(self, z: float = Z90) -> dict:
        """{class: (factor, low, high)} from the fit's covariance of log factors."""
        cov = np.asarray(self.log_cov, float) if self.log_cov else None
        out = {}
        for i, c in enumerate(self.classes):
            f = self.factor(c)
            sd = math.sqrt(cov[i, i]) if cov is not None else float("nan")
            out[c] = (f, f * math.exp(-z * sd), f * math.exp(z * sd))
        return out

    @property
    def id(self) -> str:
        body = {"scale": round(self.scale, 12), "label": self.label, "provenance": self.provenance}
        if self.factors:  # one-scale ids are as they were before per-component calibration existed
            body["factors"] = {k: round(v, 12) for k, v in self.factors.items()}
        blob = json.dumps(body, sort_keys=True).encode()
        return ("identity" if self.scale == 1.0 and not self.provenance and not self.factors
                else "cal-" + hashlib.sha256(blob).hexdigest()[:16])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["log_cov"] = [list(r) for r in self.log_cov]
        d["kind"] = self.kind
        d["id"] = self.id
        return d

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        """Read a calibration JSON written by `save` (or an older one-scale file without `kind`).
        Raises `CalibrationError` naming `path` when the file is missing, unreadable, not JSON, or
        lacks a positive finite `scale` (or, per-component, positive finite factors)."""
        text = read_text(path, "calibration file", CalibrationError)
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise ValueError(f"a JSON {type(d).__name__}, not an object")
            return cls.from_dict(d)
        except (ValueError, TypeError) as e:
            # json.JSONDecodeError is a ValueError; float("abc") too
            raise CalibrationError(f"{path}: not a calibration file ({e})") from None

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        """The calibration of a `to_dict` document; ValueError naming what is wrong."""
        if "scale" not in d:
            raise ValueError("no 'scale' field")
        scale = float(d["scale"])
        if not (np.isfinite(scale) and scale > 0):
            raise ValueError(f"scale {d['scale']!r} is not a positive number")
        provenance = d.get("provenance", {})
        if not isinstance(provenance, dict):
            raise ValueError("'provenance' is not an object")
        kind = d.get("kind", ONE_SCALE)
        if kind not in (ONE_SCALE, PER_COMPONENT):
            raise ValueError(f"kind {kind!r} is not {ONE_SCALE} or {PER_COMPONENT}")
        factors = {}
        if kind == PER_COMPONENT:
            raw = d.get("factors")
            if not isinstance(raw, dict) or not raw:
                raise ValueError("a per-component calibration without 'factors'")
            factors = {str(k): float(v) for k, v in raw.items()}
            bad = [k for k, v in factors.items() if not (np.isfinite(v) and v > 0)]
            if bad:
                raise ValueError(f"factor of {bad[0]!r} is not a positive number")
        cov = tuple(tuple(float(x) for x in r) for r in d.get("log_cov") or ())
        if cov and len(cov) != len(factors or (STEP,)):
            raise ValueError("'log_cov' does not match the classes")
        rs = d.get("resid_sd")
        return cls(scale=scale, label=d.get("label", LABEL), provenance=provenance, factors=factors,
                   log_cov=cov, resid_sd=None if rs is None else float(rs))


IDENTITY = Calibration()


def default_calibration(cluster) -> Calibration:
    """The shipped fit for GPU clusters, identity for CPU (no published runs to fit on)."""
    if getattr(cluster, "is_gpu", True) and DEFAULT_GPU_CALIBRATION.exists():
        return Calibration.load(DEFAULT_GPU_CALIBRATION)
    return IDENTITY


def user_calibration_path(kind: str) -> Path:
    """Where `moetune calibrate` installs a fit for a cluster kind: $MOETUNE_HOME/calibration/<kind>.json."""
    from specs.home import moetune_home
    return moetune_home() / "calibration" / f"{kind}.json"


def calibration_for(cluster, tables=None) -> Calibration:
    """The lookup rule: the installed fit for this cluster kind when its provenance names the
    digest of `tables` (the tables the model will read; a fit on other tables is not used), else
    `default_calibration(cluster)`."""
    p = user_calibration_path(cluster.kind)
    if p.is_file():
        try:
            cal = Calibration.load(p)
        except CalibrationError as e:
            log.warning("ignoring the installed calibration: %s", e)  # the lookup falls back; say why
            cal = None
        if cal is not None and (tables is None or cal.provenance.get("tables_digest") == tables.digest):
            return cal
    return default_calibration(cluster)




def _as_parts(pred, classes) -> np.ndarray:
    """A row's predicted raw seconds per class, in `classes` order (a float: all of it in the one
    class of a one-scale fit; a dict for one class: its sum)."""
    if not isinstance(pred, dict):
        if len(classes) != 1:
            raise ValueError("a per-component fit needs each row's predicted time per class")
        return np.array([float(pred)])
    if len(classes) == 1:
        return np.array([float(sum(pred.values()))])
    unknown = set(pred) - set(classes)
    if unknown:
        raise ValueError(f"predicted classes {sorted(unknown)} are not among {list(classes)}")
    return np.array([float(pred.get(c, 0.0)) for c in classes])


def fit_calibration(pairs, *, provenance: dict | None = None, classes=None,
                    prior_sd: float | None = PRIOR_SD) -> tuple[Calibration, dict]:
    """Fit a calibration; returns (Calibration, report).

    Args:
        pairs: rows (predicted, measured_step_s[, label[, measured_parts]]): `predicted` is the raw
            step time (float) or {class: raw seconds}; `measured_parts` ({class: measured seconds},
            optional) is the trial's own split. Every row is fitted on its total
            (log sum_k f_k p_k vs log measured); a row with a split also per class (log f_k p_k vs
            log m_k, each class with time on both sides, at SPLIT_WEIGHT).
        classes: None: one-scale (one class, no prior: robust least squares of log step time, as
            the shipped GPU default is fitted); else the classes of a per-component fit.
        prior_sd: per-component only: sd of the Gaussian prior on each class's deviation d_k from
            the common scale (None: none, the factors free). Prior residuals d_k / prior_sd * OBS_SD
            (and log c / COMMON_PRIOR_SD * OBS_SD) sit beside the rows' log residuals, all under
            the soft-L1 loss of scale OBS_SD.

    The report has `scale`, `factors`, per-row residuals after the fit and leave-one-out relative
    errors of the total (`loo_rel_err`), and their maxima.
    """
    from scipy.optimize import least_squares
    pairs = list(pairs)
    one = classes is None
    classes = (STEP,) if one else tuple(classes)
    K = len(classes)
    # the part keys: the classes, then any "F@M" parts (F's factor, measured in M)
    keys = classes if one else classes + tuple(sorted({k for p in pairs if isinstance(p[0], dict) for k in p[0]
                                                       if MEASURED_IN in k}))
    bad = [k for k in keys if factor_class(k) not in classes or measured_class(k) not in classes]
    if bad:
        raise ValueError(f"predicted parts {bad} name classes that are not among {list(classes)}")
    F = np.array([[1.0 if factor_class(k) == c else 0.0 for c in classes] for k in keys])  # key -> its factor
    P = np.array([_as_parts(p[0], keys) for p in pairs], float).reshape(len(pairs), len(keys))
    pred = P.sum(axis=1)
    meas = np.array([p[1] for p in pairs], float)
    labels = [p[2] if len(p) > 2 else str(i) for i, p in enumerate(pairs)]
    split = [p[3] if len(p) > 3 and p[3] and not one else None for p in pairs]
    M = np.array([[float(s.get(c, 0.0)) if s else 0.0 for c in classes] for s in split], float).reshape(len(pairs), K)
    # measured class <- the predicted part keys compared in it
    measured_in = np.array([[1.0 if measured_class(k) == c else 0.0 for k in keys] for c in classes])
    # per-component: x = (log c, d_1..d_K), log f = log c + d (module docstring); one-scale: x = (log f,)
    hier = not one
    prior_w = 0.0 if (one or prior_sd is None) else OBS_SD / prior_sd
    n_x = K + 1 if hier else K

    # the factors that share the common scale c (all but the in-situ classes), each d_k's prior weight
    shares_c = np.array([0.0 if c in IN_SITU_PRIOR_SD else 1.0 for c in classes])
    prior_ws = np.array([OBS_SD / IN_SITU_PRIOR_SD[c] if c in IN_SITU_PRIOR_SD else prior_w for c in classes])

    def log_f(x):
        return shares_c * x[0] + x[1:] if hier else x

    def residuals(x, idx):
        lf = F @ log_f(x)  # per part key
        r = []
        for i in idx:
            r.append(np.logaddexp.reduce(lf + np.log(np.maximum(P[i], 1e-300)), where=P[i] > 0) - np.log(meas[i])
                     if K > 1 else lf[0] + np.log(pred[i]) - np.log(meas[i]))
            if split[i] is not None:
                q = measured_in @ (np.exp(lf) * P[i])  # predicted per measured class
                m = M[i]
                ok = (q > 0) & (m > 0)
                r.extend(SPLIT_WEIGHT * (np.log(q[ok]) - np.log(m[ok])))
        if hier:
            r.append(OBS_SD / COMMON_PRIOR_SD * x[0])
            r.extend(prior_ws * x[1:])  # prior_sd None: no pull (prior_w 0), the d_k as free as c
        return np.array(r, float) if r else np.zeros(1)

    def fit(idx):
        res = least_squares(lambda x: residuals(x, idx), x0=np.zeros(n_x), loss="soft_l1", f_scale=OBS_SD)
        return log_f(res.x), res

    allidx = np.arange(len(pairs))
    theta, res = fit(allidx)
    f = np.exp(theta)
    calp = P @ (F @ f)
    resid = calp / meas - 1.0
    loo = []
    for i in allidx:
        if len(pairs) < 2:
            loo.append(float("nan"))
            continue
        th_i, _ = fit(allidx[allidx != i])
        loo.append(float(P[i] @ (F @ np.exp(th_i)) / meas[i] - 1.0))
    # covariance of log f (Gauss-Newton at the optimum): the rows' information at their residual
    # variance, plus the priors' precisions (a class no row informs keeps the common scale's sd
    # and its own prior's)
    J = res.jac
    n_obs = max(1, len(res.fun) - (n_x if hier else 0))
    s2 = max(OBS_SD ** 2 if len(pairs) < 3 else 0.0, float(np.sum(res.fun[:n_obs] ** 2)) / max(1, n_obs - 1))
    prec = J[:n_obs].T @ J[:n_obs] / max(s2, 1e-300)
    if hier:
        prec = prec + np.diag([1.0 / COMMON_PRIOR_SD ** 2] + [(w / OBS_SD) ** 2 for w in prior_ws])
    try:
        cov = np.linalg.pinv(prec)
        if hier:  # of (log c, d) -> of log f = log c + d
            A = np.hstack([shares_c[:, None], np.eye(K)])
            cov = A @ cov @ A.T
    except np.linalg.LinAlgError:
        cov = np.full((K, K), np.nan)
    loo_log = [math.log1p(e) for e in loo if np.isfinite(e) and e > -1]
    resid_sd = math.sqrt(sum(e * e for e in loo_log) / len(loo_log)) if len(loo_log) >= 2 else None
    rows = [{"label": lab, "raw_pred_s": float(p), "measured_s": float(mm), "calibrated_rel_err": float(e),
             "loo_rel_err": lo} for lab, p, mm, e, lo in zip(labels, pred, meas, resid, loo)]
    for r, s in zip(rows, split):
        if s:
            r["measured_parts_s"] = {c: float(v) for c, v in s.items()}
    scale = float(f[0]) if one else 1.0
    factors = {} if one else {c: float(v) for c, v in zip(classes, f)}
    common = None if one else float(np.exp(res.x[0]))
    report = {"kind": ONE_SCALE if one else PER_COMPONENT, "scale": scale, "factors": factors, "rows": rows,
              "common_scale": common,
              "max_abs_rel_err": float(np.max(np.abs(resid))) if len(pairs) else 0.0,
              "loo_max_abs_rel_err": float(np.nanmax(np.abs(loo))) if len(pairs) > 1 else float("nan")}
    prov = dict(provenance or {})
    if one:
        prov.update(method="scipy least_squares soft_l1 on log step time", n=len(pairs), residuals=rows)
    else:
        prov.update(method=f"scipy least_squares soft_l1 (scale {OBS_SD}) in log space on each step total, and "
                           f"per class (weight {SPLIT_WEIGHT}) where the trial split its time; hierarchical "
                           f"prior log f_k = log c + d_k, d_k ~ N(0, {prior_sd}^2), log c ~ N(0, {COMMON_PRIOR_SD}^2)",
                    n=len(pairs), n_split=sum(1 for s in split if s), prior_sd=prior_sd,
                    common_scale=common, residuals=rows)
    cal = Calibration(scale=scale, provenance=prov, factors=factors,
                      log_cov=tuple(tuple(float(x) for x in r) for r in cov), resid_sd=resid_sd)
    report["factor_intervals"] = cal.factor_intervals()
    return cal, report
