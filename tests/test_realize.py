"""One accepting and one rejecting case for every realizability rule, and the published layouts."""
import dataclasses

import pytest

from clusters import load_cluster
from specs.cpu_support import CPU_UNSUPPORTED
from specs.models import load_model
from specs.plan import Plan
from specs.stack import GPU_FULL, GPU_NO_EP_LIBS, GPU_NO_TE, cpu_profile
from specs.workload import Workload
from tuner.rank.complete import complete_plan
from tuner.space.megatron_rules import RULES, check


def wl(model="mixtral-8x7b", kind="h100-sxm", gpus=64, gbs=256, seq=4096, **model_changes):
    m = load_model(model)
    if model_changes:
        m = dataclasses.replace(m, **model_changes)
    return Workload(m, load_cluster(kind, gpus), gbs, seq)


def codes(w, plan, profile=GPU_FULL):
    return {r.code for r in check(w, plan, profile)}


P = Plan.parse
BASE = "grouped_gemm=1"

# code -> (workload kwargs, accepted plan, rejected plan[, profile])
CASES = {
    "world-div-tp-cp-pp": ({}, "tp=2,pp=4", "tp=2,pp=3"),
    "world-div-etp-ep-pp": ({"gpus": 16}, "ep=8,pp=2", "ep=8,etp=2,pp=2"),
    "ep-needs-moe": ({"num_experts": 0, "moe_layers": (False,) * 32, "moe_router_topk": 0}, "ep=1,grouped_gemm=0", "ep=2,grouped_gemm=0"),
    "experts-div-ep": ({}, "ep=8", "ep=16"),
    "heads-div-tp": ({"num_attention_heads": 24, "num_query_groups": 8, "kv_channels": 128}, "tp=8", "tp=16"),
    "groups-vs-tp": ({"num_attention_heads": 48, "num_query_groups": 12, "kv_channels": 128}, "tp=4", "tp=8"),
    "vocab-div-tp": ({"vocab_size": 32001}, "tp=1", "tp=2"),
    "ffn-div-tp": ({"model": "deepseek-v2-lite", "gpus": 16, "ffn_hidden_size": 10940}, "tp=1", "tp=8"),
    "moe-bias-etp": ({"attention_bias": True}, "etp=1", "etp=2"),
    "moe-ffn-div-etp": ({"moe_ffn_hidden_size": 14340}, "etp=4", "etp=8"),
    "seq-div-2cp": ({"seq": 4100}, "cp=2", "cp=4"),
    "seq-div-tp-sp": ({"seq": 4100}, "tp=2", "tp=8"),
    "policy-seq-le-max-pos": ({"seq": 4096, "max_position_embeddings": 4096}, "tp=1", None),
    "gbs-div-mbs-dp": ({"gbs": 192}, "mbs=1", "mbs=2"),
    "pp-layers": ({}, "pp=4", "pp=4,pp_first=7"),
    "vpp-needs-pp": ({}, "pp=2,vpp=2", "vpp=2"),
    "layout-conflict": ({}, "pp=2,pp_layout=Et*16|t*16L", "pp=2,pp_layout=Et*16|t*16L,pp_first=16"),
    "interleave-microbatches": ({"gbs": 256}, "pp=4,vpp=2,mbs=1", "pp=4,vpp=2,mbs=8"),
    "recompute-args": ({}, "recompute=selective", "recompute=selective,recompute_method=uniform"),
    # uniform steps n layers through each 8-layer chunk: n must divide 8 (transformer_block.py)
    "recompute-layers": ({}, "recompute=full,recompute_method=uniform,recompute_layers=4,pp=4",
                         "recompute=full,recompute_method=uniform,recompute_layers=3,pp=4"),
    "recompute-module": ({}, "recompute=selective,recompute_modules=moe_act",
                         "recompute=selective,recompute_modules=mla_up_proj"),
    "opg-needs-dist-opt": ({}, "dist_opt=1,overlap_param_gather=1", "dist_opt=0,overlap_param_gather=1"),
    "fp8-param": ({}, "precision=fp8-tensorwise,fp8_param=1", "precision=bf16,fp8_param=1"),
    "token-drop": ({}, "ep=8,capacity_factor=1,pad_to_capacity=1", "ep=8,pad_to_capacity=1"),
    "fsdp": ({}, "fsdp=1", "fsdp=1,dist_opt=0,overlap_param_gather=0"),
    "opg-needs-ogr": ({}, "overlap_grad_reduce=1,overlap_param_gather=1", "overlap_grad_reduce=0,overlap_param_gather=1"),
    "flex-backend": ({}, "ep=8,dispatcher=flex,flex_backend=deepep", "ep=8,dispatcher=flex"),
    "flex-needs-tp-ep": ({}, "ep=2,dispatcher=flex,flex_backend=hybridep", "ep=1,dispatcher=flex,flex_backend=hybridep"),
    "shared-overlap": ({"model": "qwen3-30b-a3b", "gpus": 16, "moe_shared_expert_ffn": 1024},
                       "ep=8,shared_expert_overlap=1", "ep=8,shared_expert_overlap=1,dispatcher=allgather"),
    "a2a-overlap": ({}, "ep=8,a2a_overlap=1", "ep=1,a2a_overlap=1"),
    "delay-wgrad": ({}, "ep=8,a2a_overlap=1,delay_wgrad=1", "ep=8,delay_wgrad=1"),
    "cuda-graph": ({}, "ep=8,cuda_graph_impl=transformer_engine,cuda_graph_scope=attn+moe_router+moe_preprocess",
                   "ep=8,cuda_graph_impl=transformer_engine,cuda_graph_scope=full_iteration"),
    "cuda-graph-sync": ({}, "ep=8,cuda_graph_impl=transformer_engine,cuda_graph_scope=attn",
                        "ep=8,cuda_graph_impl=transformer_engine"),
    "fp8-hardware": ({}, "precision=fp8-blockwise", "precision=mxfp8"),
    # TE assert_dim_for_fp8_exec: 4100 tokens per GEMM is not a multiple of 8; mbs=2 gives 8200
    "fp8-gemm-dims": ({"seq": 4100}, "precision=fp8-tensorwise,mbs=2", "precision=fp8-tensorwise,mbs=1"),
    # GPT-OSS hidden 2880 is not a multiple of 128: blockwise fp8 cannot all-gather it under SP
    "fp8-blockwise-sp": ({"model": "gpt-oss-20b", "gpus": 16}, "tp=1,precision=fp8-blockwise",
                         "tp=2,precision=fp8-blockwise"),
    "fp8-delayed-recompute": ({}, "precision=fp8-tensorwise,recompute=selective,recompute_modules=layernorm",
                              "precision=fp8-delayed,recompute=selective,recompute_modules=layernorm"),
    "dispatcher-needs-moe": ({"num_experts": 0, "moe_layers": (False,) * 32, "moe_router_topk": 0},
                             "grouped_gemm=0", "grouped_gemm=0,dispatcher=allgather"),
}


def _plan(text):
    fields = dict(kv.split("=") for kv in text.split(","))
    if "grouped_gemm" not in fields:
        text = text + "," + BASE
    return P(text)


# the two profile rules (stack-missing, stack-cpu) have their cases in test_stack_rules
@pytest.mark.parametrize("code", sorted(set(RULES) - {"stack-missing", "stack-cpu", "shared-expert-bias"}))
def test_every_rule_has_an_accepting_and_a_rejecting_case(code):
    kwargs, ok, bad = CASES[code]
    kwargs = dict(kwargs)
    w = wl(**{k: kwargs.pop(k) for k in ("model", "kind", "gpus", "gbs", "seq") if k in kwargs}, **kwargs)
    assert code not in codes(w, _plan(ok)), check(w, _plan(ok), GPU_FULL)
    if code == "policy-seq-le-max-pos":
        w = dataclasses.replace(w, seq=8192)
        bad = "tp=1"
    reasons = check(w, _plan(bad), GPU_FULL)
    assert code in {r.code for r in reasons}
    r = next(r for r in reasons if r.code == code)
    assert r.flag.startswith("--") and len(r.sentence) > 10 and "\n" not in r.sentence


def test_accepted_cases_are_fully_realizable_where_meant_to_be():
    w = wl()
    assert check(w, _plan("tp=2,pp=4,ep=8"), GPU_FULL) == []


def test_stack_rules():
    w = wl()
    assert "stack-missing" in codes(w, _plan("ep=8,dispatcher=flex,flex_backend=deepep"), GPU_NO_EP_LIBS)
    assert "stack-missing" not in codes(w, _plan("ep=8,dispatcher=flex,flex_backend=deepep"), GPU_FULL)
    assert "stack-missing" in codes(w, _plan("precision=fp8-blockwise"), GPU_NO_TE)
    cpu = wl(model="tiny-moe", kind="cpu-local", gpus=2, gbs=16, seq=256)
    prof = cpu_profile()
    assert "stack-cpu" in codes(cpu, _plan("ep=2"), prof)  # grouped GEMM on CPU
    assert check(cpu, P("ep=2,grouped_gemm=0,permute_fusion=0,router_fusion=0,dist_opt=0,overlap_grad_reduce=0,overlap_param_gather=0"), prof) == []
    assert "stack-cpu" in codes(cpu, P("tp=2,grouped_gemm=0,permute_fusion=0,router_fusion=0,dist_opt=0,"
                                       "overlap_grad_reduce=0,overlap_param_gather=0"), prof)


@pytest.mark.parametrize("model,gpus,gbs,plan,precision", [
    ("deepseek-v3", 1024, 8192, "tp=2,pp=8,vpp=4,ep=64,mbs=1", "fp8"),
    ("qwen3-235b-a22b", 256, 8192, "tp=2,pp=8,vpp=4,ep=32,mbs=1", "bf16"),
    ("qwen3-30b-a3b", 16, 1024, "tp=1,pp=1,ep=16,mbs=1", "bf16"),
    ("mixtral-8x7b", 64, 256, "tp=1,ep=8,pp=4,vpp=8,mbs=1", "bf16"),
])
def test_published_layouts_are_realizable(model, gpus, gbs, plan, precision):
    w = wl(model=model, gpus=gpus, gbs=gbs, seq=4096)
    p = complete_plan(plan, w, GPU_FULL, precision)
    assert check(w, p, GPU_FULL) == []
    assert Plan.parse(p.canonical()) == p


def test_deepseek_v3_pp8_vpp4_gets_balanced_layout():
    w = wl(model="deepseek-v3", gpus=1024, gbs=8192)
    p = complete_plan("tp=2,pp=8,vpp=4,ep=64,mbs=1", w, GPU_FULL, "fp8")
    assert p.pp_layout == "Et|(tt|)*30L"
    assert p.precision == "fp8-blockwise"
    # without the layout the even split is impossible, and says so
    assert "pp-layers" in codes(w, p.replace(pp_layout=""))


# ---- CPU rules: one source, one line each ------------------------------------------------------------
CLEAN_CPU = dict(dist_opt=False, overlap_grad_reduce=False, overlap_param_gather=False, grouped_gemm=False,
                 permute_fusion=False, router_fusion=False)
TRIGGER = {  # a plan that needs exactly one feature the CPU stack lacks
    "grouped_gemm": dict(ep=2, grouped_gemm=True),
    "permute_fusion": dict(ep=2, permute_fusion=True),
    "router_fusion": dict(ep=2, router_fusion=True),
    "tp_sequence_parallel": dict(tp=2),
    "context_parallel": dict(cp=2),
    "flex_dispatcher": dict(ep=2, dispatcher="flex", flex_backend="deepep"),
    "dist_opt": dict(dist_opt=True),
    "overlap_param_gather": dict(dist_opt=True, overlap_grad_reduce=True, overlap_param_gather=True),
    "fp8": dict(precision="fp8-tensorwise"),
    "a2a_overlap": dict(ep=2, a2a_overlap=True),
    "recompute_moe_act": dict(recompute="selective", recompute_modules=("moe_act",)),
    "recompute_layernorm": dict(recompute="selective", recompute_modules=("layernorm",)),
    "fsdp": dict(fsdp=True, dist_opt=True),  # (FSDP needs the distributed optimizer: both are said)
}


@pytest.mark.parametrize("feature", sorted(CPU_UNSUPPORTED))
def test_each_cpu_rejection_is_reported_once(feature):
    w = wl(model="tiny-moe", kind="cpu-local", gpus=2, gbs=16, seq=256)
    plan = Plan(**{**CLEAN_CPU, **TRIGGER[feature]})
    reasons = check(w, plan, cpu_profile())
    cpu = [r for r in reasons if r.code == "stack-cpu"]
    sentence = CPU_UNSUPPORTED[feature][0]
    assert [r.sentence for r in cpu].count(sentence) == 1, reasons
    # nothing else says the same thing in other words: one reason per missing feature, other
    # reasons only from rules that are not about the CPU stack
    if feature in ("overlap_param_gather", "fsdp"):
        assert len(cpu) == 2  # it needs the distributed optimizer, itself a second missing feature
    else:
        assert len(cpu) == 1, reasons
    assert not [r for r in reasons if r.code == "stack-missing"]


def test_cpu_stack_accepts_what_the_cpu_backend_runs():
    """overlap_grad_reduce runs on CPU (gloo async all-reduce; tests/test_trials_megatron.py runs it),
    so the one source of CPU rules (specs/cpu_support.py) accepts it; the old second list did not."""
    w = wl(model="tiny-moe", kind="cpu-local", gpus=2, gbs=16, seq=256)
    assert check(w, Plan(ep=2, **{**CLEAN_CPU, "overlap_grad_reduce": True}), cpu_profile()) == []
    assert check(w, Plan(**CLEAN_CPU, pp=2, vpp=2), cpu_profile()) == []


def test_tp_on_cpu_is_a_parallel_tier_rejection():
    from tuner.space.megatron_rules import check_parallel, check_schedule_kernels
    w = wl(model="tiny-moe", kind="cpu-local", gpus=2, gbs=16, seq=256)
    p = Plan(tp=2, **CLEAN_CPU)
    assert [r.code for r in check_parallel(w, p, cpu_profile())] == ["stack-cpu"]
    assert check_schedule_kernels(w, p, cpu_profile()) == []
    assert check(w, Plan(**CLEAN_CPU), cpu_profile()) == []


# ---- findings against megatron-core 0.16.1 / TransformerEngine 2.9 ------------------------------------
def test_block_recompute_accepts_more_layers_than_a_chunk():
    """block recomputes min(n, chunk) layers of each chunk (transformer_block.py), so n > chunk runs."""
    w = wl()
    assert "recompute-layers" not in codes(w, _plan("recompute=full,recompute_method=block,recompute_layers=9,pp=4"))
    assert "recompute-layers" not in codes(w, _plan("recompute=full,recompute_method=block,recompute_layers=32,pp=4"))
    assert "recompute-layers" in codes(w, _plan("recompute=full,recompute_method=uniform,recompute_layers=9,pp=4"))


def test_uniform_recompute_reads_every_chunk():
    # 61 layers on pp=8 by the balanced layout: chunks of 7 and 8 layers; n must divide both
    w = wl(model="deepseek-v3", gpus=1024, gbs=8192)
    p = complete_plan("tp=2,pp=8,ep=64,mbs=1,recompute=full,recompute_method=uniform,recompute_layers=1",
                      w, GPU_FULL, "bf16")
    assert "recompute-layers" not in codes(w, p)
    assert "recompute-layers" in codes(w, p.replace(recompute_layers=2))
    assert "recompute-layers" not in codes(w, p.replace(recompute_method="block", recompute_layers=2))


def test_shared_experts_need_unbiased_linears():
    ok = wl(model="qwen3-30b-a3b", gpus=16, moe_shared_expert_ffn=1024)
    bad = wl(model="qwen3-30b-a3b", gpus=16, moe_shared_expert_ffn=1024, attention_bias=True)
    assert "shared-expert-bias" not in codes(ok, _plan("ep=8"))
    assert "shared-expert-bias" in codes(bad, _plan("ep=8"))
    assert "shared-expert-bias" not in codes(wl(model="gpt-oss-20b", gpus=16), _plan("ep=8"))  # biased, no shared


def test_fp8_dims_dense_ffn_of_deepseek_v2_lite():
    """10944 / tp 8 = 1368 is not a multiple of 16 (fc2 input); / tp 4 = 2736 is."""
    w = wl(model="deepseek-v2-lite", gpus=16, gbs=64)
    assert "fp8-gemm-dims" in codes(w, _plan("tp=8,ep=2,precision=fp8-blockwise"))
    assert "fp8-gemm-dims" not in codes(w, _plan("tp=4,ep=2,precision=fp8-blockwise"))
    assert "fp8-gemm-dims" not in codes(w, _plan("tp=8,ep=2"))  # bf16 has no such constraint


def test_fp8_blockwise_runs_on_blackwell_not_on_ada():
    """TE 2.9 check_fp8_block_scaling_support: compute capability >= 9.0 and CUDA >= 12.9."""
    b200 = wl(kind="b200", gpus=64)
    assert "fp8-hardware" not in codes(b200, _plan("precision=fp8-blockwise"))
    ada = wl(kind="rtx4090", gpus=64)
    assert "fp8-hardware" in codes(ada, _plan("precision=fp8-blockwise"))
    assert "fp8-hardware" not in codes(ada, _plan("precision=fp8-tensorwise"))


def test_seq_over_max_positions_is_labelled_a_policy():
    w = wl(seq=65536)
    r = next(r for r in check(w, _plan("tp=1"), GPU_FULL) if "max_position" in r.sentence)
    assert r.code.startswith("policy-") and "policy" in r.sentence and "Megatron would run it" in r.sentence
    assert "not a Megatron rule" in RULES[r.code][1]


@pytest.mark.parametrize("kwargs,plan,code", [
    ({}, "ep=8,shared_expert_overlap=1", "shared-overlap"),  # Mixtral: no shared experts
    ({}, "ep=8,dispatcher=alltoall,flex_backend=deepep", "flex-backend"),
    ({"num_experts": 0, "moe_layers": (False,) * 32, "moe_router_topk": 0}, "grouped_gemm=0,dispatcher=allgather",
     "dispatcher-needs-moe"),
])
def test_options_megatron_ignores_are_plan_hygiene(kwargs, plan, code):
    reasons = [r for r in check(wl(**kwargs), _plan(plan), GPU_FULL) if r.code == code]
    assert reasons and all(r.sentence.startswith("plan hygiene:") and "same run" in r.sentence for r in reasons)
    # the genuine rule of the same code is not called hygiene
    shared = wl(model="qwen3-30b-a3b", gpus=16, moe_shared_expert_ffn=1024)
    real = [r for r in check(shared, _plan("ep=8,shared_expert_overlap=1,dispatcher=allgather"), GPU_FULL)
            if r.code == "shared-overlap"]
    assert real and not real[0].sentence.startswith("plan hygiene")
