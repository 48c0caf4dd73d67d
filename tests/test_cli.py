"""Bad input: one clear line on stderr, exit code 2, nothing written. And `moetune plans` output."""
import json
import subprocess
import sys
from pathlib import Path

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
                 "--seq", "4096", "--level", "core", "--rank", "--top", "5", "--shard", "0/4", "--json",
                 "--exhaustive"]) == 0
    d = json.loads(capsys.readouterr().out)
    r = d["ranked"]
    tps = [p["tokens_per_s_per_gpu"] for p in r["plans"]]
    assert len(tps) == 5 and tps == sorted(tps, reverse=True)
    assert r["scored"] > r["memory_infeasible"] > 0 and "memory" in r["infeasible_reasons"]
    assert all(p["peak_memory_gib"] < 80 for p in r["plans"])


# ---- help texts ---------------------------------------------------------------------------------
def _sentence(text) -> bool:
    text = (text or "").strip()
    return bool(text) and text[0].isupper() and text.endswith(".")


def test_every_description_and_flag_help_is_a_whole_sentence():
    """Every command's (and sub-subcommand's) description and summary and every argument's help:
    non-empty, starts with a capital, ends with a full stop."""
    import argparse

    from tuner.cli import _parsers, build_parser
    bad = []
    for p in _parsers(build_parser()):
        if not _sentence(p.description):
            bad.append((p.prog, "description", p.description))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:  # the one-line summaries of the command list
                    if not _sentence(choice.help):
                        bad.append((p.prog, f"{choice.dest} summary", choice.help))
                continue
            if action.help != argparse.SUPPRESS and not _sentence(action.help):
                bad.append((p.prog, "/".join(action.option_strings) or action.dest, action.help))
    assert not bad, "\n".join(map(str, bad))


def test_top_level_help_is_a_product_description():
    out = subprocess.run([sys.executable, "-m", "tuner.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "Mixture-of-Experts" in out.stdout and "tuner/commands" not in out.stdout


# ---- sizes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["predict", "plans", "emit"])
@pytest.mark.parametrize("flag,value", [("--seq", "0"), ("--seq", "-256"), ("--gbs", "0"), ("--gbs", "-4"),
                                        ("--gpus", "0"), ("--gpus", "-8"), ("--seq", "x")])
def test_non_positive_sizes_exit_2_with_one_line(cmd, flag, value, capsys):
    argv = {"predict": ["predict"], "plans": ["plans"], "emit": ["emit", "megatron", "--plan", "ep=2"]}[cmd]
    sizes = {"--cluster": "cpu-local", "--gpus": "2", "--gbs": "16", "--seq": "256", flag: value}
    args = [*argv, "--model", "tiny-moe", *[x for kv in sizes.items() for x in kv]]
    assert main(args) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err
    assert captured.out == ""


# ---- unrealizable plans --------------------------------------------------------------------------
CPU = ["--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2", "--gbs", "16", "--seq", "256"]


def test_predict_refuses_an_unrealizable_plan_with_its_reasons(capsys):
    assert main(["predict", "--model", "tiny-moe", *W, "--plan", "tp=3"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    # the first line names the problem on its own (the first reason), the others one a line
    assert "not realizable" in err[0] and "--force" in err[0] and "more below" in err[0]
    first = err[0].split("realizable on ", 1)[1].split(": ", 1)[1]
    reasons = [first] + [line for line in err[1:] if line.strip().startswith("[")]
    assert first.startswith("[") and len(reasons) == len(err) >= 2
    assert any("[heads-div-tp]" in r for r in reasons) and any("[world-div-tp-cp-pp]" in r for r in reasons)


def test_predict_force_labels_indicative_numbers(capsys):
    assert main(["predict", "--model", "tiny-moe", *W, "--plan", "tp=3", "--force"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("NOT REALIZABLE — indicative only")
    assert "[NOT REALIZABLE — indicative only]" in out.split("step time", 1)[1].splitlines()[0]
    assert main(["predict", "--model", "tiny-moe", *W, "--plan", "tp=3", "--force", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["realizable"] is False and any("heads-div-tp" in r for r in d["realize_reasons"])
    assert main(["predict", "--model", "tiny-moe", *W, "--plan", "ep=2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["realizable"] is True and d["realize_reasons"] == []


def test_trial_refuses_an_unrealizable_plan_without_launching(capsys):
    assert main(["trial", *CPU, "--plan", "ep=2,grouped_gemm=1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "[stack-cpu]" in captured.err and "grouped GEMM" in captured.err


def test_each_cpu_rejection_is_printed_once(capsys):
    assert main(["predict", *CPU, "--plan", "ep=2,gg=1"]) == 2
    assert capsys.readouterr().err.count("[stack-cpu]") == 1
    assert main(["predict", *CPU, "--plan", "ep=2,tp=2"]) == 2
    assert capsys.readouterr().err.count("[stack-cpu]") == 1


# ---- cost-model inputs -----------------------------------------------------------------------------
@pytest.mark.parametrize("content", ["{not json", '{"scale": "abc"}', '{"label": "no scale"}', "[1, 2]",
                                     '{"scale": -1}'])
def test_malformed_calibration_names_the_file_and_the_flag(tmp_path, content, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["predict", *CPU, "--plan", "ep=2", "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--calibration {bad}: not a calibration file (" in err[0], err


def test_missing_calibration_and_bad_tables_name_the_file_and_the_flag(tmp_path, capsys):
    import shutil

    from clusters import TABLES_ROOT
    assert main(["predict", *CPU, "--plan", "ep=2", "--calibration", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--calibration {tmp_path / 'none.json'}" in err[0]
    assert main(["predict", *CPU, "--plan", "ep=2", "--tables", str(tmp_path / "nodir")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--tables {tmp_path / 'nodir'}: no such table directory" in err[0]
    t = tmp_path / "tables"
    shutil.copytree(TABLES_ROOT / "cpu-local", t)
    gemm = t / "gemm.csv"
    lines = gemm.read_text().splitlines()
    head = lines[0].split(",")
    row = lines[1].split(",")
    row[head.index("tflops")] = "fast"
    gemm.write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
    for cmd in (["predict", *CPU, "--plan", "ep=2"], ["plans", *CPU, "--rank"]):
        assert main([*cmd, "--tables", str(t)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--tables {gemm}: not a gemm table (" in err[0], err


# ---- output a person can read -------------------------------------------------------------------------
def test_predict_output_short_form_units_and_calibration_note(capsys):
    assert main(["predict", *CPU, "--plan", "ep=2,mbs=2", "--complete", "defaults"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["plan", "ep=2,mbs=2"]
    assert " 0.0 " not in out and "TFLOP/s 0.0" not in out and "MiB" in out
    assert "calibration scale" not in out  # identity on CPU: nothing to explain
    assert main(["predict", *CPU, "--plan", "ep=2,mbs=2", "--canonical"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[1].startswith("tp=1,cp=1,pp=1,vpp=1,ep=2,etp=1,mbs=2,")
    cal = json.loads((Path(__file__).parents[1] / "cost_model" / "calibration_default.json").read_text())
    from tuner.commands.predict import LARGE_CALIBRATION
    assert abs(cal["scale"] - 1) > LARGE_CALIBRATION  # the shipped GPU fit is large: predict must say so
    assert main(["predict", "--model", "qwen3-30b-a3b", *W, "--plan", "ep=8"]) == 0
    out = capsys.readouterr().out
    note = [line for line in out.splitlines() if "calibration scale" in line]
    share = 1 - 1 / cal["scale"]
    assert len(note) == 1 and f"scale {cal['scale']:.2f} (shipped GPU fit): {share:.0%} of this step time" in note[0]


def test_plans_examples_and_ranked_rows_are_short_and_distinct(capsys):
    from specs.plan import parse_fields
    assert main(["plans", *CPU, "--rank", "--top", "8", "--examples", "3"]) == 0
    out = capsys.readouterr().out
    ex = out.split("realizable examples", 1)[1].split("top 8", 1)[0].splitlines()[1:]
    table = out.split("top 8", 1)[1].splitlines()[1:]
    assert table[0].split()[:4] == ["#", "tok/s/GPU", "step", "MFU"] and table[-1].startswith("next: moetune predict")
    rows = [r for r in table if r.lstrip(" ~").split()[0].isdigit()]
    assert len(ex) == 3 and len(rows) == 8 and [int(r.lstrip(" ~").split()[0]) for r in rows] == list(range(1, 9))
    shown = [r.split()[-1] for r in rows]
    assert len(set(shown)) == len(shown)
    for text in [e.strip() for e in ex] + shown:
        assert text == "(defaults)" or len(parse_fields(text)) < 8, text
    assert main(["plans", *CPU, "--rank", "--top", "8", "--examples", "3", "--canonical"]) == 0
    rows = [r for r in capsys.readouterr().out.split("top 8", 1)[1].splitlines()[1:] if r.lstrip(" ~").split()[0].isdigit()]
    from specs.plan import Plan
    assert all(r.split()[-1].startswith("tp=") and r.count("=") == len(Plan.__dataclass_fields__) for r in rows)


def test_plans_rank_builds_no_prediction_objects(monkeypatch, capsys):
    """--rank scores with the vectorised cost model only (tuner.rank.train.rank_space)."""
    import cost_model

    def refuse(*a, **k):
        raise AssertionError("plans --rank built a Prediction")

    monkeypatch.setattr(cost_model.Prediction, "__init__", refuse)
    monkeypatch.setattr(cost_model, "predict_many", refuse)
    assert main(["plans", *CPU, "--rank", "--top", "3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["ranked"]["plans"]) == 3 and d["ranked"]["realizable"] == d["realizable"]
