"""Lookup tables in the file layout SGLang uses for its fused-MoE configurations.

Two kinds of table, both JSON objects keyed by M (tokens) and looked up at the nearest M, the rule
SGLang's `get_moe_configs` documents ("the closest batch size in the grid should be picked"):

* Weave tables: `(c*, K*, n_steal, predicted_ms)` per tokens-per-GPU, one file per
  (layer shape, EP size, routing skew, device), named
  `E={E},N={I},device_name={device},weave_ep={ep},skew={skew}.json`. A `_meta` entry records the
  hidden size, top-k and the curves (with sha256) they were computed from.
* Fused-MoE block configurations (`BLOCK_SIZE_M/N/K`, `GROUP_SIZE_M`, `num_warps`, `num_stages`)
  in exactly the format and directory SGLang 0.5.23 reads:
  `$SGLANG_MOE_CONFIG_DIR/configs/triton_<major>_<minor>_<patch>/E={E},N={N},device_name={device}.json`
  (`sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py`,
  `get_config_file_name` / `get_moe_configs`), N being the per-partition expert FFN width.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from kernels import store
from kernels.weave import Curves, LayerShape, moe_layer_time
from specs.errors import SpecError, UsageError

log = logging.getLogger(__name__)

# Tokens per GPU rows of a Weave table (prefill-sized batches, as the paper's 2k/4k/8k).
WEAVE_M_GRID = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# Batch sizes SGLang's tuning script sweeps for fused-MoE block configurations.
BLOCK_M_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)


def device_name(kind: str) -> str:
    """`torch.cuda.get_device_name()` with spaces as underscores (`clusters.torch_device_name`)."""
    from clusters import load_cluster, torch_device_name
    return torch_device_name(load_cluster(kind))


def weave_table_name(shape: LayerShape, ep: int, skew: float, device: str) -> str:
    return f"E={shape.num_experts},N={shape.inter},device_name={device},weave_ep={ep},skew={skew:g}.json"


def build_weave_table(shape: LayerShape, ep: int, skew: float, curves: Curves,
                      m_grid=WEAVE_M_GRID) -> dict:
    """One Weave table: {str(M): {"c", "K", "n_steal", "predicted_ms"}} plus `_meta`."""
    ms = np.asarray(m_grid, dtype=float)
    c, k, ns, t = moe_layer_time(shape, ms, ep, skew, curves)
    table = {str(int(m)): {"c": int(ci), "K": int(ki), "n_steal": int(ni), "predicted_ms": round(float(ti), 6)}
             for m, ci, ki, ni, ti in zip(ms, c, k, ns, t)}
    table["_meta"] = {"hidden": shape.hidden, "topk": shape.topk, "ep": ep, "skew": skew, "kind": curves.kind,
                      "curves": curves.params(), "curves_sha256": store.sha256_of(curves.to_dict())}
    return table


def write_weave_tables(kind: str, shapes, eps, skews, curves: Curves, out_dir: Path | None = None) -> list[Path]:
    """Regenerate the Weave tables of a kind for every (shape, ep, skew); returns the files written."""
    out = Path(out_dir) if out_dir else store.tables_dir(kind)
    dev = device_name(kind)
    written = []
    for shape in shapes:
        for ep in eps:
            if shape.num_experts % ep:
                continue
            for skew in skews:
                p = out / weave_table_name(shape, ep, skew, dev)
                store.write_atomic(p, json.dumps(build_weave_table(shape, ep, skew, curves), indent=1) + "\n")
                written.append(p)
    log.info("wrote %d Weave tables to %s", len(written), out)
    return written


def nearest(table: dict, m: float) -> dict:
    """The entry of the nearest M (SGLang's rule: min over keys of |key - M|)."""
    keys = [int(k) for k in table if not k.startswith("_")]
    if not keys:
        raise SpecError("empty table")
    return table[str(min(keys, key=lambda x: abs(x - m)))]


def read_table(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"cannot read table {path}: {e}") from None


def lookup_weave(kind: str, shape: LayerShape, ep: int, skew: float, tokens: float) -> dict | None:
    """The regenerated table entry for this layer, or None when no table is installed."""
    p = store.tables_dir(kind) / weave_table_name(shape, ep, skew, device_name(kind))
    if not p.is_file():
        return None
    return nearest(read_table(p), tokens)


# --------------------------------------------------------------------------------------------
# Fused-MoE block configurations (SGLang format)
# --------------------------------------------------------------------------------------------
BLOCK_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def sglang_config_file_name(num_experts: int, n: int, device: str) -> str:
    """`get_config_file_name(E, N, dtype=None)` of SGLang 0.5.23 (bf16: no dtype selector)."""
    return f"E={num_experts},N={n},device_name={device}.json"


def sglang_config_path(root: Path, num_experts: int, n: int, device: str, triton_version: str) -> Path:
    """Where SGLang reads a block table: <SGLANG_MOE_CONFIG_DIR>/configs/triton_X_Y_Z/<name>."""
    return Path(root) / "configs" / f"triton_{triton_version.replace('.', '_')}" / \
        sglang_config_file_name(num_experts, n, device)


def default_block_config(m: int, num_experts: int, topk: int) -> dict:
    """SGLang/vLLM's untuned default (`get_default_config`, bf16): small tiles while the
    average tokens per expert M*topk/E is small, 64x128x64 beyond."""
    if m * topk <= num_experts:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                "num_warps": 4, "num_stages": 3}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
            "num_warps": 4, "num_stages": 3}


def validate_block_table(table: dict) -> dict:
    """Check a block table and return it with int keys (as SGLang's loader does)."""
    out = {}
    for k, v in table.items():
        try:
            m = int(k)
        except ValueError:
            raise UsageError(f"block table key {k!r} is not a batch size M") from None
        missing = [x for x in BLOCK_KEYS if x not in v]
        if missing:
            raise UsageError(f"block config for M={m} lacks {', '.join(missing)}")
        out[m] = {x: int(v[x]) for x in BLOCK_KEYS}
    return out


def write_block_table(path: Path, table: dict) -> Path:
    table = validate_block_table(table)
    store.write_atomic(path, json.dumps({str(k): table[k] for k in sorted(table)}, indent=4) + "\n")
    return Path(path)


def block_config_for(table: dict | None, m: int, num_experts: int, topk: int) -> dict:
    """Block config for M tokens: nearest-M entry of a table, else the untuned default."""
    if not table:
        return default_block_config(m, num_experts, topk)
    t = {int(k): v for k, v in table.items()}
    return dict(t[min(t, key=lambda x: abs(x - m))])


def sglang_block_table_for(shape: LayerShape, kind: str, tp: int = 1, ep: int = 1,
                           triton_version: str | None = None) -> tuple[str, dict, str]:
    """The fused-MoE block table a serving plan should ship, for `moetune emit sglang`.

    Args:
        shape: the model's routed-expert shape.
        kind: hardware kind of the serving cluster.
        tp, ep: SGLang's tensor- and expert-parallel sizes (MoE TP = tp / ep splits the FFN width).
        triton_version: the serving stack's triton (default: the installed one).
    Returns:
        (path relative to SGLANG_MOE_CONFIG_DIR, table {M: config}, source): the table measured by
        `moetune kernels tune` on this kind when there is one for this shape, else SGLang's untuned
        default per M (which SGLang would use anyway: shipping it changes nothing but is explicit).
    """
    if ep < 1 or tp < 1 or tp % ep or shape.num_experts % ep:
        raise UsageError(f"tp {tp} / ep {ep} do not split {shape.num_experts} experts for SGLang")
    moe_tp = tp // ep
    if shape.inter % moe_tp:
        raise UsageError(f"MoE TP {moe_tp} does not divide the expert FFN width {shape.inter}")
    if triton_version is None:
        import triton
        triton_version = triton.__version__
    e_local, n = shape.num_experts // ep, shape.inter // moe_tp
    rel = sglang_config_path(Path("."), e_local, n, device_name(kind), triton_version)
    measured = store.kind_dir(kind) / "sglang" / rel
    if measured.is_file():
        return str(rel), validate_block_table(read_table(measured)), f"measured: {measured}"
    table = {m: default_block_config(m, e_local, shape.topk) for m in BLOCK_M_GRID}
    return str(rel), table, "SGLang's untuned default (no measured table for this shape and kind)"
