"""Megatron-core trial backend: real training steps (CPU + gloo here, GPU + NCCL unmodified).

`MegatronBackend` / `run_trial` (backend.py) launch one worker process per rank (worker.py);
`cpu_compat` patches megatron-core's CUDA-only calls on CPU; `cpu_support` lists what cannot run
on CPU with this stack (imported by the realizability checks).
"""
from trials.megatron.backend import MegatronBackend, run_trial  # noqa: F401
