"""`moetune tune`: Ray pre-screening -> pre-registered predictions -> an Optuna study of real
trials -> calibration feedback; resumable, watchable, reported.

  moetune tune --model tiny-moe --cluster cpu-local --gbs 16 --seq 256 --study quickstart --trials 8
      [--study-dir DIR] [--storage URL | journal:PATH] [--baseline "<plan>"]
      [--backend megatron|predict-only] [--ray-address ADDR] [--dashboard]
      [--trial-timeout S] [--iters I --warmup W] [--level core|full] [--no-progress]

Stages (see tuner/screen.py, baseline.py, prereg.py, study.py, sampler.py, report.py):
1. screening: named Ray actors `moetune-screen-<i>` (0.25 CPU each) score shards of the realizable
   space with the vectorised cost model; the top plans plus the best of distinct parallel layouts
   become the pre-registered candidates;
2. pre-registration: `<study dir>/preregistration.json` (+ .sha256) before the first trial, never
   rewritten; `moetune adjudicate` verifies it and gives PASS/FAIL;
3. trials: the baseline, the pre-registered plans, then the cost-model-guided sampler's proposals,
   each a Ray task holding the plan's devices (num_cpus=world on cpu-local, num_gpus=world on GPUs)
   running the Megatron-core trial backend; results are Optuna trial user attributes;
4. feedback: after every measured trial the calibration is refitted and the rest re-ranked;
5. report: `<study dir>/report.md`, trials.csv and plots; its path is printed last.
Rerunning the same command resumes the study (see tuner/study.py for claims and stale trials).
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path

from specs.errors import UsageError
from tuner.commands.common import add_workload_args, workload_from_args


def add_parser(subparsers):
    p = subparsers.add_parser("tune", help="search, pre-register, try and report the fastest plan",
                              description=__doc__.splitlines()[0])
    add_workload_args(p)
    p.add_argument("--study", required=True, help="study name")
    p.add_argument("--study-dir", default=None, help="study directory (default: studies/<study>)")
    p.add_argument("--storage", default=None,
                   help="Optuna storage: SQLAlchemy URL or journal:<path> (default: sqlite in the study dir)")
    p.add_argument("--trials", type=int, default=8, help="searched trials to run (baseline extra; default 8)")
    p.add_argument("--baseline", default=None, help="baseline plan (default: the hand-tuning heuristic)")
    p.add_argument("--backend", choices=("megatron", "predict-only"), default="megatron")
    p.add_argument("--ray-address", default=None, help="join an existing Ray cluster (default: embedded)")
    p.add_argument("--dashboard", action="store_true", help="start and print the Ray dashboard")
    p.add_argument("--trial-timeout", type=float, default=300.0, help="seconds before a trial is killed")
    p.add_argument("--memory-cap-gib", type=float, default=None, help="per-rank memory cap (GiB)")
    p.add_argument("--iters", type=int, default=3, help="timed iterations per trial (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up iterations per trial (default 1)")
    p.add_argument("--level", choices=("core", "full"), default="core", help="plan-space level to screen")
    p.add_argument("--screen-actors", type=int, default=4, help="screening actors (default 4)")
    p.add_argument("--preregister", type=int, default=None,
                   help="plans to pre-register (default: min(trials, max(4, trials // 2 + 1)))")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


# Ray --------------------------------------------------------------------------------------------

def start_ray(args, workload):
    import ray
    if ray.is_initialized():
        return None
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.ray_address:
        ctx = ray.init(address=args.ray_address, log_to_driver=False, logging_level=logging.WARNING)
    else:
        ncpu = os.cpu_count() or 1
        if not workload.cluster.is_gpu:
            ncpu = max(ncpu, workload.world)  # a trial holds `world` cores
        ctx = ray.init(address="local", include_dashboard=args.dashboard, _node_ip_address="127.0.0.1",
                       num_cpus=ncpu, log_to_driver=False, logging_level=logging.WARNING)
    if args.dashboard:
        url = getattr(ctx, "dashboard_url", None)
        print(f"Ray dashboard: http://{url}" if url else "Ray dashboard: not available", flush=True)
    return ctx


def _trial_fn(plan_text, workload, iters, warmup, timeout_s, memory_cap_gib):
    from specs.plan import Plan
    from trials import get_backend
    from trials.base import Resources
    res = get_backend("megatron").run(Plan.parse(plan_text), workload,
                                Resources(devices=workload.world, timeout_s=timeout_s,
                                          memory_cap_gib=memory_cap_gib),
                                iters=iters, warmup=warmup)
    return res.to_dict()


def trial_slots(workload) -> int:
    import ray
    res = ray.cluster_resources()
    key = "GPU" if workload.cluster.is_gpu else "CPU"
    return max(1, int(res.get(key, 1) // max(1, workload.world)))


# the command -----------------------------------------------------------------------------------

def run(args) -> int:
    import cost_model
    from specs.stack import profile_for
    from tuner import prereg as PR
    from tuner import study as S
    from tuner.baseline import given_baseline, hand_tuned_baseline
    from tuner.report import write_report
    from tuner.sampler import GuidedSampler
    from tuner.screen import screen, select_candidates

    if args.trials < 1:
        raise UsageError("--trials must be >= 1")
    if args.iters < 1 or args.warmup < 0:
        raise UsageError("--iters must be >= 1 and --warmup >= 0")
    if args.trial_timeout <= 0:
        raise UsageError("--trial-timeout must be positive")
    t0 = time.monotonic()
    workload = workload_from_args(args)
    profile = profile_for(workload.cluster)
    study_dir = Path(args.study_dir or Path("studies") / args.study)
    study_dir.mkdir(parents=True, exist_ok=True)
    storage_url = args.storage or S.default_storage_url(study_dir)
    progress = not args.no_progress
    calibration = cost_model.resolve_calibration(workload)
    tables = cost_model.resolve_tables(workload)

    existing = None
    if (study_dir / PR.NAME).exists():
        try:
            existing = PR.load(study_dir)
        except PR.PreregistrationError as e:
            raise UsageError(str(e)) from None
        if existing["study"] != args.study or existing["hashes"]["model_spec_sha256"] != workload.model.digest() \
                or existing["hashes"]["cluster_sha256"] != workload.cluster.digest():
            raise UsageError(f"{study_dir} holds a different study/workload; use another --study-dir")

    import ray
    started = start_ray(args, workload)
    try:
        total, pool = screen(workload, profile, args.precision, level=args.level, calibration=calibration,
                             num_actors=args.screen_actors, progress=progress)
        if not pool:
            raise UsageError("no realizable plan fits in memory by the cost model")
        print(f"screened {total} realizable plans; {len(pool)} kept "
              f"({len({s.layout for s in pool})} parallel layouts)", flush=True)

        if existing is None:
            if args.baseline:
                bplan, bpred = given_baseline(args.baseline, workload, profile, args.precision, calibration)
                bsrc = "--baseline"
            else:
                bplan, bpred = hand_tuned_baseline(workload, profile, args.precision, calibration)
                bsrc = "hand-tuning heuristic (tuner/baseline.py)"
            n_pre = args.preregister or min(args.trials, max(4, args.trials // 2 + 1))
            cands = select_candidates(pool, n_pre)
            doc = PR.build(
                study=args.study, workload=workload, precision=args.precision,
                plans=[{"rank": i + 1, "plan": s.plan, "predicted_step_time_s": s.step_time_s,
                        "predicted_raw_step_time_s": s.raw_step_time_s,
                        "predicted_tokens_per_s_per_gpu": s.tokens_per_s_per_gpu,
                        "predicted_peak_memory_gib": s.peak_memory_gib} for i, s in enumerate(cands)],
                baseline={"plan": bplan.canonical(), "predicted_step_time_s": bpred.step_time_s,
                          "predicted_raw_step_time_s": bpred.extra["raw_step_time_s"],
                          "predicted_tokens_per_s_per_gpu": bpred.tokens_per_s_per_gpu,
                          "predicted_peak_memory_gib": bpred.peak_memory_gib},
                baseline_source=bsrc, tables_digest=tables.digest, calibration=calibration,
                trials_budget=args.trials, sampler="guided-ucb",
                space={"level": args.level, "realizable_plans": total, "screened_kept": len(pool)})
            try:
                PR.write(study_dir, doc)
                existing = doc
                print(f"pre-registered {len(cands)} plans + baseline: {study_dir / PR.NAME} "
                      f"(sha256 {doc['sha256'][:16]}...)", flush=True)
            except PR.PreregistrationError:  # another tuner process wrote it first
                existing = PR.load(study_dir)
        else:
            print(f"resuming: pre-registration {study_dir / PR.NAME} verified "
                  f"(sha256 {existing['sha256'][:16]}...)", flush=True)
        prereg = existing

        storage = S.open_storage(args.storage, study_dir)
        study = S.open_study(args.study, storage)
        study.set_user_attr("preregistration_sha256", prereg["sha256"])
        sampler = GuidedSampler(pool)
        cal_state = {"cal": None, "report": None}
        if args.backend == "predict-only":
            path = write_report(study_dir, workload=workload, profile=profile, prereg=prereg,
                                rows=S.trial_rows(study), backend="predict-only", calibration=calibration,
                                predict_only_pool=pool, wall_s=time.monotonic() - t0,
                                storage_url=storage_url)
            print(path.resolve())
            return 0

        _run_trials(args, workload, study, prereg, sampler, cal_state, progress)
        rows = S.trial_rows(study)
        path = write_report(study_dir, workload=workload, profile=profile, prereg=prereg, rows=rows,
                            backend=args.backend, calibration=cal_state["cal"] or calibration,
                            cal_report=cal_state["report"], wall_s=time.monotonic() - t0,
                            storage_url=storage_url)
        from tuner.report import adjudicate
        print(adjudicate(rows, prereg)["line"], flush=True)
        print(path.resolve(), flush=True)
        return 0
    finally:
        if started is not None:
            ray.shutdown()


def _observe_all(study, sampler, prereg) -> None:
    from tuner import study as S
    for r in S.trial_rows(study):
        raw = r.get("predicted_raw_step_time_s")
        if r["state"] == "COMPLETE":
            sampler.observe(r["plan"], r["measured_step_time_s"], raw)
        elif r["state"] == "FAIL" and r.get("failure_kind") in S.REAL_FAILURES:
            sampler.observe(r["plan"], None, raw)


def _searched_done(study) -> int:
    from tuner import study as S
    plans = set()
    for r in S.trial_rows(study):
        if "searched" not in str(r.get("roles", "")):
            continue
        if r["state"] == "COMPLETE" or (r["state"] == "FAIL" and r.get("failure_kind") in S.REAL_FAILURES):
            plans.add(r["plan"])
    return len(plans)


def _run_trials(args, workload, study, prereg, sampler, cal_state, progress) -> None:
    import ray
    from tqdm import tqdm

    import cost_model
    from specs.plan import Plan
    from tuner import study as S

    remote = ray.remote(_trial_fn).options(
        num_gpus=workload.world if workload.cluster.is_gpu else 0,
        num_cpus=0 if workload.cluster.is_gpu else workload.world, max_retries=0)
    slots = trial_slots(workload)
    base_plan = prereg["baseline"]["plan"]
    pre_plans = [p["plan"] for p in prereg["plans"]]
    raw_of = {p["plan"]: p["predicted_raw_step_time_s"] for p in prereg["plans"]}
    raw_of[base_plan] = prereg["baseline"]["predicted_raw_step_time_s"]
    for p, raw in raw_of.items():
        sampler.add(p, raw)
    stale = S.fail_stale(study)
    if stale:
        print(f"resuming: marked {len(stale)} interrupted trial(s) FAIL: {stale}", flush=True)
    _observe_all(study, sampler, prereg)
    if sampler.measured:
        cal_state["cal"], cal_state["report"] = sampler.refit()

    in_flight: dict = {}  # ref -> (trial, plan, started)
    hard_timeout = args.trial_timeout * 1.5 + 120
    bar = tqdm(total=args.trials + 1, desc="trials", unit="trial", disable=not progress,
               initial=min(args.trials + 1, _searched_done(study)))

    def next_plan(status, busy):
        if S.eligible(status, base_plan) and base_plan not in busy and not status.get(base_plan, {}).get("complete"):
            return base_plan, ("baseline,searched" if base_plan in pre_plans else "baseline")
        for p in pre_plans:
            if p not in busy and S.eligible(status, p):
                return p, "searched,preregistered"
        skip = {p for p in status if not S.eligible(status, p)} | busy
        p = sampler.propose(exclude=skip)
        return (p, "searched") if p else (None, None)

    def need_more(status, busy) -> bool:
        base_done = (status.get(base_plan, {}).get("complete") or status.get(base_plan, {}).get("failed")
                     or not S.eligible(status, base_plan) or base_plan in busy)
        searched_busy = sum(1 for _, (_, _, roles, _) in in_flight.items() if "searched" in roles)
        return (not base_done) or _searched_done(study) + searched_busy < args.trials

    try:
        while True:
            status = S.plan_status(study)
            busy = {v[1] for v in in_flight.values()}
            tried_claims = 0
            while len(in_flight) < slots and need_more(status, busy) and tried_claims < 50:
                plan, roles = next_plan(status, busy)
                if plan is None:
                    break
                tried_claims += 1
                raw = sampler.rows.get(plan)
                if raw is None:
                    raw = cost_model.predict(workload, Plan.parse(plan)).extra["raw_step_time_s"]
                    sampler.add(plan, raw)
                mean, sigma = sampler.estimate(plan)
                pred_step = sampler.scale * raw
                tps = workload.tokens_per_step / (pred_step * workload.world)
                attrs = {"roles": roles, "predicted_step_time_s": pred_step,
                         "predicted_raw_step_time_s": raw, "predicted_tokens_per_s_per_gpu": tps,
                         "predicted_peak_memory_gib": _peak(workload, plan),
                         "calibration_scale": sampler.scale,
                         "calibration_id": sampler.cal.id if sampler.cal else prereg["hashes"]["calibration_id"],
                         "sampler_mean_step_time_s": mean, "sampler_sigma": sigma,
                         "attempt": 1 + status.get(plan, {}).get("interrupted", 0)}
                trial = S.claim(study, plan, attrs)
                status = S.plan_status(study)
                if trial is None:
                    continue
                ref = remote.remote(plan, workload, args.iters, args.warmup, args.trial_timeout,
                                    args.memory_cap_gib)
                in_flight[ref] = (trial, plan, roles, time.monotonic())
                busy.add(plan)
                bar.set_postfix_str(f"#{trial.number} {roles.split(',')[0]}")
            if not in_flight:
                break
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=10.0)
            now = time.monotonic()
            for ref in list(in_flight):
                trial, plan, roles, st = in_flight[ref]
                if ref in ready:
                    try:
                        result = ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - a dead task is a crashed trial
                        result = {"ok": False, "kind": "crash", "message": f"ray task failed: {e}"}
                elif now - st > hard_timeout:
                    ray.cancel(ref, force=True)
                    result = {"ok": False, "kind": "timeout", "message": f"no answer after {hard_timeout:.0f} s"}
                else:
                    continue
                del in_flight[ref]
                S.record(study, trial, result)
                raw = sampler.rows.get(plan)
                sampler.observe(plan, result["step_time_s"] if result.get("ok") else None, raw)
                if sampler.measured:
                    cal_state["cal"], cal_state["report"] = sampler.refit()
                if sampler.cal is not None:
                    study.set_user_attr("calibration", sampler.cal.to_dict() | {"provenance": {}})
                what = (f"{result['tokens_per_s_per_gpu']:.1f} tok/s/GPU" if result.get("ok")
                        else f"FAIL {result.get('kind')}")
                bar.update(1)
                bar.write(f"trial #{trial.number} [{roles}] {what}  (calibration scale {sampler.scale:.3g})")
    except BaseException:
        for trial, _plan, _roles, _started in in_flight.values():
            S.mark_interrupted(study, trial)
        for ref in in_flight:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001
                pass
        raise
    finally:
        bar.close()


def _peak(workload, plan: str) -> float:
    import cost_model
    from specs.plan import Plan
    v = cost_model.predict(workload, Plan.parse(plan)).peak_memory_gib
    return float(v) if math.isfinite(v) else -1.0


if __name__ == "__main__":  # pragma: no cover
    from tuner.cli import main
    sys.exit(main(["tune", *sys.argv[1:]]))
