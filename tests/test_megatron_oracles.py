"""Realizability rules against megatron-core 0.16.1's own checks, on generated cases, without
processes: torch's fake process group under Megatron's real `parallel_state`, the real
micro-batch calculator, the real layer-split functions, `TransformerConfig.__post_init__` and
the real tensor-parallel helpers. Hypothesis draws the cases (derandomized, no example database).

Rule (tuner/space/megatron_rules.py RULES) -> the upstream check it is compared with here:
- world-div-tp-cp-pp, world-div-etp-ep-pp, vpp-needs-pp: `parallel_state.initialize_model_parallel`
  on a fake process group of the world size (also: dp and the tp/cp/dp/pp/ep/etp/edp rank groups
  of the first and last rank equal `specs.ranks.group_ranks`).
- gbs-div-mbs-dp: `num_microbatches_calculator.ConstantNumMicroBatchesCalculator`.
- pp-layers (even and first/last splits): `TransformerConfig.__post_init__` plus
  `get_num_layers_to_build` / `get_transformer_layer_offset` per (pp rank, virtual stage) against
  `specs.pipeline.split_layers`. Megatron accepts first+last > L on some splits (a middle stage
  with a negative count); we reject those, so there the check is one-way.
- vocab-div-tp: `tensor_parallel.utils.VocabUtility.vocab_range_from_global_vocab_size` (what
  VocabParallelEmbedding calls; the emitted script pins the padded vocab to the model's).
- ffn-div-tp, moe-ffn-div-etp, experts-div-ep: `megatron.core.utils.divide`, the call
  ColumnParallelLinear / the grouped experts / MoELayer make on those sizes.
- ep-needs-moe, shared-overlap, fp8-delayed-recompute, and the nine codes of
  test_megatron_crosscheck.CONFIG_CODES: `TransformerConfig.__post_init__`.

Rules with no process-free upstream counterpart, and why:
- interleave-microbatches: checked inside `forward_backward_pipelining_with_interleaving` at run
  time (needs model chunks and a p2p communicator): the real gloo trials cover it.
- seq-div-2cp, seq-div-tp-sp: enforced by TransformerEngine's context-parallel attention and the
  sequence-parallel scatter at run time (no config check in megatron-core; TE is absent here).
- opg-needs-dist-opt, opg-needs-ogr: Megatron-LM's `arguments.py validate_args` (training
  scripts, not megatron-core).
- flex-needs-tp-ep: `token_dispatcher.py` MoEFlexTokenDispatcher's constructor (needs DeepEP).
- fp8-hardware, fp8-gemm-dims, fp8-blockwise-sp: TransformerEngine's recipe and GEMM checks
  (TE is not installed on CPU).
- recompute-layers: `transformer_block.py _checkpointed_forward` at run time.
- dispatcher-needs-moe, policy-seq-le-max-pos: moetune's own hygiene/policy, not Megatron rules.
- shared-expert-bias: asserted in `SharedExpertMLP.__init__` (builds the module: weights and a
  TP group); heads-div-tp etc. are in CONFIG_CODES.
- stack-missing, stack-cpu: properties of the target stack, not of Megatron.
"""
from __future__ import annotations

import dataclasses
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator  # noqa: E402
from megatron.core.tensor_parallel.utils import VocabUtility  # noqa: E402
from megatron.core.transformer.transformer_block import get_num_layers_to_build  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset  # noqa: E402
from megatron.core.utils import divide  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from clusters import load_cluster  # noqa: E402
from specs.errors import LayoutError  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.pipeline import split_layers  # noqa: E402
from specs.plan import Plan  # noqa: E402
from specs.ranks import group_ranks  # noqa: E402
from specs.stack import GPU_FULL  # noqa: E402
from specs.workload import Workload  # noqa: E402
from tuner.space.megatron_rules import check  # noqa: E402

ORACLE = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
DEGREES = st.sampled_from([1, 1, 2, 2, 3, 4, 4, 8, 16])


def _codes(w, p):
    return {r.code for r in check(w, p, GPU_FULL)}


def _workload(world, model="deepseek-v3", gbs=4096, seq=4096):
    return Workload(load_model(model), load_cluster("h100-sxm", world), gbs, seq)


def _megatron_model_parallel(world, p: Plan, rank=0):
    """Megatron's verdict and groups for the plan on `world` ranks, seen from `rank`."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
            virtual_pipeline_model_parallel_size=p.vpp if p.vpp > 1 else None, context_parallel_size=p.cp,
            expert_model_parallel_size=p.ep, expert_tensor_parallel_size=p.etp, create_gloo_process_groups=False)
        groups = {k: sorted(dist.get_process_group_ranks(g())) for k, g in (
            ("tp", ps.get_tensor_model_parallel_group), ("cp", ps.get_context_parallel_group),
            ("dp", lambda: ps.get_data_parallel_group(with_context_parallel=False)),
            ("pp", ps.get_pipeline_model_parallel_group), ("ep", ps.get_expert_model_parallel_group),
            ("etp", ps.get_expert_tensor_parallel_group), ("edp", ps.get_expert_data_parallel_group))}
        return None, ps.get_data_parallel_world_size(), groups
    except (RuntimeError, AssertionError, ValueError) as e:
        return str(e), None, None
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


@ORACLE
@given(world=st.sampled_from([4, 6, 8, 16, 24, 32, 48, 64, 96, 128]), tp=DEGREES, cp=st.sampled_from([1, 2, 3]),
       pp=DEGREES, ep=DEGREES, etp=st.sampled_from([1, 2, 4]), vpp=st.sampled_from([1, 2]))
def test_world_divisibility_dp_and_rank_groups_match_parallel_state(world, tp, cp, pp, ep, etp, vpp):
    p = Plan(tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, vpp=vpp)
    codes = _codes(_workload(world), p) & {"world-div-tp-cp-pp", "world-div-etp-ep-pp", "vpp-needs-pp"}
    err, dp, groups = _megatron_model_parallel(world, p)
    assert bool(codes) == (err is not None), (p.canonical(), world, codes, err)
    if err is None:
        assert dp == p.dp(world)
        for rank in (0, world - 1):
            if rank:
                _, _, groups = _megatron_model_parallel(world, p, rank)
            for kind, members in groups.items():
                ours = [g for g in group_ranks(kind, tp, cp, pp, ep, etp, world) if rank in g]
                assert ours == [members], (kind, rank, p.canonical(), world)


@ORACLE
@given(world=st.sampled_from([8, 16, 32, 64]), tp=DEGREES, pp=DEGREES, mbs=st.sampled_from([1, 2, 3, 4]),
       gbs=st.integers(1, 512))
def test_gbs_divisibility_matches_the_microbatch_calculator(world, tp, pp, mbs, gbs):
    p = Plan(tp=tp, pp=pp, mbs=mbs)
    if world % (tp * pp):
        return
    ours = "gbs-div-mbs-dp" in _codes(_workload(world, gbs=gbs), p)
    try:
        calc = ConstantNumMicroBatchesCalculator(gbs, mbs, p.dp(world), False, 0)
        theirs = False
        assert calc.get() == gbs // (mbs * p.dp(world))
    except AssertionError:
        theirs = True
    assert ours == theirs, (p.canonical(), world, gbs)


def _megatron_split(L, pp, vpp, first, last):
    """{(pp_rank, vp_stage): (count, offset)} as megatron-core builds it, or None if its config refuses."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = TransformerConfig(
                num_layers=L, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=pp,
                virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, pipeline_dtype=torch.bfloat16,
                num_layers_in_first_pipeline_stage=first or None, num_layers_in_last_pipeline_stage=last or None)
    except (ValueError, AssertionError):
        return None
    out = {}
    try:  # the builders assert the even split's divisibility (the config does not)
        for r in range(pp):
            for v in range(vpp):
                vs = v if vpp > 1 else None
                out[(r, v)] = (get_num_layers_to_build(cfg, vp_stage=vs, pp_rank=r),
                               get_transformer_layer_offset(cfg, vp_stage=vs, pp_rank=r))
    except AssertionError:
        return None
    return out


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(L=st.integers(2, 64), pp=st.integers(2, 8), vpp=st.sampled_from([1, 1, 2, 3, 4]),
       first=st.sampled_from([0, 0, 1, 2, 3, 5]), last=st.sampled_from([0, 0, 1, 2, 3, 5]))
def test_layer_split_matches_megatron(L, pp, vpp, first, last):
    theirs = _megatron_split(L, pp, vpp, first, last)
    try:
        ours = split_layers(L, pp, vpp, first, last)
    except LayoutError:
        ours = None
    if theirs is None:
        assert ours is None, ("Megatron refuses a split we accept", L, pp, vpp, first, last)
        return
    if ours is None:
        # one-way: Megatron's config accepts first+last that leave a middle stage no (or negative)
        # layers, or a chunk with no layer; its builders then return such counts
        assert any(n <= 0 for n, _ in theirs.values()) or (first + last > L), (L, pp, vpp, first, last, theirs)
        return
    for (r, v), (n, off) in theirs.items():
        chunk = ours.chunks[r][v]
        assert len(chunk) == n, (L, pp, vpp, first, last, r, v)
        if n:
            assert chunk[0] == off, (L, pp, vpp, first, last, r, v)


def test_a_known_one_way_split():
    """Megatron's TransformerConfig accepts first=2, last=3 on a 4-layer pp=3 model (the middle
    stage gets -1 layers); split_layers rejects it."""
    assert _megatron_split(4, 3, 1, 2, 3) is not None
    with pytest.raises(LayoutError):
        split_layers(4, 3, 1, 2, 3)


@ORACLE
@given(vocab=st.integers(1000, 200000), tp=DEGREES)
def test_vocab_divisibility_matches_vocab_parallel_embedding(vocab, tp):
    m = load_model("tiny-moe")
    w = Workload(dataclasses.replace(m, vocab_size=vocab), load_cluster("h100-sxm", 16), 64, 256)
    ours = "vocab-div-tp" in _codes(w, Plan(tp=tp))
    try:
        VocabUtility.vocab_range_from_global_vocab_size(vocab, 0, tp)
        theirs = False
    except AssertionError:
        theirs = True
    assert ours == theirs


def _divides(n, d):
    try:
        divide(n, d)
        return True
    except AssertionError:
        return False


@ORACLE
@given(name=st.sampled_from(["deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v2-lite",
                             "tiny-moe-shared", "qwen3-235b-a22b"]),
       tp=DEGREES, ep=st.sampled_from([1, 2, 3, 4, 5, 8, 16, 64]), etp=st.sampled_from([1, 2, 3, 4, 8]))
def test_ffn_and_expert_divisibility_match_megatron_divide(name, tp, ep, etp):
    m = load_model(name)
    codes = _codes(_workload(1024 * 3, name), Plan(tp=tp, ep=ep, etp=etp))
    ffn_ok = ((not m.num_dense_layers or _divides(m.ffn_hidden_size, tp))
              and (not m.moe_shared_expert_ffn or _divides(m.moe_shared_expert_ffn, tp)))
    assert ("ffn-div-tp" not in codes) == ffn_ok
    assert ("moe-ffn-div-etp" not in codes) == _divides(m.moe_ffn_hidden_size, etp)
    assert ("experts-div-ep" not in codes) == _divides(m.num_experts, ep)


def _config_verdict(**kw):
    base = dict(num_layers=4, hidden_size=64, num_attention_heads=4, pipeline_dtype=torch.bfloat16, bf16=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            TransformerConfig(**{**base, **kw})
        return None
    except (ValueError, AssertionError) as e:
        return str(e)
    except TypeError as e:  # past the rule under test: a TransformerEngine version check, TE absent here
        return f"te-absent: {e}"


@ORACLE
@given(moe=st.booleans(), ep=st.sampled_from([1, 2, 4]), dispatcher=st.sampled_from(["alltoall", "allgather", "flex"]),
       overlap=st.booleans())
def test_ep_and_shared_overlap_rules_match_transformer_config(moe, ep, dispatcher, overlap):
    m = load_model("tiny-moe-shared")
    if not moe:  # the same model without experts
        m = dataclasses.replace(m, num_experts=0, moe_router_topk=0, moe_ffn_hidden_size=0, moe_shared_expert_count=0,
                                moe_shared_expert_ffn=0, moe_layers=(False,) * m.num_layers)
    p = Plan(ep=ep, dispatcher=dispatcher, flex_backend="deepep" if dispatcher == "flex" else "",
             shared_expert_overlap=overlap and moe)
    codes = _codes(Workload(m, load_cluster("h100-sxm", 8), 64, 256), p)
    kw = dict(expert_model_parallel_size=ep, moe_token_dispatcher_type=dispatcher,
              moe_shared_expert_overlap=p.shared_expert_overlap)
    if m.is_moe:
        kw.update(num_moe_experts=m.num_experts, moe_router_topk=m.moe_router_topk,
                  moe_ffn_hidden_size=m.moe_ffn_hidden_size, moe_shared_expert_intermediate_size=m.moe_shared_expert_ffn or None)
    err = _config_verdict(**kw)
    ours = codes & {"ep-needs-moe", "shared-overlap"}
    assert bool(ours) == (err is not None and ("expert-parallel" in err or "shared_expert_overlap" in err)), (
        p.canonical(), ours, err)


@pytest.mark.parametrize("precision,mods", [("fp8-delayed", ("moe_act",)), ("fp8-delayed", ("layernorm",)),
                                            ("fp8-delayed", ("core_attn",)), ("fp8-tensorwise", ("core_attn",))])
def test_fp8_delayed_recompute_matches_transformer_config(precision, mods):
    w = _workload(8, "tiny-moe-shared", gbs=64, seq=256)
    p = Plan(recompute="selective", recompute_modules=mods, precision=precision)
    ours = "fp8-delayed-recompute" in _codes(w, p)
    err = _config_verdict(recompute_granularity="selective", recompute_modules=list(mods), fp8="e4m3",
                          fp8_recipe=precision.split("-")[1], num_moe_experts=8, moe_ffn_hidden_size=64,
                          moe_grouped_gemm=True)
    assert ours == (err is not None and "Delayed scaling" in err), err


@pytest.mark.parametrize("precision,dist_opt", [("fp8-tensorwise", True), ("bf16", True), ("fp8-delayed", True),
                                                ("fp8-tensorwise", False)])
def test_fp8_param_matches_transformer_config_and_arguments(precision, dist_opt):
    """fp8_param (--fp8-param-gather): TransformerConfig refuses it without fp8 ("fp8_param must be
    used together with fp8 mode"); Megatron-LM's validate_args without the distributed optimizer
    (arguments.py, not importable here: asserted on our side only)."""
    w = _workload(8, "tiny-moe-shared", gbs=64, seq=256)
    p = Plan(precision=precision, fp8_param=True, dist_opt=dist_opt, overlap_param_gather=dist_opt)
    ours = [r.sentence for r in check(w, p, GPU_FULL) if r.code == "fp8-param"]
    fp8 = {} if precision == "bf16" else {"fp8": "e4m3", "fp8_recipe": precision.split("-")[1]}
    err = _config_verdict(fp8_param=True, **fp8)
    assert any("fp8 precision" in s for s in ours) == (err is not None and "fp8_param" in err), (ours, err)
    assert any("distributed optimizer" in s for s in ours) == (not dist_opt)
    # the emitted flag rebuilds the same TransformerConfig field
    if not ours:
        from tuner.emit.megatron import plan_args
        assert "--fp8-param-gather" in plan_args(w, p, GPU_FULL)


@pytest.mark.parametrize("overlap,graphs,te", [(True, False, "2.9.0"), (False, False, "2.9.0"), (True, True, "2.9.0"),
                                               (True, True, "2.11.0"), (True, True, "2.10.0")])
def test_delay_wgrad_matches_transformer_config(monkeypatch, overlap, graphs, te):
    """delay_wgrad (--delay-wgrad-compute): TransformerConfig asserts it needs
    overlap_moe_expert_parallel_comm, and TE >= 2.10 with TE (partial) CUDA graphs; the TE version
    megatron-core reads is set to the stack profile's (TE is absent here)."""
    import megatron.core.transformer.transformer_config as tc
    from packaging.version import Version

    from specs.stack import GPU_FULL
    monkeypatch.setattr(tc, "is_te_min_version", lambda v, check_equality=True: Version(te) >= Version(v))
    profile = dataclasses.replace(GPU_FULL, transformer_engine=te)
    w = _workload(8, "tiny-moe-shared", gbs=64, seq=256)
    graph = dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",)) if graphs else {}
    p = Plan(ep=2, a2a_overlap=overlap, delay_wgrad=True, **graph)
    ours = [r.sentence for r in check(w, p, profile) if r.code == "delay-wgrad"]
    m = w.model
    kw = dict(num_moe_experts=m.num_experts, moe_router_topk=m.moe_router_topk, moe_ffn_hidden_size=m.moe_ffn_hidden_size,
              expert_model_parallel_size=2, moe_grouped_gemm=True, moe_token_dispatcher_type="alltoall",
              overlap_moe_expert_parallel_comm=overlap, delay_wgrad_compute=True)
    if graphs:
        kw.update(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn"])
    err = _config_verdict(**kw)
    refused = err is not None and "delay_wgrad_compute" in err
    assert bool(ours) == refused, (ours, err)
    if not ours:  # the emitted flags rebuild the same TransformerConfig fields
        from tuner.emit.megatron import plan_args
        args = plan_args(w, p, profile)
        assert "--delay-wgrad-compute" in args and "--overlap-moe-expert-parallel-comm" in args


@pytest.mark.parametrize("te,fused", [("", True), ("", False), ("2.1.0", True), ("2.0.0", True), ("2.9.0", False)])
def test_permute_fusion_matches_transformer_config(monkeypatch, te, fused):
    """permute_fusion (--moe-permute-fusion): TransformerConfig imports TE's fused_permute /
    fused_unpermute / fused_sort_chunks_by_index from moe_utils and refuses the option where they are
    missing (no TE: the import fails) or None (TE < 2.1: "fused permutation is not available").
    TE is absent here, so a profile's TE is matched by giving moe_utils what that TE would."""
    import megatron.core.transformer.moe.moe_utils as mu

    from specs.stack import GPU_FULL
    names = ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
             "fused_sort_chunks_by_index_with_probs", "fused_unpermute")
    if te:
        ok = tuple(int(x) for x in te.split(".")) >= (2, 1)
        for name in names:
            monkeypatch.setattr(mu, name, object() if ok else None, raising=False)
    profile = dataclasses.replace(GPU_FULL, transformer_engine=te)
    w = _workload(8, "tiny-moe-shared", gbs=64, seq=256)
    p = Plan(ep=2, permute_fusion=fused)
    ours = [r.sentence for r in check(w, p, profile) if r.code == "stack-missing" and "permute_fusion" in r.sentence]
    m = w.model
    try:
        err = _config_verdict(num_moe_experts=m.num_experts, moe_router_topk=m.moe_router_topk,
                              moe_ffn_hidden_size=m.moe_ffn_hidden_size, expert_model_parallel_size=2,
                              moe_grouped_gemm=True, moe_permute_fusion=fused)
    except ImportError as e:  # no TE at all: megatron-core cannot import the fused functions
        err = f"import: {e}"
    refused = err is not None and ("fused permutation is not available" in err or "fused_permute" in err)
    assert bool(ours) == refused, (ours, err)
    # the emitted flag is the plan's field, and it rebuilds the same TransformerConfig field
    from tuner.emit.megatron import plan_args
    assert ("--moe-permute-fusion" in plan_args(w, p, profile)) == fused


@pytest.mark.parametrize("te,fused", [("", True), ("", False), ("2.6.0", True), ("2.7.0", True), ("2.9.0", False)])
def test_router_fusion_matches_megatron_core(monkeypatch, te, fused):
    """router_fusion (--moe-router-fusion): megatron-core checks it where the router runs, not in
    TransformerConfig: moe_utils.topk_routing_with_score_function(fused=True) raises unless TE's
    fused_topk_with_score_function exists, which megatron-core's TE extension defines from TE 2.7.
    TE is absent here, so a profile's TE is matched by giving moe_utils what that TE would."""
    import megatron.core.transformer.moe.moe_utils as mu

    from specs.stack import GPU_FULL
    if te:
        ok = tuple(int(x) for x in te.split(".")) >= (2, 7)
        monkeypatch.setattr(mu, "HAVE_TE", True)
        monkeypatch.setattr(mu, "fused_topk_with_score_function",
                            (lambda logits, topk, **kw: ("fused", topk)) if ok else None, raising=False)
    profile = dataclasses.replace(GPU_FULL, transformer_engine=te)
    w = _workload(8, "tiny-moe-shared", gbs=64, seq=256)
    p = Plan(ep=2, router_fusion=fused)
    ours = [r.sentence for r in check(w, p, profile) if r.code == "stack-missing" and "router_fusion" in r.sentence]
    logits = torch.randn(16, w.model.num_experts)
    try:
        mu.topk_routing_with_score_function(logits, w.model.moe_router_topk, fused=fused)
        err = None
    except ValueError as e:
        err = str(e)
    assert bool(ours) == (err is not None and "fused_topk_with_score_function" in err), (ours, err)
    from tuner.emit.megatron import plan_args
    assert ("--moe-router-fusion" in plan_args(w, p, profile)) == fused
