"""The vLLM launch command of a serving plan (`moetune emit vllm`).

Flags come from `trials.serving.vllm_args` (the same mapping the vLLM trial backend launches
with), so the emitted command is the one a trial runs. A plan vLLM cannot express comes back as
its reasons instead (the caller exits 2).
"""
from __future__ import annotations

import shlex

from specs.serve_plan import ServePlan
from trials.serving.vllm_args import VLLM_SERVER_MODULE, vllm_flags, vllm_reasons
from tuner.space.serve_precision import KV_CACHE_FLAG


def vllm_command(plan: ServePlan, model_path: str, *, served_name: str, port: int = 8000,
                 max_model_len: int | None = None, dummy: bool = False, cpu: bool = False,
                 host: str = "0.0.0.0", quantization: str | None = None) -> tuple[str | None, list[tuple[str, str]]]:
    """(command line, []) or (None, reasons). `quantization`: the weight format the plan was priced
    with (None = the checkpoint's bf16); the KV cache as priced (auto, tuner.space.serve_precision)."""
    why = vllm_reasons(plan, cpu=cpu)
    if why:
        return None, why
    argv = ["python", "-m", VLLM_SERVER_MODULE, "--model", model_path, "--served-model-name", served_name,
            "--host", host, "--port", str(port)]
    if dummy:
        argv += ["--load-format", "dummy"]
    if quantization:
        argv += ["--quantization", quantization]
    if not cpu:
        argv += ["--kv-cache-dtype", KV_CACHE_FLAG]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    argv += vllm_flags(plan, cpu=cpu)
    env = "VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind " if cpu else ""
    return env + shlex.join(argv), []


def bench_command(served_name: str, model_path: str, isl: int, osl: int, concurrency: int, port: int = 8000) -> str:
    """The `vllm bench serve` run that measures what the header predicts: random prompts of exactly
    isl / osl tokens, `concurrency` in flight, 4x as many prompts (at least 64), p90 reported."""
    argv = ["vllm", "bench", "serve", "--backend", "vllm", "--host", "127.0.0.1", "--port", str(port),
            "--model", served_name, "--tokenizer", model_path, "--dataset-name", "random",
            "--random-input-len", str(isl), "--random-output-len", str(osl),
            "--num-prompts", str(max(4 * concurrency, 64)), "--max-concurrency", str(concurrency),
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,90,99"]
    return shlex.join(argv)
