"""Real serving trials with SGLang (GPU only): `SglangBackend(model=spec).run(plan, workload, resources)`.

One trial = model directory (config.json from the ModelSpec + offline tokenizer; `--load-format
dummy`) -> `python -m sglang.launch_server` in its own process group -> wait for /health ->
`python -m sglang.bench_serving` (random dataset, `--tokenize-prompt`: token ids, exact lengths;
`--random-range-ratio 1`: fixed isl/osl) at the workload's concurrency with JSON-lines output ->
parse it into a ServeMeasurement -> the server's group is always terminated and reaped.

SGLang 0.5.23 has no CPU kernels on PyPI (sglang-kernel needs libcuda), so on this host the
lifecycle is tested against a fake server and a fake bench module (tests/serving_fake/), passed
as `server_module` / `bench_module`; the real run is a step of bench/gpu_check.sh.

Failures as in trials/serving/vllm_backend.py: "unrealizable" (more GPUs than visible, disaggregated
plans), "stack-rejected" (SGLang's argument checks refused it), "oom", "crash", "timeout"; a
benchmark that exits non-zero or writes no JSON is a "crash" with its output tail.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specs.model_spec import ModelSpec
from specs.serve_plan import ServePlan, ServeWorkload
from trials.base import Failure, Resources, TrialBackend
from trials.processes import free_port
from trials.serving.model_dir import serve_model, write_model_dir
from trials.serving.result import ServeMeasurement, bench_serving_to_seconds, from_bench
from trials.serving.server import ServerProcess, tail


def sglang_flags(plan: ServePlan) -> list[str]:
    """SGLang 0.5.23 server flags that carry one instance's plan (no model path, no node layout); the
    one spelling of `moetune emit sglang` and of this backend, checked by SGLang's own resolver in
    tests/test_serve_oracle.py (--attn-dp-size, --cuda-graph-max-bs-decode, --disable-decode-cuda-graph)."""
    p = plan
    a = ["--tp-size", str(p.tp)]
    if p.pp > 1:
        a += ["--pp-size", str(p.pp)]
    if p.dp > 1 and not p.pd:
        a += ["--dp-size", str(p.dp)]
    if p.attn_dp > 1:
        a += ["--attn-dp-size", str(p.attn_dp)]
    if p.ep > 1:
        a += ["--ep-size", str(p.ep)]
    if p.moe_dense_tp:
        a += ["--moe-dense-tp-size", str(p.moe_dense_tp)]
    if p.a2a != "none":
        a += ["--moe-a2a-backend", p.a2a]
        if p.a2a == "deepep":
            a += ["--deepep-mode", p.deepep_mode]
    if p.tbo:
        a += ["--enable-two-batch-overlap"]
    if p.eplb_redundant:
        a += ["--enable-eplb", "--ep-num-redundant-experts", str(p.eplb_redundant)]
    if p.chunked_prefill:
        a += ["--chunked-prefill-size", str(p.chunked_prefill)]
    if p.max_running:
        a += ["--max-running-requests", str(p.max_running)]
    if p.cuda_graph_max_bs == -1:
        a += ["--disable-decode-cuda-graph"]
    elif p.cuda_graph_max_bs:
        a += ["--cuda-graph-max-bs-decode", str(p.cuda_graph_max_bs)]
    if p.mem_frac:
        a += ["--mem-fraction-static", f"{p.mem_frac:g}"]
    if p.page_size != 1:
        a += ["--page-size", str(p.page_size)]
    if p.kv_cache_dtype != "auto":
        a += ["--kv-cache-dtype", p.kv_cache_dtype]
    return a


def bench_argv(module: str, *, port: int, model_dir: str, isl: int, osl: int, num_prompts: int, concurrency: int,
               request_rate: float, out_file: str, seed: int = 0, warmup: int = 1) -> list[str]:
    return ["-m", module, "--backend", "sglang", "--host", "127.0.0.1", "--port", str(port),
            "--model", model_dir, "--tokenizer", model_dir, "--dataset-name", "random",
            "--random-input-len", str(isl), "--random-output-len", str(osl), "--random-range-ratio", "1",
            "--tokenize-prompt", "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
            "--request-rate", f"{request_rate:g}" if request_rate > 0 else "inf",
            "--warmup-requests", str(warmup), "--seed", str(seed), "--output-file", out_file, "--disable-tqdm"]


def _cuda_devices() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no usable torch: no GPUs
        return 0


class SglangBackend(TrialBackend):
    name = "sglang"

    def __init__(self, *, model: ModelSpec | None = None, server_module: str = "sglang.launch_server",
                 bench_module: str = "sglang.bench_serving", require_gpu: bool = True, keep_dir: bool = False,
                 python: str | None = None, extra_args: list[str] | None = None, env: dict | None = None):
        """server_module / bench_module: what `python -m` runs (tests pass fakes); require_gpu: refuse
        (unrealizable) when fewer GPUs are visible than the plan needs (tests with fakes pass False)."""
        if model is None:
            from specs.models import load_model
            model = load_model("tiny-moe")
        # tiny-moe's 16-wide heads are below what the attention kernels take: serve its widened twin
        self.model, self.server_module, self.bench_module = serve_model(model), server_module, bench_module
        self.require_gpu, self.keep_dir = require_gpu, keep_dir
        self.python, self.extra_args, self.env = python or sys.executable, list(extra_args or []), dict(env or {})
        self.last_dir: str | None = None

    def run(self, plan, workload: ServeWorkload, resources: Resources, *, iters: int = 1,
            warmup: int = 1) -> ServeMeasurement | Failure:
        plan = plan if isinstance(plan, ServePlan) else ServePlan.parse(str(plan))
        plan_s = plan.canonical()
        fail = lambda kind, msg: Failure(plan=plan_s, kind=kind, message=msg, backend=self.name)
        if plan.pd:
            return fail("unrealizable", "disaggregated prefill/decode plans need a router and several servers; "
                                        "a trial serves one instance")
        if plan.gpus > resources.devices:
            return fail("unrealizable", f"plan needs {plan.gpus} GPUs, the trial has {resources.devices}")
        if self.require_gpu and plan.gpus > _cuda_devices():
            return fail("unrealizable", f"plan needs {plan.gpus} GPUs, {_cuda_devices()} visible "
                                        "(SGLang 0.5.23 has no CPU kernels on PyPI)")
        tmp = tempfile.TemporaryDirectory(prefix="moetune-serve-")
        d = Path(tmp.name)
        self.last_dir = str(d)
        try:
            return self._run(plan, plan_s, workload, resources, iters, warmup, d, fail)
        finally:
            if self.keep_dir:
                tmp._finalizer.detach()
            else:
                tmp.cleanup()

    def _run(self, plan, plan_s, workload, resources, iters, warmup, d: Path, fail):
        deadline = time.monotonic() + resources.timeout_s
        model_dir = str(write_model_dir(self.model, d / "model"))
        port = free_port()
        argv = [self.python, "-m", self.server_module, "--model-path", model_dir, "--load-format", "dummy",
                "--host", "127.0.0.1", "--port", str(port), "--served-model-name", self.model.name,
                "--context-length", str(max(workload.isl + workload.osl + 16, 256)), *sglang_flags(plan),
                *self.extra_args]
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1", **self.env}
        (d / "command.txt").write_text(" ".join(argv) + "\n")
        concurrency = workload.concurrency or 1
        out_file = d / "bench.jsonl"
        with ServerProcess(argv, d / "server.log", env=env, cwd=str(d)) as server:
            err = server.wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=resources.timeout_s)
            startup_s = time.monotonic() - server.started_at
            if err:
                return fail(*err)
            bargv = [self.python, *bench_argv(self.bench_module, port=port, model_dir=model_dir, isl=workload.isl,
                                              osl=workload.osl, num_prompts=concurrency * iters,
                                              concurrency=concurrency, request_rate=workload.request_rate,
                                              out_file=str(out_file), warmup=warmup * concurrency)]
            (d / "bench_command.txt").write_text(" ".join(bargv) + "\n")
            with open(d / "bench.log", "wb") as log:
                try:
                    # its own session, so a timeout kills the benchmark's children too
                    bench = subprocess.Popen(bargv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(d),
                                             start_new_session=True)
                    rc = bench.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(bench.pid, 9)
                    bench.wait()
                    return fail("timeout", f"benchmark exceeded the trial's {resources.timeout_s:g} s")
            died = server.died()
            if died:
                return fail(*died)
            if rc != 0 or not out_file.exists():
                return fail("crash", f"bench_serving exited with code {rc}: "
                                     f"{tail(d / 'bench.log', 800).strip()[-400:]}")
            try:
                lines = [ln for ln in out_file.read_text().splitlines() if ln.strip()]
                raw = json.loads(lines[-1])
                summary = bench_serving_to_seconds(raw)
            except (ValueError, KeyError, IndexError) as e:
                return fail("crash", f"unreadable bench_serving output {out_file.name}: {e}")
            if summary["completed"] == 0:
                return fail("crash", "bench_serving completed no request")
        versions = {"sglang": _version("sglang"), "model": self.model.name, "server_module": self.server_module,
                    "bench_module": self.bench_module}
        return from_bench(plan_s, plan.gpus, startup_s, summary, backend=self.name, versions=versions)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return ""
