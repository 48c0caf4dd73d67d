"""The vLLM launch command of a serving plan (`moetune emit vllm`).

Flags come from `trials.serving.vllm_args` (the same mapping the vLLM trial backend launches
with), so the emitted command is the one a trial runs. A plan vLLM cannot express comes back as
its reasons instead (the caller exits 2).
"""
from __future__ import annotations

import shlex

from specs.serve_plan import ServePlan
from trials.serving.vllm_args import VLLM_SERVER_MODULE, vllm_flags, vllm_reasons


def vllm_command(plan: ServePlan, model_path: str, *, served_name: str, port: int = 8000,
                 max_model_len: int | None = None, dummy: bool = False, cpu: bool = False,
                 host: str = "0.0.0.0") -> tuple[str | None, list[tuple[str, str]]]:
    """(command line, []) or (None, reasons)."""
    why = vllm_reasons(plan, cpu=cpu)
    if why:
        return None, why
    argv = ["python", "-m", VLLM_SERVER_MODULE, "--model", model_path, "--served-model-name", served_name,
            "--host", host, "--port", str(port)]
    if dummy:
        argv += ["--load-format", "dummy"]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    argv += vllm_flags(plan, cpu=cpu)
    env = "VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind " if cpu else ""
    return env + shlex.join(argv), []
