"""Serving precision as its own noun: the weight format a server loads and the cost model prices.

`resolve(args, model, cluster)` decides it once for every serving command (predict --mode serve, emit
sglang / vllm): `--weight-dtype bf16|fp8` when given; else the checkpoint's own
`quantization_config` (specs.quantization: a config.json's block, or the published one of a
preset); else `--precision` (fp8 there means fp8 weights quantized online by the server). The
serving cost model prices each format's bytes per weight (cost_model.serving.constants
WEIGHT_FORMAT_BYTES: bf16 2, fp8 1, gpt-oss's MXFP4 experts 4.25 bits with bf16 attention, NVIDIA's
NVFP4 checkpoints 4.5 bits), its GEMMs at the rates SGLang's kernels for the format reach
(`cost_model.serving.step.StepModel.for_precision`). The KV cache
is priced at the plan's kv_cache_dtype.
"""
from __future__ import annotations

from clusters import check_precision_name, is_blackwell
from specs.errors import UsageError
from specs.quantization import checkpoint_quantization

WEIGHT_DTYPES = ("auto", "bf16", "fp8", "nvfp4")
# quant_method values of a config.json / hf_quant_config that mean NVIDIA's NVFP4 (ModelOpt)
NVFP4_METHODS = ("modelopt_fp4", "nvfp4")
KV_CACHE_FLAG = "auto"  # the server's default: the model's activation dtype (bf16), as priced


def resolve(args, model, cluster) -> dict:
    """{dtype, precision (what the serving cost model prices), quantization (the server's
    --quantization value, or None), source (one phrase)} on `cluster`: NVFP4 weights on a GPU
    without Blackwell's FP4 kernels are refused (SGLang's modelopt_fp4 kernels are SM100 ones).
    `--precision` is checked by name even where the checkpoint's own format wins: a misspelt value
    is an error, not silently ignored."""
    check_precision_name(getattr(args, "precision", "bf16") or "bf16")
    out = _resolve(args, model)
    if out["dtype"] == "nvfp4" and cluster.is_gpu and not is_blackwell(cluster):
        raise UsageError(f"NVFP4 weights need Blackwell GPUs (SGLang's modelopt_fp4 kernels); {cluster.kind} "
                         "has none: use the fp8 checkpoint (--weight-dtype fp8)")
    return out


def _resolve(args, model) -> dict:
    flag = getattr(args, "weight_dtype", "auto") or "auto"
    if flag == "fp8":
        return {"dtype": "fp8", "precision": "fp8", "quantization": "fp8", "source": "--weight-dtype fp8"}
    if flag == "bf16":
        return {"dtype": "bf16", "precision": "bf16", "quantization": None, "source": "--weight-dtype bf16"}
    if flag == "nvfp4":
        return {"dtype": "nvfp4", "precision": "nvfp4", "quantization": "modelopt_fp4",
                "source": "--weight-dtype nvfp4 (an NVFP4 checkpoint such as nvidia/DeepSeek-R1-0528-FP4)"}
    q = checkpoint_quantization(args.model, model.name)
    if q is not None and q.method.startswith("fp8"):
        return {"dtype": "fp8", "precision": "fp8", "quantization": "fp8",
                "source": f"checkpoint quantization_config: {q.method} ({q.detail}), from {q.source}"}
    if q is not None and q.method == "mxfp4":
        return {"dtype": "mxfp4", "precision": "mxfp4", "quantization": "mxfp4",
                "source": f"checkpoint quantization_config: {q.method} ({q.detail}), from {q.source}"}
    if q is not None and q.method in NVFP4_METHODS:
        return {"dtype": "nvfp4", "precision": "nvfp4", "quantization": "modelopt_fp4",
                "source": f"checkpoint quantization_config: {q.method} ({q.detail}), from {q.source}"}
    if q is not None:
        return {"dtype": q.method, "precision": "fp8", "quantization": q.method,
                "source": f"checkpoint quantization_config: {q.method} ({q.detail}), from {q.source}; priced at "
                          "1 byte per weight (a format the serving model does not know: an upper bound)"}
    precision = getattr(args, "precision", "bf16") or "bf16"
    if precision.startswith(("fp8", "mxfp8")):
        return {"dtype": "fp8", "precision": "fp8", "quantization": "fp8",
                "source": f"--precision {precision}: bf16 checkpoint quantized to fp8 by the server"}
    return {"dtype": "bf16", "precision": "bf16", "quantization": None,
            "source": "bf16 checkpoint (no quantization_config)"}
