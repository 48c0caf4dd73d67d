"""Launcher for Megatron-core trials: `MegatronBackend().run(plan, workload, resources)`.

Spawns `world` worker processes (trials/megatron/worker.py), each in one new session / process
group, with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1,
MASTER_PORT=free port), in a per-trial temporary directory.

Before launching, the plan is checked against what this machine has installed
(`specs.stack.detect_installed`): `spec_choice.layer_spec_choice` picks the layer spec the emitted
script would build (TE or local) and lists what the installed stack cannot build; such a plan,
or one with more ranks than visible GPUs, comes back Failure("unrealizable") without launching.
On GPU the ranks get the emitted script's environment (`specs.stack.launch_env`).

Watches the ranks:
- CPU: any rank's RSS above `Resources.memory_cap_gib` -> kill all -> Failure("oom"); on GPU the
  cap is set on the device by each rank (`set_per_process_memory_fraction`) and CUDA OOM is "oom";
- wall time above `Resources.timeout_s` -> kill all -> Failure("timeout");
- a rank reporting an error -> the earliest report wins: stack-rejected (megatron-core's own
  validation refused the config, message kept), unrealizable, oom, or crash (with the traceback);
- a rank dying without a report -> crash (stderr tail).
Every process group is killed in `finally`; nothing survives a trial.
"""
from __future__ import annotations

import json
import signal
import statistics
import tempfile
import time
from pathlib import Path

from specs.plan import Plan
from specs.stack import Installed, detect_installed, launch_env
from trials.base import Failure, Measurement, Resources, TrialBackend
from trials.megatron.spec_choice import layer_spec_choice, ranks_fit
from trials.processes import RankGroup

POLL_S = 0.1


def _describe(inst: Installed) -> str:
    parts = [f"megatron-core {inst.megatron_core or 'absent'}",
             f"TE {inst.transformer_engine}" if inst.transformer_engine else "no TE"]
    parts += [n for n, ok in (("DeepEP", inst.deepep), ("HybridEP", inst.hybridep),
                              ("grouped_gemm", inst.grouped_gemm), ("apex", inst.apex)) if ok]
    parts.append(f"{inst.devices} GPU(s)")
    return ", ".join(parts)


def _tail(path: Path, n: int = 3000) -> str:
    try:
        data = path.read_bytes()[-n:]
        return data.decode(errors="replace")
    except OSError:
        return ""


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
        too_many = ranks_fit(world, inst)
        if too_many:
            return Failure(plan=plan_s, kind="unrealizable", backend=self.name, message=too_many)
        extra = {"use_te": choice.use_te, "layer_spec": choice.to_dict(), **self.extra_spec}
        if inst.cuda:
            # the device cap is set by each rank; host RSS says nothing about GPU memory
            extra["memory_cap_gib"] = resources.memory_cap_gib
        res = launch(plan_s, workload.model.to_dict(), workload.gbs, workload.seq, world,
                     timeout_s=resources.timeout_s,
                     memory_cap_gib=None if inst.cuda else resources.memory_cap_gib,
                     master_port=resources.master_port, iters=iters, warmup=warmup,
                     keep_dir=self.keep_dir, extra=extra,
                     env=launch_env(plan, workload.cluster) if inst.cuda else None)
        if not res["ok"]:
            return Failure(plan=plan_s, kind=res["kind"], message=res["message"], backend=self.name)
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
            backend=self.name)


def launch(plan: str, model: dict, gbs: int, seq: int, world: int, *, timeout_s: float = 600.0,
           memory_cap_gib: float | None = None, master_port: int | None = None, iters: int = 5,
           warmup: int = 2, mode: str = "train", out_dir: str | None = None,
           keep_dir: bool = False, extra: dict | None = None, env: dict | None = None) -> dict:
    """Run the workers; return {"ok": True, "ranks": [...], "dir": ...} or
    {"ok": False, "kind", "message", "dir"}. memory_cap_gib: host RSS cap per rank (CPU trials);
    extra: more worker spec keys; env: extra environment variables for every rank."""
    tmp = tempfile.TemporaryDirectory(prefix="moetune-trial-") if out_dir is None else None
    d = Path(out_dir or tmp.name)
    d.mkdir(parents=True, exist_ok=True)
    spec = {"plan": plan, "model": model, "gbs": gbs, "seq": seq, "iters": iters, "warmup": warmup,
            "out_dir": str(d), "mode": mode, "pg_timeout_s": max(60.0, float(timeout_s)), **(extra or {})}
    (d / "spec.json").write_text(json.dumps(spec))
    try:
        with RankGroup("trials.megatron.worker", d / "spec.json", world, d, master_port, env=env) as group:
            result = _watch(group.procs, d, world, timeout_s, memory_cap_gib)
        result["dir"] = str(d)
        return result
    finally:
        if tmp is not None and not keep_dir:
            tmp.cleanup()


def _rss_gib(pid: int) -> float:
    try:
        import psutil
        p = psutil.Process(pid)
        return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)]) / 2**30
    except Exception:  # noqa: BLE001 - process gone
        return 0.0


def _watch(procs, d: Path, world: int, timeout_s: float, cap_gib: float | None) -> dict:
    t0 = time.monotonic()
    first_exit = None
    while True:
        reports = _reports(d, world)
        errors = [r for r in reports.values() if not r.get("ok")]
        if errors:
            # give peers a moment to write their own reports, then pick the root cause
            time.sleep(0.5)
            return _classify_error(_reports(d, world), d)
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            reports = _reports(d, world)
            if len(reports) == world and all(r.get("ok") for r in reports.values()):
                return {"ok": True, "ranks": [reports[r] for r in range(world)]}
            return _classify_error(reports, d, codes=codes)
        if any(c not in (None, 0) for c in codes):
            first_exit = first_exit or time.monotonic()
            if time.monotonic() - first_exit > 2.0:
                return _classify_error(_reports(d, world), d, codes=codes)
        if cap_gib is not None:
            for r, p in enumerate(procs):
                rss = _rss_gib(p.pid)
                if rss > cap_gib:
                    return {"ok": False, "kind": "oom",
                            "message": f"rank {r} resident memory {rss:.2f} GiB exceeded the "
                                       f"per-rank cap {cap_gib:g} GiB"}
        if time.monotonic() - t0 > timeout_s:
            return {"ok": False, "kind": "timeout",
                    "message": f"trial exceeded {timeout_s:g} s; all {world} ranks killed"}
        time.sleep(POLL_S)


def _reports(d: Path, world: int) -> dict:
    out = {}
    for r in range(world):
        f = d / f"rank{r}.json"
        if f.exists():
            try:
                out[r] = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError):
                pass
    return out


def _classify_error(reports: dict, d: Path, codes=None) -> dict:
    errors = sorted((r for r in reports.values() if not r.get("ok")), key=lambda r: r["time"])
    # a rank's own validation error beats peers' secondary errors (connection closed etc.)
    for pref in ("stack-rejected", "unrealizable", "oom"):
        for e in errors:
            if e["kind"] == pref:
                return {"ok": False, "kind": pref, "message": f"rank {e['rank']}: {e['message']}"}
    if errors:
        e = errors[0]
        return {"ok": False, "kind": "crash",
                "message": f"rank {e['rank']} ({e['phase']}): {e['message']}\n{e.get('traceback', '')[-1500:]}"}
    # died without a report (signal, hard crash)
    bad = [r for r, c in enumerate(codes or []) if c not in (None, 0)] or [0]
    r = bad[0]
    code = (codes or [None])[r] if codes else None
    tail = _tail(d / f"rank{r}.log")
    kind = "oom" if code == -signal.SIGKILL or "out of memory" in tail.lower() else "crash"
    return {"ok": False, "kind": kind, "message": f"rank {r} exited with code {code}; stderr tail:\n{tail}"}


def run_trial(plan, workload, resources: Resources, iters: int = 5, warmup: int = 2):
    """Function form of MegatronBackend().run."""
    return MegatronBackend().run(plan, workload, resources, iters=iters, warmup=warmup)
