"""Bad input: one clear line on stderr, exit code 2, nothing written. And `moetune plans` output."""
import json
import subprocess
import sys

import pytest

from tuner.cli import main

W = ["--cluster", "h100-sxm", "--gpus", "16", "--gbs", "64", "--seq", "4096"]


@pytest.mark.parametrize("argv,needle", [
    (["plans", "--model", "no-such-model", *W], "unknown model"),
    (["plans", "--model", "tiny-moe", "--cluster", "h100-sxm", "--gpus", "12", "--gbs", "64"], "whole number"),
    (["plans", "--model", "tiny-moe", "--cluster", "h100-sxm", "--gpus", "0", "--gbs", "64"], "positive"),
    (["plans", "--model", "tiny-moe", "--cluster", "nosuch", "--gbs", "64"], "unknown cluster"),
    (["plans", "--model", "tiny-moe", *W, "--shard", "3/2"], "--shard"),
    (["plans", "--model", "tiny-moe", *W, "--precision", "fp7"], "--precision"),
    (["plans", "--model", "tiny-moe", "--cluster", "a100-sxm-80g", "--gbs", "64", "--precision", "fp8"], "fp8"),
    (["emit", "megatron", "--model", "tiny-moe", *W, "--plan", "tp=2,bogus=1"], "unknown plan key"),
    (["predict", "--model", "tiny-moe", *W, "--plan", "tp=x"], "bad value"),
    (["plans", "--model", "tiny-moe", *W, "--gbs", "-4"], "--gbs"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_malformed_files(tmp_path, capsys):
    y = tmp_path / "m.yaml"
    y.write_text("num_layers: [1, 2\n")
    assert main(["plans", "--model", str(y), *W]) == 2
    assert "malformed YAML" in capsys.readouterr().err
    j = tmp_path / "config.json"
    j.write_text("{not json")
    assert main(["plans", "--model", str(j), *W]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    j.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 8}))
    assert main(["plans", "--model", str(j), *W]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_plans_json_counts_and_reasons(capsys):
    assert main(["plans", "--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2", "--gbs", "16",
                 "--seq", "256", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["space_size"] > d["realizable"] > 0
    assert d["stack"] == "cpu-local" and "stack-cpu" in d["rejections"]
    assert all(" " not in p for p in d["examples"])


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "tuner.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for cmd in ("plans", "emit", "predict", "trial", "tune", "profile", "calibrate", "adjudicate"):
        assert cmd in out.stdout


def test_plans_rank_orders_feasible_plans_by_predicted_throughput(capsys):
    assert main(["plans", "--model", "qwen3-30b-a3b", "--cluster", "h100-sxm", "--gpus", "16", "--gbs", "1024",
                 "--seq", "4096", "--level", "core", "--rank", "--top", "5", "--shard", "0/4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    r = d["ranked"]
    tps = [p["tokens_per_s_per_gpu"] for p in r["plans"]]
    assert len(tps) == 5 and tps == sorted(tps, reverse=True)
    assert r["scored"] > r["memory_infeasible"] > 0 and "memory" in r["infeasible_reasons"]
    assert all(p["peak_memory_gib"] < 80 for p in r["plans"])
