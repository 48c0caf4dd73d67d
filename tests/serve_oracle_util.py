"""Shared by the serving oracle tests: plans -> argvs -> SGLang's resolver -> compare with ours."""
from __future__ import annotations

from clusters import load_cluster
from specs.hf_export import write_model_dir
from specs.models import load_model
from specs.serve_resolve import server_nodes
from tuner.emit.sglang import server_argv
from tuner.space.sglang_rules import realize

MODELS = ("deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b")


def cases(plans_by_model: dict, tmp_path, cluster_kind="h200-sxm", gpus=16):
    """(model name, plan, our verdict, argv, cluster) for each plan."""
    cl = load_cluster(cluster_kind, gpus)
    out = []
    for name, plans in plans_by_model.items():
        m = load_model(name)
        d = str(write_model_dir(m, tmp_path / name))
        for p in plans:
            n = server_nodes(p.replace(pd="", dp=1) if p.pd else p, cl.devices_per_node)
            argv = server_argv(p.replace(pd="", dp=1) if p.pd else p, d, m, cl, nnodes=n)
            out.append((name, p, realize(p, m, cl, gpus=gpus), argv, cl))
    return cl, out


def expected(v) -> dict:
    """Every field SGLang's resolver returns (tuner/sglang_oracle.KEYS and the CUDA-graph config),
    as our resolution (specs.serve_resolve) says it resolves; the argv a pd plan's case is one
    aggregated instance of it."""
    e, src = v.effective, v.plan
    p = e.plan
    return {
        "tp_size": p.tp, "pp_size": p.pp, "dp_size": 1 if src.pd else p.dp, "attn_dp_size": p.attn_dp,
        "ep_size": p.ep, "moe_dense_tp_size": p.moe_dense_tp or None, "moe_a2a_backend": p.a2a, "deepep_mode": p.deepep_mode,
        "enable_two_batch_overlap": p.tbo, "enable_eplb": p.eplb_redundant > 0,
        "ep_num_redundant_experts": p.eplb_redundant, "chunked_prefill_size": p.chunked_prefill,
        "max_running_requests": p.max_running or None,
        "schedule_conservativeness": round(e.schedule_conservativeness, 6),
        "disable_overlap_schedule": not e.overlap_schedule, "mem_fraction_static": e.mem_frac,
        "page_size": p.page_size, "nnodes": e.nnodes, "disaggregation_mode": "null", "kv_cache_dtype": p.kv_cache_dtype,
        "attention_backend": e.attention_backend, "enable_dp_lm_head": False,
        "decode_graph_backend": "disabled" if p.cuda_graph_max_bs == -1 else "full",
        "decode_graph_max_bs": e.graph_bs_mem,
        "prefill_graph_backend": "enabled" if e.prefill_cuda_graph else "disabled",
        "prefill_graph_max_bs": e.prefill_graph_max_bs,
        "flashinfer_allreduce_fusion_backend": "auto" if e.allreduce_fusion else None,
    }


def mismatches(results, cases_) -> list[str]:
    """Our sglang-sourced verdict and every resolved field vs the resolver's; one line per disagreement."""
    bad = []
    for r, (name, p, v, _argv, *_) in zip(results, cases_):
        ours = v.sglang_ok()
        if ours != r["ok"]:
            bad.append(f"{name} {p}: ours={v.codes} sglang={r['error'] or 'ok'}")
            continue
        if not r["ok"] or not v.ok:
            continue
        want = expected(v)
        got = dict(r["resolved"])
        got["schedule_conservativeness"] = round(got["schedule_conservativeness"], 6)
        got = {k: got.get(k) for k in want}
        if got != want:
            diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
            bad.append(f"{name} {p}: (ours, sglang) {diff}")
    return bad
