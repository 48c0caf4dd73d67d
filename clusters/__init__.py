"""Hardware catalog: one YAML per device kind in this folder, each value with its source.

`load_cluster(kind, gpus)` returns a `ClusterSpec` for N devices of that kind. Measured and
published performance tables live under `clusters/tables/<kind>/` (see `cost_model.tables`).
"""
from __future__ import annotations

import difflib
import hashlib
import json
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from specs.errors import SpecError
from specs.inputs import as_bool, as_float, as_int, as_str, load_yaml, safe_name
from specs.plan import PRECISIONS
from specs.serve_resolve import is_hopper as _hopper_by_name

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


# The fields of a cluster YAML and their checks (kind, device_name: names; the rest: numbers and flags).
_WHOLE = {"devices_per_node": 1, "sm_count": 1, "scaleup_domain": 1}  # field -> least value
_POSITIVE = ("hbm_gib", "hbm_tbps")  # physical sizes and rates that cannot be 0
_NON_NEGATIVE = ("nvlink_gbps", "scaleout_gbps", "pcie_gbps")  # 0 = that fabric is absent
_FLAGS = ("is_gpu", "fp8", "mxfp8", "detect_host")
_REQUIRED = ("kind", "device_name", "devices_per_node", "sm_count", "peak_tflops", "hbm_gib", "hbm_tbps",
             "scaleup_domain", "nvlink_gbps", "scaleout_gbps")


def _cluster_path(kind: str) -> Path:
    """A cluster YAML file given by path, or the catalog entry of a kind name."""
    path = Path(kind)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    if kind not in kind_names():  # only catalog names: "../x" must not reach a YAML elsewhere
        near = difflib.get_close_matches(kind, kind_names(), n=1, cutoff=0.5)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise SpecError(f"unknown cluster {kind!r}: {hint}choose one of {', '.join(kind_names())} or give a .yaml file")
    return CLUSTER_DIR / f"{kind}.yaml"


def _checked(values: dict, where: str) -> dict:
    """The cluster fields type- and range-checked: one SpecError naming the file and the field."""
    missing = [k for k in _REQUIRED if k not in values]
    if missing:
        raise SpecError(f"{where}: cluster file is missing field(s) {', '.join(missing)}")
    known = set(_REQUIRED) | set(_FLAGS) | {"pcie_gbps"}
    unknown = sorted(str(k) for k in set(values) - known)
    if unknown:
        raise SpecError(f"{where}: unknown cluster field(s) {', '.join(unknown)}")
    out = dict(values)
    out["kind"] = safe_name(values["kind"], "kind", where)
    out["device_name"] = as_str(values["device_name"], "device_name", where)
    for k, lo in _WHOLE.items():
        out[k] = as_int(values[k], k, where, lo=lo)
    for k in _POSITIVE:
        out[k] = as_float(values[k], k, where, lo=0.0, lo_open=True)
    for k in _NON_NEGATIVE:
        if k in values:
            out[k] = as_float(values[k], k, where, lo=0.0)
    for k in _FLAGS:
        if k in values:
            out[k] = as_bool(values[k], k, where)
    peaks = values["peak_tflops"]
    if not isinstance(peaks, dict) or not peaks:
        raise SpecError(f"{where}: peak_tflops must map dtypes to TFLOPS (e.g. bf16: 989), got {peaks!r}")
    out["peak_tflops"] = {as_str(dt, "peak_tflops dtype", where):
                          as_float(v, f"peak_tflops.{dt}", where, lo=0.0, lo_open=True) for dt, v in peaks.items()}
    return out


def load_cluster(kind: str, gpus: int | None = None) -> ClusterSpec:
    """The cluster of `gpus` devices (None: one node) of a catalog kind or a cluster YAML file.
    Every field is checked (types, finite and positive where physical); a bad file or name is one
    SpecError naming the file and the field."""
    path = _cluster_path(kind)
    raw = load_yaml(path, "cluster YAML")
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a cluster file must be a mapping of field: value, got {type(raw).__name__}")
    values, sources = {}, {}
    for k, v in raw.items():
        if k == "peak_tflops" and isinstance(v, dict):
            values[k], sources[k] = {}, {}
            for dt, e in v.items():
                values[k][dt], sources[k][dt] = _value(e)
        else:
            values[k], sources[k] = _value(v)
    values = _checked(values, str(path))
    _check_table_source(path, values)
    if kind == "cpu-local" or values.get("detect_host"):
        values = _detect_host(values)
    values.pop("detect_host", None)
    per_node = values["devices_per_node"]
    n = per_node if gpus is None else gpus
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n <= 0:
        raise SpecError(f"--gpus must be a positive number of devices, got {gpus}")
    if n > per_node and n % per_node:
        raise SpecError(f"--gpus {n} is not a whole number of {values['kind']} nodes "
                        f"({per_node} devices each)")
    values["num_devices"] = n = int(n)
    if n < per_node:
        values["devices_per_node"] = n
    return ClusterSpec(sources=sources, **values)


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
    """Hopper (sm90) GPUs (`specs.serve_resolve.is_hopper` on the device name): blockwise fp8 scaling
    is a Hopper recipe in TransformerEngine; SGLang's sm90 defaults."""
    return _hopper_by_name(cluster.device_name)


def is_blackwell(cluster) -> bool:
    """Blackwell (sm100) GPUs: B200/B300 and the GB200/GB300 racks (their collective latencies differ
    from Hopper's)."""
    return any(tag in cluster.device_name.upper() for tag in ("B200", "B300", "BLACKWELL"))


# What `torch.cuda.get_device_name()` reports on each kind, where it differs from the catalog's
# marketing name (SGLang and this project name per-device kernel tables by it, spaces as
# underscores): the names SGLang 0.5.23's shipped fused-MoE configs carry for these GPUs
# (srt/layers/moe/moe_runner/triton_utils/configs/*/E=...,device_name=<name>...json).
_TORCH_DEVICE_NAMES = {
    "a100-sxm-80g": "NVIDIA A100-SXM4-80GB", "h100-sxm": "NVIDIA H100 80GB HBM3", "h200-sxm": "NVIDIA H200",
    "h800-sxm": "NVIDIA H800", "h20": "NVIDIA H20", "b200": "NVIDIA B200", "b300": "NVIDIA B300 SXM6 AC",
    "gb200-nvl72": "NVIDIA GB200", "gb300-nvl72": "NVIDIA GB300", "rtx4090": "NVIDIA GeForce RTX 4090",
}


def torch_device_name(cluster) -> str:
    """`torch.cuda.get_device_name()` of a cluster's device with spaces as underscores (the key of
    SGLang's and our per-device kernel tables); a kind without a known one (a user's cluster file):
    its catalog name less the parenthesised form-factor note."""
    name = _TORCH_DEVICE_NAMES.get(cluster.kind) or cluster.device_name.split(" (")[0].strip()
    return name.replace(" ", "_")


def check_precision_name(precision: str) -> str:
    """`precision` when it names one (bf16, fp8 or a recipe), else the one-line error."""
    if precision != "fp8" and precision not in PRECISIONS:
        raise SpecError(f"unknown --precision {precision!r}: use fp8 or one of {', '.join(PRECISIONS)}")
    return precision


def precision_recipe(precision: str, cluster) -> str:
    """Map `--precision` (bf16 | fp8 | a recipe) to one recipe for this hardware."""
    if check_precision_name(precision) in PRECISIONS:
        return precision
    if precision == "fp8":
        if cluster.mxfp8:
            return "mxfp8"
        if cluster.fp8:
            return "fp8-blockwise" if is_hopper(cluster) else "fp8-tensorwise"
    raise SpecError(f"--precision fp8: {cluster.device_name} has no fp8 support")


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
    raw = load_yaml(shipped, "cluster YAML")
    base = {k: ({dt: _value(e)[0] for dt, e in v.items()} if k == "peak_tflops" else _value(v)[0])
            for k, v in raw.items()}
    def show(v):
        return f"{v:g}" if isinstance(v, float) else str(v)
    diff = [f"{k} {show(values.get(k))} (tables: {show(base.get(k))})" for k in TABLE_SOURCE_FIELDS
            if values.get(k) != base.get(k)]
    if diff:
        raise SpecError(f"{path}: kind {kind!r} but {'; '.join(diff)}: the shipped {kind} tables come from "
                        f"clusters/{kind}.yaml, so these numbers would be ignored. Give the file its own `kind:` "
                        f"and build its tables: python -m cost_model.build_default_tables --kinds {path} "
                        "--out $MOETUNE_HOME/tables (or measure them on that machine: moetune profile --cluster "
                        f"{path})")
