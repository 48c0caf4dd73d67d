"""`plans --rank` finds the exact top of a space by per-parallel-point bounds
(`tuner.rank.train.rank_space_top`): the same pool as scoring every realizable plan, with most points
skipped; a bound that a scored plan beats makes it score everything instead."""
import pytest

from clusters import load_cluster
from specs.models import load_model
from specs.stack import GPU_FULL
from specs.workload import Workload
from tuner.rank import train as screen
from tuner.space.train import default_space


@pytest.fixture(autouse=True)
def _home(monkeypatch, tmp_path):
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))


def _rows(pool):
    return [(s.effective, round(s.tokens_per_s_per_gpu, 6), round(s.peak_memory_gib, 6)) for s in pool]


@pytest.mark.parametrize("model,gpus,precision,keep", [("tiny-moe-shared", 8, "bf16", 20),
                                                       ("qwen3-30b-a3b", 16, "fp8", 7)])
def test_pruned_top_equals_exhaustive_scoring(model, gpus, precision, keep):
    w = Workload(load_model(model), load_cluster("h100-sxm", gpus), 256, 4096 if gpus > 8 else 256)
    space = default_space(w, GPU_FULL, precision, level="full" if gpus == 8 else "core")
    shard, n = (0, 1) if gpus == 8 else (1, 4)
    exhaustive = screen.rank_space(w, space, GPU_FULL, shard, n, keep=keep, per_layout=False)
    top = screen.rank_space_top(w, space, GPU_FULL, shard, n, keep=keep)
    assert not top.exhaustive and not top.bound_violated
    assert top.pruned > 0 and top.pruned_points > 0  # it did skip work
    assert top.seen == exhaustive.seen and len(top.pool) == keep
    assert _rows(top.pool) == _rows(exhaustive.pool)
    # prune=False is the exhaustive ranking itself
    full = screen.rank_space_top(w, space, GPU_FULL, shard, n, keep=keep, prune=False)
    assert full.exhaustive and _rows(full.pool) == _rows(exhaustive.pool)


def test_a_violated_bound_falls_back_to_scoring_everything(monkeypatch):
    """Bounds evaluated on a pessimistic plan (full recompute) are beaten by scored plans: the
    ranker notices and scores every plan, so the answer stays exact."""
    w = Workload(load_model("tiny-moe-shared"), load_cluster("h100-sxm", 8), 256, 256)
    space = default_space(w, GPU_FULL, "bf16", level="full")
    monkeypatch.setattr(screen, "_RECOMPUTE_RESET", dict(recompute="full", recompute_modules=(),
                                                         recompute_method="uniform", recompute_layers=1))
    top = screen.rank_space_top(w, space, GPU_FULL, keep=10)
    assert top.bound_violated and top.exhaustive and top.pruned == 0
    assert _rows(top.pool) == _rows(screen.rank_space(w, space, GPU_FULL, keep=10, per_layout=False).pool)


# (model, cluster, gpus, gbs, seq, precision, shards, stride): a sample of shard 0 of `shards`, every
# `stride`-th realizable plan; the whole space where it is small (tiny-moe on CPU: 400 plans).
# qwen3 on b200 at short sequences is launch-bound: there recompute's extra backward compute ran
# under the CPU launch floor yet lengthened the DP overlap window, and shortened the step.
@pytest.mark.parametrize("model,kind,gpus,gbs,seq,precision,shards,stride", [
    ("mixtral-8x7b", "h100-sxm", 64, 256, 4096, "bf16", 37, 7),
    ("deepseek-v3", "h100-sxm", 1024, 8192, 4096, "fp8", 37, 7),
    ("qwen3-30b-a3b", "b200", 16, 64, 4096, "fp8", 37, 7),
    ("qwen3-30b-a3b", "b200", 16, 16, 512, "fp8", 8, 3),
    ("tiny-moe", "cpu-local", 2, 16, 256, "bf16", 1, 1)])
def test_recompute_never_shortens_a_predicted_step(model, kind, gpus, gbs, seq, precision, shards, stride):
    """The one property of the cost model the bounds rest on, checked on the real model for a
    sample of every preset's realizable plans with recompute: resetting recompute never makes the
    predicted step longer. If the model's physics ever breaks it, this fails (and rank_space_top
    would fall back to exhaustive scoring when it sees a scored plan beat its bound)."""
    import cost_model
    from specs.stack import cpu_profile
    from tuner.space.train import iter_realizable
    w = Workload(load_model(model), load_cluster(kind, gpus), gbs, seq)
    profile = cpu_profile() if kind == "cpu-local" else GPU_FULL
    # the full space where walking it is cheap; the core one (fewer schedule options) for the big ones
    space = default_space(w, profile, precision, level="full" if gpus <= 64 and seq <= 512 or kind == "h100-sxm"
                          and gpus <= 64 else "core")
    plans = [p for i, p in enumerate(iter_realizable(space, w, profile, 0, shards))
             if p.recompute != "none" and i % stride == 0][:3000]
    assert len(plans) > 100
    reset = [p.replace(**screen._RECOMPUTE_RESET) for p in plans]
    a = cost_model.predict_arrays(w, plans)["step_time_s"]
    b = cost_model.predict_arrays(w, reset)["step_time_s"]
    assert (a >= b * (1 - 1e-12)).all(), [plans[i].canonical() for i in range(len(plans)) if a[i] < b[i] * (1 - 1e-12)][:3]


def test_ranking_deeper_reuses_the_bounds_and_matches_exhaustive():
    """`enough` (what `plans --rank` passes when predicted-equal variants crowd the list) doubles
    keep until it holds; the pool is then the exhaustive one at the final keep."""
    w = Workload(load_model("tiny-moe-shared"), load_cluster("h100-sxm", 8), 256, 256)
    space = default_space(w, GPU_FULL, "bf16", level="full")
    asked = []

    def enough(pool):
        asked.append(len(pool))
        return len(pool) >= 40

    top = screen.rank_space_top(w, space, GPU_FULL, keep=10, enough=enough)
    assert asked == [10, 20, 40] and not top.exhaustive and top.pruned > 0
    assert _rows(top.pool) == _rows(screen.rank_space(w, space, GPU_FULL, keep=40, per_layout=False).pool)
