"""Shared by the serving oracle tests: plans -> argvs -> SGLang's resolver -> compare with ours."""
from __future__ import annotations

from clusters import load_cluster
from specs.hf_export import write_model_dir
from specs.models import load_model
from tuner.emit_sglang import server_argv
from tuner.serve_realize import realize, server_nodes

MODELS = ("deepseek-v3", "qwen3-235b-a22b", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-120b")


def cases(plans_by_model: dict, tmp_path, cluster_kind="h200-sxm", gpus=16):
    """(model name, plan, our verdict, argv) for each plan."""
    cl = load_cluster(cluster_kind, gpus)
    out = []
    for name, plans in plans_by_model.items():
        m = load_model(name)
        d = str(write_model_dir(m, tmp_path / name))
        for p in plans:
            n = server_nodes(p.replace(pd="", dp=1) if p.pd else p, cl.devices_per_node)
            argv = server_argv(p.replace(pd="", dp=1) if p.pd else p, d, m, cl, nnodes=n)
            out.append((name, p, realize(p, m, cl, gpus=gpus), argv))
    return cl, out


def mismatches(results, cases_) -> list[str]:
    """Our sglang-sourced verdict and effective plan vs the resolver's; one line per disagreement."""
    bad = []
    for r, (name, p, v, _argv) in zip(results, cases_):
        ours = v.sglang_ok()
        if ours != r["ok"]:
            bad.append(f"{name} {p}: ours={v.codes} sglang={r['error'] or 'ok'}")
            continue
        if not r["ok"] or not v.ok:
            continue
        e, d = v.effective, r["resolved"]
        got = {"ep": d["ep_size"], "chunk": d["chunked_prefill_size"],
               "graphs_off": d["decode_graph_backend"] == "disabled",
               "graph_bs": d["decode_graph_max_bs"],
               "conservativeness": round(d["schedule_conservativeness"], 6),
               "overlap": not d["disable_overlap_schedule"]}
        want = {"ep": e.plan.ep, "chunk": e.plan.chunked_prefill, "graphs_off": e.plan.cuda_graph_max_bs == -1,
                "graph_bs": got["graph_bs"] if e.plan.cuda_graph_max_bs == -1 else e.plan.cuda_graph_max_bs,
                "conservativeness": round(e.schedule_conservativeness, 6), "overlap": e.overlap_schedule}
        if got != want:
            diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
            bad.append(f"{name} {p}: (ours, sglang) {diff}")
    return bad
