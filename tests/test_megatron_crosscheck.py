"""Cross-checks against the real megatron-core: TransformerConfig's verdict on sampled plans, and
the rank groups of megatron.core.parallel_state.RankGenerator."""
import random
import warnings

import pytest

torch = pytest.importorskip("torch")
tc_mod = pytest.importorskip("megatron.core.transformer.transformer_config")
from megatron.core.parallel_state import RankGenerator  # noqa: E402

from clusters import load_cluster  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan  # noqa: E402
from specs.ranks import group_ranks, group_size_stride, nodes_spanned  # noqa: E402
from specs.stack import GPU_FULL  # noqa: E402
from specs.workload import Workload  # noqa: E402
from tuner.space.megatron_rules import check  # noqa: E402
from tuner.space.train import default_space, parallel_points  # noqa: E402

# Rules that TransformerConfig.__post_init__ itself enforces (the rest live in arguments.py,
# parallel_state and the schedules, which need a process group to exercise).
CONFIG_CODES = {"moe-bias-etp", "heads-div-tp", "groups-vs-tp", "layout-conflict", "recompute-args",
                "recompute-module", "a2a-overlap", "pp-layers", "flex-backend", "cuda-graph"}


def megatron_verdict(w, p: Plan):
    """True if megatron-core's TransformerConfig accepts the plan's config."""
    m = w.model
    kw = dict(
        num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
        num_query_groups=m.query_groups, ffn_hidden_size=m.ffn_hidden_size,
        tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vpp if p.vpp > 1 else None,
        context_parallel_size=p.cp, expert_model_parallel_size=p.ep, expert_tensor_parallel_size=p.etp,
        sequence_parallel=p.tp > 1, pipeline_dtype=torch.bfloat16, bf16=True,
        num_moe_experts=m.num_experts or None, moe_router_topk=m.moe_router_topk or 2,
        moe_ffn_hidden_size=m.moe_ffn_hidden_size or None,
        moe_shared_expert_intermediate_size=m.moe_shared_expert_ffn or None,
        moe_shared_expert_overlap=p.shared_expert_overlap,
        moe_token_dispatcher_type=p.dispatcher, moe_grouped_gemm=p.grouped_gemm,
        overlap_moe_expert_parallel_comm=p.a2a_overlap, add_bias_linear=m.attention_bias,
        gated_linear_unit=True,
    )
    if p.flex_backend:
        kw["moe_flex_dispatcher_backend"] = p.flex_backend
    if p.recompute != "none":
        kw["recompute_granularity"] = p.recompute
        kw["recompute_method"] = p.recompute_method or None
        kw["recompute_num_layers"] = p.recompute_layers or None
        if p.recompute_modules:
            kw["recompute_modules"] = list(p.recompute_modules)
    else:
        # 'none' with stray fields has no Megatron spelling: granularity None ignores the rest.
        if p.recompute_method or p.recompute_layers or p.recompute_modules:
            return False
    if p.pp_first:
        kw["num_layers_in_first_pipeline_stage"] = p.pp_first
    if p.pp_last:
        kw["num_layers_in_last_pipeline_stage"] = p.pp_last
    if p.pp_layout:
        kw["pipeline_model_parallel_layout"] = p.pp_layout
    kw.update(account_for_embedding_in_pipeline_split=p.pp_embedding, account_for_loss_in_pipeline_split=p.pp_loss)
    if p.cuda_graph_impl != "none":
        kw.update(cuda_graph_impl=p.cuda_graph_impl, cuda_graph_scope=",".join(p.cuda_graph_scope) or [])
    if m.mla:
        kw.update(multi_latent_attention=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg_cls = tc_mod.MLATransformerConfig if m.mla else tc_mod.TransformerConfig
            if m.mla:
                kw.update(q_lora_rank=m.q_lora_rank or None, kv_lora_rank=m.kv_lora_rank,
                          qk_head_dim=m.qk_head_dim, qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
                          v_head_dim=m.v_head_dim)
            cfg_cls(**kw)
        return True
    except (ValueError, AssertionError):
        return False


def _comparable(w, p: Plan) -> bool:
    """Plans whose every applicable rule is either config-enforced or absent: the even split
    divides (arguments.py checks that one), flex has a backend (config defaults it), and the
    rules outside TransformerConfig hold."""
    if p.dispatcher == "flex" and not p.flex_backend:
        return False
    if p.vpp > 1 and p.pp == 1:
        return False
    if not (p.pp_layout or p.pp_first or p.pp_last or p.pp_embedding or p.pp_loss) and w.model.num_layers % (p.pp * p.vpp):
        return False
    other = {r.code for r in check(w, p, GPU_FULL)} - CONFIG_CODES
    # rules not enforced by TransformerConfig must not be the only reason, else verdicts differ
    return not other


@pytest.mark.parametrize("model,gpus,gbs,seed", [
    ("mixtral-8x7b", 64, 512, 0), ("deepseek-v2-lite", 16, 256, 1), ("tiny-moe-shared", 8, 64, 2),
    ("gpt-oss-20b", 16, 256, 3),
])
def test_transformer_config_agrees_on_sampled_plans(model, gpus, gbs, seed):
    m = load_model(model)
    w = Workload(m, load_cluster("h100-sxm", gpus), gbs, min(4096, m.seq_length))
    space = default_space(w, GPU_FULL, "bf16", level="full")
    rng = random.Random(seed)
    points = list(parallel_points(space))
    pool = [Plan(**rng.choice(points), **rng.choice(space.schedules), **rng.choice(space.kernels))
            for _ in range(6000)]
    # add explicit pipeline variants (uneven, layout, conflicts) that the space does not list
    L = m.num_layers
    extras = [Plan(pp=2, pp_first=L // 2 - 1, pp_last=L // 2 + 1), Plan(pp=2, pp_first=L // 2 + 1),
              Plan(pp=2, vpp=2, pp_first=3), Plan(pp=2, pp_layout="E" + "t" * (L - 1) + "|tL"),
              Plan(pp=2, pp_layout="E" + "t" * L + "|L", pp_first=1),
              Plan(pp=2, pp_layout="Et|" + "t" * (L - 2) + "L")]
    plans = [p for p in pool if _comparable(w, p)][:250] + [p for p in extras if _comparable(w, p)]
    assert len(plans) >= 100
    accepted = rejected = 0
    for p in plans:
        ours = not ({r.code for r in check(w, p, GPU_FULL)} & CONFIG_CODES)
        theirs = megatron_verdict(w, p)
        assert ours == theirs, (p.canonical(), check(w, p, GPU_FULL))
        accepted += ours
        rejected += not ours
    assert accepted >= 20 and rejected >= 20


@pytest.mark.parametrize("world,tp,cp,pp,ep,etp", [
    (8, 2, 1, 2, 2, 1), (16, 1, 2, 2, 4, 2), (64, 2, 2, 2, 8, 1), (32, 4, 1, 1, 8, 4), (16, 1, 1, 4, 4, 1),
])
def test_rank_groups_match_megatron_rank_generator(world, tp, cp, pp, ep, etp):
    dp = world // (tp * cp * pp)
    edp = world // (etp * ep * pp)
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    expert = RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    for kind, gen, token in (("tp", dense, "tp"), ("cp", dense, "cp"), ("dp", dense, "dp"),
                             ("pp", dense, "pp"), ("ep", expert, "ep"), ("etp", expert, "tp"),
                             ("edp", expert, "dp")):
        ours = group_ranks(kind, tp, cp, pp, ep, etp, world)
        assert ours == sorted(sorted(g) for g in gen.get_ranks(token)), kind
        # node-crossing as the cost model sees it equals what the explicit groups say
        size, stride = group_size_stride(kind, tp, cp, pp, ep, etp, world)
        for per_node in (2, 4, 8):
            spans = max(len({r // per_node for r in g}) for g in ours)
            assert int(nodes_spanned(size, stride, per_node)) == spans, (kind, per_node)
