"""Hardware performance tables: ONE on-disk format, read by the cost model, written by
`cost_model/build_default_tables.py` (published numbers) and later by `moetune profile` (measured).

Layout: `clusters/tables/<kind>/` holds one CSV per operator family plus `meta.json`.

Every CSV has a header row; columns are, in order, the family's *key* columns (strings), its
*axis* columns (positive numbers, interpolated in log space), its *value* columns (positive
numbers, interpolated in log space) and a final `source` column naming where the row comes from
(a measurement file, a public benchmark with its URL/commit, or `derived: <how>`). Rows of one key
should form a full grid over the axes; holes are filled from the nearest grid point in log space.
Queries outside the grid clamp to its edge (the metadata says which ranges were extrapolated).

| family        | keys                 | axes                    | values                                  |
|---------------|----------------------|-------------------------|-----------------------------------------|
| gemm          | dtype                | m, n, k                 | tflops (achieved, 2mnk/time)            |
| grouped_gemm  | dtype                | groups, m, n, k         | tflops (m = rows per group, all groups) |
| attention     | dtype, direction     | seq, head_dim, bh       | tflops (causal flops, fwd or bwd)       |
| collectives   | collective, scope    | group, per_node, bytes  | busbw_gbps (nccl-tests convention, GB/s)|
| ep_dispatch   | backend, scope       | ep                      | dispatch_gbps, combine_gbps, latency_us |
| dispatch_gap  | mode                 | -                       | gap_us (CPU enqueue stall per kernel)   |
| membw         | op                   | -                       | gbps (achieved bytes/s of a memory-bound op) |

dtype: bf16 | fp8 (any fp8/mxfp8 recipe) | fp32. direction: fwd | bwd. collective: all_reduce,
reduce_scatter, all_gather, all_to_all, send_recv. scope: scaleup (group inside one NVLink
domain) | scaleout (group spans several). per_node: members of the group per scale-up domain.
ep_dispatch scope: scaleup | scaleout bandwidth of the fabric the bytes cross (per GPU).
membw op: elementwise, permute, router, cross_entropy, optimizer.
attention bh: batch x heads of ONE attention call on one rank (a training micro-batch's mbs x heads
per TP rank; a serving step's requests x heads per attention-TP rank). Per-head cost depends on it
on CPU (the unfused s^2 score tensors, bh*s*s*4 bytes, spill the cache); a table whose rows all
carry one bh value (the GPU tables) makes the axis inert.

Optional axes (`OPTIONAL_AXES`, family -> {axis: default}): axes added after tables were written.
A CSV without such a column (a table built or profiled before the axis existed, e.g. one in a
user's $MOETUNE_HOME/tables) still loads: every row takes the default, a single value, which
`GridTable.lookup` ignores (a one-valued axis is inert). Lookups always name every axis.

`meta.json`: {"kind", "format": 1, "generator", "notes": [...], "sources": {tag: full citation}
(a row's `source` may be a short tag explained there), "files": {name: sha256},
"digest": sha256 over the CSV files (name + bytes, sorted by name)}. Reports quote `digest`.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clusters import TABLES_ROOT as TABLE_ROOT  # the shipped tables, clusters/tables/<kind>/
from specs.errors import InputError
from specs.home import moetune_home

FORMAT_VERSION = 1

FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "gemm": (("dtype",), ("m", "n", "k"), ("tflops",)),
    "grouped_gemm": (("dtype",), ("groups", "m", "n", "k"), ("tflops",)),
    "attention": (("dtype", "direction"), ("seq", "head_dim", "bh"), ("tflops",)),
    "collectives": (("collective", "scope"), ("group", "per_node", "bytes"), ("busbw_gbps",)),
    "ep_dispatch": (("backend", "scope"), ("ep",), ("dispatch_gbps", "combine_gbps", "latency_us")),
    "dispatch_gap": (("mode",), (), ("gap_us",)),
    "membw": (("op",), (), ("gbps",)),
}

# axes a table may lack (written before the axis existed), with the value its rows then take.
# attention bh = 8: the batch x heads the CPU profile measured at before the axis existed
# (its former constant HEADS, trials/profile/attention.py); alone in a table the value is inert.
OPTIONAL_AXES: dict[str, dict[str, float]] = {"attention": {"bh": 8}}


def with_optional_axes(family: str, rows: list[dict]) -> list[dict]:
    """Rows with every optional axis of `family` present (the default where a row lacks it)."""
    opt = OPTIONAL_AXES.get(family)
    if not opt:
        return rows
    return [{**r, **{a: d for a, d in opt.items() if r.get(a) in (None, "")}} for r in rows]


class TableError(InputError):
    """Tables that cannot be used: a missing directory or family, a malformed file, a key with no
    rows. Names the directory or file; the CLI adds the flag (`--tables`)."""


class GridTable:
    """Rows of one family, pivoted to a dense log-space grid per key; vectorised lookups."""

    def __init__(self, family: str, rows: list[dict]):
        keys, axes, values = FAMILIES[family]
        self.family, self.keys, self.axes, self.values = family, keys, axes, values
        rows = with_optional_axes(family, rows)
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            groups.setdefault(tuple(r[k] for k in keys), []).append(r)
        self.grids: dict[tuple, tuple[list[np.ndarray], dict[str, np.ndarray]]] = {}
        for key, rs in groups.items():
            ax = [np.unique(np.array([float(r[a]) for r in rs])) for a in axes]
            shape = tuple(len(a) for a in ax)
            vals = {v: np.full(shape, np.nan) for v in values}
            for r in rs:
                idx = tuple(int(np.searchsorted(ax[i], float(r[a]))) for i, a in enumerate(axes))
                for v in values:
                    vals[v][idx] = float(r[v])
            logax = [np.log(a) for a in ax]
            for v in values:
                vals[v] = _fill_holes(np.log(np.maximum(vals[v], 1e-30)), logax)
            self.grids[key] = (logax, vals)

    def has(self, *key) -> bool:
        return tuple(key) in self.grids

    def row_keys(self) -> list[tuple]:
        """The row keys the table has."""
        return list(self.grids)

    def axis_min(self, key, axis: str) -> float:
        """The smallest value row `key` holds on `axis` (lookups clamp below it)."""
        logax, _ = self.grids[tuple([key] if isinstance(key, str) else key)]
        return float(np.exp(logax[self.axes.index(axis)][0]))

    def lookup(self, key, value: str | None = None, **axes) -> np.ndarray:
        """Interpolated value(s) at the given axis arrays (broadcast together)."""
        key = tuple([key] if isinstance(key, str) else key)
        if key not in self.grids:
            raise TableError(f"{self.family} table has no rows for {key}; has {sorted(self.grids)}")
        logax, vals = self.grids[key]
        grid = vals[value or self.values[0]]
        if not self.axes:
            return np.exp(grid.reshape(()))
        pts = np.broadcast_arrays(*[np.asarray(axes[a], dtype=float) for a in self.axes])
        out_shape = pts[0].shape
        if pts[0].size > 2048:  # many plans share shapes: interpolate each distinct point once
            stacked = np.ascontiguousarray(np.stack([p.ravel() for p in pts], axis=1))
            keys = stacked.view(np.dtype((np.void, stacked.dtype.itemsize * stacked.shape[1]))).ravel()
            _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
            if len(first) < 0.5 * len(keys):
                uq = self.lookup(key, value, **{a: stacked[first, i] for i, a in enumerate(self.axes)})
                return uq[inv.reshape(-1)].reshape(out_shape)
        # multilinear interpolation in log space, clamped at the edges
        lo_idx, w = [], []
        for la, p in zip(logax, pts):
            x = np.log(np.maximum(p.ravel(), 1e-30))
            if len(la) == 1:
                lo_idx.append(np.zeros(x.shape, dtype=np.intp))
                w.append(np.zeros(x.shape))
                continue
            x = np.clip(x, la[0], la[-1])
            i = np.clip(np.searchsorted(la, x, side="right") - 1, 0, len(la) - 2)
            lo_idx.append(i)
            w.append((x - la[i]) / (la[i + 1] - la[i]))
        res = np.zeros(pts[0].size)
        nd = len(logax)
        for corner in range(1 << nd):
            idx, wt = [], 1.0
            for d in range(nd):
                bit = (corner >> d) & 1
                if len(logax[d]) == 1:
                    if bit:
                        wt = 0.0
                        break
                    idx.append(lo_idx[d])
                    continue
                idx.append(lo_idx[d] + bit)
                wt = wt * (w[d] if bit else (1.0 - w[d]))
            if isinstance(wt, float) and wt == 0.0:
                continue
            res += wt * grid[tuple(idx)]
        return np.exp(res).reshape(out_shape)


def _fill_holes(grid: np.ndarray, logax: list[np.ndarray]) -> np.ndarray:
    """Fill holes (NaN): by log-space linear interpolation between the nearest filled points on
    both sides along an axis (averaged over the axes that bracket the hole), else from the nearest
    filled grid point (Euclidean in log-axis space). A profile cut by its budget measures a coarse
    subset of a grid: a hole between two measured sequence lengths is their interpolation, not a
    copy of whichever one happens to be nearer."""
    mask = np.isnan(grid)
    if not mask.any():
        return grid
    if mask.all():
        raise TableError("a table key has no values")
    out = grid.copy()
    for idx in zip(*np.nonzero(mask)):
        est = []
        for d, la in enumerate(logax):
            line = [grid[idx[:d] + (j,) + idx[d + 1:]] for j in range(len(la))]
            lo = next((j for j in range(idx[d] - 1, -1, -1) if not np.isnan(line[j])), None)
            hi = next((j for j in range(idx[d] + 1, len(la)) if not np.isnan(line[j])), None)
            if lo is not None and hi is not None:
                w = (la[idx[d]] - la[lo]) / (la[hi] - la[lo])
                est.append((1.0 - w) * line[lo] + w * line[hi])
        if est:
            out[idx] = float(np.mean(est))
    rest = np.isnan(out)
    if not rest.any():
        return out
    coords = np.stack(np.meshgrid(*logax, indexing="ij"), axis=-1).reshape(-1, len(logax)) if logax \
        else np.zeros((1, 0))
    flat = out.ravel()
    have = ~np.isnan(grid.ravel())
    src = grid.ravel()
    for i in np.flatnonzero(rest.ravel()):
        dist = ((coords[have] - coords[i]) ** 2).sum(axis=1)
        flat[i] = src[have][int(np.argmin(dist))]
    return flat.reshape(grid.shape)


def read_rows(path: Path, family: str) -> list[dict]:
    keys, axes, values = FAMILIES[family]
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise TableError(f"{path}: not a readable CSV table ({e})") from None
    need = set(keys) | set(axes) | set(values) | {"source"}
    need -= set(OPTIONAL_AXES.get(family, {}))
    if rows and not need <= set(rows[0]):
        raise TableError(f"{path}: missing columns {sorted(need - set(rows[0]))}")
    numeric = [c for c in (*axes, *values) if c in (rows[0] if rows else {})]
    for line_no, r in enumerate(rows, start=2):  # line 1 is the header
        if not r.get("source"):
            raise TableError(f"{path}: line {line_no} has no source")
        for c in numeric:  # axes and values are interpolated in log space: finite and > 0
            try:
                x = float(r[c])
            except (TypeError, ValueError):
                raise TableError(f"{path}: not a {family} table (line {line_no}: {c} must be a number, "
                                 f"got {r[c]!r})") from None
            if not (math.isfinite(x) and x > 0):
                raise TableError(f"{path}: not a {family} table (line {line_no}: {c} must be a finite number > 0, "
                                 f"got {r[c]!r})")
    return with_optional_axes(family, rows)


def write_family(directory: Path, family: str, rows: list[dict]) -> None:
    keys, axes, values = FAMILIES[family]
    # a profile measured in rounds adds each row's rounds and their relative spread (information
    # for the reader; the model does not read them)
    extra = [c for c in ("samples", "spread") if any(c in r for r in rows)]
    cols = [*keys, *axes, *values, "source", *extra]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: _fmt(r[c]) if c not in extra or c in r else "" for c in cols})
    (directory / f"{family}.csv").write_text(buf.getvalue())


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def digest_of(directory: Path) -> tuple[str, dict[str, str]]:
    h = hashlib.sha256()
    files = {}
    for p in sorted(directory.glob("*.csv")):
        data = p.read_bytes()
        files[p.name] = hashlib.sha256(data).hexdigest()
        h.update(p.name.encode() + b"\0" + data + b"\0")
    return h.hexdigest(), files


def row_counts(directory: Path) -> dict[str, int]:
    """Data rows of each CSV (lines after the header): meta.json keeps them so that a file cut
    short after it was written is refused on load, not silently read as a smaller grid."""
    return {p.name: max(0, len(p.read_bytes().splitlines()) - 1) for p in sorted(directory.glob("*.csv"))}


def write_meta(directory: Path, kind: str, generator: str, notes: list[str],
               sources: dict[str, str] | None = None) -> str:
    digest, files = digest_of(directory)
    meta = {"kind": kind, "format": FORMAT_VERSION, "generator": generator, "notes": notes,
            "sources": sources or {}, "files": files, "rows": row_counts(directory), "digest": digest}
    (directory / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return digest


@dataclass
class Tables:
    """All families of one hardware kind. `digest` is the content hash reports quote."""
    kind: str
    directory: Path
    families: dict[str, GridTable]
    meta: dict

    @property
    def digest(self) -> str:
        return self.meta["digest"]

    def __getitem__(self, family: str) -> GridTable:
        return self.families[family]

    @classmethod
    def load(cls, directory: str | Path) -> "Tables":
        directory = Path(directory)
        if not directory.is_dir():
            hint = ""
            if directory.parent in (TABLE_ROOT, moetune_home() / "tables"):  # a kind with no tables yet
                hint = (f"; no tables for cluster kind {directory.name!r}: build them from its YAML with "
                        "`python -m cost_model.build_default_tables --kinds FILE.yaml --out $MOETUNE_HOME/tables` "
                        "or measure them with `moetune profile --cluster FILE.yaml`")
            raise TableError(f"{directory}: no such table directory{hint}")
        meta_path = directory / "meta.json"
        try:
            meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            raise TableError(f"{meta_path}: not a table meta.json ({e})") from None
        digest, files = digest_of(directory)
        recorded = meta.get("rows") if isinstance(meta.get("rows"), dict) else {}
        for name, n in row_counts(directory).items():
            want = recorded.get(name)
            if isinstance(want, int) and n < want:  # a truncated copy, or a write cut short
                raise TableError(f"{directory / name}: has {n} rows, its meta.json records {want} "
                                 "(cut short? re-run `moetune profile` or restore the file)")
        if meta.get("digest") not in (None, digest):
            meta = dict(meta, stale_digest=meta["digest"])  # edited by hand: quote the real hash
        meta["digest"] = digest
        fams = {}
        for fam in FAMILIES:
            p = directory / f"{fam}.csv"
            if not p.exists():
                raise TableError(f"{directory}: not a table directory (no {fam}.csv)")
            rows = read_rows(p, fam)
            try:
                fams[fam] = GridTable(fam, rows)
            except (ValueError, TypeError) as e:  # float("abc") in a value or axis column
                if isinstance(e, TableError):
                    raise TableError(f"{p}: {e}") from None
                raise TableError(f"{p}: not a {fam} table ({e})") from None
        return cls(meta.get("kind", directory.name), directory, fams, meta)


def measured_tables_dir(kind: str) -> Path:
    """Where `moetune profile --cluster <kind>` writes by default: $MOETUNE_HOME/tables/<kind>/."""
    return moetune_home() / "tables" / str(kind)


def tables_dir_for(kind: str) -> Path:
    """The lookup rule: measured tables ($MOETUNE_HOME/tables/<kind>/, when its meta.json exists)
    are preferred over the shipped defaults (clusters/tables/<kind>/). `--tables DIR` overrides both."""
    m = measured_tables_dir(kind)
    return m if (m / "meta.json").is_file() else TABLE_ROOT / str(kind)


_CACHE: dict[str, Tables] = {}


def load_tables(kind_or_dir: str | Path) -> Tables:
    """Tables for a cluster kind (clusters/tables/<kind>/) or an explicit directory; cached."""
    p = Path(kind_or_dir)
    directory = p if p.is_dir() else TABLE_ROOT / str(kind_or_dir)
    key = str(directory.resolve())
    digest, _ = digest_of(directory) if directory.is_dir() else (None, None)
    hit = _CACHE.get(key)
    if hit is not None and hit.digest == digest:
        return hit
    t = Tables.load(directory)
    _CACHE[key] = t
    return t
