"""Driver of `moetune profile`: sweep points -> Ray actors (one per device) / spawned collective
workers -> partial CSVs (resume) -> the tables the cost model reads, written atomically.

    run_profile("cpu-local", out_dir, budget_s=600)

Budget: per-device sweeps run coarse-to-fine (grid ends first, then midpoints), interleaved over
families, until their share of the budget is used; collectives get the rest (minus a few seconds
to assemble). Unmeasured grid points are holes the table loader fills from the nearest measured
point; a rerun measures only what is missing (partial/<runner>.csv in the output directory).
A family with no measured row at all keeps the shipped default rows (source "default: ...").
GEMM, grouped GEMM and attention are merged into the shipped grid per key (dtype, direction):
a measured key replaces the shipped rows at the points it measured and keeps the rest of the
shipped grid scaled by the measured/shipped ratio interpolated from the measured points around
each cell (`_ratio_field`), so a measurement never narrows the
range the cost model can look up; a key with no measured row (e.g. fp8 where this machine cannot
run fp8) keeps its shipped rows, and the notes say so.

Rounds: every per-device point is measured `rounds` times (default 2), interleaved: within each
coarse-to-fine level, blocks of ROUND_BLOCK points are measured once, then again, so two samples
of a point are a block apart (not back-to-back calls) and a budget that ends mid-level leaves
what it reached measured in every round. A table
row holds the median over its rounds, `samples` and `spread` ((max - min) / median of the rounds);
points whose spread exceeds SPREAD_WARN are listed in the report ("noisy") and logged. A point
measured in one round only (the budget ran out) has samples 1 and no spread.

What was measured and what was not (with the reason: skipped on this device, budget reached,
errors) is in the returned info's "report" and in meta.json ("profile" -> "report"); the tables
written always equal what that report says. Each family's timing statistic is in meta.json
("statistic").
"""
from __future__ import annotations

import csv
import datetime
import importlib
import io
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from specs.fileio import write_atomic
from trials.profile.common import Ctx, fp8_skip_reason, host_info, pin_to_core, sustain_clocks, te_skip_reason

DEVICE_RUNNERS = ("dispatch_gap", "gemm", "grouped_mlp", "attention", "elementwise", "cross_entropy")
# table families each runner writes (the report names a family's runners when it is not measured)
RUNNER_FAMILIES = {"dispatch_gap": ("dispatch_gap",), "stack_floor": ("dispatch_gap",), "gemm": ("gemm",),
                   "grouped_mlp": ("grouped_gemm",), "attention": ("attention",), "elementwise": ("membw",),
                   "cross_entropy": ("membw",), "collectives": ("collectives", "ep_dispatch")}
MERGED_FAMILIES = ("gemm", "grouped_gemm", "attention")  # merged into the shipped grid per key
ROUNDS = 2  # samples of each per-device point, interleaved (see the module docstring)
ROUND_SEP = "#r"  # point id of round k > 0: "<id>#r<k>"
ROUND_BLOCK = 8  # points measured once before they are measured again (see _ordered)
SPREAD_WARN = 0.10  # a point whose rounds differ by more than this (relative) is reported noisy
REPO = Path(__file__).resolve().parents[2]
SOURCES = {
    "measured:gemm": "moetune profile: torch F.linear(x[m,k], w[n,k]) timed per device (trials/profile/gemm.py)",
    "measured:sequential-mlp": "moetune profile: Megatron SequentialMLP expert loop (split, F.linear per local expert, cat), "
                               "as the CPU trial stack runs the experts; /fwd, /dgrad, /wgrad (trials/profile/grouped_mlp.py)",
    "measured:scaled-mm-fp8": "moetune profile: torch._scaled_mm fp8 (e4m3, tensorwise scales, bf16 out) GEMM, "
                              "quantisation not timed (trials/profile/gemm.py)",
    "measured:te-grouped-linear": "moetune profile: TransformerEngine te.pytorch.GroupedLinear (the layer under "
                                  "Megatron's TEGroupedMLP), /fwd, /dgrad, /wgrad at their table coordinates; fp8 "
                                  "under fp8_autocast(DelayedScaling), quantisation included (trials/profile/grouped_mlp.py)",
    "measured:grouped-mm": "moetune profile: torch._grouped_mm grouped GEMM, /fwd, /dgrad, /wgrad; TE was not "
                           "importable, and no stack runs this kernel: a stand-in (trials/profile/grouped_mlp.py)",
    "measured:sequential-loop": "moetune profile: one F.linear per group on GPU (neither TE nor torch._grouped_mm "
                                "available) (trials/profile/grouped_mlp.py)",
    "measured:sdpa-flash": "moetune profile: torch SDPA causal fwd/bwd, flash backend forced, batch x heads in the "
                           "source (trials/profile/attention.py)",
    "measured:sdpa-efficient": "moetune profile: torch SDPA causal fwd/bwd, memory-efficient backend forced (flash "
                               "could not run the shape) (trials/profile/attention.py)",
    "measured:sdpa-math": "moetune profile: torch SDPA causal fwd/bwd, math backend forced (neither flash nor "
                          "efficient could run the shape) (trials/profile/attention.py)",
    "measured:megatron-local-attention": "moetune profile: unfused baddbmm/mask/fp32 softmax/bmm of Megatron's local "
                                         "DotProductAttention, fwd and bwd (trials/profile/attention.py)",
    "measured:dispatch-gap-eager": "moetune profile: per-op time of a chain of 1-element adds (trials/profile/dispatch_gap.py)",
    "measured:dispatch-gap-autograd": "moetune profile: per-op time of a recorded chain, fwd + bwd (trials/profile/dispatch_gap.py)",
    "measured:stack-floor": "moetune profile: Megatron trial backend, 1 rank, reference MoE model with 1 and 3 layers at "
                            "16 tokens; per-layer fwd+bwd time / structural kernels (trials/profile/stack_floor.py)",
    "measured:ep-alltoall": "moetune profile: Megatron alltoall dispatcher pattern (counts all_to_all + all_to_all_single "
                            "with splits), t = latency + sent/bw least-squares fit over payloads (trials/profile/collectives.py)",
}


# ---- partial store (resume) -------------------------------------------------------------------
class PartialStore:
    """out/partial/<runner>.csv: one line per measured row (point id, family, row as JSON).
    Rewritten atomically (temp file + os.replace) after every result."""

    def __init__(self, out: Path):
        self.dir = Path(out) / "partial"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, dict[str, list]] = {}
        for p in self.dir.glob("*.csv"):
            rows: dict[str, list] = {}
            try:
                with open(p, newline="") as f:
                    for r in csv.DictReader(f):
                        try:
                            rows.setdefault(r["point"], []).append((r["family"], json.loads(r["row"])))
                        except (KeyError, json.JSONDecodeError, TypeError):
                            continue
            except (OSError, csv.Error):
                continue
            self.data[p.stem] = rows

    def done(self, runner: str) -> set:
        return set(self.data.get(runner, {}))

    def add(self, runner: str, point_id: str, rows: list) -> None:
        self.data.setdefault(runner, {})[point_id] = [(f, dict(r)) for f, r in rows]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["point", "family", "row"])
        for pid, rs in self.data[runner].items():
            for fam, r in rs:
                w.writerow([pid, fam, json.dumps(r, sort_keys=True)])
        write_atomic(self.dir / f"{runner}.csv", buf.getvalue())

    def rows(self) -> dict[str, list[dict]]:
        """Every measured row by family; a row of a point measured in several rounds carries the
        point's `samples` and `spread` (`point_spreads`)."""
        spreads = {(runner, pid): s for runner, pid, s, _ in self.point_spreads()}
        counts = {}
        for runner, rs in self.data.items():
            for pid in rs:
                base = pid.split(ROUND_SEP)[0]
                counts[(runner, base)] = counts.get((runner, base), 0) + 1
        out: dict[str, list[dict]] = {}
        for runner, rs in self.data.items():
            for pid, lst in rs.items():
                base = pid.split(ROUND_SEP)[0]
                extra = {}
                if counts[(runner, base)] > 1:
                    extra = {"samples": counts[(runner, base)], "spread": spreads.get((runner, base), 0.0)}
                for fam, r in lst:
                    out.setdefault(fam, []).append(dict(r, **extra))
        return out

    def point_spreads(self) -> list[tuple[str, str, float, int]]:
        """[(runner, point id, spread, rounds)] of the points measured in more than one round:
        the largest relative spread, (max - min) / median over the rounds, of any row's first
        value column (rows of a point line up across rounds: the runner returns them in order)."""
        from cost_model.tables import FAMILIES
        out = []
        for runner, rs in self.data.items():
            by: dict = {}
            for pid, lst in rs.items():
                by.setdefault(pid.split(ROUND_SEP)[0], []).append(lst)
            for base, rounds in by.items():
                if len(rounds) < 2 or len({len(x) for x in rounds}) != 1:
                    continue
                worst = 0.0
                for j in range(len(rounds[0])):
                    fam = rounds[0][j][0]
                    col = FAMILIES[fam][2][0] if fam in FAMILIES else next(
                        (k for k in ("seconds", "gbps", "tflops") if k in rounds[0][j][1]), None)
                    try:
                        v = [float(x[j][1][col]) for x in rounds]
                    except (KeyError, TypeError, ValueError):
                        continue
                    med = statistics.median(v)
                    if med > 0:
                        worst = max(worst, (max(v) - min(v)) / med)
                out.append((runner, base, worst, len(rounds)))
        return out

    def count(self) -> int:
        return sum(len(v) for v in self.data.values())


# ---- per-device execution ----------------------------------------------------------------------
class DeviceProfiler:
    """Measures sweep points on one device (a pinned core on CPU, one GPU). Used as a Ray actor."""

    def __init__(self, index: int, device: str, sweep: str, min_time_s: float = 0.01, reps: int = 3,
                 flush_l2: bool = True, sustain_s: float = 2.0, extra: dict | None = None):
        import torch
        if device.startswith("cuda"):
            torch.cuda.set_device(index % max(1, torch.cuda.device_count()))
            device = f"cuda:{torch.cuda.current_device()}"
        else:
            pin_to_core(index)
        self.ctx = Ctx(device=device, sweep=sweep, min_time_s=min_time_s, reps=reps, flush_l2=flush_l2,
                       sustain_s=sustain_s, extra=dict(extra or {}))
        # GPU: settle the clocks at their sustained value before the first point (no-op on CPU);
        # the points then run back to back, which keeps the device loaded
        sustain_clocks(self.ctx)

    def measure(self, runner: str, point: dict):
        mod = importlib.import_module(f"trials.profile.{runner}")
        try:
            return runner, point["id"], mod.measure(point, self.ctx), None
        except Exception as e:  # noqa: BLE001 - one bad point must not end the sweep
            return runner, point["id"], [], f"{type(e).__name__}: {e}"


def _ray_session(address: str | None, num_cpus: int, on_gpu: bool = True):
    """Ray for the profiling actors (trials/ray_runtime.py: token, loopback, workers not niced);
    their workers import this checkout and run one OpenMP thread each. CPU profiling workers get
    the trial ranks' allocator (trials/megatron/backend.py cpu_allocator_env): with glibc's
    defaults a microbenchmark page-faults its temporaries in again on every call, which the
    trials do not (Megatron's CPU attention, fwd + bwd, one thread, quiet 2-core VM, three runs of
    12 calls, bench/cpu_attention_alloc_probe.py: seq 1024 bh 4 faulted 20-33 MiB per call with the
    defaults, 3-6 MiB with the trials' tunables, +11-32% CPU time; bh 8 -1..+42%; seq 256 bh 32
    -1..+10%), so the
    tables priced what the trials do not pay. `--executor local` measures in the calling process,
    with whatever allocator it started with."""
    from trials.megatron.backend import cpu_allocator_env
    from trials.ray_runtime import ray_session
    env = {"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **({} if on_gpu else cpu_allocator_env())}}
    return ray_session(address, num_cpus=num_cpus, runtime_env=env, object_store_memory=80 * 1024 * 1024,
                       configure_logging=False)


def _prof_args(ctx: Ctx) -> tuple:
    return ctx.sweep, ctx.min_time_s, ctx.reps, ctx.flush_l2, ctx.sustain_s, ctx.extra


def _make_actors(ray, ctx: Ctx, devices: int, address: str | None):
    remote = ray.remote(DeviceProfiler)
    if ctx.on_gpu:
        return [remote.options(num_gpus=1, num_cpus=1).remote(i, "cuda", *_prof_args(ctx)) for i in range(devices)]
    if address:  # a Ray cluster of CPU nodes: one actor per node, points spread over the nodes
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        return [remote.options(num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(
            0, "cpu", *_prof_args(ctx)) for n in nodes]
    return [remote.options(num_cpus=1).remote(i, "cpu", *_prof_args(ctx)) for i in range(devices)]


def _ordered(todo: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """Coarse-to-fine; within a level, round-robin over runners, in blocks of ROUND_BLOCK points:
    a block once, then the same block again for each further round, then the next block. Two
    samples of a point are a block apart (interleaved, never back to back), and a budget that ends
    mid-level leaves the points it reached measured in every round."""
    by: dict = {}
    rounds: dict = {}
    for r, p in todo:
        base = p["id"].split(ROUND_SEP)[0]
        key = (p.get("level", 0), r)
        if base not in rounds.setdefault(key, {}):
            by.setdefault(key, []).append(base)
        rounds[key].setdefault(base, {})[p.get("_round", 0)] = (r, p)
    out = []
    for lvl in sorted({k[0] for k in by}):
        keys = [k for k in sorted(by) if k[0] == lvl]
        queues = [list(by[k]) for k in keys]
        seq = []  # (key, base) round-robin over runners
        while any(queues):
            for k, q in zip(keys, queues):
                if q:
                    seq.append((k, q.pop(0)))
        for i in range(0, len(seq), ROUND_BLOCK):
            block = seq[i:i + ROUND_BLOCK]
            for k_round in sorted({n for k, b in block for n in rounds[k][b]}):
                out += [rounds[k][b][k_round] for k, b in block if k_round in rounds[k][b]]
    return out


def run_profile(kind: str, out: str | Path, budget_s: float, *, ray_address: str | None = None,
                executor: str = "ray", sweep: str = "full", devices: int | None = None,
                progress: bool = True, log=print, min_time_s: float = 0.01, reps: int = 3,
                flush_l2: bool = True, sustain_s: float = 2.0, extra: dict | None = None,
                rounds: int = ROUNDS) -> dict:
    """Measure this machine's tables for cluster kind `kind` into `out` within `budget_s` seconds.

    ray_address: an existing Ray cluster (default: embedded); executor: "ray" (an actor per
    device) or "local" (this process, one device); sweep: tiny | small | full; devices: devices
    to use (default: all GPUs, or all usable cores); progress: show a progress bar; log: one-line
    messages (skips, errors); min_time_s, reps, flush_l2, sustain_s: timing (trials.profile.common.Ctx);
    extra: runner options (attention: attn_heads, attn_tokens, sdpa_backends); rounds: samples
    of each per-device point, interleaved (>= 1).
    Returns the profile info written into meta.json["profile"], with "report" (measured and
    not-measured families with reasons, points per runner) and "digest"."""
    import torch
    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    on_gpu = torch.cuda.is_available()
    ctx = Ctx(device="cuda" if on_gpu else "cpu", sweep=sweep, min_time_s=min_time_s, reps=reps,
              flush_l2=flush_l2, sustain_s=sustain_s, extra=dict(extra or {}))
    if devices is None:
        devices = torch.cuda.device_count() if on_gpu else len(os.sched_getaffinity(0))
    store = PartialStore(out)
    skipped = _gpu_only_skips(ctx)
    substitutes = _substitutes(ctx)
    todo, total = [], 0
    ids: dict[str, set] = {}
    for name in DEVICE_RUNNERS:
        mod = importlib.import_module(f"trials.profile.{name}")
        # a runner that can always measure on this device defines no skip_reason
        why = getattr(mod, "skip_reason", lambda _ctx: None)(ctx)
        if why:
            skipped.append(f"{name}: {why}")
            continue
        pts = [p if k == 0 else dict(p, id=f"{p['id']}{ROUND_SEP}{k}") for k in range(rounds)
               for p in mod.points(ctx)]
        for p in pts:
            p["_round"] = int(p["id"].split(ROUND_SEP)[1]) if ROUND_SEP in p["id"] else 0
        ids[name] = {p["id"] for p in pts}
        total += len(pts)
        done = store.done(name)
        todo += [(name, p) for p in pts if p["id"] not in done]
    from trials.profile import stack_floor as _sf
    sf_why = _sf.skip_reason(ctx)
    if not sf_why:
        ids["stack_floor"] = {p["id"] for p in _sf.points(ctx)}
        total += len(ids["stack_floor"])
        already_sf = len(ids["stack_floor"] & store.done("stack_floor"))
    else:
        already_sf = 0
    from trials.profile import collectives
    why = collectives.skip_reason(ctx, devices)
    cpts = []
    if why:
        skipped.append(f"collectives: {why}; the shipped collective and ep_dispatch rows are kept")
    else:
        allc = collectives.points(ctx, devices)
        ids["collectives"] = {p["id"] for p in allc}
        total += len(allc)
        done = store.done("collectives")
        cpts = [p for p in allc if p["id"] not in done]
    for s_ in skipped:
        log(f"skip  {s_}")
    for s_ in substitutes:
        log(f"note  {s_}")
    todo = _ordered(todo)
    already = total - len(todo) - len(cpts) - (len(ids["stack_floor"]) - already_sf if not sf_why else 0)
    if already:
        log(f"resume: {already} of {total} points already measured in {out / 'partial'}")
    reserve = min(10.0, 0.05 * budget_s)
    dev_deadline = t0 + (budget_s - reserve) * (0.6 if cpts else 1.0)
    bar = _bar(total, already, progress)
    errors: list[str] = []

    def record(runner, pid, rows, err):
        if err:
            errors.append(f"{runner} {pid}: {err}")
        elif rows:
            store.add(runner, pid, rows)
        bar.update(1)

    # The stack floor first: on CPU it is the largest term of a small trial's step (Megatron's
    # per-layer Python), and a budget spent on the GEMM grid before it used to leave its grid
    # incomplete (3 of 4 points at --budget-min 4), so the model fell back to the bare eager gap.
    # Round 0 (one sample per grid point, ~4 trial launches) always runs; later rounds only while
    # the first 30% of the budget lasts.
    if sf_why:
        skipped.append(f"dispatch_gap stack: {sf_why}")
    else:
        for p in _sf.points(ctx):
            if p["id"] in store.done("stack_floor"):
                continue
            if p["round"] > 0 and time.time() > t0 + (budget_s - reserve) * 0.3:
                break
            try:
                # on every profiled core at once, as a cpu-local trial's ranks run (stack_floor.py)
                sec, split = _sf.measure_layers(p["layers"], p["microbatches"], world=devices,
                                                **({"iters": 3, "warmup": 1} if sweep == "tiny" else {}))
                record("stack_floor", p["id"], [("stack_sample", dict(
                    layers=p["layers"], microbatches=p["microbatches"], seconds=sec, split=split,
                    source="measured:stack-floor"))], None)
            except Exception as e:  # noqa: BLE001
                record("stack_floor", p["id"], [], f"{type(e).__name__}: {e}")
    if todo:
        if executor == "local":
            _run_local(todo, ctx, dev_deadline, record)
        else:
            _run_ray(todo, ctx, devices, dev_deadline, record, ray_address)
    if cpts:
        coll_deadline = t0 + budget_s - reserve
        if time.time() < coll_deadline:
            r = collectives.run(ctx, cpts, devices, coll_deadline,
                                on_result=lambda pid, rows: record("collectives", pid, rows, None))
            if r["stopped"]:
                errors.append(f"collectives: {r['stopped']}")
    bar.close()
    for e in errors[:10]:
        log(f"error {e}")
    measured = store.count()
    points = {r: [len(ids[r] & store.done(r)), len(ids[r])] for r in ids}
    spreads = store.point_spreads()
    noisy = sorted(([r, p, round(s, 4), n] for r, p, s, n in spreads if s > SPREAD_WARN), key=lambda x: -x[2])
    for _r, p, s, n in noisy[:10]:
        log(f"noisy {p}: its {n} rounds differ by {s:.0%} (> {SPREAD_WARN:.0%})")
    if len(noisy) > 10:
        log(f"noisy: {len(noisy) - 10} more points over {SPREAD_WARN:.0%} (meta.json profile.noisy_points)")
    info = dict(host_info(), date=datetime.datetime.now().isoformat(timespec="seconds"), budget_s=budget_s,
                sweep=sweep, device=ctx.device, devices=devices, points_total=total, points_measured=measured,
                rounds=rounds, points_with_rounds=len(spreads), spread_warn=SPREAD_WARN, noisy_points=noisy,
                elapsed_s=round(time.time() - t0, 1), skipped=skipped, substitutes=substitutes, errors=errors[:50],
                statistic=ctx.statistic, points_by_runner=points, timing=dict(
                    min_time_s=min_time_s, reps=reps, flush_l2=flush_l2 and on_gpu,
                    sustain_s=sustain_s if on_gpu else 0.0, extra=ctx.extra))
    digest = assemble(kind, out, store, info)
    info.update(digest=digest, elapsed_s=round(time.time() - t0, 1))
    return info


def _substitutes(ctx: Ctx) -> list[str]:
    """What this device measures in place of the stack's own kernel (logged, and in the notes)."""
    if not ctx.on_gpu:
        return []
    from trials.profile import grouped_mlp
    be = grouped_mlp.backend(ctx)
    if be == "te-grouped-linear":
        return []
    return [f"grouped_gemm: {te_skip_reason() or 'TE has no GroupedLinear'}; measured with {be} instead "
            f"(row source measured:{be}/...), which no stack runs: a stand-in for TE's grouped GEMM"]


def family_report(fam: dict[str, list[dict]], info: dict) -> dict:
    """{"measured": [families with a measured row], "not_measured": {family: reason}} from the
    assembled rows and the run's skips, per-runner point counts and errors."""
    from cost_model.tables import FAMILIES
    measured = sorted(f for f in FAMILIES if any(str(r["source"]).startswith("measured") for r in fam[f]))
    not_measured = {}
    for f in FAMILIES:
        if f in measured:
            continue
        runners = [r for r, fs in RUNNER_FAMILIES.items() if f in fs]
        # a whole-runner skip is logged as "<runner>: <reason>" (partial ones as "<runner> <part>: ...")
        why = [s for s in info.get("skipped", []) if s.split(":")[0] in runners + [f]]
        pts = {r: info.get("points_by_runner", {}).get(r) for r in runners if r in info.get("points_by_runner", {})}
        errs = [e for e in info.get("errors", []) if e.split(" ")[0].rstrip(":") in runners]
        if why:
            reason = "skipped: " + "; ".join(why)
        elif errs:
            reason = f"{len(errs)} point(s) failed, e.g. {errs[0]}"
        elif pts:
            reason = "budget reached before any of its points was measured (" + ", ".join(
                f"{r}: {m} of {n} points measured" for r, (m, n) in pts.items()) + ")"
        else:
            reason = "no runner measures it on this device"
        not_measured[f] = reason
    return {"measured": measured, "not_measured": not_measured}


class _NoBar:
    def update(self, n=1):
        pass

    def close(self):
        pass


def _bar(total, initial, progress):
    if not progress:
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit="pt", desc="profile", dynamic_ncols=True)


def _run_local(todo, ctx: Ctx, deadline: float, record) -> None:
    import torch
    try:
        aff = os.sched_getaffinity(0)
    except AttributeError:
        aff = None
    threads = torch.get_num_threads()
    try:
        prof = DeviceProfiler(0, ctx.device, *_prof_args(ctx))
        for runner, p in todo:
            if time.time() > deadline:
                break
            record(*prof.measure(runner, p))
    finally:  # the CLI process must not stay pinned: collective workers inherit its affinity
        torch.set_num_threads(threads)
        if aff is not None:
            os.sched_setaffinity(0, aff)


def _run_ray(todo, ctx: Ctx, devices: int, deadline: float, record, address: str | None) -> None:
    import ray
    with _ray_session(address, devices, ctx.on_gpu):
        actors = _make_actors(ray, ctx, devices, address)
        queue = list(todo)
        inflight = {}
        for a in actors:
            if queue:
                r, p = queue.pop(0)
                inflight[a.measure.remote(r, p)] = a
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=max(1.0, deadline - time.time() + 60))
            if not ready:
                break
            for ref in ready:
                a = inflight.pop(ref)
                record(*ray.get(ref))
                if queue and time.time() < deadline:
                    r, p = queue.pop(0)
                    inflight[a.measure.remote(r, p)] = a
        for a in actors:
            ray.kill(a)


def _gpu_only_skips(ctx: Ctx) -> list[str]:
    kept = "the shipped fp8 rows are kept, so fp8 plans are predicted from the shipped table, not this machine"
    if ctx.on_gpu:
        out = []
        why = fp8_skip_reason(ctx)
        if why:
            out.append(f"gemm fp8: {why}; {kept}")
        from trials.profile.grouped_mlp import fp8_grouped_skip_reason
        why_g = fp8_grouped_skip_reason(ctx)
        if why_g:
            out.append(f"grouped_mlp fp8: {why_g}; {kept}")
        return out + [
            "ep_dispatch deepep/hybridep: DeepEP/HybridEP kernels are not benchmarked here (alltoall only)",
            "collectives scaleout: one host measured; scale-out rows copy scale-up (run on a Ray cluster "
            "spanning nodes to measure them)"]
    return [f"gemm/grouped_gemm fp8: GPU only (the CPU trial stack runs bf16 plans in fp32; fp32 is measured "
            f"and written under bf16 and fp32); {kept}",
            "grouped GEMM kernel: GPU only (CPU: Megatron's SequentialMLP loop is measured instead)",
            "attention SDPA flash backend: GPU only (CPU: Megatron's local unfused attention is measured)",
            "ep_dispatch deepep/hybridep: GPU only (alltoall dispatcher measured)",
            "collectives scaleout: single host (scale-out rows copy the measured scale-up rows)"]


# ---- assembly ------------------------------------------------------------------------------------
def _median_rows(rows: list[dict], keys: tuple, values: tuple) -> list[dict]:
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for _, rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        r = dict(rs[0])
        for v in values:
            r[v] = float(statistics.median(float(x[v]) for x in rs))
        if any("samples" in x for x in rs):  # a point measured in rounds: its worst spread
            r["samples"] = max(int(x.get("samples", 1)) for x in rs)
            r["spread"] = max(float(x.get("spread", 0.0)) for x in rs)
        srcs = sorted({str(x["source"]) for x in rs})
        if len(srcs) > 1:  # e.g. a fwd and a wgrad measurement landing on the same grouped_gemm point
            r["source"] = "+".join(srcs)
        out.append(r)
    return out


def merge_with_shipped(family: str, measured: list[dict], shipped: list[dict]) -> tuple[list[dict], list[str]]:
    """Measured rows of a grid family merged into the shipped grid, per key (e.g. dtype).

    family: gemm | grouped_gemm | attention; measured: one row per measured point; shipped: the
    shipped default rows of this kind. Per key: measured rows are kept as they are; shipped
    points the profile did not measure are kept, scaled by the measured/shipped ratio
    interpolated from the measured points around them (`_ratio_field`: the measured level carries
    over without seams, and a cell far from every measurement does not take the level of the few
    points a budget reached elsewhere in the grid; the grid the
    cost model can look up is never narrower than the shipped one); a key with no measured row
    keeps its shipped rows unchanged (source "default: ..."). Returns (rows, notes).

    Optional axes (`cost_model.tables.OPTIONAL_AXES`, attention's bh): the shipped tables hold one
    value of them (inert), the profile several. The shipped grid fills the unmeasured cells of the
    other axes at EACH measured value, scaled by the ratio measured there (so the bh dependence
    the profile saw carries into the filled cells), and never at a value of its own: a shipped
    bh no measurement has would become a grid point of the merged table."""
    from cost_model.tables import FAMILIES, OPTIONAL_AXES, GridTable, with_optional_axes
    keys, axes, values = FAMILIES[family]
    sl_axes = tuple(a for a in axes if a in OPTIONAL_AXES.get(family, {}))  # sliced: measured values only
    plain = tuple(a for a in axes if a not in sl_axes)
    measured, shipped = with_optional_axes(family, measured), with_optional_axes(family, shipped)
    kof = lambda r: tuple(str(r[k]) for k in keys)  # noqa: E731
    at = lambda r, ax: tuple(float(r[a]) for a in ax)  # noqa: E731
    by_m: dict[tuple, list[dict]] = {}
    by_s: dict[tuple, list[dict]] = {}
    for r in measured:
        by_m.setdefault(kof(r), []).append(r)
    for r in shipped:
        by_s.setdefault(kof(r), []).append(r)
    out, notes = [], []
    for key in sorted(set(by_m) | set(by_s)):
        m_rows, s_rows = by_m.get(key, []), by_s.get(key, [])
        name = f"{family} {'/'.join(key)}"
        if not m_rows:
            out += [dict(r, source=f"default: {r['source']}") for r in s_rows]
            notes.append(f"{name}: not measured here; the shipped rows are kept ({len(s_rows)} rows)")
            continue
        out += m_rows
        if not s_rows:
            continue
        grid = GridTable(family, s_rows)
        slices: dict[tuple, list[dict]] = {}
        for r in m_rows:
            slices.setdefault(at(r, sl_axes), []).append(r)
        kept, ratios = 0, []
        for sv, rs in sorted(slices.items()):
            fixed = dict(zip(sl_axes, sv))
            pts = np.array([at(r, plain) for r in rs])
            ref = grid.lookup(key, values[0], **{a: pts[:, i] for i, a in enumerate(plain)}, **fixed)
            ratio = _ratio_field(family, rs, np.array([float(r[values[0]]) for r in rs]) / ref)
            have = {tuple(p) for p in pts.tolist()}
            cell_ratios = []
            for r in s_rows:
                c = at(r, plain)
                if c in have:
                    continue
                have.add(c)  # one row per cell and slice, whatever optional values the shipped rows hold
                exact = at(r, sl_axes) == sv  # the shipped row itself; else the shipped grid there
                x = float(ratio.lookup(key, values[0], **dict(zip(plain, c)), **fixed))
                cell_ratios.append(x)
                vals = {v: (float(r[v]) if exact else float(grid.lookup(key, v, **dict(zip(plain, c)), **fixed))) * x
                        for v in values}
                out.append(dict(r, **{a: rs[0][a] for a in sl_axes}, **vals, source=f"default x{x:.3g}: {r['source']}"))
                kept += 1
            ratios.append((min(cell_ratios), max(cell_ratios)) if cell_ratios else (1.0, 1.0))
        pts = np.array([at(r, axes) for r in m_rows])
        lo = {a: float(pts[:, i].min()) for i, a in enumerate(axes)}
        hi = {a: float(pts[:, i].max()) for i, a in enumerate(axes)}
        span = lambda x: f"x{x[0]:.3g}" if f"{x[0]:.3g}" == f"{x[1]:.3g}" else f"x{x[0]:.3g}..{x[1]:.3g}"  # noqa: E731
        scaled = (span(ratios[0]) if len(ratios) == 1 else
                  "per " + "/".join(sl_axes) + " " + ", ".join(f"{span(x)} at {'/'.join(f'{v:g}' for v in sv)}"
                                                               for x, sv in zip(ratios, sorted(slices))))
        notes.append(f"{name}: {len(m_rows)} measured points ("
                     + ", ".join(f"{a} {lo[a]:g}..{hi[a]:g}" for a in axes)
                     + f"); {kept} shipped points kept, scaled {scaled} (the measured/shipped ratio "
                       "interpolated from the measured points nearest each)")
    return out, notes


def _ratio_field(family: str, rows: list[dict], ratio: np.ndarray):
    """The measured/shipped ratio over the measured points of one key (and optional-axis slice),
    as a table of the family's own layout: a shipped cell the profile did not measure takes the
    ratio interpolated (log space, clamped at the measured range's edges) from the measured points
    around it, so the shipped grid's shape survives only between measurements. One median ratio
    for the whole grid (what this was) let the points a budget happened to reach set the level of
    every other cell: the CPU's tiny GEMMs run at 0.3-0.6x of the shipped H800-shaped grid and its
    64-4096-wide ones at 1.5-2x, so a profile cut before the mid widths scaled the quickstart
    model's 2048x64x64 GEMMs by 0.60 and one that reached them by 1.48 (issue 27: nine CPU
    profiles read them at 0.024-0.060 TFLOPS, and the calibration's gemm factor 0.45-1.2 chased
    it; rebuilt with the ratio field from the same measurements, 0.072-0.078)."""
    from cost_model.tables import FAMILIES, GridTable
    _keys, _axes, values = FAMILIES[family]
    return GridTable(family, [dict(r, **{v: float(x) for v in values}) for r, x in zip(rows, ratio)])


def build_family_rows(kind: str, rows: dict[str, list[dict]]) -> tuple[dict[str, list[dict]], list[str]]:
    """Measured partial rows -> rows per table family (+ notes). Families without measured rows
    are filled from the shipped defaults for `kind` (source "default: ...")."""
    from cost_model.tables import FAMILIES, TABLE_ROOT, read_rows
    fam: dict[str, list[dict]] = {}
    notes = []
    for f in ("gemm", "grouped_gemm", "attention", "dispatch_gap"):
        k, a, v = FAMILIES[f]
        # partial rows of a resumed profile written before an axis existed (attention's bh) lack
        # its column; their point ids no longer match, so those points are measured again
        fresh = [r for r in rows.get(f, []) if all(r.get(x) not in (None, "") for x in a)]
        if len(fresh) < len(rows.get(f, [])):
            notes.append(f"{f}: {len(rows[f]) - len(fresh)} partial rows without the {'/'.join(a)} columns "
                         "(a profile from before an axis was added) ignored")
            rows = dict(rows, **{f: fresh})
        if rows.get(f):
            fam[f] = _median_rows(rows[f], k + a, v)
            if f in MERGED_FAMILIES:
                shipped = TABLE_ROOT / kind / f"{f}.csv"
                fam[f], more = merge_with_shipped(f, fam[f], read_rows(shipped, f) if shipped.exists() else [])
                notes += more
    if rows.get("collectives"):
        k, a, v = FAMILIES["collectives"]
        best: dict = {}
        for r in rows["collectives"]:  # slower of contiguous / strided layouts
            key = tuple(r[x] for x in k + a)
            if key not in best or float(r["busbw_gbps"]) < float(best[key]["busbw_gbps"]):
                best[key] = r
        up = [dict(r) for r in best.values()]
        out_rows = [dict(r, scope="scaleout", per_node=1,
                         source="derived: single-host profile, no scale-out fabric; copy of the measured scale-up row")
                    for r in up]
        fam["collectives"] = up + out_rows
        lay = {}
        for r in rows["collectives"]:
            lay.setdefault(r.get("layout", "contiguous"), []).append(r)
        notes.append("collectives: rank layouts measured " + ", ".join(f"{k} ({len(v)} rows)" for k, v in sorted(lay.items())))
    if rows.get("ep_sample"):
        eps = {}
        for r in rows["ep_sample"]:
            eps.setdefault(int(r["ep"]), []).append(r)
        out = []
        for ep, rs in sorted(eps.items()):
            sent = np.array([float(r["bytes"]) * (ep - 1) / ep for r in rs])
            t = np.array([float(r["seconds"]) for r in rs])
            if len(rs) >= 2 and np.ptp(sent) > 0:
                slope, lat = np.polyfit(sent, t, 1)
            else:
                slope, lat = float(t[0] / sent[0]), 0.0
            slope = max(float(slope), 1e-15)
            lat = max(float(lat), 1e-9)  # the table loader takes latency_us > 0 only; a noisy fit can give <= 0
            bw = 1.0 / slope / 1e9
            for scope in ("scaleup", "scaleout"):
                out.append(dict(backend="alltoall", scope=scope, ep=ep, dispatch_gbps=bw, combine_gbps=bw,
                                latency_us=lat * 1e6, source="measured:ep-alltoall" if scope == "scaleup" else
                                "derived: single host; copy of the measured scale-up alltoall fit"))
            notes.append(f"ep_dispatch ep={ep}: latency {lat * 1e6:.1f} us, {bw:.3f} GB/s over {len(rs)} payloads")
        fam["ep_dispatch"] = out
    if rows.get("stack_sample"):
        from trials.profile.stack_floor import rows_from
        times: dict = {}
        splits: dict = {}
        for r in rows["stack_sample"]:  # several rounds per grid point: keep each point's fastest
            key = (int(r["layers"]), int(r.get("microbatches", 1)))
            if float(r["seconds"]) < times.get(key, float("inf")):
                times[key], splits[key] = float(r["seconds"]), r.get("split") or {}
        if len(times) >= 4:
            for _fam, r in rows_from(times, splits):
                fam.setdefault("dispatch_gap", []).append(r)
                notes.append(f"dispatch_gap stack: {r['source']}")
    if rows.get("membw_sample"):
        ops = {}
        for r in rows["membw_sample"]:
            ops.setdefault(r["op"], []).append(float(r["gbps"]))
        fam["membw"] = [dict(op=o, gbps=float(statistics.median(g)),
                             source=f"measured:membw-{o} (median of {len(g)} sizes)") for o, g in sorted(ops.items())]
        notes.append("membw: " + ", ".join(f"{o} {statistics.median(g):.2f} GB/s" for o, g in sorted(ops.items())))
    # complete: every family and every op/key the cost model looks up
    default_dir = TABLE_ROOT / kind
    for f in FAMILIES:
        dflt = read_rows(default_dir / f"{f}.csv", f) if (default_dir / f"{f}.csv").exists() else []
        if f not in fam:
            fam[f] = [dict(r, source=f"default: {r['source']}") for r in dflt]
            notes.append(f"{f}: not measured, shipped default rows kept")
        elif f == "membw":
            have = {r["op"] for r in fam[f]}
            for r in dflt:
                if r["op"] not in have:
                    fam[f].append(dict(r, source=f"default: {r['source']}"))
                    notes.append(f"membw {r['op']}: not measured, default kept")
        elif f == "collectives":
            # a budget can run out before every collective was measured: a (collective, scope) the
            # profile never reached keeps its shipped rows, or the cost model could not price it
            have = {(r["collective"], r["scope"]) for r in fam[f]}
            missing = sorted({(r["collective"], r["scope"]) for r in dflt} - have)
            fam[f] += [dict(r, source=f"default: {r['source']}") for r in dflt
                       if (r["collective"], r["scope"]) in missing]
            if missing:
                notes.append("collectives " + ", ".join("/".join(k) for k in missing)
                             + ": not measured, shipped default rows kept")
        elif f == "dispatch_gap" and not any(r["mode"] == "eager" for r in fam[f]):
            fam[f] += [dict(r, source=f"default: {r['source']}") for r in dflt if r["mode"] == "eager"]
    return fam, notes


def family_statistics(device_stat: str) -> dict[str, str]:
    """{family: which statistic its measured rows hold, and why} for meta.json.
    device_stat: Ctx.statistic of the per-device runners (min on CPU, median on GPU)."""
    least = ("minimum of 3 wall-clock batches (perf_counter, synchronised): shared hosts and fabrics only add "
             "time, so the least-interfered batch is the uncontended cost")
    return {"gemm": device_stat, "grouped_gemm": device_stat + "; fwd, dgrad and wgrad landing on one point: their median",
            "attention": device_stat + "; bwd timed alone over a retained graph",
            "membw": "median over the op's sizes of the achieved GB/s, each size timed as: " + device_stat,
            "dispatch_gap": least + " (host time per launch, wall clock on every device)",
            "collectives": least + "; the slower of contiguous and strided rank layouts",
            "ep_dispatch": "least-squares fit t = latency + sent/bw over payloads, each payload timed as the " + least}


def assemble(kind: str, out: Path, store: PartialStore, info: dict) -> str:
    """Write the tables (CSV per family + meta.json) into `out` atomically: staged in a temp dir,
    then each file moved into place with os.replace (meta.json last)."""
    from cost_model.tables import FAMILIES, write_family, write_meta
    fam, notes = build_family_rows(kind, store.rows())
    stage = out / f".staging-{os.getpid()}"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir()
    try:
        for f in FAMILIES:
            write_family(stage, f, fam[f])
        report = family_report(fam, info)
        measured = report["measured"]
        info["report"] = report  # the caller (run_profile) returns the same dict
        notes = ([f"measured on {info.get('host')} ({info.get('cpu') if not info.get('gpu') else info.get('gpu')}), "
                  f"{info.get('date')}; families measured: {', '.join(measured)}"]
                 + [f"not measured: {f}: {why}" for f, why in report["not_measured"].items()]
                 + [f"skipped: {s_}" for s_ in info.get("skipped", [])]
                 + [f"substitute: {s_}" for s_ in info.get("substitutes", [])] + notes)
        digest = write_meta(stage, kind, "moetune profile (trials/profile)", notes, SOURCES)
        meta = json.loads((stage / "meta.json").read_text())
        meta.update(measured=True, profile=info, measured_families=measured,
                    statistic=family_statistics(info.get("statistic", "")))
        (stage / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True, default=str) + "\n")
        for f in FAMILIES:
            os.replace(stage / f"{f}.csv", out / f"{f}.csv")
        os.replace(stage / "meta.json", out / "meta.json")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return digest
