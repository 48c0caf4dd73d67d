"""Emitted launch files say what was priced and refuse what cannot run (tuner/emit/header.py):
the header's predicted numbers round-trip through `moetune predict`, a plan the model predicts
will not fit is refused with exit 3 (written only with --force, labelled), multi-node scripts fail
fast on unset variables."""
import json
import os
import re
import shlex
import subprocess

import pytest

from tuner.cli import main

MIX = ["--model", "mixtral-8x7b", "--cluster", "h100-sxm", "--gpus", "64", "--gbs", "256", "--seq", "4096"]
GPTOSS = ["--model", "gpt-oss-120b", "--cluster", "h100-sxm", "--gpus", "64", "--gbs", "1024", "--seq", "4096"]


def _header_value(text: str, label: str) -> str:
    m = re.search(r"^#\s+" + re.escape(label) + r":\s+([^\s(]+)", text, re.M)
    assert m, f"no {label!r} in the header"
    return m.group(1).replace(",", "")


def _reproduce(text: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith("# reproduce: "))
    argv = shlex.split(line.removeprefix("# reproduce: "))
    assert argv[:2] == ["moetune", "predict"]
    return argv[1:]


def test_megatron_header_round_trips_through_predict(capsys):
    assert main(["emit", "megatron", *MIX, "--plan", "tp=1,ep=8,pp=4,vpp=8"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("#!/usr/bin/env bash") and "# moetune 0.1" in text
    assert "--mock-data" in text and "--moe-router-force-load-balancing" in text and "# not expressible: none" in text
    assert main([*_reproduce(text), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert _header_value(text, "elapsed time per iteration (ms)") == f"{d['step_time_s'] * 1e3:.1f}"
    assert _header_value(text, "throughput per GPU (TFLOP/s/GPU)") == f"{d['model_tflops_per_gpu']:.1f}"
    assert _header_value(text, "tokens/s") == f"{d['tokens_per_s_per_gpu'] * 64:.0f}"
    stages = re.search(r"memory per pipeline stage \(GiB\): ([\d. ]+) ", text).group(1).split()
    assert stages == [f"{x:.1f}" for x in d["memory_by_stage_gib"]] and len(stages) == 4


def test_serving_headers_round_trip_through_predict(capsys):
    for target in ("sglang", "vllm"):
        assert main(["emit", target, "--model", "qwen3-30b-a3b", "--cluster", "h200-sxm", "--gpus", "8",
                     "--isl", "4000", "--osl", "1000", "--plan", "tp=8", "--precision", "fp8"]) == 0
        text = capsys.readouterr().out
        assert main([*_reproduce(text), "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        out = d["output_tokens_per_s_per_gpu"]
        assert _header_value(text, "Output token throughput (tok/s)") == f"{out * 8:.1f}"
        assert _header_value(text, "P90 TTFT (ms)") == f"{d['ttft_p90_s'] * 1e3:.1f}"
        assert _header_value(text, "P90 TPOT (ms)") == f"{d['tpot_p90_s'] * 1e3:.1f}"
        assert d["weight_dtype"] == "fp8" and "--quantization fp8" in text and "--kv-cache-dtype auto" in text


def test_emit_refuses_a_plan_that_does_not_fit(tmp_path, capsys):
    out = tmp_path / "gptoss.sh"
    assert main(["emit", "megatron", *GPTOSS, "--plan", "ep=8,fsdp=0", "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert not out.exists() and "does not fit" in err[0] and "GiB usable" in err[0] and "135.7" in err[0]
    assert main(["emit", "megatron", *GPTOSS, "--plan", "ep=8,fsdp=0", "--out", str(out), "--force"]) == 0
    assert "# FORCED (--force)" in out.read_text() and "DOES NOT FIT" in out.read_text()
    # predict prints the numbers, then says so in its exit code
    assert main(["predict", *GPTOSS, "--plan", "ep=8,fsdp=0"]) == 3
    assert "does not fit" in capsys.readouterr().out


def test_emit_serving_refuses_weights_that_do_not_fit_and_says_what_would(capsys):
    base = ["emit", "sglang", "--model", "deepseek-v3", "--cluster", "h200-sxm", "--gpus", "8", "--isl", "1024",
            "--osl", "1024", "--plan", "tp=8"]
    assert main([*base, "--weight-dtype", "bf16"]) == 3
    err = capsys.readouterr().err
    assert "weights_exceed_hbm" in err and "157.7 GiB/GPU" in err and "fp8 weights" in err and "16 GPUs" in err
    assert main(base) == 0  # the checkpoint's own fp8 weights fit
    text = capsys.readouterr().out
    assert "weights: fp8 (checkpoint quantization_config" in text and "--quantization fp8" in text
    assert main(["predict", "--mode", "serve", *base[2:], "--weight-dtype", "bf16"]) == 3
    assert "hint           would fit: fp8 weights" in capsys.readouterr().out


def test_quantization_config_of_a_local_checkpoint(tmp_path, capsys):
    from specs.hf_export import write_model_dir
    from specs.models import load_model
    d = write_model_dir(load_model("qwen3-30b-a3b"), tmp_path / "q")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (d / "config.json").write_text(json.dumps(cfg))
    assert main(["predict", "--mode", "serve", "--model", str(d), "--cluster", "h200-sxm", "--gpus", "8",
                 "--isl", "1000", "--osl", "100", "--plan", "tp=8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["weight_dtype"] == "fp8" and str(d) in r["weight_source"] and r["precision"] == "fp8"


@pytest.mark.parametrize("gpus,fails", [(16, True), (8, False)])
def test_multinode_script_fails_fast_on_unset_variables(tmp_path, capsys, gpus, fails):
    out = tmp_path / "l.sh"
    assert main(["emit", "megatron", "--model", "tiny-moe", "--cluster", "h100-sxm", "--gpus", str(gpus),
                 "--gbs", "64", "--seq", "1024", "--plan", "ep=2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "srun bash THIS_SCRIPT" in text and "SLURM_NODEID" in text
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    # the script stops before torchrun when a multi-node variable is unset (torchrun is absent here:
    # a single-node script gets past the checks and fails on it instead)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "NODE_RANK", "SLURM_JOB_ID")}
    env["MEGATRON_LM"] = str(tmp_path)
    env["PATH"] = "/usr/bin:/bin"
    p = subprocess.run(["bash", str(out)], capture_output=True, text=True, env=env)
    assert p.returncode != 0
    assert ("NODE_RANK" in p.stderr) == fails and ("torchrun" in p.stderr) == (not fails)
