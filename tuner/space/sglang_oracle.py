"""SGLang 0.5.23's own argument resolver as an offline oracle (a test and cross-check tool).

`resolve_many(argvs, gpu_mem_mib)` runs, in ONE subprocess (importing sglang costs ~10-45 s, each
plan ~0.3 s), for every argv: `prepare_server_args(argv)` -> `.resolve_once()` ->
`.check_server_args()` -> `.resolved_dict()`, with `memory_hook.get_device_memory_capacity`
patched to the target GPU's memory. It returns per argv `{"ok", "error", "resolved"}`.

Why the subprocess: the resolver mutates module state (env flags, loggers) and sglang's import is
heavy; a child keeps moetune's process clean and lets one import serve a batch.
Why the import stubs: sglang is installed --no-deps here; `torchvision` and `gguf` are imported
only by multimodal / GGUF loaders on the import path of the resolver, never called by it, so
absent ones are replaced by inert modules (transformers' own availability probe runs first and
still sees them absent).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

# the resolved fields the cross-check reads
KEYS = ("tp_size", "pp_size", "dp_size", "attn_dp_size", "ep_size", "moe_dense_tp_size", "moe_a2a_backend", "deepep_mode",
        "enable_two_batch_overlap", "enable_eplb", "ep_num_redundant_experts", "chunked_prefill_size",
        "max_running_requests", "schedule_conservativeness", "disable_overlap_schedule",
        "mem_fraction_static", "page_size", "nnodes", "disaggregation_mode", "kv_cache_dtype",
        "attention_backend", "enable_dp_lm_head", "flashinfer_allreduce_fusion_backend")
_STUBBED = ("torchvision", "gguf")


def available() -> bool:
    import importlib.util
    return importlib.util.find_spec("sglang") is not None


def platform_facts(cluster) -> dict:
    """SGLang platform facts (`runtime_context.override_platform`) of the target GPU that its
    resolver reads and a CPU host probes wrongly: Blackwell's (the trtllm_mla backend is refused
    without them) and Hopper's `is_sm90` (FlashInfer all-reduce fusion turns on by itself on sm90
    and sm100, SG/arg_groups/overrides.py:991)."""
    from specs.serve_resolve import is_blackwell, is_hopper
    if is_blackwell(cluster.device_name):
        return {"is_blackwell": True, "is_sm100": True, "is_sm100_or_sm110": True}
    if is_hopper(cluster.device_name):
        return {"is_sm90": True}
    return {}


def resolve_many(argvs: list[list[str]], gpu_mem_mib, timeout: float = 1800, platforms=None) -> list[dict]:
    """Resolve each argv with SGLang's resolver in one child process. `gpu_mem_mib`: the GPU memory
    every argv's server sees, or a list of it, one per argv; `platforms`: None or one
    `platform_facts` dict per argv."""
    mems = list(gpu_mem_mib) if isinstance(gpu_mem_mib, (list, tuple)) else [gpu_mem_mib] * len(argvs)
    facts = list(platforms) if platforms is not None else [{}] * len(argvs)
    if not len(mems) == len(facts) == len(argvs):
        raise ValueError(f"{len(mems)} GPU memories and {len(facts)} platforms for {len(argvs)} argvs")
    with tempfile.TemporaryDirectory(prefix="moetune-sgl-") as d:
        req, out = os.path.join(d, "req.json"), os.path.join(d, "out.json")
        with open(req, "w") as f:
            json.dump({"gpu_mem_mib": mems, "platforms": facts, "argvs": argvs}, f)
        proc = subprocess.run([sys.executable, "-m", "tuner.space.sglang_oracle", req, out], capture_output=True,
                              text=True, timeout=timeout,
                              env={**os.environ, "SGLANG_LOGGING_LEVEL": "error"})
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"sglang oracle failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
        with open(out) as f:
            return json.load(f)


def _install_stubs() -> None:
    import importlib.machinery
    import importlib.util
    import types

    import transformers.utils.import_utils  # noqa: F401  (its availability probes run before the stubs)

    missing = {n for n in _STUBBED if importlib.util.find_spec(n) is None}

    class _Inert:
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            return _Inert()

        def __getattr__(self, name):
            return _Inert()

        def __mro_entries__(self, bases):
            return (object,)

    class _Finder:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in missing:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            m = types.ModuleType(spec.name)
            m.__path__ = []

            def __getattr__(n):
                if n.startswith("__"):
                    raise AttributeError(n)
                return _Inert()
            m.__getattr__ = __getattr__
            return m

        def exec_module(self, m):
            pass

    sys.meta_path.insert(0, _Finder())


def _summary(d: dict) -> dict:
    r = {k: d.get(k) for k in KEYS}
    cg = d.get("cuda_graph_config") or {}
    dec, pre = cg.get("decode") or {}, cg.get("prefill") or {}
    r["decode_graph_backend"] = dec.get("backend")
    r["decode_graph_max_bs"] = dec.get("max_bs")
    r["prefill_graph_backend"] = pre.get("backend")
    r["prefill_graph_max_bs"] = pre.get("max_bs")
    return r


def _child(req_path: str, out_path: str) -> None:
    import contextlib
    import io
    import logging

    _install_stubs()
    with open(req_path) as f:
        req = json.load(f)
    from sglang.srt.arg_groups import memory_hook
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import prepare_server_args
    mem = {"mib": 0.0}
    memory_hook.get_device_memory_capacity = lambda *a, **k: mem["mib"]
    logging.disable(logging.WARNING)
    results = []
    for argv, mib, facts in zip(req["argvs"], req["gpu_mem_mib"], req["platforms"]):
        mem["mib"] = mib
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), override_platform(**facts):
                sa = prepare_server_args(list(argv))
                sa.resolve_once()
                sa.check_server_args()
                d = sa.resolved_dict()
            results.append({"ok": True, "error": "", "resolved": _summary(d)})
        except SystemExit:  # argparse: bad or ambiguous flag
            results.append({"ok": False, "error": "argparse: " + err.getvalue().strip().splitlines()[-1:][0]
                            if err.getvalue().strip() else "argparse error", "resolved": None})
        except Exception as e:  # noqa: BLE001 (every resolver rejection is a verdict, not a crash)
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}".strip()[:500], "resolved": None})
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
