"""Real runs of a plan: trial backends behind one interface, and the microbenchmark runners.

Public vocabulary: `TrialBackend` (`run(plan, workload, resources) -> Measurement | Failure`),
`Measurement`, `Failure`, `Resources`, and the registry `get_backend(name, **options)` /
`backend_names()`. A backend registers itself by name in `_REGISTRY` below (the module path only,
so importing `trials` stays cheap: torch and megatron load when a backend is built).
"""
from __future__ import annotations

import importlib

from specs.errors import InputError
from trials.base import FAILURE_KINDS, Failure, Measurement, Resources, TrialBackend

# name -> "module:Class"
_REGISTRY: dict[str, str] = {
    "megatron": "trials.megatron.backend:MegatronBackend",
    "sglang": "trials.serving.sglang_backend:SglangBackend",
    "vllm": "trials.serving.vllm_backend:VllmBackend",
}


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str, **options) -> TrialBackend:
    """The trial backend registered as `name`, built with `options` (backend-specific keywords)."""
    if name not in _REGISTRY:
        raise InputError(f"unknown trial backend {name!r}: choose {', '.join(backend_names())}")
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)


__all__ = ["FAILURE_KINDS", "Failure", "Measurement", "Resources", "TrialBackend", "backend_names", "get_backend"]
