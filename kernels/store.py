"""Where kernels/ keeps user state: measured (c, K) grids with provenance, fitted curves and
regenerated tables, under $MOETUNE_HOME/kernels/<kind>/.

The home folder rule is `specs.home.moetune_home`, shared by every layer.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from specs.fileio import write_atomic as _write_atomic
from specs.home import moetune_home


def kind_dir(kind: str) -> Path:
    return moetune_home() / "kernels" / str(kind)


def grids_dir(kind: str) -> Path:
    return kind_dir(kind) / "grids"


def tables_dir(kind: str) -> Path:
    return kind_dir(kind) / "tables"


def fitted_curves_path(kind: str) -> Path:
    return kind_dir(kind) / "curves.json"


def sha256_of(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def save_grid(kind: str, case: dict, points: list, source: str) -> Path:
    """Keep one measured grid with its provenance (sha256 of the points, where they came from, when).

    Args:
        kind: hardware kind the grid was measured on.
        case: the workload: {"shape": {...}, "tokens": ..., "ep": ..., "skew": ...}.
        points: [{"c", "K", "ms"}, ...].
        source: what produced it (e.g. "moetune kernels tune on <host>", "stand-in timer").
    """
    d = {"kind": kind, "case": case, "points": points,
         "provenance": {"source": source, "sha256": sha256_of({"case": case, "points": points}),
                        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
    name = (f"E={case['shape']['num_experts']},N={case['shape']['inter']},T={int(case['tokens'])},"
            f"ep={case['ep']},skew={case['skew']:g}.json")
    path = grids_dir(kind) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, json.dumps(d, indent=1) + "\n")
    return path


def load_grids(kind: str) -> list[dict]:
    """Every measured grid kept for a kind (checked against its sha256)."""
    out = []
    for p in sorted(grids_dir(kind).glob("*.json")):
        d = json.loads(p.read_text())
        ok = sha256_of({"case": d["case"], "points": d["points"]}) == d["provenance"]["sha256"]
        d["path"] = str(p)
        d["intact"] = ok
        out.append(d)
    return out


def write_atomic(path, text: str) -> None:
    """Re-exported so table writers in kernels/ share one atomic writer."""
    _write_atomic(path, text)
