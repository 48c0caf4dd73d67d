"""The embedding/loss pipeline split (`pp_embedding`, `pp_loss`) and CUDA graphs
(`cuda_graph_impl`, `cuda_graph_scope`) against megatron-core 0.16.1 itself: its TransformerConfig
accepts exactly the plans `tuner.space.megatron_rules` accepts, its get_num_layers_to_build /
get_transformer_layer_offset build the chunks `specs.pipeline.split_layers` says, and the flags the
emitter writes rebuild a valid TransformerConfig."""
import warnings

import pytest

torch = pytest.importorskip("torch")
tc = pytest.importorskip("megatron.core.transformer.transformer_config")
from megatron.core.transformer.transformer_block import get_num_layers_to_build  # noqa: E402
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset  # noqa: E402
from test_emit_architecture import _field_flags, config_from_flags, script_flags  # noqa: E402

from clusters import load_cluster  # noqa: E402
from specs.errors import LayoutError  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.pipeline import split_layers  # noqa: E402
from specs.plan import Plan  # noqa: E402
from specs.stack import GPU_FULL  # noqa: E402
from specs.workload import Workload  # noqa: E402
from tuner.emit.megatron import megatron_script  # noqa: E402
from tuner.rank.complete import best_completion, complete_plan  # noqa: E402
from tuner.space.megatron_rules import check  # noqa: E402


def _config(num_layers, pp, vpp, emb=False, loss=False, first=0, last=0, layout="", moe=False, **kw):
    """megatron-core's TransformerConfig for a small GPT with this pipeline split; raises as it does."""
    args = dict(num_layers=num_layers, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=pp,
                virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, pipeline_dtype=torch.bfloat16,
                bf16=True, account_for_embedding_in_pipeline_split=emb, account_for_loss_in_pipeline_split=loss,
                num_layers_in_first_pipeline_stage=first or None, num_layers_in_last_pipeline_stage=last or None,
                pipeline_model_parallel_layout=layout or None)
    if moe:
        args.update(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=32, expert_model_parallel_size=1)
    args.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tc.TransformerConfig(**args)


SPLITS = [  # (layers, pp, vpp, embedding, loss): accepted and rejected ones
    (94, 32, 3, True, True), (94, 2, 1, True, True), (6, 2, 1, True, True), (7, 2, 1, True, False),
    (7, 2, 1, False, True), (8, 4, 2, True, True), (10, 4, 3, True, True), (94, 32, 1, True, True),
    (95, 32, 3, True, True), (94, 8, 4, True, False), (6, 4, 1, True, True), (48, 4, 2, True, False),
    (61, 8, 1, True, True), (30, 4, 2, True, True), (4, 1, 1, True, True),
]


@pytest.mark.parametrize("layers,pp,vpp,emb,loss", SPLITS)
def test_split_flags_agree_with_megatron(layers, pp, vpp, emb, loss):
    try:
        ours = split_layers(layers, pp, vpp, embedding=emb, loss=loss)
    except LayoutError:
        ours = None
    try:
        cfg = _config(layers, pp, vpp, emb, loss)
    except (ValueError, AssertionError):
        cfg = None
    assert (ours is None) == (cfg is None), (layers, pp, vpp, emb, loss)
    if cfg is None:
        return
    for p in range(pp):
        for v in range(vpp):
            vp = v if vpp > 1 else None
            n = get_num_layers_to_build(cfg, vp_stage=vp, pp_rank=p)
            chunk = ours.chunks[p][v]
            assert len(chunk) == n, (p, v, chunk, n)
            if n and pp > 1:
                assert chunk[0] == get_transformer_layer_offset(cfg, vp_stage=vp, pp_rank=p), (p, v)


def test_split_flags_sample_has_both_verdicts():
    verdicts = set()
    for layers, pp, vpp, emb, loss in SPLITS:
        try:
            _config(layers, pp, vpp, emb, loss)
            verdicts.add(True)
        except (ValueError, AssertionError):
            verdicts.add(False)
    assert verdicts == {True, False}


@pytest.mark.parametrize("kw", [dict(first=3), dict(last=3), dict(layout="Ettt|tttL")])
def test_split_flags_conflict_like_megatron(kw):
    with pytest.raises((ValueError, AssertionError)):
        _config(6, 2, 1, True, True, **kw)
    w = Workload(load_model("qwen3-30b-a3b"), load_cluster("h100-sxm", 16), 64, 4096)
    p = Plan(pp=2, pp_embedding=True, pp_loss=True, pp_first=kw.get("first", 0), pp_last=kw.get("last", 0),
             pp_layout=kw.get("layout", ""))
    assert "layout-conflict" in {r.code for r in check(w, p, GPU_FULL)}


def _qwen235(gbs=2048):
    return Workload(load_model("qwen3-235b-a22b"), load_cluster("h100-sxm", 256), gbs, 4096)


def test_nvidia_qwen3_235b_layout_is_accepted_and_emitted_with_the_split_flags():
    """Megatron-MoE-ModelZoo Qwen3-235B-A22B: TP2 PP32 VPP3 EP8 on 256 H100, 94 layers + embedding
    + loss over 96 chunks."""
    w = _qwen235()
    p = complete_plan("tp=2,pp=32,vpp=3,ep=8", w, GPU_FULL)
    assert p.pp_embedding and p.pp_loss and not p.pp_layout
    assert not check(w, p, GPU_FULL)
    assert check(w, p.replace(pp_embedding=False, pp_loss=False), GPU_FULL)  # without them: pp-layers
    script = megatron_script(w, p, GPU_FULL)
    assert "--account-for-embedding-in-pipeline-split" in script
    assert "--account-for-loss-in-pipeline-split" in script
    best = best_completion("tp=2,pp=32,vpp=3,ep=8", w, GPU_FULL)
    assert best.plan.pp_embedding and best.plan.pp_loss


PLAN_FIELD_FLAGS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--context-parallel-size",
                    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                    "--cuda-graph-impl", "--cuda-graph-scope", "--moe-token-dispatcher-type",
                    "--overlap-moe-expert-parallel-comm", "--moe-flex-dispatcher-backend", "--sequence-parallel",
                    "--moe-expert-capacity-factor", "--moe-pad-expert-input-to-capacity")


def _rebuild(script: str):
    """TransformerConfig from the emitted flags: the architecture (test_emit_architecture) plus the
    plan's TransformerConfig-field flags; --num-virtual-stages-per-pipeline-rank as arguments.py
    reads it (virtual_pipeline_model_parallel_size); list flags comma-joined as the config splits them."""
    body = script.split("pretrain_gpt.py\" \\\n", 1)[1].replace("\\\n", " ")
    import shlex
    allf, key = {}, None
    for t in shlex.split(body):
        if t.startswith("--"):
            key = t
            allf[key] = []
        else:
            allf[key].append(t)
    flags = dict(script_flags(script))
    table = _field_flags(tc.TransformerConfig)
    for f in PLAN_FIELD_FLAGS:
        if f in allf:
            assert f in table, f
            flags[f] = [",".join(allf[f])] if allf[f] else []
    # TE's fused RoPE / permute kernels are absent here (no TE in the test env); they only switch kernels
    flags["--no-rope-fusion"] = []
    flags.pop("--moe-permute-fusion", None)
    pp = int(flags.pop("--pipeline-model-parallel-size", ["1"])[0])
    cfg, _ = config_from_flags(flags)
    # arguments.py: vpp from --num-virtual-stages-per-pipeline-rank, pipeline_dtype = params dtype (--bf16)
    vpp = int(allf.get("--num-virtual-stages-per-pipeline-rank", ["1"])[0])
    import dataclasses
    return dataclasses.replace(cfg, pipeline_model_parallel_size=pp, pipeline_dtype=torch.bfloat16,
                               virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)


def test_emitted_split_flags_rebuild_a_valid_transformer_config():
    w = _qwen235()
    p = complete_plan("tp=2,pp=32,vpp=3,ep=8", w, GPU_FULL)
    cfg = _rebuild(megatron_script(w, p, GPU_FULL))
    assert cfg.account_for_embedding_in_pipeline_split and cfg.account_for_loss_in_pipeline_split
    assert cfg.virtual_pipeline_model_parallel_size == 3
    assert get_num_layers_to_build(cfg, vp_stage=0, pp_rank=0) == 0  # the embedding's chunk
    assert get_num_layers_to_build(cfg, vp_stage=2, pp_rank=31) == 0  # the loss's chunk


# ---- CUDA graphs ------------------------------------------------------------------------------------
GRAPH_CASES = [  # (model, plan): accepted and rejected by megatron-core's own TransformerConfig
    ("qwen3-30b-a3b", "ep=8,cuda_graph_impl=transformer_engine,cuda_graph_scope=attn+moe_router+moe_preprocess"),
    ("qwen3-30b-a3b", "ep=8,cuda_graph_impl=transformer_engine,cuda_graph_scope=attn"),
    ("qwen3-30b-a3b", "ep=8,a2a_overlap=1,cuda_graph_impl=transformer_engine,cuda_graph_scope=attn+moe_router"),
    ("qwen3-30b-a3b", "ep=8,cuda_graph_impl=transformer_engine,cuda_graph_scope=full_iteration"),
    ("qwen3-30b-a3b", "ep=8,cuda_graph_impl=transformer_engine,cuda_graph_scope=moe_preprocess"),
    ("qwen3-30b-a3b", "ep=8,cuda_graph_impl=transformer_engine,cuda_graph_scope=moe+moe_router"),
    ("qwen3-30b-a3b", "ep=8,cuda_graph_impl=transformer_engine,cuda_graph_scope=moe"),
    ("qwen3-30b-a3b", "ep=8,cuda_graph_impl=transformer_engine,cuda_graph_scope=mlp"),
    ("qwen3-30b-a3b", "ep=8,recompute=full,cuda_graph_impl=transformer_engine,cuda_graph_scope=attn"),
    ("qwen3-30b-a3b", "ep=8,recompute=selective,recompute_modules=moe,cuda_graph_impl=transformer_engine,"
                      "cuda_graph_scope=attn+moe_router"),
    ("qwen3-30b-a3b", "ep=8,a2a_overlap=1,cuda_graph_impl=transformer_engine,cuda_graph_scope=attn+moe"),
    ("dense", "cuda_graph_impl=transformer_engine,cuda_graph_scope=attn+mlp"),
    ("dense", "recompute=selective,cuda_graph_impl=transformer_engine,cuda_graph_scope=attn"),
    ("dense", "recompute=selective,cuda_graph_impl=transformer_engine,cuda_graph_scope=mlp"),
    ("dense", "cuda_graph_impl=transformer_engine,cuda_graph_scope=moe_router"),
    ("dense", "cuda_graph_impl=local,cuda_graph_scope=full_iteration,recompute=full"),
]


def _model(name: str):
    """A preset, or "dense": qwen3-30b-a3b's shape with every layer dense."""
    if name != "dense":
        return load_model(name)
    import dataclasses
    m = load_model("qwen3-30b-a3b")
    return dataclasses.replace(m, name="dense", num_experts=0, moe_router_topk=0, moe_layers=(False,) * m.num_layers)


def _graph_verdict(w, p: Plan) -> bool:
    m = w.model
    kw = dict(cuda_graph_impl=p.cuda_graph_impl, cuda_graph_scope=",".join(p.cuda_graph_scope) or [],
              overlap_moe_expert_parallel_comm=p.a2a_overlap, expert_model_parallel_size=p.ep)
    if p.recompute != "none":
        kw.update(recompute_granularity=p.recompute)
        if p.recompute == "full":
            kw.update(recompute_method="uniform", recompute_num_layers=1)
        elif p.recompute_modules:
            kw.update(recompute_modules=list(p.recompute_modules))
    try:
        if m.is_moe:
            _config(4, 1, 1, moe=True, moe_token_dispatcher_type=p.dispatcher, **kw)
        else:
            _config(4, 1, 1, **kw)
        return True
    except (ValueError, AssertionError):
        return False


@pytest.mark.parametrize("model,plan", GRAPH_CASES)
def test_cuda_graph_rules_agree_with_transformer_config(model, plan):
    w = Workload(_model(model), load_cluster("h100-sxm", 8), 64, 4096)
    p = complete_plan(plan, w, GPU_FULL)
    ours = "cuda-graph" not in {r.code for r in check(w, p, GPU_FULL)}
    assert ours == _graph_verdict(w, p), (plan, check(w, p, GPU_FULL))


def test_cuda_graph_cases_have_both_verdicts():
    got = set()
    for model, plan in GRAPH_CASES:
        w = Workload(_model(model), load_cluster("h100-sxm", 8), 64, 4096)
        got.add(_graph_verdict(w, complete_plan(plan, w, GPU_FULL)))
    assert got == {True, False}


def test_dropless_moe_whole_layer_graphs_are_refused():
    w = Workload(load_model("qwen3-30b-a3b"), load_cluster("h100-sxm", 8), 64, 4096)
    p = complete_plan("ep=8,cuda_graph_impl=transformer_engine", w, GPU_FULL)
    assert "cuda-graph-sync" in {r.code for r in check(w, p, GPU_FULL)}


def test_emitted_cuda_graph_flags_rebuild_a_valid_transformer_config():
    w = Workload(load_model("qwen3-30b-a3b"), load_cluster("h100-sxm", 16), 1024, 4096)
    p = complete_plan("ep=16,cuda_graph_impl=transformer_engine,cuda_graph_scope=attn+moe_router+moe_preprocess",
                      w, GPU_FULL)
    assert not check(w, p, GPU_FULL)
    script = megatron_script(w, p, GPU_FULL)
    assert "--cuda-graph-impl transformer_engine" in script
    assert "--cuda-graph-scope attn moe_router moe_preprocess" in script
    cfg = _rebuild(script)
    assert cfg.cuda_graph_impl == "transformer_engine"
    assert [s.name for s in cfg.cuda_graph_scope] == ["attn", "moe_router", "moe_preprocess"]


def test_graphs_cost_memory_and_cut_host_launches():
    """Partial graphs keep static buffers (more memory) and replace the graphed kernels' launches
    by one replay per region: never a longer step, a launch-bound plan gets faster."""
    import cost_model
    w = Workload(load_model("tiny-moe"), load_cluster("h100-sxm", 8), 8, 256)  # launch-bound
    base = complete_plan("ep=1", w, GPU_FULL)
    graphed = base.replace(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "moe_router", "moe_preprocess"))
    a, b = cost_model.predict_many(w, [base, graphed])
    assert b.peak_memory_gib > a.peak_memory_gib
    assert b.step_time_s <= a.step_time_s
    assert b.breakdown_s["cpu_launch_floor"] < a.breakdown_s["cpu_launch_floor"]


# explicit layouts with MTP layers (m), as NVIDIA's DeepSeek-V3 recipes write them: (layout, pp,
# model layers, model mtp_num_layers); Megatron's validate_layer_layout is the oracle, except the
# standalone MTP stage it allows and the cost model does not price (ours refuses it, said so)
MTP_LAYOUTS = [
    ("Et*4|(t*4|)*14,tmL", 8, 61, 1),     # Megatron-Bridge DeepSeek-V3 B200/GB200 (pp8 vpp2)
    ("Et|(tt|)*30mL", 8, 61, 1),          # the emitter's own form
    ("Et|(tt|)*30mmL", 8, 61, 1),         # two m, the model has one
    ("Et|(tt|)*30mL", 8, 61, 0),          # m for a model without MTP
    ("Et|(tt|)*30L", 8, 61, 1),           # none: the emitter adds them (Megatron alone refuses)
    ("Et|(tt|)*29tmt|L", 8, 61, 1),       # a decoder layer after the MTP layer
    ("Ettm|tt|t|L", 2, 5, 1),             # m in a non-final virtual stage
]


@pytest.mark.parametrize("layout,pp,layers,mtp", MTP_LAYOUTS)
def test_mtp_layers_in_the_layout_agree_with_megatron(layout, pp, layers, mtp):
    import dataclasses

    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    lay = PipelineParallelLayerLayout(layout, pipeline_model_parallel_size=pp)
    base = load_model("deepseek-v3")
    spec = dataclasses.replace(base, num_layers=layers, moe_layers=base.moe_layers[:layers], mtp_num_layers=mtp)
    vpp = lay.virtual_pipeline_model_parallel_size
    p = Plan(pp=pp, vpp=vpp, ep=8, pp_layout=layout.replace(",", ""))
    w = Workload(spec, load_cluster("h100-sxm", 8 * pp), 64 * pp, 4096)
    ours = [r.code for r in check(w, p, GPU_FULL) if r.code == "pp-layers"]
    if "m" not in layout:
        # ours: no m = the model's MTP layers beside the loss, which the emitter writes into the flag
        assert ours == [] and f"{'m' * mtp}L'" in megatron_script(w, p, GPU_FULL)
        return
    try:
        lay.validate_layer_layout(num_layers=layers, mtp_num_layers=mtp or None)
        megatron_ok = True
    except AssertionError:
        megatron_ok = False
    assert (ours == []) == megatron_ok, (ours, megatron_ok)


def test_a_layout_with_cosmetic_commas_parses_and_prices_like_megatron_reads_it():
    """Megatron's layout strings may carry commas ("purely cosmetic"); inside --plan, where items
    are comma-separated, the layout keeps its tail and the canonical form drops the commas."""
    w = Workload(load_model("deepseek-v3"), load_cluster("b200", 256), 4096, 4096)
    with_commas = Plan.parse("pp=8,vpp=2,ep=32,pp_layout=Et*4|(t*4|)*14,tmL,mbs=1")
    assert with_commas.pp_layout == "Et*4|(t*4|)*14tmL" and with_commas.mbs == 1
    assert Plan.parse(with_commas.canonical()) == with_commas
    assert check(w, with_commas, GPU_FULL) == [] or all(r.code != "pp-layers" for r in check(w, with_commas, GPU_FULL))
    without_m = with_commas.replace(pp_layout="Et*4|(t*4|)*14tL")
    import cost_model
    a, b = cost_model.predict(w, with_commas), cost_model.predict(w, without_m)
    assert a.step_time_s == b.step_time_s and a.memory_by_stage_gib == b.memory_by_stage_gib
    script = megatron_script(w, with_commas, GPU_FULL)
    assert "--pipeline-model-parallel-layout 'Et*4|(t*4|)*14tmL'" in script and "--mtp-num-layers 1" in script
