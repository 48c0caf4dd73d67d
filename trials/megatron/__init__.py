"""Megatron-core trial backend: real training steps (CPU + gloo here, GPU + NCCL unmodified).

`MegatronBackend` / `run_trial` (backend.py) launch one worker process per rank (worker.py);
`cpu_compat` patches megatron-core's CUDA-only calls on CPU; what cannot run on CPU with this stack
is listed in `specs.cpu_support` (the stack profile reads it, so the plan space agrees).
"""
from trials.megatron.backend import MegatronBackend, run_trial  # noqa: F401
