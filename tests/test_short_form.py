"""Plans as a person reads them: the short form completes back to the same plan; plans Megatron runs
identically share one effective plan; ranking (one engine for `plans --rank` and the screening actors)
keeps the best distinct plans, exactly as scoring every plan one by one would."""
import random
import zlib

import pytest

import cost_model
from clusters import load_cluster
from cost_model.plans import PlanArrays
from specs.models import load_model
from specs.plan import Plan, parse_fields
from specs.stack import GPU_FULL, GPU_NO_EP_LIBS, GPU_NO_TE, cpu_profile
from specs.workload import Workload
from tuner.rank.complete import complete_plan, effective_plan, short_form
from tuner.rank.train import _prune, _score_chunk, rank_plans, rank_space, score_shard
from tuner.space.train import default_space, iter_realizable


def _random_plan(rng):
    return Plan(tp=rng.choice([1, 2, 4]), cp=rng.choice([1, 2]), pp=rng.choice([1, 2, 3, 4, 8]),
                vpp=rng.choice([1, 2, 4]), ep=rng.choice([1, 2, 8]), etp=rng.choice([1, 2]),
                mbs=rng.choice([1, 2]), recompute=rng.choice(["none", "selective", "full"]),
                recompute_modules=rng.choice([(), ("core_attn",), ("core_attn", "moe_act")]),
                recompute_method=rng.choice(["", "uniform", "block"]), recompute_layers=rng.choice([0, 1, 3]),
                dist_opt=rng.random() < .5, overlap_grad_reduce=rng.random() < .5,
                overlap_param_gather=rng.random() < .5, shared_expert_overlap=rng.random() < .5,
                a2a_overlap=rng.random() < .5, pp_first=rng.choice([0, 0, 5]), pp_last=rng.choice([0, 0, 3]),
                pp_layout=rng.choice(["", "", "Et|(tt|)*30L"]),
                grouped_gemm=rng.random() < .5, dispatcher=rng.choice(["alltoall", "allgather", "flex"]),
                flex_backend=rng.choice(["", "deepep", "hybridep"]),
                precision=rng.choice(["bf16", "fp8-blockwise", "fp8-tensorwise"]))


WORKLOADS = [("mixtral-8x7b", "h100-sxm", 64, 256, 4096), ("deepseek-v3", "h100-sxm", 1024, 8192, 4096),
             ("tiny-moe", "cpu-local", 2, 16, 256), ("qwen3-30b-a3b", "b200", 16, 64, 4096)]


@pytest.mark.parametrize("spec", WORKLOADS, ids=[w[0] for w in WORKLOADS])
@pytest.mark.parametrize("profile", [GPU_FULL, GPU_NO_EP_LIBS, GPU_NO_TE, cpu_profile()], ids=lambda p: p.name)
def test_short_form_completes_back_to_the_same_plan(spec, profile):
    model, kind, gpus, gbs, seq = spec
    w = Workload(load_model(model), load_cluster(kind, gpus), gbs, seq)
    rng = random.Random(zlib.crc32(f"{model}/{profile.name}".encode()))
    canonical_fallbacks = 0
    for _ in range(300):
        p = _random_plan(rng)
        s = short_form(p, w, profile)
        assert complete_plan(s, w, profile) == p, (p.canonical(), s)
        canonical_fallbacks += s == p.canonical()
    assert canonical_fallbacks == 0  # every plan has a partial string that completes to it


def test_short_form_is_what_the_user_left_out():
    w = Workload(load_model("mixtral-8x7b"), load_cluster("h100-sxm", 64), 256, 4096)
    for given in ("", "ep=8", "tp=2,pp=4,vpp=2,ep=8,mbs=2", "ep=8,dispatcher=flex,flex_backend=deepep",
                  "pp=4,recompute=full,recompute_layers=2", "ep=8,dist_opt=0", "precision=fp8-blockwise"):
        p = complete_plan(given, w, GPU_FULL)
        assert parse_fields(short_form(p, w, GPU_FULL)) == parse_fields(given), given
    cpu = Workload(load_model("tiny-moe"), load_cluster("cpu-local", 2), 16, 256)
    # the completion defaults differ by stack, and so does what the short form leaves out
    p = complete_plan("ep=2", cpu, cpu_profile())
    assert short_form(p, cpu, cpu_profile()) == "ep=2"
    # (overlap_param_gather follows dist_opt and overlap_grad_reduce: no need to write it)
    assert set(parse_fields(short_form(p, cpu, GPU_FULL))) == {"ep", "dist_opt", "overlap_grad_reduce", "grouped_gemm",
                                                                  "permute_fusion", "router_fusion"}


def test_realizable_plans_have_short_forms():
    w = Workload(load_model("qwen3-30b-a3b"), load_cluster("h100-sxm", 16), 1024, 4096)
    space = default_space(w, GPU_FULL, "bf16", level="core")
    for i, p in enumerate(iter_realizable(space, w, GPU_FULL, 0, 64)):
        if i % 97:
            continue
        s = short_form(p, w, GPU_FULL)
        assert complete_plan(s, w, GPU_FULL) == p and len(s) < len(p.canonical()) // 2


# ---- effective plans -------------------------------------------------------------------------------
def test_effective_plan_merges_only_what_megatron_ignores():
    mixtral = load_model("mixtral-8x7b")  # no shared experts
    base = Plan(ep=8)
    for p in (base.replace(shared_expert_overlap=True), base.replace(flex_backend="deepep"),
              base.replace(recompute_method="block", recompute_layers=2)):
        assert effective_plan(p, mixtral) == effective_plan(base, mixtral) == base
    # core_attn alone is Megatron's default module list
    assert effective_plan(Plan(ep=8, recompute="selective", recompute_modules=("core_attn",)), mixtral) == \
        effective_plan(Plan(ep=8, recompute="selective", recompute_modules=()), mixtral)
    assert effective_plan(Plan(recompute="selective", recompute_modules=("moe_act", "core_attn")), mixtral) == \
        effective_plan(Plan(recompute="selective", recompute_modules=("core_attn", "moe_act")), mixtral)
    # ep*etp == 1: the dispatchers only permute locally
    assert effective_plan(Plan(dispatcher="allgather"), mixtral) == Plan()
    # what Megatron does run differently stays apart
    for a, b in [(Plan(ep=8, dispatcher="allgather"), Plan(ep=8)), (Plan(ep=8, a2a_overlap=True), Plan(ep=8)),
                 (Plan(ep=8, overlap_grad_reduce=False), Plan(ep=8)), (Plan(pp=2, pp_first=3), Plan(pp=2))]:
        assert effective_plan(a, mixtral) != effective_plan(b, mixtral)
    shared = load_model("tiny-moe-shared")
    assert effective_plan(base.replace(shared_expert_overlap=True), shared) != effective_plan(base, shared)
    assert effective_plan(base, mixtral) is base  # no copy when nothing is ignored


# ---- the ranking engine ----------------------------------------------------------------------------
def _cpu():
    return Workload(load_model("tiny-moe"), load_cluster("cpu-local", 2), 16, 256)


def test_rank_plans_equals_scoring_every_plan(monkeypatch, tmp_path):
    """The vectorised ranker keeps what a brute-force sort over every plan's prediction gives:
    the best distinct configurations, and (per_layout) the best of every layout."""
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    w = _cpu()
    prof = cpu_profile()
    plans = list(iter_realizable(default_space(w, prof, "bf16"), w, prof))
    r = cost_model.predict_arrays(w, plans)
    rows = sorted(((-float(r["tokens_per_s_per_gpu"][i]), p.canonical(), p) for i, p in enumerate(plans)
                   if r["fits"][i]), key=lambda x: x[:2])
    expect, configs = [], set()
    for _, _, p in rows:
        e = effective_plan(p, w.model)
        if e not in configs:
            configs.add(e)
            expect.append(e)
    for chunk in (37, 4096):  # many chunks or one: the same answer
        got = rank_plans(w, plans, keep=12, per_layout=False, chunk=chunk)
        assert got.seen == len(plans) and got.memory_infeasible == int((~r["fits"]).sum())
        assert [Plan.parse(s.effective) for s in got.pool] == expect[:12]
        assert len({s.effective for s in got.pool}) == 12
    # per_layout adds the best plan of every parallel layout
    got = rank_plans(w, plans, keep=3, per_layout=True, chunk=50)
    layouts = {tuple(getattr(p, f) for f in ("tp", "cp", "pp", "vpp", "ep", "etp")) for _, _, p in rows}
    assert {s.layout for s in got.pool} == layouts
    assert len({s.effective for s in got.pool}) == len(got.pool)  # still one row per configuration


@pytest.mark.parametrize("profile", [GPU_FULL, cpu_profile()], ids=lambda p: p.name)
def test_ranking_a_space_as_columns_equals_ranking_its_plans(profile, monkeypatch, tmp_path):
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    w = Workload(load_model("tiny-moe-shared"), load_cluster("h100-sxm" if profile.gpu else "cpu-local", 8 if profile.gpu else 2),
                 64, 256)
    space = default_space(w, profile, "bf16", level="full")
    for shard, n, keep, per_layout in ((0, 8, 15, False), (3, 8, 40, True)):
        a = rank_space(w, space, profile, shard, n, keep=keep, per_layout=per_layout, chunk=500)
        b = rank_plans(w, iter_realizable(space, w, profile, shard, n), keep=keep, per_layout=per_layout, chunk=777)
        assert a.seen == b.seen > 0 and a.memory_infeasible == b.memory_infeasible
        # the same configurations with the same predictions; which of two plans with one effective
        # plan and one predicted throughput is shown may differ (the cost model's table lookups
        # batch per chunk, so such ties can differ in the last bit)
        assert sorted((s.effective, round(s.tokens_per_s_per_gpu, 3)) for s in a.pool) == \
            sorted((s.effective, round(s.tokens_per_s_per_gpu, 3)) for s in b.pool)


def test_chunk_selection_is_exact_for_screening(monkeypatch, tmp_path):
    """Pruning only the rows a chunk selects gives the pool that pruning all its rows gives."""
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    w = Workload(load_model("qwen3-30b-a3b"), load_cluster("h100-sxm", 16), 1024, 4096)
    plans = list(iter_realizable(default_space(w, GPU_FULL, "bf16", level="core"), w, GPU_FULL, 0, 16))[:3000]
    tables = cost_model.resolve_tables(w)
    cal = cost_model.resolve_calibration(w, None, tables)
    pa = PlanArrays.from_plans(plans)
    for keep in (5, 40):
        chosen, _ = _score_chunk(w, pa, plans.__getitem__, cal, tables, keep, True)
        everything, _ = _score_chunk(w, pa, plans.__getitem__, cal, tables, len(plans) + 1, True)
        assert len(chosen) < len(everything)
        assert _prune(chosen, keep, w.model) == _prune(everything, keep, w.model)
    n, pool = score_shard(w, GPU_FULL, "bf16", "core", 0, 64, keep=10)
    assert n > 0 and pool[:10] == sorted(pool, key=lambda s: (-s.tokens_per_s_per_gpu, s.plan))[:10]


def test_precision_fp8_in_a_plan_means_what_the_flag_means():
    w = Workload(load_model("mixtral-8x7b"), load_cluster("h100-sxm", 64), 256, 4096)
    assert complete_plan("ep=8,precision=fp8", w, GPU_FULL) == complete_plan("ep=8", w, GPU_FULL, "fp8")
    assert complete_plan("ep=8,precision=fp8", w, GPU_FULL).precision == "fp8-blockwise"
