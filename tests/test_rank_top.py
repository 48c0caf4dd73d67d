"""`plans --rank` finds the exact top of a space by per-parallel-point bounds
(`tuner.screen.rank_space_top`): the same pool as scoring every realizable plan, with most points
skipped; a bound that a scored plan beats makes it score everything instead."""
import pytest

from clusters import load_cluster
from specs.models import load_model
from specs.stack import GPU_FULL
from specs.workload import Workload
from tuner import screen
from tuner.space import default_space


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
