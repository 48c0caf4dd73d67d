"""`plans --rank` (training): the table's header names every column, and `--distinct parallel` keeps
the best plan of each parallel layout (issue 28)."""
import json

from tuner.cli import main

W = ["--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "4", "--gbs", "16", "--seq", "256", "--examples", "0", "--level", "core"]
PARALLEL = ("tp", "cp", "pp", "ep", "etp", "mbs")


def _layout(plan: str) -> tuple:
    f = dict(x.split("=", 1) for x in plan.split(","))
    return tuple(f[k] for k in PARALLEL)


def test_distinct_parallel_keeps_the_best_plan_of_each_layout(capsys):
    assert main(["plans", *W, "--rank", "--top", "6", "--json"]) == 0
    every = json.loads(capsys.readouterr().out)["ranked"]["plans"]
    assert main(["plans", *W, "--rank", "--top", "6", "--json", "--distinct", "parallel"]) == 0
    distinct = json.loads(capsys.readouterr().out)["ranked"]["plans"]
    layouts = [_layout(r["plan"]) for r in distinct]
    assert len(layouts) == len(set(layouts)) and len(distinct) >= 2
    assert distinct[0]["plan"] == every[0]["plan"]  # the leader is the leader
    tps = [r["tokens_per_s_per_gpu"] for r in distinct]
    assert tps == sorted(tps, reverse=True)
    # every layout's row is its best: no plan of the full list beats it within its layout
    for r in every:
        best = next((d for d in distinct if _layout(d["plan"]) == _layout(r["plan"])), None)
        if best is not None:
            assert r["tokens_per_s_per_gpu"] <= best["tokens_per_s_per_gpu"] + 1e-9


def test_training_rank_table_has_a_header_mfu_and_next_step(capsys):
    assert main(["plans", *W, "--rank", "--top", "3"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("#") and "tok/s/GPU" in line)
    for col in ("tok/s/GPU", "step", "MFU", "peak mem", "plan"):
        assert col in header, col
    assert "next: moetune predict" in out
