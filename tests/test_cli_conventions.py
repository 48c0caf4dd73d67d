"""CLI conventions (tuner/conventions.py, `moetune list`, specs.models' hub ids and "did you mean"):
--version, listing what names are accepted, JSON errors on stdout, the same workload fields in
training and serving JSON, hub ids read from the local cache or refused with the reason."""
import json
import shutil

import pytest

from tuner.cli import main

W = ["--cluster", "cpu-local", "--gpus", "2", "--gbs", "16", "--seq", "256"]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip().startswith("moetune 0.")


@pytest.mark.parametrize("what,name", [("models", "deepseek-v3"), ("clusters", "h200-sxm"), ("stacks", "gpu-full")])
def test_list(capsys, what, name):
    assert main(["list", what]) == 0
    out = capsys.readouterr().out
    assert name in out and len(out.splitlines()) >= 4
    assert main(["list", what, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema_version"] == 1 and name in [r["name"] for r in d[what]]


@pytest.mark.parametrize("argv,want", [
    (["--model", "olmoe", *W], "did you mean 'olmoe-1b-7b'?"),
    (["--model", "tiny-moe", "--cluster", "h100", "--gbs", "8"], "did you mean 'h100-sxm'?"),
])
def test_did_you_mean(capsys, argv, want):
    assert main(["predict", *argv, "--plan", "tp=1"]) == 2
    assert want in capsys.readouterr().err


def test_hub_id_refused_with_the_reason_or_read_from_the_local_cache(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    base = ["--cluster", "h200-sxm", "--gpus", "8", "--gbs", "64", "--seq", "4096", "--plan", "ep=8"]
    assert main(["predict", "--model", "Qwen/Qwen3-30B-A3B", *base]) == 2
    err = capsys.readouterr().err
    assert "not in the local cache" in err and "--model qwen3-30b-a3b" in err and "does not download" in err
    from specs.hf_export import write_model_dir
    from specs.models import load_model
    cfg = write_model_dir(load_model("qwen3-30b-a3b"), tmp_path / "x") / "config.json"
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    shutil.copy(cfg, snap / "config.json")
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("0123abc")
    assert main(["predict", "--model", "Qwen/Qwen3-30B-A3B", *base, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["workload"]["model"] == "Qwen3-30B-A3B"
    assert main(["predict", "--model", "qwen3-30b-a3b", *base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == d["step_time_s"]  # the same architecture


def test_json_errors_on_stdout_with_coded_reasons(capsys):
    assert main(["predict", "--model", "tiny-moe", *W, "--plan", "tp=3", "--json"]) == 2
    cap = capsys.readouterr()
    d = json.loads(cap.out)
    assert d["schema_version"] == 1 and d["ok"] is False and d["exit_code"] == 2
    assert d["error"]["code"] == "unrealizable"
    assert {"code": "heads-div-tp", "message": "4 attention heads are not divisible by tp=3"} in d["error"]["reasons"]
    assert cap.err.startswith("moetune predict: error:")
    assert main(["predict", "--model", "nope", *W, "--plan", "tp=1", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "bad-spec"


def test_training_and_serving_json_carry_the_same_workload_fields(capsys):
    assert main(["predict", "--model", "tiny-moe", *W, "--plan", "tp=1", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert main(["predict", "--mode", "serve", "--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2",
                 "--isl", "128", "--osl", "32", "--plan", "tp=1", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    for d, mode in ((t, "train"), (s, "serve")):
        assert d["schema_version"] == 1 and d["mode"] == mode and d["moetune_version"]
        assert {"model", "cluster", "gpus", "precision"} <= set(d["workload"])
    assert t["workload"]["gbs"] == 16 and s["workload"]["isl"] == 128
