"""Launcher for Megatron-core trials: `MegatronBackend().run(plan, workload, resources)`.

Spawns `world` worker processes (trials/megatron/worker.py), each in one new session / process
group, with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1,
MASTER_PORT=free port), in a per-trial temporary directory. When `Resources.layout` says the world
spans Ray nodes, trials/placement.py starts each node's share of the ranks the same way from a
launcher actor in a placement group, rendezvous on the first node.

Before launching, the plan is checked against what this machine has installed
(`specs.stack.detect_installed`): `spec_choice.layer_spec_choice` picks the layer spec the emitted
script would build (TE or local) and lists what the installed stack cannot build; such a plan,
or one with more ranks than visible GPUs, comes back Failure("unrealizable") without launching.
On GPU the ranks get the emitted script's environment (`specs.stack.launch_env`).

Watches the ranks (trials/rank_watch.py):
- CPU: any rank's RSS above `Resources.memory_cap_gib` -> kill all -> Failure("oom"); on GPU the
  cap is set on the device by each rank (`set_per_process_memory_fraction`) and CUDA OOM is "oom";
- wall time above `Resources.timeout_s` -> kill all -> Failure("timeout");
- a rank reporting an error -> the earliest report wins: stack-rejected (megatron-core's own
  validation refused the config, message kept), unrealizable, oom, or crash (with the traceback);
- a rank dying without a report -> crash (stderr tail).
Every process group is killed in `finally`; nothing survives a trial.

CPU ranks run with `cpu_allocator_env()` (CPU_ALLOCATOR_TUNABLES): glibc malloc keeps the memory a step frees (fixed mmap
threshold, no heap trimming), as PyTorch's CUDA caching allocator does on a GPU. With glibc's
defaults each step handed its activation memory back to the kernel and faulted it in again on
the next step; on this project's 2-core VM that cost 30-40 ms of a 0.5 s step and most of the
run-to-run spread (tiny-moe mbs=8 gbs 16 seq 256, three interleaved runs each: 0.509/0.509/0.731 s
median step with the defaults, 0.477/0.482/0.479 s with the tunables; minor faults per step
~20K -> ~2K).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import statistics
import threading
from pathlib import Path

from specs.plan import Plan
from specs.stack import Installed, detect_installed, launch_env
from trials.base import Failure, Measurement, Resources, TrialBackend
from trials.megatron.components import component_times
from trials.megatron.spec_choice import layer_spec_choice, ranks_fit
from trials.processes import RankGroup, trial_tempdir
from trials.rank_watch import watch_local

logger = logging.getLogger(__name__)
PORT_RETRIES = 2  # launches again when another process took the rendezvous port (`launch`)

# glibc tunables for CPU ranks (module docstring): 32 MiB is glibc's largest dynamic mmap
# threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit), fixed here so the threshold does not move;
# the trim threshold (16 GiB) keeps freed heap memory in the process.
CPU_ALLOCATOR_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184"


def cpu_allocator_env() -> dict:
    """The environment CPU trial ranks get: CPU_ALLOCATOR_TUNABLES, after any GLIBC_TUNABLES the
    user set (glibc applies the list in order, so ours win only for the two malloc keys)."""
    own = os.environ.get("GLIBC_TUNABLES")
    return {"GLIBC_TUNABLES": f"{own}:{CPU_ALLOCATOR_TUNABLES}" if own else CPU_ALLOCATOR_TUNABLES}


def _describe(inst: Installed) -> str:
    parts = [f"megatron-core {inst.megatron_core or 'absent'}",
             f"TE {inst.transformer_engine}" if inst.transformer_engine else "no TE"]
    parts += [n for n, ok in (("DeepEP", inst.deepep), ("HybridEP", inst.hybridep),
                              ("grouped_gemm", inst.grouped_gemm), ("apex", inst.apex)) if ok]
    parts.append(f"{inst.devices} GPU(s)")
    return ", ".join(parts)


class MegatronBackend(TrialBackend):
    name = "megatron"

    def __init__(self, *, keep_dir: bool = False, extra_spec: dict | None = None,
                 enforce_stack: bool = True, enforce_cpu_support: bool | None = None,
                 installed: Installed | None = None):
        """enforce_stack: refuse (Failure "unrealizable") plans the installed stack cannot build
        as planned (spec_choice.layer_spec_choice; on CPU the cpu_support table) instead of
        handing them to megatron-core; False lets megatron-core's own validation answer.
        enforce_cpu_support: the former name of enforce_stack (overrides it when given).
        installed: the stack to check against; None = `detect_installed()` of this machine."""
        self.enforce_stack = enforce_stack if enforce_cpu_support is None else enforce_cpu_support
        self.keep_dir = keep_dir
        self.extra_spec = dict(extra_spec or {})
        self.installed = installed

    # The plan is run as given (the caller completes / checks it; see tuner.commands.trial).
    def run(self, plan, workload, resources: Resources, *, iters: int = 5,
            warmup: int = 2) -> Measurement | Failure:
        plan = plan if hasattr(plan, "canonical") else Plan.parse(str(plan))
        plan_s = plan.canonical()
        world = resources.devices
        inst = self.installed or detect_installed()
        choice = layer_spec_choice(plan, inst, workload.model)
        where = "CPU trial backend" if not inst.cuda else f"installed stack: {_describe(inst)}"
        if self.enforce_stack and not choice.realizable:
            return Failure(plan=plan_s, kind="unrealizable", backend=self.name,
                           message=f"{choice.reason()} ({where})")
        too_many = ranks_fit(world if not resources.layout else max(resources.layout), inst)
        if too_many:
            return Failure(plan=plan_s, kind="unrealizable", backend=self.name, message=too_many)
        extra = {"use_te": choice.use_te, "layer_spec": choice.to_dict(), **self.extra_spec}
        if inst.cuda:
            # the device cap is set by each rank; host RSS says nothing about GPU memory
            extra["memory_cap_gib"] = resources.memory_cap_gib
        env = launch_env(plan, workload.cluster) if inst.cuda else cpu_allocator_env()
        cap = None if inst.cuda else resources.memory_cap_gib
        if resources.layout:  # the world spans Ray nodes: one launcher per node (trials/placement.py)
            from trials.placement import launch_spread
            spec = worker_spec(plan_s, workload.model.to_dict(), workload.gbs, workload.seq, iters=iters,
                               warmup=warmup, timeout_s=resources.timeout_s, extra=extra)
            res = launch_spread("trials.megatron.worker", spec, world, list(resources.layout),
                                is_gpu=inst.cuda, timeout_s=resources.timeout_s, memory_cap_gib=cap, env=env)
        else:
            res = launch(plan_s, workload.model.to_dict(), workload.gbs, workload.seq, world,
                         timeout_s=resources.timeout_s, memory_cap_gib=cap,
                         master_port=resources.master_port, iters=iters, warmup=warmup,
                         keep_dir=self.keep_dir, extra=extra, env=env)
        nodes = tuple(res.get("nodes") or ())
        if not res["ok"]:
            return Failure(plan=plan_s, kind=res["kind"], message=res["message"], backend=self.name,
                           nodes=nodes)
        r0 = res["ranks"][0]
        times = r0["step_times_s"]
        med = statistics.median(times)
        return Measurement(
            plan=plan_s, step_time_s=med, step_time_spread_s=max(times) - min(times),
            step_times_s=tuple(times),
            tokens_per_s_per_gpu=workload.gbs * workload.seq / med / world,
            peak_memory_gib=tuple(r0["peak_memory_gib"]),
            losses=tuple(float(x) for x in r0["losses"]),
            versions=dict(r0.get("versions", {}), world=world, dp=r0.get("dp"),
                          num_microbatches=r0.get("num_microbatches"),
                          cpu_patched=r0.get("cpu_patched"), experts=choice.experts,
                          fp8_recipe=choice.fp8_recipe,
                          memory=(r0.get("memory_detail") or [{}])[0].get("what", "")),
            backend=self.name, nodes=nodes, component_times_s=component_times(r0.get("component_shares"), med))


def worker_spec(plan: str, model: dict, gbs: int, seq: int, *, iters: int, warmup: int, timeout_s: float,
                mode: str = "train", extra: dict | None = None) -> dict:
    """The worker's spec.json, less its out_dir (each node's launcher sets its own)."""
    return {"plan": plan, "model": model, "gbs": gbs, "seq": seq, "iters": iters, "warmup": warmup,
            "mode": mode, "pg_timeout_s": max(60.0, float(timeout_s)), **(extra or {})}


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM raises SystemExit while a trial runs in the main thread (where the default action
    would end the process without its `finally` clauses: the temporary folder would stay)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def _raise(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def launch(plan: str, model: dict, gbs: int, seq: int, world: int, *, timeout_s: float = 600.0,
           memory_cap_gib: float | None = None, master_port: int | None = None, iters: int = 5,
           warmup: int = 2, mode: str = "train", out_dir: str | None = None,
           keep_dir: bool = False, extra: dict | None = None, env: dict | None = None) -> dict:
    """Run the workers; return {"ok": True, "ranks": [...], "dir": ...} or
    {"ok": False, "kind", "message", "dir"}. memory_cap_gib: host RSS cap per rank (CPU trials);
    extra: more worker spec keys; env: extra environment variables for every rank."""
    # the rendezvous port is picked free and bound by rank 0 a moment later: on a busy host another
    # process can take it in between (a profile's stack-floor trial, 2026-12-05: "OSError: [Errno
    # 98] Address already in use" at init). A port we chose is chosen again, in a fresh folder; one
    # the caller named, or a folder the caller keeps, is not retried.
    retries = PORT_RETRIES if master_port is None and out_dir is None else 0
    while True:
        result = _launch_once(plan, model, gbs, seq, world, timeout_s=timeout_s, memory_cap_gib=memory_cap_gib,
                              master_port=master_port, iters=iters, warmup=warmup, mode=mode, out_dir=out_dir,
                              keep_dir=keep_dir, extra=extra, env=env)
        if result["ok"] or retries == 0 or "Address already in use" not in str(result.get("message", "")):
            return result
        retries -= 1
        logger.warning("trial rendezvous port taken by another process; retrying on a new port")


def _launch_once(plan, model, gbs, seq, world, *, timeout_s, memory_cap_gib, master_port, iters, warmup, mode,
                 out_dir, keep_dir, extra, env) -> dict:
    tmp = trial_tempdir(owned=not keep_dir) if out_dir is None else None  # a kept folder is never swept
    d = Path(out_dir or tmp.name)
    try:
        d.mkdir(parents=True, exist_ok=True)
        spec = worker_spec(plan, model, gbs, seq, iters=iters, warmup=warmup, mode=mode, timeout_s=timeout_s,
                           extra=extra)
        (d / "spec.json").write_text(json.dumps(dict(spec, out_dir=str(d))))
        with _sigterm_raises(), \
                RankGroup("trials.megatron.worker", d / "spec.json", world, d, master_port, env=env,
                          die_with_parent=True) as group:  # a launcher killed with -9 takes its ranks along
            result = watch_local(group.procs, d, world, timeout_s, memory_cap_gib)
        result["dir"] = str(d)
        return result
    finally:
        if tmp is not None and not keep_dir:
            tmp.cleanup()


def run_trial(plan, workload, resources: Resources, iters: int = 5, warmup: int = 2):
    """Function form of MegatronBackend().run."""
    return MegatronBackend().run(plan, workload, resources, iters=iters, warmup=warmup)
