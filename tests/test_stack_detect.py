"""Stack profiles: what `detect_installed` finds, the profile built from it, `auto` for planning,
gpu-plain's limits, and the launch environment / fp8 table shared with the emitted script."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clusters import load_cluster
from specs.models import load_model
from specs.plan import Plan
from specs.stack import (
    FP8_RECIPES,
    GPU_FULL,
    GPU_NO_TE,
    Installed,
    detect_installed,
    launch_env,
    profile_for,
    profile_from_installed,
)
from specs.workload import Workload

REPO = Path(__file__).resolve().parents[1]


def _py(code: str, extra_path: str | None = None) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, str(REPO), env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                       text=True, timeout=120, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_specs_stack_does_not_import_torch():
    assert _py("import sys, specs.stack; print('torch' in sys.modules)") == "False"


def test_detect_installed_matches_this_machine():
    inst = detect_installed()
    has = lambda m: importlib.util.find_spec(m) is not None  # noqa: E731
    expect_mc = importlib.metadata.version("megatron-core") if has("megatron") else ""
    assert inst.megatron_core == expect_mc
    assert bool(inst.transformer_engine) == has("transformer_engine")
    assert inst.deepep == has("deep_ep") and inst.grouped_gemm == has("grouped_gemm") and inst.apex == has("apex")
    torch = pytest.importorskip("torch")
    assert inst.cuda == torch.cuda.is_available()
    assert inst.devices == (torch.cuda.device_count() if inst.cuda else 0)


def test_detect_installed_finds_packages_on_the_path(tmp_path):
    """Real detection (find_spec, distribution metadata, the HybridEPBuffer name megatron's
    fused_a2a imports) over stand-in packages put on the path of a fresh interpreter."""
    (tmp_path / "grouped_gemm").mkdir()
    (tmp_path / "grouped_gemm" / "__init__.py").write_text("")
    (tmp_path / "deep_ep").mkdir()
    (tmp_path / "deep_ep" / "__init__.py").write_text("class Buffer: pass\nclass HybridEPBuffer: pass\n")
    (tmp_path / "transformer_engine").mkdir()
    (tmp_path / "transformer_engine" / "__init__.py").write_text("")
    dist = tmp_path / "transformer_engine-2.9.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: transformer_engine\nVersion: 2.9.0\n")
    out = json.loads(_py("""
        import json
        from specs.stack import detect_installed
        print(json.dumps(detect_installed().to_dict()))""", extra_path=str(tmp_path)))
    assert out["transformer_engine"] == "2.9.0"
    assert out["deepep"] and out["hybridep"] and out["grouped_gemm"]
    # DeepEP without the HybridEP branch: DeepEP yes, HybridEP no
    (tmp_path / "deep_ep" / "__init__.py").write_text("class Buffer: pass\n")
    out = json.loads(_py("""
        import json
        from specs.stack import detect_installed
        print(json.dumps(detect_installed().to_dict()))""", extra_path=str(tmp_path)))
    assert out["deepep"] and not out["hybridep"]


def test_profile_from_installed():
    assert profile_from_installed(Installed(megatron_core="0.16.1")).name == "cpu-local"
    full = profile_from_installed(Installed(megatron_core="0.16.1", transformer_engine="2.9.0", deepep=True,
                                            hybridep=True, cuda=True, devices=8))
    assert full.gpu and full.te_at_least("2.9") and full.grouped_gemm and full.sequence_parallel
    assert full.context_parallel and full.deepep and full.hybridep and full.dist_opt
    plain = profile_from_installed(Installed(megatron_core="0.16.1", cuda=True, devices=1))
    assert not (plain.transformer_engine or plain.grouped_gemm or plain.sequence_parallel
                or plain.context_parallel or plain.deepep)
    gg = profile_from_installed(Installed(megatron_core="0.16.1", grouped_gemm=True, cuda=True, devices=1))
    assert gg.grouped_gemm and not gg.sequence_parallel


def test_profile_for_auto_plans_for_the_target_and_installed_detects():
    h = load_cluster("h100-sxm", 8)
    assert profile_for(h) is GPU_FULL and profile_for(h, "auto") is GPU_FULL  # whatever is installed here
    assert profile_for(load_cluster("cpu-local", 2), "auto").name == "cpu-local"
    assert profile_for(h, "installed") == profile_from_installed(detect_installed())
    assert profile_for(h, "gpu-plain") is GPU_NO_TE


def test_gpu_plain_refuses_grouped_gemm_and_tp_sp():
    from tuner.space.megatron_rules import check
    w = Workload(model=load_model("tiny-moe"), cluster=load_cluster("h100-sxm", 8), gbs=64, seq=256)
    assert not GPU_NO_TE.grouped_gemm and not GPU_NO_TE.sequence_parallel
    gg = {r.code for r in check(w, Plan(ep=8, grouped_gemm=True, precision="bf16"), GPU_NO_TE)}
    assert "stack-missing" in gg
    assert "stack-missing" not in {r.code for r in check(w, Plan(ep=8, grouped_gemm=True), GPU_FULL)}
    tp = check(w, Plan(tp=2, ep=4, grouped_gemm=False), GPU_NO_TE)
    assert any("sequence parallel" in r.sentence for r in tp), tp


# Expected values, each with its reason: CUDA_DEVICE_MAX_CONNECTIONS=1 is what Megatron-LM's
# validate_args requires with TP or CP before Blackwell (b200 is exempt); NVLS only where NVLink
# switches exist (the CPU "cluster" has none); record streams avoided everywhere.
@pytest.mark.parametrize("kind,plan,want", [
    ("h100-sxm", Plan(), {"NCCL_NVLS_ENABLE": "1", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}),
    ("h100-sxm", Plan(tp=2), {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "1",
                              "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}),
    ("h100-sxm", Plan(cp=2), {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "1",
                              "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}),
    ("b200", Plan(tp=2), {"NCCL_NVLS_ENABLE": "1", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}),
    # Megatron FSDP asserts != 1; EP A2A overlap needs more queues: Megatron-Bridge's 32 (flex) / 8
    ("h100-sxm", Plan(fsdp=True), {"CUDA_DEVICE_MAX_CONNECTIONS": "8", "NCCL_NVLS_ENABLE": "1",
                                   "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}),
    ("h100-sxm", Plan(tp=2, ep=4, a2a_overlap=True, dispatcher="flex", flex_backend="deepep"),
     {"CUDA_DEVICE_MAX_CONNECTIONS": "32", "NCCL_NVLS_ENABLE": "1", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}),
    ("cpu-local", Plan(), {"NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"})])
def test_launch_env_values_and_the_emitted_script_exports_them(kind, plan, want):
    from tuner.emit.megatron import megatron_script
    w = Workload(model=load_model("tiny-moe"), cluster=load_cluster(kind, 8 if kind != "cpu-local" else 2),
                 gbs=64, seq=256)
    assert launch_env(plan, w.cluster) == want
    script = megatron_script(w, plan, GPU_FULL)
    for k, v in want.items():
        assert f"{k}={v}" in script, (k, v)
    if "CUDA_DEVICE_MAX_CONNECTIONS" not in want:
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in script


def test_fp8_recipes_are_megatrons_choices():
    """Each plan precision maps to a format megatron-core's fp8_utils accepts (e4m3 | hybrid) and a
    recipe of its Fp8Recipe enum; and to distinct pairs."""
    enums = pytest.importorskip("megatron.core.enums")
    recipes = {r.value for r in enums.Fp8Recipe}
    for precision, (fmt, recipe) in FP8_RECIPES.items():
        assert fmt in ("e4m3", "hybrid") and recipe in recipes, precision
    assert len(set(FP8_RECIPES.values())) == len(FP8_RECIPES)
