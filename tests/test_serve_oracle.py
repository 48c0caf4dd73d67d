"""Our serving rules against SGLang 0.5.23's own resolver (tuner/sglang_oracle.py): same verdict,
same effective plan (ep, per-rank chunk, decode CUDA graphs, conservativeness, overlap scheduler);
and every command `emit sglang` writes resolves. Skips where sglang is not installed.
The fast tests share one resolver process (one sglang import, ~45 s on a shared 2-core box)."""
import pytest
from serve_oracle_util import MODELS, cases, mismatches
from test_serve_rules import PAIRS

from clusters import load_cluster
from specs.hf_export import write_model_dir
from specs.models import load_model
from specs.serve_plan import ServePlan
from tuner import sglang_oracle
from tuner.emit_sglang import launch_commands
from tuner.serve_realize import realize
from tuner.serve_space import ServeSpace, sample

pytestmark = [pytest.mark.skipif(not sglang_oracle.available(),
                                 reason="sglang not installed (pip install --no-deps sglang==0.5.23)"),
              # one worker resolves everything of this file in one sglang process (pytest-xdist)
              pytest.mark.xdist_group("sglang")]

REWRITE_PLANS = ["tp=8,attn_dp=8,a2a=deepep,deepep_mode=normal", "tp=8,ep=2,a2a=deepep",
                 "tp=8,attn_dp=4,chunked_prefill=16384", "tp=4,pp=2", "tp=2,max_running=64",
                 "tp=8,attn_dp=8,a2a=deepep,tbo=1,eplb_redundant=32,page_size=64",
                 "tp=16,attn_dp=16,a2a=deepep,deepep_mode=low_latency,cuda_graph_max_bs=128"]
SGLANG_CODES = {"dp-with-attn-dp", "attn-dp-divides-tp", "tbo-needs-a2a-or-attn-dp", "eplb-needs-ep", "chunk-page",
                "multinode-dp", "flashinfer-a2a-runner", "pplx-needs-attn-dp", "pplx-dispatch-tokens"}
EMITTED = [("qwen3-30b-a3b", 8, "tp=4,dp=2,cuda_graph_max_bs=256", False),
           ("deepseek-v3", 16, "tp=16,attn_dp=16,a2a=deepep,tbo=1,eplb_redundant=32", False),
           ("qwen3-235b-a22b", 16, "tp=8,pp=2,mem_frac=0.85,page_size=64", False),
           ("deepseek-v3", 16, "tp=8,attn_dp=8,a2a=deepep,pd=1:1", True),
           ("gpt-oss-120b", 8, "tp=2,ep=2,cuda_graph_max_bs=-1,pd=1:3", True)]


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sgl")
    plans = {}
    for model, bad, good in PAIRS.values():
        plans.setdefault(model.name, []).extend([ServePlan.parse(bad), ServePlan.parse(good)])
    plans.setdefault("deepseek-v3", []).extend(ServePlan.parse(t) for t in REWRITE_PLANS)
    cl, cs = cases(plans, tmp)
    emitted = []
    for name, n, text, pd in EMITTED:
        m, c = load_model(name), load_cluster("h200-sxm", n)
        p = ServePlan.parse(text)
        assert realize(p, m, c).ok
        d = str(write_model_dir(m, tmp / f"emit-{name}"))
        emitted.append((name, n, pd, [a for title, a in launch_commands(p, d, m, c, pd=pd) if title != "router"]))
    # the sampled plans too: one sglang import (~45 s on a shared 2-core box) for the whole file
    sp = ServeSpace(gpus=16)
    _, sampled = cases({m: sample(sp, 60, seed=100 + i) for i, m in enumerate(MODELS)}, tmp / "sampled")
    argvs = [c[3] for c in cs] + [a for *_, cmds in emitted for a in cmds] + [c[3] for c in sampled]
    res = sglang_oracle.resolve_many(argvs, cl.hbm_gib * 1024)
    n_emit = len(argvs) - len(cs) - len(sampled)
    return cs, res[:len(cs)], emitted, res[len(cs):len(cs) + n_emit], sampled, res[len(cs) + n_emit:]


def test_rule_pairs_and_rewrites_agree_with_resolver(resolved):
    cs, res, *_ = resolved
    assert mismatches(res, cs) == []
    by_plan = {(c[0], c[1]): r for c, r in zip(cs, res)}
    for code, (model, bad, good) in PAIRS.items():
        if code in SGLANG_CODES:  # the pair really splits the resolver too
            assert not by_plan[(model.name, ServePlan.parse(bad))]["ok"], code
            assert by_plan[(model.name, ServePlan.parse(good))]["ok"], code


def test_emitted_commands_resolve(resolved):
    _, _, emitted, res, *_ = resolved
    for name, n, pd, cmds in emitted:
        assert any("--nnodes" in a for a in cmds) == (n > 8 and not pd and name != "qwen3-30b-a3b")
        assert all("--cuda-graph-max-bs" not in a and "--enable-dp-attention" not in a for a in cmds)
    assert [r["error"] for r in res if not r["ok"]] == []
    assert len(res) == sum(len(c) for *_, c in emitted) >= 10


def test_sampled_plans_agree_with_resolver(resolved):
    """300 plans (60 per model) sampled from the 16-GPU H200 serving space (resolved with the rest)."""
    *_, cs, res = resolved
    assert len(res) == len(cs) > 250
    assert mismatches(res, cs) == []
    ok = sum(r["ok"] for r in res)
    assert 0 < ok < len(res)  # both verdicts are exercised
