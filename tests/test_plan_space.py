"""Plans: canonical round-trip and partial completion; the space: sharded == unsharded, and the
cached counting equals checking every plan one by one."""
import itertools
import random
from collections import Counter

import pytest

from clusters import load_cluster
from specs.errors import PlanSyntaxError
from specs.models import load_model
from specs.plan import Plan
from specs.stack import GPU_FULL, cpu_profile
from specs.workload import Workload
from tuner.rank.complete import complete_plan
from tuner.space.megatron_rules import check, check_parallel
from tuner.space.train import count_parallel_points, default_space, iter_plans, iter_realizable, summarize


def _random_plan(rng):
    return Plan(tp=rng.choice([1, 2, 4, 8]), cp=rng.choice([1, 2]), pp=rng.choice([1, 2, 4, 8]),
                vpp=rng.choice([1, 2, 4]), ep=rng.choice([1, 8, 64]), etp=rng.choice([1, 2]),
                mbs=rng.choice([1, 2]), recompute=rng.choice(["none", "selective", "full"]),
                recompute_modules=rng.choice([(), ("core_attn", "moe_act"), ("mla_up_proj",)]),
                recompute_method=rng.choice(["", "uniform", "block"]), recompute_layers=rng.choice([0, 1, 3]),
                dist_opt=rng.random() < .5, overlap_grad_reduce=rng.random() < .5,
                overlap_param_gather=rng.random() < .5, shared_expert_overlap=rng.random() < .5,
                a2a_overlap=rng.random() < .5, pp_first=rng.choice([0, 5]), pp_last=rng.choice([0, 3]),
                pp_layout=rng.choice(["", "Et|(tt|)*30L", "Et*3|(tt|)*29,mL"]),
                grouped_gemm=rng.random() < .5, dispatcher=rng.choice(["alltoall", "allgather", "flex"]),
                flex_backend=rng.choice(["", "deepep", "hybridep"]),
                precision=rng.choice(["bf16", "fp8-blockwise", "mxfp8"]))


def test_canonical_string_round_trips_exactly():
    rng = random.Random(0)
    for _ in range(500):
        p = _random_plan(rng)
        s = p.canonical()
        assert Plan.parse(s) == p
        assert Plan.parse(s).canonical() == s
        assert hash(Plan.parse(s)) == hash(p)
    assert Plan().canonical().startswith("tp=1,cp=1,pp=1,vpp=1,ep=1,etp=1,mbs=1,")


@pytest.mark.parametrize("bad", ["tp=0", "tp=2,tp=4", "foo=1", "tp", "dispatcher=ring", "dist_opt=maybe",
                                 "recompute_modules=core_attn+bogus"])
def test_malformed_plans_are_one_clear_error(bad):
    with pytest.raises(PlanSyntaxError) as e:
        Plan.parse(bad)
    assert "\n" not in str(e.value)


def test_partial_plan_completes_with_defaults():
    w = Workload(load_model("qwen3-235b-a22b"), load_cluster("h100-sxm", 256), 8192, 4096)
    p = complete_plan("tp=2,pp=8,vpp=4,ep=32,mbs=1", w, GPU_FULL, "bf16")
    assert (p.tp, p.pp, p.vpp, p.ep, p.etp, p.cp) == (2, 8, 4, 32, 1, 1)
    assert p.dist_opt and p.overlap_grad_reduce and p.overlap_param_gather and p.grouped_gemm
    # 94 layers do not split over 32 chunks, 94 + embedding + loss do: the split flags NVIDIA's
    # recipes use are filled in, the same chunks as the most balanced explicit layout
    assert p.pp_layout == "" and p.pp_embedding and p.pp_loss
    assert check(w, p, GPU_FULL) == []
    from specs.pipeline import split_layers
    assert split_layers(94, 8, 4, embedding=True, loss=True).chunks == \
        split_layers(94, 8, 4, layout="Ett|(ttt|)*30ttL").chunks
    even = complete_plan("pp=2", w, GPU_FULL, "bf16")
    assert even.pp_layout == "" and not (even.pp_first or even.pp_last)
    cpu = Workload(load_model("tiny-moe"), load_cluster("cpu-local", 2), 16, 256)
    q = complete_plan("ep=2", cpu, cpu_profile(), "bf16")
    assert not (q.dist_opt or q.overlap_param_gather or q.grouped_gemm)
    assert check(cpu, q, cpu_profile()) == []


def _small():
    """A slice of the full space small enough to check plan by plan (every 17th schedule and
    every 5th kernel option keeps rules of every tier in play)."""
    import dataclasses
    w = Workload(load_model("tiny-moe-shared"), load_cluster("h100-sxm", 8), 64, 256)
    space = default_space(w, GPU_FULL, "fp8", level="full")
    space = dataclasses.replace(space, schedules=space.schedules[::17], kernels=space.kernels[::5],
                                vpp=(1, 2), mbs=(1, 4), cp=(1, 2))
    return w, space


def test_sharded_enumeration_equals_unsharded():
    w, space = _small()
    full = list(iter_plans(space))
    shards = [list(iter_plans(space, i, 3)) for i in range(3)]
    assert sorted(map(str, full)) == sorted(str(p) for s in shards for p in s)
    assert sum(map(len, shards)) == len(full) == len(set(full))
    real = list(iter_realizable(space, w, GPU_FULL))
    real_sh = [p for i in range(3) for p in iter_realizable(space, w, GPU_FULL, i, 3)]
    assert sorted(map(str, real)) == sorted(map(str, real_sh))
    sums = [summarize(space, w, GPU_FULL, i, 3) for i in range(3)]
    whole = summarize(space, w, GPU_FULL)
    assert whole.total == sum(s.total for s in sums) == len(full)
    assert whole.realizable == sum(s.realizable for s in sums) == len(real)


def test_cached_counting_equals_plan_by_plan_check():
    w, space = _small()
    counts, ok = Counter(), 0
    plans = list(iter_plans(space))
    for p in plans:
        reasons = check(w, p, GPU_FULL)
        ok += not reasons
        # a plan rejected at tier 1 is counted under its tier-1 reasons only (summarize's rule)
        tier1 = check_parallel(w, p, GPU_FULL)
        counts.update({r.code for r in (tier1 or reasons)})
    s = summarize(space, w, GPU_FULL)
    assert s.total == len(plans)
    assert s.realizable == ok > 0
    assert dict(s.rejections) == dict(counts)
    assert {str(p) for p in iter_realizable(space, w, GPU_FULL)} == {str(p) for p in plans if not check(w, p, GPU_FULL)}


def test_enumeration_is_a_stream():
    w = Workload(load_model("deepseek-v3"), load_cluster("h100-sxm", 1024), 8192, 4096)
    space = default_space(w, GPU_FULL, "fp8")
    it = iter_plans(space)
    first = list(itertools.islice(it, 1000))  # a generator: nothing is materialised up front
    assert len(first) == 1000 and len(set(first)) == 1000
    assert count_parallel_points(space) * space.options_per_point > 10 ** 8
