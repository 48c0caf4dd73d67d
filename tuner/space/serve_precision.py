"""Serving precision as its own noun: the weight format a server loads and the cost model prices.

`resolve(args, model)` decides it once for every serving command (predict --mode serve, emit
sglang / vllm): `--weight-dtype bf16|fp8` when given; else the checkpoint's own
`quantization_config` (specs.quantization: a config.json's block, or the published one of a
preset); else `--precision` (fp8 there means fp8 weights quantized online by the server). The
serving cost model prices weights at 1 byte (fp8) or 2 (bf16); an MXFP4 checkpoint is priced at
1 byte, an upper bound on its weight memory, and says so. The KV cache is priced at 2 bytes
(bf16), which is what `--kv-cache-dtype auto` gives for these checkpoints.
"""
from __future__ import annotations

from specs.quantization import checkpoint_quantization

WEIGHT_DTYPES = ("auto", "bf16", "fp8")
KV_CACHE_FLAG = "auto"  # the server's default: the model's activation dtype (bf16), as priced


def resolve(args, model) -> dict:
    """{dtype, precision (what the serving cost model prices), quantization (the server's
    --quantization value, or None), source (one phrase)}."""
    flag = getattr(args, "weight_dtype", "auto") or "auto"
    if flag == "fp8":
        return {"dtype": "fp8", "precision": "fp8", "quantization": "fp8", "source": "--weight-dtype fp8"}
    if flag == "bf16":
        return {"dtype": "bf16", "precision": "bf16", "quantization": None, "source": "--weight-dtype bf16"}
    q = checkpoint_quantization(args.model, model.name)
    if q is not None and q.method.startswith("fp8"):
        return {"dtype": "fp8", "precision": "fp8", "quantization": "fp8",
                "source": f"checkpoint quantization_config: {q.method} ({q.detail}), from {q.source}"}
    if q is not None:
        return {"dtype": q.method, "precision": "fp8", "quantization": q.method,
                "source": f"checkpoint quantization_config: {q.method} ({q.detail}), from {q.source}; priced at "
                          "1 byte per weight (the serving model has no sub-byte price: an upper bound)"}
    precision = getattr(args, "precision", "bf16") or "bf16"
    if precision.startswith(("fp8", "mxfp8")):
        return {"dtype": "fp8", "precision": "fp8", "quantization": "fp8",
                "source": f"--precision {precision}: bf16 checkpoint quantized to fp8 by the server"}
    return {"dtype": "bf16", "precision": "bf16", "quantization": None,
            "source": "bf16 checkpoint (no quantization_config)"}
