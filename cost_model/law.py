"""The G-augmented sparse-MoE scaling law of the MOSAIC paper, and its fit.

Joint law, the paper's eq. (10), in total parameters `N` (= N_tot), sparsity `S`, training tokens
`D` and expert split factor `G`:

    L(N, S, D, G) = a/N^alpha + b/D^beta + c (1-S)^-lambda + j / ((1-S)^delta N^gamma G^eta) + e

The per-G law, eq. (9), is the same form fitted on one G at a time, so the G^eta factor is folded into
`j` (no `eta`). `N` and `D` enter in billions (`N_SCALE`, `D_SCALE`): the prefactors a, b, j are
relative to 1e9 parameters / tokens, which keeps every coefficient O(0.01..10) for the optimiser.

Fitting follows the paper's recipe (its §4.2 "Fitting Results" and App. B.2):
  * Huber loss (delta 0.1) on the residual of log L, minimised by L-BFGS-B over the logarithms of the
    coefficients (every coefficient is positive), from several random starts (`fit`);
  * the top 10% of runs by N_act within each G stratum are held out, and their RMSE in loss units is
    reported (`heldout_mask`);
  * 95% intervals by a wild bootstrap with Rademacher residual flips, warm-started at the fit, read
    off with BCa (bias correction from the bootstrap, acceleration from a jackknife) (`bootstrap_ci`);
  * an identifiability scan (`identifiability`): many fresh restarts, keeping those whose objective
    is statistically indistinguishable from the best one (likelihood-ratio threshold), plus a profile
    check (move one coefficient by +-rel_tol, refit all others): a coefficient is `identified` when
    the indistinguishable restarts agree on it and the profile rejects the move, else `ridge`.

Input runs come from a CSV (`read_runs_csv`) whose bad rows are refused with `RunsError`, an
`InputError` (one line, exit 2 at the CLI). This module imports numpy/scipy and `specs` only.
"""
from __future__ import annotations

import csv
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import minimize
from scipy.stats import norm

from specs.errors import InputError
from specs.inputs import read_text

log = logging.getLogger(__name__)

NAMES = ("a", "alpha", "b", "beta", "c", "lambda", "j", "gamma", "delta", "eta", "e")
PER_G_NAMES = tuple(n for n in NAMES if n != "eta")  # eq. (9): G folded into j
N_SCALE = 1e9  # N_tot in the law is in billions of parameters
D_SCALE = 1e9  # D in the law is in billions of tokens
HUBER_DELTA = 0.1  # paper §4.2: Huber on log L with delta 0.1
HOLDOUT_FRAC = 0.10  # paper §4.2: top 10% by N_act within each G stratum
EXPONENTS = ("alpha", "beta", "lambda", "gamma", "delta", "eta")
# Search box (natural units) for the optimiser, and the narrower box random starts are drawn from.
BOUNDS = {"a": (1e-6, 1e3), "b": (1e-6, 1e3), "c": (1e-6, 1e3), "j": (1e-6, 1e3), "e": (1e-4, 10.0),
          **{k: (1e-3, 3.0) for k in EXPONENTS}}
START_BOX = {"a": (0.05, 10.0), "b": (0.05, 10.0), "c": (0.005, 1.0), "j": (0.05, 10.0),
             "e": (0.1, 1.5), **{k: (0.05, 1.0) for k in EXPONENTS}}

REQUIRED_COLUMNS = ("n_tot", "n_act", "s", "g", "d", "loss")
OPTIONAL_COLUMNS = ("e", "k", "layers", "d_model")


class RunsError(InputError):
    """A runs CSV (or law JSON) that cannot be used: the message names the row and the problem."""


# ---- data --------------------------------------------------------------------------------------

@dataclass
class Runs:
    """Training runs: parameter counts (raw), sparsity in [0, 1), split factor G, tokens (raw), loss."""
    n_tot: np.ndarray
    n_act: np.ndarray
    s: np.ndarray
    g: np.ndarray
    d: np.ndarray
    loss: np.ndarray
    extra: dict = field(default_factory=dict)  # optional columns (e, k, layers, d_model)

    def __len__(self) -> int:
        return len(self.loss)

    def subset(self, mask) -> "Runs":
        return Runs(self.n_tot[mask], self.n_act[mask], self.s[mask], self.g[mask], self.d[mask],
                    self.loss[mask], {k: v[mask] for k, v in self.extra.items()})


def make_runs(n_tot, n_act, s, g, d, loss, source: str = "runs") -> Runs:
    """Runs from array-likes, validated like a CSV (row numbers count from 1).

    Args:
        n_tot, n_act: total and active parameter counts (raw counts, > 0, n_act <= n_tot).
        s: sparsity, in [0, 1).  g: expert split factor (> 0).  d: training tokens (> 0).
        loss: final training loss (> 0).  source: name used in error messages.
    """
    cols = [np.asarray(x, dtype=float) for x in (n_tot, n_act, s, g, d, loss)]
    n = len(cols[0])
    if any(len(c) != n for c in cols):
        raise RunsError(f"{source}: columns have different lengths")
    for i in range(n):
        problem = _row_problem(*(float(c[i]) for c in cols))
        if problem:
            raise RunsError(f"{source}: row {i + 1}: {problem}")
    return Runs(*cols)


def _row_problem(n_tot, n_act, s, g, d, loss) -> str:
    for name, v in (("n_tot", n_tot), ("n_act", n_act), ("g", g), ("d", d), ("loss", loss)):
        if not math.isfinite(v) or v <= 0:
            return f"{name} must be a positive number, got {v:g}"
    if not (math.isfinite(s) and 0.0 <= s < 1.0):
        return f"s must be in [0, 1), got {s:g}"
    if n_act > n_tot:
        return f"n_act {n_act:g} exceeds n_tot {n_tot:g}"
    return ""


def read_runs_csv(path) -> Runs:
    """Read and validate a runs CSV: columns n_tot, n_act, s, g, d, loss (optional e, k, layers,
    d_model). Raises `RunsError` naming the file row (header = line 1) and the problem."""
    path = Path(path)
    text = read_text(path, "runs CSV", RunsError)
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise RunsError(f"{path}: missing column(s) {', '.join(missing)} (need {', '.join(REQUIRED_COLUMNS)})")
    reader.fieldnames = header
    rows: dict = {c: [] for c in REQUIRED_COLUMNS}
    extra: dict = {c: [] for c in OPTIONAL_COLUMNS if c in header}
    for line_no, row in enumerate(reader, start=2):
        vals = {}
        for c in (*REQUIRED_COLUMNS, *extra):
            raw = (row.get(c) or "").strip()
            if raw == "" and c in REQUIRED_COLUMNS:
                raise RunsError(f"{path}: line {line_no}: column {c} is empty")
            try:
                vals[c] = float(raw) if raw else float("nan")
            except ValueError:
                raise RunsError(f"{path}: line {line_no}: {c} {raw!r} is not a number") from None
        problem = _row_problem(*(vals[c] for c in REQUIRED_COLUMNS))
        if problem:
            raise RunsError(f"{path}: line {line_no}: {problem}")
        for c in REQUIRED_COLUMNS:
            rows[c].append(vals[c])
        for c in extra:
            extra[c].append(vals[c])
    if not rows["loss"]:
        raise RunsError(f"{path}: no runs")
    return Runs(*(np.array(rows[c]) for c in REQUIRED_COLUMNS), {k: np.array(v) for k, v in extra.items()})


# ---- the law -----------------------------------------------------------------------------------

def _features(n_tot, s, d, g):
    """log N (billions), log D (billions), log(1-S), log G as float arrays."""
    ln_n = np.log(np.asarray(n_tot, dtype=float) / N_SCALE)
    ln_d = np.log(np.asarray(d, dtype=float) / D_SCALE)
    ln_1s = np.log1p(-np.asarray(s, dtype=float))
    ln_g = np.log(np.asarray(g, dtype=float))
    return np.broadcast_arrays(ln_n, ln_d, ln_1s, ln_g)


def _terms(c: dict, ln_n, ln_d, ln_1s, ln_g):
    t_a = c["a"] * np.exp(-c["alpha"] * ln_n)
    t_b = c["b"] * np.exp(-c["beta"] * ln_d)
    t_c = c["c"] * np.exp(-c["lambda"] * ln_1s)
    t_j = c["j"] * np.exp(-c["delta"] * ln_1s - c["gamma"] * ln_n - c.get("eta", 0.0) * ln_g)
    return t_a, t_b, t_c, t_j


def predict_loss(coefficients: dict, n_tot, s, d, g=1.0) -> np.ndarray:
    """Loss of eq. (10) (or eq. (9) when `coefficients` has no `eta`).

    Args:
        coefficients: a, alpha, b, beta, c, lambda, j, gamma, delta, [eta], e.
        n_tot: total parameters (raw count).  s: sparsity in [0, 1).  d: tokens (raw count).
        g: expert split factor (ignored by eq. (9)).
    """
    ln_n, ln_d, ln_1s, ln_g = _features(n_tot, s, d, g)
    t = _terms(coefficients, ln_n, ln_d, ln_1s, ln_g)
    return t[0] + t[1] + t[2] + t[3] + coefficients["e"]


@dataclass
class Law:
    """A fitted (or published/default) law: coefficients plus where they come from."""
    coefficients: dict
    form: str = "eq10"
    provenance: dict = field(default_factory=dict)  # name -> source sentence
    meta: dict = field(default_factory=dict)

    def loss(self, n_tot, s, d, g=1.0) -> np.ndarray:
        return predict_loss(self.coefficients, n_tot, s, d, g)

    def to_dict(self) -> dict:
        return {"form": self.form, "units": {"n_tot": N_SCALE, "d": D_SCALE},
                "coefficients": dict(self.coefficients), "provenance": dict(self.provenance), **self.meta}


def load_law(path) -> Law:
    """A law JSON: `moetune law fit --out` output, or the shipped default whose coefficients are
    {value, status, source} entries. Raises `RunsError` on a missing or malformed file."""
    path = Path(path)
    text = read_text(path, "law file", RunsError)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise RunsError(f"law file {path} is not valid JSON: {e.msg} (line {e.lineno})") from None
    coefs = raw.get("coefficients") if isinstance(raw, dict) else None
    if not isinstance(coefs, dict):
        raise RunsError(f"law file {path} has no 'coefficients' mapping")
    units = raw.get("units", {})
    if units and (float(units.get("n_tot", N_SCALE)) != N_SCALE or float(units.get("d", D_SCALE)) != D_SCALE):
        raise RunsError(f"law file {path} uses units {units}; this version reads N and D in 1e9")
    out, prov = {}, {}
    for name in NAMES:
        entry = coefs.get(name)
        if isinstance(entry, dict):
            prov[name] = f"{entry.get('status', '')}: {entry.get('source', '')}".strip(": ")
            entry = entry.get("value")
        if entry is None:
            raise RunsError(f"law file {path} lacks coefficient {name!r}")
        try:
            v = float(entry)
        except (TypeError, ValueError):
            raise RunsError(f"law file {path}: coefficient {name} {entry!r} is not a number") from None
        if not (math.isfinite(v) and v > 0):
            raise RunsError(f"law file {path}: coefficient {name} must be positive, got {v:g}")
        out[name] = v
    meta = {k: raw[k] for k in ("identified", "ci", "heldout_rmse") if k in raw}
    return Law(out, form=str(raw.get("form", "eq10")), provenance=prov, meta=meta)


DEFAULT_LAW_PATH = Path(__file__).parent / "data" / "mosaic_law_default.json"


def default_law() -> Law:
    """The shipped law: the paper's published eta and beta, other coefficients labelled placeholders."""
    return load_law(DEFAULT_LAW_PATH)


# ---- fitting -----------------------------------------------------------------------------------

class _Problem:
    """Huber objective on log L in log-coefficient space, with its analytic gradient."""

    def __init__(self, runs: Runs, names: tuple, weights=None, log_target=None):
        self.names = names
        self.ln_n, self.ln_d, self.ln_1s, self.ln_g = _features(runs.n_tot, runs.s, runs.d, runs.g)
        if "eta" not in names:
            self.ln_g = np.zeros_like(self.ln_g)
        self.y = np.log(runs.loss) if log_target is None else log_target
        self.n = len(self.y)
        self.w = np.ones(self.n) if weights is None else weights
        self.scale = 1e4 / max(1.0, float(self.w.sum()))  # keeps L-BFGS-B's tolerances meaningful
        self.idx = {k: i for i, k in enumerate(names)}

    def coefs(self, theta) -> dict:
        return {k: float(math.exp(t)) for k, t in zip(self.names, theta)}

    def pred_log(self, theta) -> np.ndarray:
        c = self.coefs(theta)
        t = _terms(c, self.ln_n, self.ln_d, self.ln_1s, self.ln_g)
        return np.log(t[0] + t[1] + t[2] + t[3] + c["e"])

    def __call__(self, theta):
        c = self.coefs(theta)
        t_a, t_b, t_c, t_j = _terms(c, self.ln_n, self.ln_d, self.ln_1s, self.ln_g)
        L = t_a + t_b + t_c + t_j + c["e"]
        r = np.log(L) - self.y
        ar = np.abs(r)
        rho = np.where(ar <= HUBER_DELTA, 0.5 * r * r, HUBER_DELTA * (ar - 0.5 * HUBER_DELTA))
        psi = np.clip(r, -HUBER_DELTA, HUBER_DELTA) * self.w / L
        # d L / d log(coef) for each coefficient
        dd = {"a": t_a, "alpha": -c["alpha"] * self.ln_n * t_a, "b": t_b, "beta": -c["beta"] * self.ln_d * t_b,
              "c": t_c, "lambda": -c["lambda"] * self.ln_1s * t_c, "j": t_j,
              "gamma": -c["gamma"] * self.ln_n * t_j, "delta": -c["delta"] * self.ln_1s * t_j,
              "eta": -c.get("eta", 0.0) * self.ln_g * t_j, "e": np.full_like(L, c["e"])}
        # elementwise products, not BLAS dot: tiny vectors, and a threaded BLAS on a busy machine
        # costs 10x more in thread hand-offs than the arithmetic
        g = (np.stack([dd[k] for k in self.names]) * psi).sum(axis=1)
        return float((self.w * rho).sum()) * self.scale, g * self.scale

    def bounds(self, fixed: dict | None = None):
        b = []
        for k in self.names:
            if fixed and k in fixed:
                v = math.log(fixed[k])
                b.append((v, v))
            else:
                lo, hi = BOUNDS[k]
                b.append((math.log(lo), math.log(hi)))
        return b

    def solve(self, theta0, fixed: dict | None = None, maxiter: int = 3000, ftol: float = 1e-12):
        th = np.array(theta0, dtype=float)
        bnds = self.bounds(fixed)
        th = np.clip(th, [lo for lo, _ in bnds], [hi for _, hi in bnds])
        _single_thread_blas()
        res = minimize(self, th, jac=True, method="L-BFGS-B", bounds=bnds,
                       options={"maxiter": maxiter, "ftol": ftol, "gtol": 1e-10, "maxcor": 30})
        return res.x, float(res.fun) / self.scale


_BLAS_LIMITED = False


def _single_thread_blas() -> None:
    """Ask scipy's bundled OpenBLAS for one thread. L-BFGS-B calls BLAS on 11-vectors thousands of
    times; on a shared machine a threaded BLAS spends ~10x the arithmetic in thread hand-offs.
    Best effort: a build without the symbol is left alone."""
    global _BLAS_LIMITED
    if _BLAS_LIMITED:
        return
    _BLAS_LIMITED = True
    import ctypes
    import glob
    import os

    import scipy
    libdir = os.path.join(os.path.dirname(scipy.__file__), os.pardir, "scipy.libs")
    for lib in glob.glob(os.path.join(libdir, "libscipy_openblas*.so")):
        try:
            handle = ctypes.CDLL(lib)
        except OSError:
            continue
        for sym in ("scipy_openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
                    "openblas_set_num_threads"):
            fn = getattr(handle, sym, None)
            if fn is not None:
                fn(1)
                log.debug("limited %s to one BLAS thread", os.path.basename(lib))
                break


def _random_starts(names, n, rng) -> np.ndarray:
    lo = np.log([START_BOX[k][0] for k in names])
    hi = np.log([START_BOX[k][1] for k in names])
    return lo + (hi - lo) * rng.random((n, len(names)))


def heldout_mask(runs: Runs, frac: float = HOLDOUT_FRAC) -> np.ndarray:
    """True for the held-out runs: the top `frac` by n_act within each G stratum (rounded to the
    nearest whole run, so a stratum of fewer than 1/(2 frac) runs keeps them all for training)."""
    mask = np.zeros(len(runs), dtype=bool)
    for gv in np.unique(runs.g):
        idx = np.flatnonzero(runs.g == gv)
        k = int(math.floor(frac * len(idx) + 0.5))
        if k:
            mask[idx[np.argsort(runs.n_act[idx], kind="stable")[-k:]]] = True
    return mask


@dataclass
class Fit:
    """One fit: coefficients, objective, held-out RMSE (loss units) and the split used."""
    coefficients: dict
    objective: float  # sum of Huber terms on the training runs
    train_rmse: float
    heldout_rmse: float | None
    n_train: int
    n_heldout: int
    theta: np.ndarray = field(repr=False, default=None)


def _rmse(a, b) -> float:
    return float(np.sqrt(np.mean((np.asarray(a) - np.asarray(b)) ** 2))) if len(a) else float("nan")


def fit(runs: Runs, *, form: str = "eq10", starts: int = 16, seed: int = 0, holdout: bool = True,
        theta0=None) -> Fit:
    """Fit eq. (10) (form="eq10") or eq. (9) (form="eq9") by multi-start L-BFGS-B.

    Args:
        runs: the runs (see `read_runs_csv`).  form: "eq10" joint law, "eq9" per-G form (no eta).
        starts: random starts (plus `theta0` when given).  seed: RNG seed for the starts.
        holdout: hold out the top 10% by n_act within each G stratum and report their RMSE.
        theta0: optional start in log-coefficient space (e.g. a previous fit).
    """
    names = NAMES if form == "eq10" else PER_G_NAMES
    if len(runs) < len(names) + 1:
        raise RunsError(f"{len(runs)} runs cannot pin {len(names)} coefficients (need at least {len(names) + 1})")
    hold = heldout_mask(runs) if holdout else np.zeros(len(runs), dtype=bool)
    if (~hold).sum() < len(names) + 1:
        hold[:] = False
    train = runs.subset(~hold)
    prob = _Problem(train, names)
    rng = np.random.default_rng(seed)
    inits = list(_random_starts(names, starts, rng))
    if theta0 is not None:
        inits.insert(0, np.asarray(theta0, dtype=float))
    best = None
    for th0 in inits:
        th, obj = prob.solve(th0)
        if best is None or obj < best[1]:
            best = (th, obj)
    th, obj = best
    coefs = prob.coefs(th)
    pred_train = predict_loss(coefs, train.n_tot, train.s, train.d, train.g)
    held = runs.subset(hold)
    rmse_h = None
    if len(held):
        rmse_h = _rmse(predict_loss(coefs, held.n_tot, held.s, held.d, held.g), held.loss)
    return Fit(coefs, obj, _rmse(pred_train, train.loss), rmse_h, len(train), len(held), th)


def bootstrap_ci(runs: Runs, base: Fit, *, form: str = "eq10", reps: int = 200, seed: int = 1,
                 level: float = 0.95, jackknife: bool = True) -> dict:
    """Wild-bootstrap (Rademacher) BCa intervals for every coefficient, warm-started at `base`.

    Uses the training runs of `base` (the held-out ones stay out). Returns name -> [lo, hi].

    Args:
        runs: all runs (the same ones given to `fit`).  base: the point fit.  reps: refits.
        level: interval coverage.  jackknife: estimate the BCa acceleration by a leave-one-out
            jackknife (else acceleration 0, i.e. the bias-corrected percentile interval).
    """
    names = NAMES if form == "eq10" else PER_G_NAMES
    hold = heldout_mask(runs) if base.n_heldout else np.zeros(len(runs), dtype=bool)
    train = runs.subset(~hold)
    prob = _Problem(train, names)
    yhat = prob.pred_log(base.theta)
    resid = prob.y - yhat
    rng = np.random.default_rng(seed)
    boots = np.empty((reps, len(names)))
    for b in range(reps):
        v = rng.choice((-1.0, 1.0), size=len(resid))
        pb = _Problem(train, names, log_target=yhat + v * resid)
        boots[b], _ = pb.solve(base.theta, ftol=1e-10)
    accel = np.zeros(len(names))
    if jackknife and len(train) > len(names) + 2:
        jack = np.empty((len(train), len(names)))
        for i in range(len(train)):
            w = np.ones(len(train))
            w[i] = 0.0
            jack[i], _ = _Problem(train, names, weights=w).solve(base.theta, ftol=1e-10)
        jv = np.exp(jack)
        dev = jv.mean(axis=0) - jv
        den = 6.0 * (dev ** 2).sum(axis=0) ** 1.5
        accel = np.where(den > 0, (dev ** 3).sum(axis=0) / np.where(den > 0, den, 1.0), 0.0)
    alpha = (1.0 - level) / 2.0
    z_lo, z_hi = norm.ppf(alpha), norm.ppf(1.0 - alpha)
    out = {}
    bv = np.exp(boots)
    for k, name in enumerate(names):
        theta_hat = base.coefficients[name]
        col = bv[:, k]
        if np.ptp(col) == 0:
            out[name] = [float(col[0]), float(col[0])]
            continue
        p = (np.sum(col < theta_hat) + 0.5 * np.sum(col == theta_hat)) / reps
        p = min(max(p, 0.5 / reps), 1.0 - 0.5 / reps)
        z0 = norm.ppf(p)
        a = accel[k]
        qs = []
        for z in (z_lo, z_hi):
            num = z0 + z
            qs.append(float(norm.cdf(z0 + num / (1.0 - a * num))))
        out[name] = [float(np.quantile(col, qs[0])), float(np.quantile(col, qs[1]))]
    return out


def identifiability(runs: Runs, base: Fit, *, form: str = "eq10", restarts: int = 100, seed: int = 2,
                    rel_tol: float = 0.05) -> dict:
    """Which coefficients the data pin down. Returns {"status": name -> "identified"|"ridge",
    "scan_range": name -> [min, max] over the indistinguishable restarts, "n_indistinguishable",
    "threshold", "profile": name -> objective increase at +-rel_tol}.

    Two solutions are indistinguishable when their Huber objectives differ by less than the 95%
    likelihood-ratio threshold for one coefficient, 0.5 * 3.84 * sigma^2 with sigma^2 the mean
    squared log residual of the best fit (Huber = half the squared residual inside delta).
    A coefficient is `identified` when (1) across the indistinguishable fresh restarts its value
    varies by at most `rel_tol` of the point estimate, and (2) fixing it at (1 +- rel_tol) times the
    point estimate and refitting every other coefficient raises the objective by more than the
    threshold on both sides. Otherwise it sits on a `ridge` that other coefficients trade along.

    Args:
        runs: all runs.  base: the point fit.  restarts: fresh random restarts for the scan.
        rel_tol: relative precision a coefficient must be pinned to, to count as identified.
    """
    names = NAMES if form == "eq10" else PER_G_NAMES
    hold = heldout_mask(runs) if base.n_heldout else np.zeros(len(runs), dtype=bool)
    train = runs.subset(~hold)
    prob = _Problem(train, names)
    r = prob.pred_log(base.theta) - prob.y
    sigma2 = float(np.mean(r ** 2))
    thresh = 0.5 * 3.84 * sigma2
    rng = np.random.default_rng(seed)
    sols = []
    best_obj = base.objective
    for th0 in _random_starts(names, restarts, rng):
        # a restart that has not converged in 600 steps sits above the threshold and drops out
        th, obj = prob.solve(th0, maxiter=600, ftol=1e-10)
        sols.append((th, obj))
        best_obj = min(best_obj, obj)
    close = [np.exp(th) for th, obj in sols if obj <= best_obj + thresh]
    close.append(np.exp(base.theta))
    close = np.array(close)
    status, ranges, profile = {}, {}, {}
    for k, name in enumerate(names):
        v = base.coefficients[name]
        lo, hi = float(close[:, k].min()), float(close[:, k].max())
        ranges[name] = [lo, hi]
        spread_ok = (hi - lo) <= rel_tol * abs(v)
        rises = []
        for f in (1.0 - rel_tol, 1.0 + rel_tol):
            fixed_v = v * f
            blo, bhi = BOUNDS[name]
            if not (blo <= fixed_v <= bhi):
                rises.append(float("inf"))
                continue
            th0 = base.theta.copy()
            th0[k] = math.log(fixed_v)
            _, obj = prob.solve(th0, fixed={name: fixed_v})
            rises.append(obj - base.objective)
        profile[name] = rises
        status[name] = "identified" if spread_ok and min(rises) > thresh else "ridge"
    return {"status": status, "scan_range": ranges, "n_indistinguishable": int(len(close)),
            "restarts": restarts, "threshold": thresh, "profile": profile, "rel_tol": rel_tol}


def fit_report(runs: Runs, *, starts: int = 16, bootstrap: int = 200, restarts: int = 100,
               rel_tol: float = 0.05, per_g: bool = False, seed: int = 0, progress=None) -> dict:
    """The whole `moetune law fit`: joint fit, BCa intervals, identifiability, optional per-G fits.

    Args:
        runs: validated runs.  starts: random starts of the point fit.  bootstrap: wild-bootstrap
            refits (0 = none).  restarts: fresh restarts of the identifiability scan (0 = none).
        rel_tol: see `identifiability`.  per_g: also fit eq. (9) on each G stratum.
        progress: optional callable(step_name) told as each stage starts.
    """
    say = progress or (lambda _s: None)
    say("fit")
    base = fit(runs, starts=starts, seed=seed)
    out = {"form": "eq10", "units": {"n_tot": N_SCALE, "d": D_SCALE},
           "coefficients": base.coefficients, "heldout_rmse": base.heldout_rmse,
           "train_rmse": base.train_rmse, "n_train": base.n_train, "n_heldout": base.n_heldout,
           "objective": base.objective}
    if bootstrap:
        say("bootstrap")
        out["ci"] = bootstrap_ci(runs, base, reps=bootstrap, seed=seed + 1)
    if restarts:
        say("identifiability")
        ident = identifiability(runs, base, restarts=restarts, seed=seed + 2, rel_tol=rel_tol)
        out["identified"] = [k for k in NAMES if ident["status"][k] == "identified"]
        out["ridge"] = [k for k in NAMES if ident["status"][k] == "ridge"]
        out["identifiability"] = {k: v for k, v in ident.items() if k != "status"}
    if per_g:
        say("per-G")
        out["per_g"] = per_g_fits(runs, starts=starts, seed=seed)
    out["_fit"] = base
    return out


def per_g_fits(runs: Runs, *, starts: int = 16, seed: int = 0) -> dict:
    """Eq. (9) fitted on each G stratum with enough runs (> 11): G -> {coefficients, heldout_rmse,
    train_rmse, n_train, n_heldout}; strata too small say so under `skipped`."""
    out: dict = {}
    for gv in np.unique(runs.g):
        sub = runs.subset(runs.g == gv)
        key = f"{gv:g}"
        if len(sub) < len(PER_G_NAMES) + 2:
            out[key] = {"skipped": f"{len(sub)} runs, need {len(PER_G_NAMES) + 2}"}
            continue
        f = fit(sub, form="eq9", starts=starts, seed=seed)
        out[key] = {"coefficients": f.coefficients, "heldout_rmse": f.heldout_rmse,
                    "train_rmse": f.train_rmse, "n_train": f.n_train, "n_heldout": f.n_heldout}
    return out


def synthetic_runs(coefficients: dict, n: int = 150, noise: float = 0.0078, seed: int = 0) -> Runs:
    """Runs drawn over the paper's scaling grid (App. C.1 ranges) with losses from `coefficients`
    plus Gaussian noise of `noise` loss units: the fixture the fit tests and the bench use.

    Args:
        coefficients: eq. (10) coefficients.  n: runs.  noise: loss-unit standard deviation
            (default the paper's joint held-out RMSE, §4.2).  seed: RNG seed.
    """
    rng = np.random.default_rng(seed)
    g = rng.choice([1.0, 2.0, 4.0, 6.0, 8.0], size=n)
    n_act = np.exp(rng.uniform(math.log(0.10e9), math.log(2.72e9), size=n))
    s = rng.uniform(0.499, 0.981, size=n)
    n_tot = n_act / (1.0 - s)
    tpp = np.exp(rng.uniform(math.log(10.8), math.log(70.0), size=n))
    d = tpp * n_act
    loss = predict_loss(coefficients, n_tot, s, d, g) + rng.normal(0.0, noise, size=n)
    return make_runs(n_tot, n_act, s, g, d, loss, source="synthetic")
