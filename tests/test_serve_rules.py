"""Serving realizability rules: an accept/reject pair per code, the silent rewrites, the space,
and the ModelSpec -> HF config.json writer (round trip through the reader)."""
import pytest

from clusters import load_cluster
from specs.hf_config import hf_dict_to_spec
from specs.hf_export import model_to_hf_config
from specs.models import load_model
from specs.serve_plan import ServePlan
from tuner.space.serve import ServeSpace, default_serve_space, summarize
from tuner.space.sglang_rules import RULES, realize

H200_16 = load_cluster("h200-sxm", 16)
DSV3, QWEN30, MIXTRAL = load_model("deepseek-v3"), load_model("qwen3-30b-a3b"), load_model("mixtral-8x7b")
P = ServePlan.parse

# code -> (model, rejected plan, the nearest accepted plan)
PAIRS = {
    "dp-with-attn-dp": (QWEN30, "tp=4,dp=2,attn_dp=2", "tp=4,dp=2"),
    "attn-dp-divides-tp": (QWEN30, "tp=8,attn_dp=16", "tp=8,attn_dp=8"),
    # SGLang accepts None (0), 1 or tp (validation_hook.py:207); 1 does not need attention DP
    "moe-dense-tp-values": (DSV3, "tp=8,attn_dp=8,moe_dense_tp=2", "tp=8,attn_dp=8,moe_dense_tp=1"),
    "tbo-needs-a2a-or-attn-dp": (QWEN30, "tp=8,tbo=1", "tp=8,attn_dp=8,tbo=1"),
    "eplb-needs-ep": (QWEN30, "tp=8,eplb_redundant=32", "tp=8,ep=8,eplb_redundant=32"),
    "chunk-page": (QWEN30, "tp=8,chunked_prefill=1000,page_size=64", "tp=8,chunked_prefill=1024,page_size=64"),
    "multinode-dp": (QWEN30, "tp=8,dp=2", "tp=16,attn_dp=16"),
    "instance-whole-nodes": (QWEN30, "tp=3,pp=3", "tp=4,pp=4"),  # 9 GPUs over 2 nodes
    "flashinfer-a2a-attn-dp": (QWEN30, "tp=8,a2a=flashinfer", "tp=8,attn_dp=8,a2a=deepep"),
    "flashinfer-a2a-runner": (QWEN30, "tp=8,attn_dp=8,a2a=flashinfer", "tp=8,attn_dp=8,a2a=deepep"),
    "pplx-needs-attn-dp": (QWEN30, "tp=8,a2a=pplx,chunked_prefill=128,cuda_graph_max_bs=64",
                           "tp=8,attn_dp=2,a2a=pplx,chunked_prefill=256,cuda_graph_max_bs=64"),
    "pplx-dispatch-tokens": (QWEN30, "tp=8,attn_dp=2,a2a=pplx,cuda_graph_max_bs=64",
                             "tp=8,attn_dp=2,a2a=pplx,chunked_prefill=256,cuda_graph_max_bs=64"),
    "ep-divides-tp": (QWEN30, "tp=8,ep=16", "tp=8,ep=8"),
    "heads-attn-tp": (QWEN30, "tp=6", "tp=4"),  # 32 heads
    "kv-heads-attn-tp": (QWEN30, "tp=6", "tp=8"),  # 4 KV heads
    "experts-ep": (MIXTRAL, "tp=16,attn_dp=2,ep=16", "tp=16,attn_dp=2,ep=8"),
    "moe-ffn-tp": (MIXTRAL, "tp=3", "tp=4"),  # expert FFN 14336 = 2^11 * 7
    "pp-layers": (load_model("tiny-moe"), "tp=1,pp=16", "tp=1,pp=2"),
    "pd-with-dp": (QWEN30, "tp=4,dp=2,pd=1:1", "tp=4,pd=1:1"),
    "gpus-exceed": (QWEN30, "tp=8,pd=2:1", "tp=8,pd=1:1"),
}


def test_every_code_has_a_pair():
    assert set(PAIRS) == set(RULES)


@pytest.mark.parametrize("code", sorted(PAIRS))
def test_rule_pair(code):
    model, bad, good = PAIRS[code]
    vb, vg = realize(P(bad), model, H200_16), realize(P(good), model, H200_16)
    assert code in vb.codes, vb.codes
    assert code not in vg.codes, vg.codes
    assert all(r.sentence and "\n" not in r.sentence for r in vb.reasons)


def test_rewrites():
    v = realize(P("tp=8,ep=2,attn_dp=8,a2a=deepep,deepep_mode=normal,chunked_prefill=16384"), DSV3, H200_16)
    e = v.effective
    assert e.plan.ep == 8 and e.plan.chunked_prefill == 2048 and e.plan.cuda_graph_max_bs == -1
    assert e.schedule_conservativeness == 0.3 and e.overlap_schedule and not e.prefill_cuda_graph
    assert {"a2a-forces-ep", "deepep-normal-no-graphs", "attn-dp-chunk"} <= set(e.rewrites)
    e2 = realize(P("tp=4,pp=2"), QWEN30, H200_16).effective
    assert not e2.overlap_schedule and e2.plan.chunked_prefill == 8192 and e2.plan.cuda_graph_max_bs == 512
    assert realize(P("tp=2,max_running=64"), QWEN30, H200_16).effective.plan.cuda_graph_max_bs == 64
    # B200 (180 GB): SGLang's larger memory tier
    e3 = realize(P("tp=8"), QWEN30, load_cluster("b200", 8)).effective
    assert e3.plan.chunked_prefill == 16384


def test_space_streams_exact_gpu_counts():
    sp = ServeSpace(gpus=8)
    plans = list(sp)
    assert len(plans) == sp.size() == len(set(plans))
    from tuner.space.sglang_rules import deployment_gpus
    assert all(deployment_gpus(p) == 8 for p in plans)
    assert {p.pd for p in plans} == {"", "1:1", "1:3"}  # 1:2 and 2:1 cannot split 8 GPUs
    # the dense MLP's own TP width is tried with attention DP (its layout), SGLang's default elsewhere
    assert {(p.attn_dp > 1, p.moe_dense_tp) for p in plans} == {(False, 0), (True, 0), (True, 1)}


def test_summary_counts_and_examples():
    s = summarize(ServeSpace(gpus=8, pd_ratios=("",)), QWEN30, load_cluster("h200-sxm", 8), max_examples=3)
    assert 0 < s.realizable < s.total and len(s.examples) == 3
    assert sum(1 for p in s.examples if realize(p, QWEN30, load_cluster("h200-sxm", 8)).ok) == 3
    assert default_serve_space(16).size() > 10_000


def test_serve_plan_round_trip():
    for p in list(ServeSpace(gpus=8))[::997]:
        assert ServePlan.parse(p.canonical()) == p


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b"])
def test_hf_export_round_trip(name):
    m = load_model(name)
    back = hf_dict_to_spec(model_to_hf_config(m), name)
    for f in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "num_experts", "moe_router_topk",
              "moe_ffn_hidden_size", "query_groups", "mla", "kv_lora_rank", "num_moe_layers"):
        assert getattr(back, f) == getattr(m, f), f
