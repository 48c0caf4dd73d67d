"""Token drop as plan fields (`capacity_factor`, `pad_to_capacity`: Megatron's
--moe-expert-capacity-factor / --moe-pad-expert-input-to-capacity): megatron-core 0.16.1's own
TransformerConfig accepts exactly the plans the rules accept, the emitted flags rebuild it, and the
cost model prices what drop-and-pad changes (no token counts to the host, every expert at its
capacity) and nothing it does not."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core.transformer.transformer_config")
from test_split_and_graph_fields import _config, _rebuild  # noqa: E402

from clusters import load_cluster  # noqa: E402
from cost_model import predict  # noqa: E402
from cost_model.calibration import IDENTITY  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan  # noqa: E402
from specs.stack import GPU_FULL  # noqa: E402
from specs.workload import Workload  # noqa: E402
from tuner.emit.megatron import megatron_script, plan_args  # noqa: E402
from tuner.rank.complete import best_completion, complete_plan  # noqa: E402
from tuner.space.megatron_rules import check  # noqa: E402

TE_GRAPHS = "cuda_graph_impl=transformer_engine,cuda_graph_scope="
CASES = [  # accepted and rejected by TransformerConfig
    "ep=8,capacity_factor=1,pad_to_capacity=1",
    "ep=8,capacity_factor=1.25",
    "ep=8,pad_to_capacity=1",
    "ep=8,dispatcher=flex,flex_backend=deepep,capacity_factor=1",
    "ep=8,dispatcher=flex,flex_backend=deepep,capacity_factor=1,pad_to_capacity=1",
    "ep=8,dispatcher=flex,flex_backend=hybridep,capacity_factor=1,pad_to_capacity=1",
    "ep=8,capacity_factor=1,pad_to_capacity=1," + TE_GRAPHS + "attn+moe",
    "ep=8,capacity_factor=1," + TE_GRAPHS + "attn+moe",
    "ep=8,capacity_factor=1," + TE_GRAPHS + "moe_router+moe_preprocess",
    "ep=8,capacity_factor=1,pad_to_capacity=1," + TE_GRAPHS + "moe_router+moe_preprocess",
    "ep=8,dispatcher=flex,flex_backend=hybridep,capacity_factor=1," + TE_GRAPHS + "moe_router+moe_preprocess",
]


def _w(gpus=8, gbs=64, seq=4096, model="qwen3-30b-a3b"):
    return Workload(load_model(model), load_cluster("h100-sxm", gpus), gbs, seq)


def _verdict(p: Plan) -> bool:
    kw = dict(moe_token_dispatcher_type=p.dispatcher, expert_model_parallel_size=p.ep,
              moe_expert_capacity_factor=p.capacity_factor or None,
              moe_pad_expert_input_to_capacity=p.pad_to_capacity)
    if p.flex_backend:
        kw["moe_flex_dispatcher_backend"] = p.flex_backend
    if p.cuda_graph_impl != "none":
        kw.update(cuda_graph_impl=p.cuda_graph_impl, cuda_graph_scope=",".join(p.cuda_graph_scope))
    try:
        _config(4, 1, 1, moe=True, **kw)
        return True
    except (ValueError, AssertionError):
        return False


@pytest.mark.parametrize("plan", CASES)
def test_token_drop_rules_agree_with_transformer_config(plan):
    w = _w()
    p = complete_plan(plan, w, GPU_FULL)
    codes = {r.code for r in check(w, p, GPU_FULL)}
    assert ("token-drop" not in codes and "cuda-graph" not in codes) == _verdict(p), (plan, check(w, p, GPU_FULL))


def test_token_drop_cases_have_both_verdicts():
    w = _w()
    assert {_verdict(complete_plan(c, w, GPU_FULL)) for c in CASES} == {True, False}


def test_dense_models_refuse_token_drop_fields():
    import dataclasses
    m = load_model("qwen3-30b-a3b")
    dense = dataclasses.replace(m, name="dense", num_experts=0, moe_router_topk=0, moe_layers=(False,) * m.num_layers)
    w = Workload(dense, load_cluster("h100-sxm", 8), 64, 4096)
    assert "token-drop" in {r.code for r in check(w, Plan(capacity_factor=1.0), GPU_FULL)}
    assert "token-drop" not in {r.code for r in check(w, Plan(), GPU_FULL)}


def test_drop_and_pad_makes_whole_moe_graphs_sync_free():
    """The dropless dispatcher's token counts go to the host (cuda-graph-sync); drop-and-pad on the
    alltoall dispatcher has none, so the moe scope is accepted and emitted."""
    w = _w()
    graphed = "ep=8,capacity_factor=1,pad_to_capacity=1," + TE_GRAPHS + "attn+moe"
    p = complete_plan(graphed, w, GPU_FULL)
    assert not check(w, p, GPU_FULL)
    dropless = p.replace(capacity_factor=0.0, pad_to_capacity=False)
    assert "cuda-graph" in {r.code for r in check(w, dropless, GPU_FULL)}
    whole = complete_plan("ep=8,capacity_factor=1,pad_to_capacity=1,cuda_graph_impl=transformer_engine", w, GPU_FULL)
    assert "cuda-graph-sync" not in {r.code for r in check(w, whole, GPU_FULL)}
    assert "cuda-graph-sync" in {r.code for r in check(w, whole.replace(pad_to_capacity=False), GPU_FULL)}


def test_emitted_token_drop_flags_rebuild_a_valid_transformer_config():
    w = _w(gpus=16, gbs=1024)
    p = complete_plan("ep=8,pp=2,capacity_factor=1,pad_to_capacity=1," + TE_GRAPHS + "attn+moe", w, GPU_FULL)
    assert not check(w, p, GPU_FULL)
    args = plan_args(w, p, GPU_FULL)
    assert args[args.index("--moe-expert-capacity-factor") + 1] == "1"
    assert "--moe-pad-expert-input-to-capacity" in args
    cfg = _rebuild(megatron_script(w, p, GPU_FULL))
    assert cfg.moe_expert_capacity_factor == 1.0 and cfg.moe_pad_expert_input_to_capacity
    assert [s.name for s in cfg.cuda_graph_scope] == ["attn", "moe"]
    # dropless plans write neither flag
    assert "--moe-expert-capacity-factor" not in plan_args(w, p.replace(capacity_factor=0.0, pad_to_capacity=False,
                                                                        cuda_graph_impl="none", cuda_graph_scope=()),
                                                           GPU_FULL)


def test_completion_never_turns_token_drop_on():
    """Token drop changes what the model learns: a user pins it, completion keeps what was given."""
    w = _w(gpus=16, gbs=1024)
    best = best_completion("tp=1,pp=1,ep=16,mbs=1", w, GPU_FULL)
    assert best.plan.capacity_factor == 0.0 and not best.plan.pad_to_capacity
    pinned = best_completion("tp=1,pp=1,ep=16,mbs=1,capacity_factor=1,pad_to_capacity=1", w, GPU_FULL)
    assert pinned.plan.capacity_factor == 1.0 and pinned.plan.pad_to_capacity


def _pair(w, plan: Plan, imbalance=1.0):
    return predict(w, plan, calibration=IDENTITY, imbalance=imbalance)


def test_drop_and_pad_removes_the_count_sync_and_exchange():
    w = _w(gpus=16, gbs=1024)
    base = Plan(ep=16, mbs=1, grad_reduce_bf16=True)
    a, b = _pair(w, base), _pair(w, base.replace(capacity_factor=1.0, pad_to_capacity=True))
    assert a.breakdown_s["moe_host_sync"] > 0 and b.breakdown_s["moe_host_sync"] == 0
    assert b.breakdown_s["dispatcher_preprocess"] < a.breakdown_s["dispatcher_preprocess"]
    # the router's capacity top-k and masks cost memory-bound time of their own
    assert b.breakdown_s["router_permutation"] > a.breakdown_s["router_permutation"]
    # balanced routing at factor 1: every expert already holds its capacity, the same GEMMs
    assert b.breakdown_s["expert_gemm"] == pytest.approx(a.breakdown_s["expert_gemm"], rel=1e-6)
    # DeepEP keeps its counts on the host even with a capacity factor (it refuses padding)
    deepep = base.replace(dispatcher="flex", flex_backend="deepep")
    c, d = _pair(w, deepep), _pair(w, deepep.replace(capacity_factor=1.0))
    assert d.breakdown_s["moe_host_sync"] == pytest.approx(c.breakdown_s["moe_host_sync"], rel=0.05)


def test_capacity_caps_the_busiest_expert_and_padding_fills_every_expert():
    w = _w(gpus=16, gbs=1024)
    base = Plan(ep=16, mbs=1, grad_reduce_bf16=True)
    dropless = _pair(w, base, imbalance=2.0).breakdown_s
    drop = _pair(w, base.replace(capacity_factor=1.25), imbalance=2.0).breakdown_s
    pad = _pair(w, base.replace(capacity_factor=1.25, pad_to_capacity=True), imbalance=1.0).breakdown_s
    balanced = _pair(w, base).breakdown_s
    # dropping caps the busiest expert at 1.25x the mean: less than imbalance 2, more than balanced
    assert balanced["expert_gemm"] < drop["expert_gemm"] < dropless["expert_gemm"]
    assert drop["ep_dispatch_combine"] < dropless["ep_dispatch_combine"]
    # padding computes (and the alltoall sends) every expert's full capacity even when balanced
    assert pad["expert_gemm"] == pytest.approx(drop["expert_gemm"], rel=1e-6)
    assert pad["ep_dispatch_combine"] > balanced["ep_dispatch_combine"]


@pytest.mark.parametrize("fields", [dict(ep=16), dict(ep=8, pp=2), dict(ep=16, dispatcher="flex", flex_backend="hybridep"),
                                    dict(ep=8, cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "moe"))])
def test_a_larger_capacity_never_predicts_a_shorter_step(fields):
    """Padding to a larger capacity computes and sends more rows: never faster (nor, dropping at
    imbalance 2, a larger cap)."""
    w = _w(gpus=16, gbs=256)
    base = Plan(mbs=1, grad_reduce_bf16=True, pad_to_capacity=True, **fields)
    steps = [_pair(w, base.replace(capacity_factor=cf)).step_time_s for cf in (1.0, 1.5, 2.0)]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    drop = base.replace(pad_to_capacity=False, cuda_graph_impl="none", cuda_graph_scope=())
    steps = [_pair(w, drop.replace(capacity_factor=cf), imbalance=2.0).step_time_s for cf in (1.0, 1.5, 2.0, 3.0)]
    assert steps == sorted(steps) and steps[-2] == pytest.approx(steps[-1])
