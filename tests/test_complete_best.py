"""`--complete best`: a partial plan completes to the realizable, memory-feasible completion with the
highest predicted throughput; `--complete defaults` keeps the documented defaults. The oracle is a
brute force over the plan space's options with the per-plan cost model (`cost_model.predict`)."""
import itertools
import json

import pytest

import cost_model
from clusters import load_cluster
from specs.models import load_model
from specs.plan import Plan, parse_fields
from specs.stack import GPU_FULL, cpu_profile
from specs.workload import Workload
from tuner.cli import main
from tuner.rank.complete import best_completion, complete, complete_plan
from tuner.space.megatron_rules import check
from tuner.space.train import default_space, pipeline_splits

CPU = ["--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2", "--gbs", "16", "--seq", "256"]


@pytest.fixture(autouse=True)
def _home(monkeypatch, tmp_path):
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))


def _brute_force(given: str, w, profile, precision):
    """Best predicted throughput over every realizable completion that keeps the given fields."""
    fields = parse_fields(given)
    base = complete_plan(given, w, profile, precision)
    space = default_space(w, profile, precision, level="full")
    splits = [{}] if base.pp == 1 or {"pp_layout", "pp_first", "pp_last"} & fields.keys() else \
        [{**dict(pp_first=0, pp_last=0, pp_layout=""), **s} for s in pipeline_splits(w.model.num_layers, base.pp, base.vpp)]
    best = None
    for split, s, k in itertools.product(splits, space.schedules, space.kernels):
        p = base.replace(**split, **s, **k)
        if any(getattr(p, f) != getattr(base, f) for f in fields if f != "precision" or fields[f] != "fp8"):
            continue  # not a completion of what the user gave
        if check(w, p, profile):
            continue
        pr = cost_model.predict(w, p)
        if pr.feasible and (best is None or pr.tokens_per_s_per_gpu > best[0]):
            best = (pr.tokens_per_s_per_gpu, p)
    return best


@pytest.mark.parametrize("given", ["ep=2", "ep=2,mbs=2", "pp=2,ep=1"])
def test_best_completion_is_the_fastest_realizable_feasible_completion(given):
    w = Workload(load_model("tiny-moe"), load_cluster("cpu-local", 2), 16, 256)
    c = best_completion(given, w, cpu_profile(), "bf16")
    tps, _ = _brute_force(given, w, cpu_profile(), "bf16")
    assert c.mode == "best" and not check(w, c.plan, cpu_profile())
    pred = cost_model.predict(w, c.plan)
    assert pred.feasible and pred.tokens_per_s_per_gpu == pytest.approx(tps, rel=1e-9)
    assert c.tokens_per_s_per_gpu == pytest.approx(tps, rel=1e-9)
    for k, v in parse_fields(given).items():  # what the user gave is kept
        assert getattr(c.plan, k) == v


def test_best_completion_on_a_gpu_workload_beats_the_defaults_and_keeps_the_recipe_family():
    # issue 10: Qwen3-30B on 16 H100, fp8, tp=1,pp=1,ep=16,mbs=1 -- the defaults leave EP
    # communication exposed, the best completion does not
    w = Workload(load_model("qwen3-30b-a3b"), load_cluster("h100-sxm", 16), 512, 4096)
    c = best_completion("tp=1,pp=1,ep=16,mbs=1", w, GPU_FULL, "fp8")
    d = complete("tp=1,pp=1,ep=16,mbs=1", w, GPU_FULL, "fp8", "defaults")
    assert d.plan == complete_plan("tp=1,pp=1,ep=16,mbs=1", w, GPU_FULL, "fp8") and d.mode == "defaults"
    assert c.plan.precision.startswith(("fp8", "mxfp8")) and not check(w, c.plan, GPU_FULL)
    assert (c.plan.tp, c.plan.pp, c.plan.ep, c.plan.mbs) == (1, 1, 16, 1)
    assert c.tokens_per_s_per_gpu > c.defaults_tokens_per_s_per_gpu > 0 and c.chosen
    assert c.candidates > c.feasible > 0
    assert "chose" in c.describe() and set(c.chosen) == {f for f in Plan.__dataclass_fields__
                                                        if getattr(c.plan, f) != getattr(d.plan, f)}
    # a canonical plan has nothing left to choose
    full = best_completion(d.plan.canonical(), w, GPU_FULL, "fp8")
    assert full.plan == d.plan and full.candidates == 1


def test_no_feasible_completion_falls_back_to_the_defaults_and_says_so():
    w = Workload(load_model("deepseek-v3"), load_cluster("h100-sxm", 8), 64, 4096)
    c = best_completion("ep=8", w, GPU_FULL, "bf16")  # 671B parameters on one node: nothing fits
    assert c.plan == complete_plan("ep=8", w, GPU_FULL) and c.note and c.feasible == 0


def test_commands_show_the_completion_they_used(capsys, tmp_path):
    assert main(["predict", *CPU, "--plan", "ep=2", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert best["completion"]["mode"] == "best" and best["plan"] == best["completion"]["plan"]
    assert main(["predict", *CPU, "--plan", "ep=2", "--json", "--complete", "defaults"]) == 0
    dflt = json.loads(capsys.readouterr().out)
    assert dflt["completion"]["mode"] == "defaults"
    assert best["tokens_per_s_per_gpu"] >= dflt["tokens_per_s_per_gpu"]
    assert main(["predict", *CPU, "--plan", "ep=2"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("completion     best of ")
    # emit writes the best completion's script: the same script as emitting that plan outright
    out = tmp_path / "run.sh"
    assert main(["emit", "megatron", *CPU, "--plan", "ep=2", "--out", str(out)]) == 0
    assert "completion: best of" in capsys.readouterr().err
    assert main(["emit", "megatron", *CPU, "--plan", best["plan"], "--complete", "defaults"]) == 0
    assert capsys.readouterr().out == out.read_text()
    assert main(["predict", *CPU, "--plan", "ep=2", "--complete", "fastest"]) == 2


def test_memory_savers_only_when_nothing_else_fits():
    """NVIDIA's Qwen3-30B-A3B recipe on 8 B200 (EP8, MBS4, no recompute) does not fit with fp32 main
    gradients; completion then takes bf16 gradient reduction, as the recipe trains, and says so. A
    layout that fits never has its numerics changed, and a user's own grad_reduce_bf16=0 is kept."""
    w = Workload(load_model("qwen3-30b-a3b"), load_cluster("b200", 8), 512, 4096)
    pinned = "tp=1,pp=1,ep=8,mbs=4,recompute=none,dispatcher=flex,flex_backend=hybridep"
    c = best_completion(pinned, w, GPU_FULL, "bf16")
    assert c.plan.grad_reduce_bf16 and not c.plan.fp8_param and c.feasible > 0
    assert "bf16 gradient reduction" in c.note
    kept = best_completion(pinned + ",grad_reduce_bf16=0", w, GPU_FULL, "bf16")
    assert not kept.plan.grad_reduce_bf16 and kept.feasible == 0 and "fits in memory" in kept.note
    roomy = Workload(load_model("qwen3-30b-a3b"), load_cluster("h100-sxm", 16), 1024, 4096)
    c = best_completion("tp=1,pp=1,ep=16,mbs=1", roomy, GPU_FULL, "fp8")
    assert c.feasible > 0 and not c.plan.grad_reduce_bf16 and not c.plan.fp8_param and not c.note


def test_the_space_offers_the_loss_stage_layout_nvidia_runs():
    """61 layers over PP8 x VPP2: beside the layout that weighs the loss as one layer, the one that
    weighs it (with the MTP layer the model places there) as three, which is NVIDIA's DeepSeek-V3
    B200 MXFP8 layout (Megatron-Bridge DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2 "Et*4|(t*4|)*14tmL");
    with it the best completion of that layout is the recipe's own split, as the emitter writes it."""
    from specs.pipeline import parse_layout
    from specs.stack import GPU_FULL_TE211
    from tuner.emit.megatron import layout_with_mtp
    layouts = [s.get("pp_layout") for s in pipeline_splits(61, 8, 2)]
    assert "Etttt|(tttt|)*14tL" in layouts and "Ettt|(tttt|)*14ttL" in layouts
    w = Workload(load_model("deepseek-v3"), load_cluster("b200", 256), 4096, 4096)
    best = best_completion("tp=1,pp=8,vpp=2,ep=32,mbs=1", w, GPU_FULL_TE211, "mxfp8")
    assert parse_layout(layout_with_mtp(best.plan.pp_layout, w.model.mtp_num_layers)) == \
        parse_layout("Et*4|(t*4|)*14tmL")
