"""`moetune emit sglang` and `moetune plans --mode serve`: output shape, the 0.5.23 spelling, and
bad input as one line with exit code 2."""
import json

import pytest

from tuner.cli import main

Q = ["--model", "qwen3-30b-a3b", "--cluster", "h200-sxm"]


def test_emit_sglang_one_node(capsys, tmp_path):
    assert main(["emit", "sglang", *Q, "--gpus", "8", "--plan", "tp=8,attn_dp=8,a2a=deepep,cuda_graph_max_bs=128",
                 "--out", str(tmp_path / "launch.sh")]) == 0
    text = (tmp_path / "launch.sh").read_text()
    assert text.count("python -m sglang.launch_server") == 1
    assert "--attn-dp-size 8" in text and "--moe-a2a-backend deepep" in text
    assert "--cuda-graph-max-bs-decode 128" in text and "--enable-dp-attention" not in text
    assert "--nnodes" not in text and "a2a-forces-ep" in text
    assert json.loads((tmp_path / "qwen3-30b-a3b-config" / "config.json").read_text())["num_experts"] == 128


def test_emit_sglang_multinode_and_pd(capsys):
    assert main(["emit", "sglang", "--model", "deepseek-v3", "--cluster", "h200-sxm", "--gpus", "16",
                 "--plan", "tp=16,attn_dp=16,a2a=deepep", "--nnodes", "2", "--model-path", "/m"]) == 0
    out = capsys.readouterr().out
    assert out.count("sglang.launch_server") == 2 and "--node-rank 1" in out and "--dist-init-addr" in out
    assert main(["emit", "sglang", *Q, "--gpus", "8", "--plan", "tp=2,pd=1:3", "--pd", "--model-path", "/m"]) == 0
    out = capsys.readouterr().out
    assert out.count("--disaggregation-mode prefill") == 1 and out.count("--disaggregation-mode decode") == 3
    assert out.count("sglang_router.launch_router --pd-disaggregation") == 1


@pytest.mark.parametrize("argv", [
    ["--gpus", "8", "--plan", "tp=8,tbo=1"],                      # unrealizable
    ["--gpus", "8", "--plan", "tp=8,bogus=1"],                    # bad key
    ["--gpus", "8", "--plan", "tp=4,pd=1:1"],                     # pd plan without --pd
    ["--gpus", "16", "--plan", "tp=16,attn_dp=16", "--nnodes", "3"],  # wrong node count
])
def test_emit_sglang_bad_input_one_line(capsys, argv):
    assert main(["emit", "sglang", *Q, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err


def test_emit_megatron_still_needs_gbs(capsys):
    assert main(["emit", "megatron", *Q, "--gpus", "8", "--plan", "tp=1"]) == 2


def test_plans_serve_json(capsys):
    assert main(["plans", "--mode", "serve", *Q, "--gpus", "8", "--json", "--examples", "3"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert 0 < d["realizable"] < d["space_size"] and len(d["examples"]) == 3
    assert sum(d["rejections"].values()) >= d["space_size"] - d["realizable"]
    assert "tbo-needs-a2a-or-attn-dp" in d["rejection_examples"]


def test_plans_serve_rank_hook_refuses_until_wired(capsys):
    from specs.errors import UsageError
    from tuner.commands.plans import rank_serve_plans
    with pytest.raises(UsageError):
        rank_serve_plans([], None, None, 5)
