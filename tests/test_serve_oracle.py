"""Our serving rules and resolution against SGLang 0.5.23's own resolver (tuner/space/sglang_oracle.py):
same verdict, and every resolved field the same (specs/serve_resolve.py: ep, moe_dense_tp, per-rank chunk, decode
CUDA graphs and their batch, mem_fraction_static, page_size, nnodes, attention backend, ...) on the
rule pairs, the rewrite plans and 320 plans sampled (deterministically) from the 8-, 16-, 32- and
72-GPU serving spaces of H200, H100, B200 and GB200 NVL72; and every command `emit sglang` writes
resolves. Skips where sglang is not installed. The tests share one resolver process (one sglang
import, ~10-45 s on a shared 2-core box; ~0.03 s a plan)."""
import pytest
from serve_oracle_util import MODELS, cases, mismatches
from test_serve_rules import PAIRS

from clusters import load_cluster
from specs.hf_export import write_model_dir
from specs.models import load_model
from specs.serve_plan import ServePlan
from tuner.emit.sglang import launch_commands
from tuner.space import sglang_oracle as sglang_oracle
from tuner.space.serve import ServeSpace, sample
from tuner.space.sglang_rules import realize

pytestmark = [pytest.mark.skipif(not sglang_oracle.available(),
                                 reason="sglang not installed (pip install --no-deps sglang==0.5.23)"),
              # one worker resolves everything of this file in one sglang process (pytest-xdist)
              pytest.mark.xdist_group("sglang")]

REWRITE_PLANS = ["tp=8,attn_dp=8,a2a=deepep,deepep_mode=normal", "tp=8,kv_cache_dtype=fp8_e4m3,mem_frac=0.8", "tp=8,ep=2,a2a=deepep",
                 "tp=8,attn_dp=4,chunked_prefill=16384", "tp=4,pp=2", "tp=2,max_running=64",
                 "tp=8,attn_dp=8,a2a=deepep,tbo=1,eplb_redundant=32,page_size=64",
                 "tp=16,attn_dp=16,a2a=deepep,deepep_mode=low_latency,cuda_graph_max_bs=128",
                 "tp=8,moe_dense_tp=8", "tp=8,moe_dense_tp=1", "tp=8,attn_dp=4,moe_dense_tp=1,a2a=deepep"]
SGLANG_CODES = {"dp-with-attn-dp", "moe-dense-tp-values", "attn-dp-divides-tp", "tbo-needs-a2a-or-attn-dp", "eplb-needs-ep", "chunk-page",
                "multinode-dp", "flashinfer-a2a-runner", "pplx-needs-attn-dp", "pplx-dispatch-tokens"}
EMITTED = [("qwen3-30b-a3b", 8, "tp=4,dp=2,cuda_graph_max_bs=256", False),
           ("deepseek-v3", 16, "tp=16,attn_dp=16,a2a=deepep,tbo=1,eplb_redundant=32", False),
           ("qwen3-235b-a22b", 16, "tp=8,pp=2,mem_frac=0.85,page_size=64", False),
           ("deepseek-v3", 16, "tp=8,attn_dp=8,a2a=deepep,pd=1:1", True),
           ("deepseek-v3", 16, "tp=16,attn_dp=16,moe_dense_tp=1,a2a=deepep,deepep_mode=low_latency", False),
           ("gpt-oss-120b", 8, "tp=2,ep=2,cuda_graph_max_bs=-1,pd=1:3", True),
           # a completed plan (tuner/serve_complete): every knob written, fp8 KV cache
           ("deepseek-v3", 16, "tp=16,attn_dp=16,a2a=deepep,mem_frac=0.8,cuda_graph_max_bs=64,chunked_prefill=8192,"
                               "max_running=2048,kv_cache_dtype=fp8_e4m3", False)]


# FlashInfer all-reduce fusion, which SGLang turns on by itself (one node on Hopper, any on
# Blackwell; tp > 1, no attention DP, no all-to-all; not for Mixtral): (cluster, GPUs, model, plan, on)
FUSION = [("h200-sxm", 8, "deepseek-v3", "tp=8", True), ("h200-sxm", 16, "deepseek-v3", "tp=16", False),
          ("h200-sxm", 8, "qwen3-235b-a22b", "tp=8,attn_dp=2", False), ("h200-sxm", 8, "qwen3-30b-a3b", "tp=8,a2a=deepep", False),
          ("h200-sxm", 8, "mixtral-8x7b", "tp=8", False), ("h200-sxm", 8, "gpt-oss-120b", "tp=1,dp=8", False),
          ("b200", 16, "deepseek-v3", "tp=16", True), ("b200", 8, "gpt-oss-120b", "tp=4,dp=2", True),
          ("h100-sxm", 8, "qwen3-30b-a3b", "tp=4,pp=2", True)]

# (cluster, GPUs): the sampled spaces; 16 plans per model and space (seeded: the same plans every run)
SAMPLED = (("h200-sxm", 8), ("h100-sxm", 16), ("b200", 32), ("gb200-nvl72", 72))
PER_MODEL = 16


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sgl")
    plans = {}
    for model, bad, good in PAIRS.values():
        plans.setdefault(model.name, []).extend([ServePlan.parse(bad), ServePlan.parse(good)])
    plans.setdefault("deepseek-v3", []).extend(ServePlan.parse(t) for t in REWRITE_PLANS)
    cl, cs = cases(plans, tmp)
    for kind, gpus, name, text, _on in FUSION:
        cs += cases({name: [ServePlan.parse(text)]}, tmp / f"fusion-{kind}", kind, gpus)[1]
    n_fixed = len(cs)
    for kind, gpus in SAMPLED:
        sp = ServeSpace(gpus=gpus)
        sampled = {m: sample(sp, PER_MODEL, seed=7 + i) for i, m in enumerate(MODELS)}
        cs += cases(sampled, tmp / f"{kind}-{gpus}", kind, gpus)[1]
    emitted = []
    for name, n, text, pd in EMITTED:
        m, c = load_model(name), load_cluster("h200-sxm", n)
        p = ServePlan.parse(text)
        assert realize(p, m, c).ok
        d = str(write_model_dir(m, tmp / f"emit-{name}"))
        emitted.append((name, n, pd, [a for title, a in launch_commands(p, d, m, c, pd=pd) if title != "router"]))
    argvs = [c[3] for c in cs] + [a for *_, cmds in emitted for a in cmds]
    clusters = [c[4] for c in cs] + [cl] * (len(argvs) - len(cs))
    res = sglang_oracle.resolve_many(argvs, [c.hbm_gib * 1024 for c in clusters],
                                     platforms=[sglang_oracle.platform_facts(c) for c in clusters])
    return cs[:n_fixed], res[:n_fixed], emitted, res[len(cs):], cs[n_fixed:], res[n_fixed:len(cs)]


def test_rule_pairs_and_rewrites_agree_with_resolver(resolved):
    cs, res, *_ = resolved
    assert mismatches(res, cs) == []
    by_plan = {(c[0], c[1]): r for c, r in zip(cs, res)}
    for code, (model, bad, good) in PAIRS.items():
        if code in SGLANG_CODES:  # the pair really splits the resolver too
            assert not by_plan[(model.name, ServePlan.parse(bad))]["ok"], code
            assert by_plan[(model.name, ServePlan.parse(good))]["ok"], code


def test_allreduce_fusion_turns_on_where_sglang_turns_it_on(resolved):
    """SGLang 0.5.23 turns FlashInfer all-reduce fusion on by itself (overrides.py:956-1001); ours
    says where (specs.serve_resolve.allreduce_fusion) and the resolver agrees on each case (the
    field is compared by `mismatches` with the rest)."""
    cs, res, *_ = resolved
    got = {(c[4].kind, c[0], str(c[1])): (c[2].effective.allreduce_fusion, r["resolved"]["flashinfer_allreduce_fusion_backend"])
           for c, r in zip(cs, res) if r["ok"] and c[2].ok}
    for kind, _g, name, text, on in FUSION:
        ours, sglang = got[(kind, name, str(ServePlan.parse(text)))]
        assert ours == on and sglang == ("auto" if on else None), (kind, name, text)


def test_emitted_commands_resolve(resolved):
    _, _, emitted, res, *_ = resolved
    for name, n, pd, cmds in emitted:
        assert any("--nnodes" in a for a in cmds) == (n > 8 and not pd and name != "qwen3-30b-a3b")
        assert all("--cuda-graph-max-bs" not in a and "--enable-dp-attention" not in a for a in cmds)
    assert [r["error"] for r in res if not r["ok"]] == []
    assert len(res) == sum(len(c) for *_, c in emitted) >= 10


def test_sampled_plans_agree_with_resolver_field_by_field(resolved):
    """320 plans over 8, 16, 32 and 72 GPUs: our verdict and every resolved field, 0 mismatches."""
    *_, cs, res = resolved
    assert len(cs) == len(SAMPLED) * len(MODELS) * PER_MODEL >= 300
    assert {c[4].num_devices for c in cs} == {8, 16, 32, 72}
    assert mismatches(res, cs) == []
    ok = [c for c, r in zip(cs, res) if r["ok"] and c[2].ok]
    assert 100 <= len(ok) < len(cs)  # both verdicts are exercised, and many plans compared field by field
    # the fields that used to drift are exercised: default mem fractions, DeepEP normal, multi-node,
    # a backend-forced page size (trtllm_mla on Blackwell)
    assert any("default-mem-frac" in c[2].effective.rewrites and c[2].effective.plan.a2a == "deepep" for c in ok)
    assert any(c[2].effective.nnodes > 1 for c in ok)
    assert any("backend-page-size" in c[2].effective.rewrites for c in ok)
    assert any(c[2].effective.plan.moe_dense_tp == 1 for c in ok)  # --moe-dense-tp-size 1, resolved alike
    assert any(c[2].effective.allreduce_fusion for c in ok)  # SGLang's own all-reduce fusion default


def test_pinned_plan_resolves_to_the_same_effective_plan(resolved):
    """`EffectivePlan.pinned()` (what the serving study launches) resolves to the plan it came from."""
    from clusters import load_cluster
    from specs.serve_resolve import resolve
    *_, cs, _ = resolved
    for name, _p, v, _a, cl in cs:
        if v.ok:
            e = v.effective
            again = resolve(e.pinned(), load_model(name), load_cluster(cl.kind, cl.num_devices))
            assert (again.plan, again.mem_frac, again.mem_frac_decode, again.graph_bs_mem) == \
                (e.plan, e.mem_frac, e.mem_frac_decode, e.graph_bs_mem), (name, _p)


def test_blackwell_attention_backend_is_the_one_sglang_picks(tmp_path):
    """moetune names the attention backend (`specs.serve_resolve.attention_backend`: a CPU host
    probes wrongly); on sm100 it is the one SGLang's own resolver picks with the flag left out and
    the GPU's platform facts given: trtllm_mha for GQA models (SG/arg_groups/model_override_base.py
    :312-325, gpt-oss's override), trtllm_mla for DeepSeek-V3, each with the page size it forces."""
    from specs.serve_resolve import attention_backend
    argvs, facts, mems, want = [], [], [], []
    for name in ("qwen3-235b-a22b", "gpt-oss-120b", "deepseek-v3"):
        cl, cs = cases({name: [ServePlan.parse("tp=8")]}, tmp_path / name, "b200", 8)
        argv = list(cs[0][3])
        i = argv.index("--attention-backend")
        del argv[i:i + 2]
        argvs.append(argv)
        facts.append(sglang_oracle.platform_facts(cl))
        mems.append(cl.hbm_gib * 1024)
        want.append((attention_backend(load_model(name), cl), cs[0][2].effective.plan.page_size))
    res = sglang_oracle.resolve_many(argvs, mems, platforms=facts)
    got = [(r["resolved"]["attention_backend"], r["resolved"]["page_size"]) for r in res]
    assert got == want == [("trtllm_mha", 64), ("trtllm_mha", 64), ("trtllm_mla", 64)]
