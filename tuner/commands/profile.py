"""`moetune profile`: measure this machine's performance tables for a cluster kind (GEMM, grouped
expert MLP, attention, memory-bound ops, cross-entropy, collectives, dispatch gap) and write them in
the one table format the cost model reads (cost_model/tables.py).

  moetune profile --cluster cpu-local [--budget-min 10] [--out DIR] [--ray-address ADDR]
      [--sweep tiny|small|full] [--executor ray|local] [--no-progress]

Default output: $MOETUNE_HOME/tables/<kind>/ (MOETUNE_HOME defaults to ~/.moetune), which the
cost model then prefers over the shipped clusters/tables/<kind>/ (`moetune predict` prints which it
used). Rerunning resumes: points already in <out>/partial/*.csv are not measured again. Per-device
sweeps run in one Ray actor per device (embedded Ray on 127.0.0.1 unless --ray-address);
collectives in spawned torch.distributed workers. See trials/profile/.
"""
from __future__ import annotations

import time

from specs.errors import UsageError
from tuner.commands.common import check_home, check_output_dir, count, minutes

SUMMARY = "Measure this machine's performance tables for the cost model."
DESCRIPTION = ("Measure this machine's performance tables for a cluster kind (GEMM, grouped expert MLP, "
               "attention, memory-bound ops, cross-entropy, collectives, dispatch gap) and write them in the "
               "table format the cost model reads, by default to $MOETUNE_HOME/tables/<kind>, which the cost "
               "model then prefers over the shipped tables. Rerunning resumes where the last run stopped.")


def add_parser(subparsers):
    p = subparsers.add_parser("profile", help=SUMMARY, description=DESCRIPTION)
    p.add_argument("--cluster", required=True, help="Hardware kind (one of clusters/*.yaml) the tables are for.")
    p.add_argument("--budget-min", type=minutes, default=None,
                   help="Wall-clock budget in minutes (default 10 on CPU kinds, 30 on GPU kinds).")
    p.add_argument("--out", default=None, help="Output directory (default $MOETUNE_HOME/tables/<kind>).")
    p.add_argument("--ray-address", default=None,
                   help="Address of an existing Ray cluster; by default an embedded one on 127.0.0.1.")
    p.add_argument("--sweep", choices=("tiny", "small", "full"), default="full",
                   help="Sweep density: full (default), small, or tiny (for tests and smoke runs).")
    p.add_argument("--executor", choices=("ray", "local"), default="ray",
                   help="Run the per-device sweeps in Ray actors (default) or in this process (one device).")
    p.add_argument("--rounds", type=count(1, 100), default=None,
                   help="Samples of each per-device point, interleaved round by round (default 2); the table "
                        "records their spread and points that disagree by more than 10%% are reported.")
    p.add_argument("--no-progress", action="store_true", help="Do not show a progress bar.")
    return p


def run(args) -> int:
    try:
        import torch
    except ImportError:  # the core install has no torch
        raise UsageError("moetune profile runs torch microbenchmarks: install the trials extra "
                         "(pip install -e '.[trials]')") from None

    from clusters import load_cluster
    from cost_model.tables import measured_tables_dir
    from trials.profile.driver import run_profile
    check_home()
    cluster = load_cluster(args.cluster)
    if cluster.is_gpu and not torch.cuda.is_available():
        raise UsageError(f"{cluster.kind} is a GPU kind but this machine has no visible GPU; "
                         "run on that hardware (or profile cpu-local)")
    budget_min = args.budget_min if args.budget_min is not None else (30.0 if cluster.is_gpu else 10.0)
    if budget_min <= 0:
        raise UsageError("--budget-min must be positive")
    if args.rounds is not None and args.rounds < 1:
        raise UsageError(f"--rounds must be >= 1, got {args.rounds}")
    # measured_tables_dir's kind is a checked name (clusters.load_cluster): it stays under MOETUNE_HOME
    out = check_output_dir(args.out, "--out") if args.out else check_output_dir(measured_tables_dir(cluster.kind),
                                                                                  "MOETUNE_HOME")
    devices = cluster.devices_per_node if not cluster.is_gpu else None
    t0 = time.time()
    print(f"profiling {cluster.kind} on this machine -> {out} (budget {budget_min:g} min, sweep {args.sweep})",
          flush=True)
    info = run_profile(cluster.kind, out, budget_min * 60.0, ray_address=args.ray_address, executor=args.executor,
                       sweep=args.sweep, devices=devices, progress=not args.no_progress,
                       **({} if args.rounds is None else {"rounds": args.rounds}))
    print(f"measured {info['points_measured']} of {info['points_total']} points in {time.time() - t0:.0f} s "
          f"({info['device']}, {info['devices']} device(s))")
    print(f"tables   {out} sha256 {info['digest'][:16]}")
    print(f"rounds   {info['rounds']} per point; {info['points_with_rounds']} points measured more than once, "
          f"{len(info['noisy_points'])} with a spread over {info['spread_warn']:.0%}")
    if info["points_measured"] < info["points_total"]:
        print("note     budget reached before the full sweep: unmeasured grid points are filled from the "
              "nearest measured one; rerun to measure the rest")
    return 0
