"""`moetune emit megatron`: every flag is one Megatron-LM core_v0.16.1 accepts, the values
reproduce the plan, and unrealizable plans are refused with nothing written."""
import shlex
from pathlib import Path

import pytest

from clusters import load_cluster
from specs.models import load_model
from specs.stack import GPU_FULL
from specs.workload import Workload
from tuner.cli import main
from tuner.emit.megatron import layout_with_mtp, megatron_script
from tuner.rank.complete import complete_plan

FLAGS = {line.strip() for line in (Path(__file__).parent / "fixtures" / "megatron_lm_core_v0.16.1_flags.txt")
         .read_text().splitlines() if line.startswith("--")}


def _args(script: str) -> dict:
    body = script.split("pretrain_gpt.py\" \\\n", 1)[1].replace("\\\n", " ")
    toks = shlex.split(body)
    out, key = {}, None
    for t in toks:
        if t.startswith("--"):
            key = t
            out[key] = []
        else:
            out[key].append(t)
    return out


PUBLISHED = [
    ("deepseek-v3", 1024, 8192, "tp=2,pp=8,vpp=4,ep=64,mbs=1", "fp8"),
    ("qwen3-235b-a22b", 256, 8192, "tp=2,pp=8,vpp=4,ep=32,mbs=1", "bf16"),
    ("qwen3-30b-a3b", 16, 1024, "tp=1,pp=1,ep=16,mbs=1", "bf16"),
    ("mixtral-8x7b", 64, 256, "tp=1,ep=8,pp=4,vpp=8,mbs=1", "bf16"),
    ("deepseek-v2-lite", 8, 64, "pp=2,vpp=2,ep=8,dispatcher=flex,recompute=full,a2a_overlap=0", "bf16"),
]


@pytest.mark.parametrize("model,gpus,gbs,plan,prec", PUBLISHED)
def test_emitted_flags_exist_and_reproduce_the_plan(model, gpus, gbs, plan, prec):
    w = Workload(load_model(model), load_cluster("h100-sxm", gpus), gbs, 4096)
    p = complete_plan(plan, w, GPU_FULL, prec)
    script = megatron_script(w, p, GPU_FULL)
    args = _args(script)
    unknown = set(args) - FLAGS
    assert not unknown, unknown
    assert args["--tensor-model-parallel-size"] == [str(p.tp)]
    assert args["--pipeline-model-parallel-size"] == [str(p.pp)]
    assert args["--expert-model-parallel-size"] == [str(p.ep)]
    assert args["--global-batch-size"] == [str(gbs)]
    if p.pp_layout:
        assert args["--pipeline-model-parallel-layout"] == [layout_with_mtp(p.pp_layout, w.model.mtp_num_layers)]
        assert "--num-virtual-stages-per-pipeline-rank" not in args  # implied by the layout
    elif p.vpp > 1:
        assert args["--num-virtual-stages-per-pipeline-rank"] == [str(p.vpp)]
    # interleaved PP=2 must keep overlapped, non-batched p2p (Megatron-LM issues 750, 1450)
    assert "--no-overlap-p2p-communication" not in args
    assert ("--sequence-parallel" in args) == (p.tp > 1)
    assert f"--nproc-per-node {min(8, gpus)}" in script
    if p.tp > 1:
        assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script
    if p.fp8:
        assert args["--fp8-recipe"] == ["blockwise"]
    assert script.startswith("#!/usr/bin/env bash") and p.canonical() in script


def test_emit_cli_writes_script_and_refuses_unrealizable(tmp_path, capsys):
    out = tmp_path / "launch.sh"
    rc = main(["emit", "megatron", "--model", "mixtral-8x7b", "--cluster", "h100-sxm", "--gpus", "64",
               "--gbs", "256", "--seq", "4096", "--plan", "tp=1,ep=8,pp=4,vpp=8,mbs=1", "--out", str(out)])
    assert rc == 0 and out.exists() and "pretrain_gpt.py" in out.read_text()
    capsys.readouterr()
    bad = tmp_path / "bad.sh"
    rc = main(["emit", "megatron", "--model", "mixtral-8x7b", "--cluster", "h100-sxm", "--gpus", "64",
               "--gbs", "256", "--seq", "4096", "--plan", "tp=3", "--out", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and not bad.exists()
    assert len(err) == 1 and "heads-div-tp" in err[0] and "world-div-tp-cp-pp" in err[0]
