"""Hardware catalog: one YAML per device kind in this folder, each value with its source.

`load_cluster(kind, gpus)` returns a `ClusterSpec` for N devices of that kind. Measured and
published performance tables live under `clusters/tables/<kind>/` (see `cost_model.tables`).
"""
from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from specs.errors import SpecError
from specs.plan import PRECISIONS

CLUSTER_DIR = Path(__file__).parent
TABLES_ROOT = CLUSTER_DIR / "tables"  # shipped performance tables, one folder per kind


@dataclass(frozen=True)
class ClusterSpec:
    kind: str
    device_name: str
    num_devices: int
    devices_per_node: int
    sm_count: int
    peak_tflops: dict  # dtype -> dense peak TFLOPS per device (bf16, fp8, fp4, fp32 ...)
    hbm_gib: float
    hbm_tbps: float
    scaleup_domain: int  # devices sharing the NVLink (or equivalent) domain
    nvlink_gbps: float  # per-device unidirectional scale-up GB/s (0 = none, e.g. PCIe only)
    scaleout_gbps: float  # per-device scale-out Gb/s (network)
    pcie_gbps: float = 0.0  # per-device PCIe GB/s unidirectional, used where no NVLink
    is_gpu: bool = True
    fp8: bool = False  # has fp8 tensor cores (tensorwise/delayed/blockwise recipes)
    mxfp8: bool = False  # has microscaling fp8 (Blackwell)
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_devices // self.devices_per_node)

    @property
    def scaleup_size(self) -> int:
        """Devices reachable over the scale-up fabric from one device in this cluster."""
        return min(self.scaleup_domain, self.num_devices)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "sources"}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def tables_dir(kind: str) -> Path:
    """Where the shipped performance tables of a hardware kind live (`clusters/tables/<kind>/`)."""
    return TABLES_ROOT / kind


def kind_names() -> list[str]:
    return sorted(p.stem for p in CLUSTER_DIR.glob("*.yaml"))


def _value(entry):
    """YAML entries are either plain values or {value: ..., source: ...}."""
    if isinstance(entry, dict) and "value" in entry:
        return entry["value"], entry.get("source", "")
    return entry, ""


def load_cluster(kind: str, gpus: int | None = None) -> ClusterSpec:
    path = Path(kind)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = CLUSTER_DIR / f"{kind}.yaml"
    if not path.exists():
        near = difflib.get_close_matches(kind, kind_names(), n=1, cutoff=0.5)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise SpecError(f"unknown cluster {kind!r}: {hint}choose one of {', '.join(kind_names())}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError(f"malformed YAML in {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"malformed cluster file {path}: expected a mapping")
    values, sources = {}, {}
    for k, v in raw.items():
        if k == "peak_tflops":
            values[k], sources[k] = {}, {}
            for dt, e in v.items():
                values[k][dt], sources[k][dt] = _value(e)
        else:
            values[k], sources[k] = _value(v)
    _check_table_source(path, values)
    if kind == "cpu-local" or values.get("detect_host"):
        values = _detect_host(values)
    values.pop("detect_host", None)
    per_node = int(values["devices_per_node"])
    n = per_node if gpus is None else int(gpus)
    if n <= 0:
        raise SpecError(f"--gpus must be a positive number of devices, got {gpus}")
    if n > per_node and n % per_node:
        raise SpecError(f"--gpus {n} is not a whole number of {values['kind']} nodes "
                        f"({per_node} devices each)")
    values["num_devices"] = n
    if n < per_node:
        values["devices_per_node"] = n
    try:
        return ClusterSpec(sources=sources, **values)
    except TypeError as e:
        raise SpecError(f"bad cluster file {path}: {e}") from None


# The numbers the shipped tables of a kind are built from (cost_model/build_default_tables.py reads
# them from clusters/<kind>.yaml); hbm_gib is not one: the memory model reads it from the YAML.
TABLE_SOURCE_FIELDS = ("peak_tflops", "hbm_tbps", "sm_count", "nvlink_gbps", "scaleout_gbps", "pcie_gbps")


def _check_table_source(path: Path, values: dict) -> None:
    """A cluster file that names a catalog kind but changes a number that kind's tables were built
    from would be priced with the catalog's tables, silently: refuse it, saying how to give it its
    own tables."""
    kind = values.get("kind")
    shipped = CLUSTER_DIR / f"{kind}.yaml"
    if not shipped.exists() or path.resolve() == shipped.resolve():
        return
    raw = yaml.safe_load(shipped.read_text())
    base = {k: ({dt: _value(e)[0] for dt, e in v.items()} if k == "peak_tflops" else _value(v)[0])
            for k, v in raw.items()}
    diff = [f"{k} {values.get(k)} (tables: {base.get(k)})" for k in TABLE_SOURCE_FIELDS
            if values.get(k) != base.get(k)]
    if diff:
        raise SpecError(f"{path}: kind {kind!r} but {'; '.join(diff)}: the shipped {kind} tables come from "
                        f"clusters/{kind}.yaml, so these numbers would be ignored. Give the file its own `kind:` "
                        f"and build its tables: python -m cost_model.build_default_tables --kinds {path} "
                        "--out $MOETUNE_HOME/tables (or measure them on that machine: moetune profile --cluster "
                        f"{path})")


def _detect_host(values: dict) -> dict:
    """cpu-local: one device per core of this host."""
    import os
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    values = dict(values)
    values["devices_per_node"] = cores
    values["scaleup_domain"] = cores
    return values


# Hardware facts the plan space and realizability read from a ClusterSpec.
def is_hopper(cluster) -> bool:
    """Blockwise fp8 scaling is a Hopper (sm90) recipe in TransformerEngine."""
    return any(tag in cluster.device_name.upper() for tag in ("H100", "H200", "H800", "H20", "GH200"))


def precision_recipe(precision: str, cluster) -> str:
    """Map `--precision` (bf16 | fp8 | a recipe) to one recipe for this hardware."""
    if precision in PRECISIONS:
        return precision
    if precision == "fp8":
        if cluster.mxfp8:
            return "mxfp8"
        if cluster.fp8:
            return "fp8-blockwise" if is_hopper(cluster) else "fp8-tensorwise"
        raise SpecError(f"--precision fp8: {cluster.device_name} has no fp8 support")
    raise SpecError(f"unknown --precision {precision!r}: use bf16, fp8 or one of {', '.join(PRECISIONS)}")
