"""How a model's published checkpoint stores its weights: the `quantization_config` of its
Hugging Face config.json, for serving (SGLang and vLLM read the same block and load the weights
in that format unless told otherwise).

`checkpoint_quantization(ref)` reads it from a config.json (file or directory) and, for a preset,
from `PUBLISHED` (the block of the preset's source config.json, copied here with that source).
Training is not concerned: Megatron trains from bf16 master weights whatever the checkpoint holds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Quantization:
    method: str   # quant_method as the config writes it: "fp8", "mxfp4", ... ("" = none: bf16 weights)
    detail: str   # e.g. "e4m3, weight_block_size [128, 128]"
    source: str   # where it was read


# quantization_config of the presets' published checkpoints (the config.json each preset names as
# its source). Presets absent here publish bf16 weights (no quantization_config).
PUBLISHED = {
    "deepseek-v3": Quantization("fp8", "e4m3, dynamic activations, weight_block_size [128, 128]",
                                "huggingface.co/deepseek-ai/DeepSeek-V3 config.json quantization_config "
                                "(README_WEIGHTS.md: FP8 weights)"),
    "deepseek-r1": Quantization("fp8", "e4m3, dynamic activations, weight_block_size [128, 128]",
                                "huggingface.co/deepseek-ai/DeepSeek-R1 config.json quantization_config"),
    "kimi-k2": Quantization("fp8", "e4m3, dynamic activations, weight_block_size [128, 128]",
                            "huggingface.co/moonshotai/Kimi-K2-Instruct config.json quantization_config"),
    "gpt-oss-120b": Quantization("mxfp4", "MoE expert weights in MXFP4, the rest bf16",
                                 "huggingface.co/openai/gpt-oss-120b config.json quantization_config"),
    "gpt-oss-20b": Quantization("mxfp4", "MoE expert weights in MXFP4, the rest bf16",
                                "huggingface.co/openai/gpt-oss-20b config.json quantization_config"),
}


def _from_config(path: Path) -> Quantization | None:
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # the model loader reports a malformed file; here it only means "unknown"
    q = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if not isinstance(q, dict) or not q.get("quant_method"):
        return None
    parts = [str(q[k]) for k in ("fmt", "activation_scheme", "quant_algo") if q.get(k)]
    if q.get("weight_block_size"):
        parts.append(f"weight_block_size {q['weight_block_size']}")
    method = str(q["quant_method"])
    # NVIDIA ModelOpt exports write quant_method "modelopt" and the format in quant_algo (NVFP4,
    # FP8): the name SGLang's --quantization gives each (modelopt_fp4 / fp8)
    algo = str(q.get("quant_algo") or "").upper()
    if method == "modelopt" and "FP4" in algo:
        method = "modelopt_fp4"
    elif method == "modelopt" and algo.startswith("FP8"):
        method = "fp8"
    return Quantization(method, ", ".join(parts), f"{path} quantization_config")


def checkpoint_quantization(ref: str, model_name: str = "") -> Quantization | None:
    """The checkpoint's weight quantization for a model reference (a config.json, a directory
    holding one, or a preset name), or None when it stores bf16 weights or is not known."""
    from specs.models import resolve_model_ref
    path = Path(resolve_model_ref(ref))
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.exists():
        return _from_config(path)
    return PUBLISHED.get(model_name or ref)
