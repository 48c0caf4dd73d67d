"""SGLang 0.5.23 launch commands for a serving plan.

The 0.5.23 spelling: `--attn-dp-size` (not `--dp-size N --enable-dp-attention`), `--moe-a2a-backend`,
`--cuda-graph-max-bs-decode` (the undecorated `--cuda-graph-max-bs` is an ambiguous prefix there and
argparse rejects it). Options SGLang probes from the platform (attention backend, device) are passed
explicitly, so the command means the same on the GPU host as in the offline resolver.
"""
from __future__ import annotations

import shlex

from specs.serve_plan import ServePlan
from specs.serve_resolve import attention_backend, server_nodes
from trials.serving.sglang_backend import sglang_flags
from tuner.space.serve_precision import KV_CACHE_FLAG

ROUTER_PORT = 8000
BOOTSTRAP_PORT = 8998


def server_argv(plan: ServePlan, model_path: str, model, cluster, *, nnodes: int = 1, node_rank: int = 0,
                dist_init_addr: str = "", mode: str = "", port: int = 30000, quantization: str | None = None,
                dummy: bool = False) -> list[str]:
    """Arguments of `python -m sglang.launch_server` for one node of one server: real weights from
    `model_path` unless `dummy` (--load-format dummy, a speed benchmark), in the weight format the
    plan was priced with (`quantization`, None = the checkpoint's bf16) and the KV cache dtype it
    was priced with (auto: bf16 for these models, tuner.space.serve_precision)."""
    a = ["--model-path", model_path, *(["--load-format", "dummy"] if dummy else []), "--device", "cuda",
         *(["--quantization", quantization] if quantization else []),
         *(["--kv-cache-dtype", KV_CACHE_FLAG] if plan.kv_cache_dtype == "auto" else []),  # else sglang_flags
         "--attention-backend", attention_backend(model, cluster), "--host", "0.0.0.0", "--port", str(port)]
    a += sglang_flags(plan)
    if nnodes > 1:
        a += ["--dist-init-addr", dist_init_addr or "NODE0_IP:5000", "--nnodes", str(nnodes), "--node-rank", str(node_rank)]
    if mode:
        a += ["--disaggregation-mode", mode, "--disaggregation-bootstrap-port", str(BOOTSTRAP_PORT)]
    return a


def _line(argv: list[str], head: str = "python -m sglang.launch_server") -> str:
    return head + " " + " ".join(shlex.quote(x) for x in argv)


def launch_commands(plan: ServePlan, model_path: str, model, cluster, *, nnodes: int | None = None,
                    pd: bool = False, quantization: str | None = None,
                    dummy: bool = False) -> list[tuple[str, list[str]]]:
    """(title, argv) per process to start, in order; the router, if any, last.

    Aggregated: one server over `nnodes` nodes (default: as many as the plan needs).
    pd: the plan's prefill:decode ratio of servers (1:1 if none), each the plan's instance on its
    own nodes, then the router that joins them (`python -m sglang_router.launch_router --pd-disaggregation`).
    quantization, dummy: as for `server_argv`.
    """
    wfmt = {"quantization": quantization, "dummy": dummy}
    gpn = cluster.devices_per_node
    n = nnodes or server_nodes(plan, gpn)
    if not pd:
        return [(f"node {r} of {n}", server_argv(plan, model_path, model, cluster, nnodes=n, node_rank=r,
                                                 dist_init_addr="NODE0_IP:5000", **wfmt))
                for r in range(n)]
    inst = plan.replace(dp=1, pd="")
    n = nnodes or server_nodes(inst, gpn)
    n_prefill, n_decode = plan.pd_ratio or (1, 1)
    out, router = [], ["--pd-disaggregation"]
    for mode, count, base in (("prefill", n_prefill, 30000), ("decode", n_decode, 31000)):
        for i in range(count):
            host = f"{mode.upper()}{i}_NODE0_IP"
            for r in range(n):
                out.append((f"{mode} server {i}, node {r} of {n}",
                            server_argv(inst, model_path, model, cluster, nnodes=n, node_rank=r,
                                        dist_init_addr=f"{host}:5000", mode=mode, port=base + i, **wfmt)))
            router += [f"--{mode}", f"http://{host}:{base + i}"] + ([str(BOOTSTRAP_PORT)] if mode == "prefill" else [])
    out.append(("router", router + ["--host", "0.0.0.0", "--port", str(ROUTER_PORT)]))
    return out


def render(commands: list[tuple[str, list[str]]]) -> str:
    lines = []
    for title, argv in commands:
        head = "python -m sglang_router.launch_router" if title == "router" else "python -m sglang.launch_server"
        lines += [f"# {title}", _line(argv, head)]
    return "\n".join(lines) + "\n"


def bench_command(model_path: str, isl: int, osl: int, concurrency: int, *, pd: bool = False) -> str:
    """The `sglang.bench_serving` run that measures what the header predicts: random prompts of
    exactly isl / osl tokens (--random-range-ratio 1), `concurrency` in flight, 4x as many prompts
    (at least 64, as the serving model's closed loop), against the server (or the pd router)."""
    argv = ["--backend", "sglang", "--host", "127.0.0.1", "--port", str(ROUTER_PORT if pd else 30000),
            "--model", model_path, "--dataset-name", "random", "--random-input-len", str(isl),
            "--random-output-len", str(osl), "--random-range-ratio", "1", "--num-prompts",
            str(max(4 * concurrency, 64)), "--max-concurrency", str(concurrency)]
    return _line(argv, "python -m sglang.bench_serving")
