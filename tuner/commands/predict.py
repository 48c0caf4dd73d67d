"""`moetune predict`: the cost model's prediction for one plan of one workload."""
from __future__ import annotations

import json

from tuner.commands.common import UsageError, add_stack_arg, add_workload_args, completed_plan, workload_from_args
from tuner.realize import check


def add_parser(subparsers):
    p = subparsers.add_parser("predict", help="predict step time, throughput, MFU and memory of one plan")
    add_workload_args(p)
    add_stack_arg(p)
    p.add_argument("--plan", default="", help='canonical or partial plan string, e.g. "tp=2,pp=8,vpp=4,ep=64"')
    p.add_argument("--json", action="store_true", help="print the Prediction as JSON")
    p.add_argument("--tables", default=None, help="table directory (default: measured $MOETUNE_HOME/tables/<kind> "
                   "when `moetune profile` wrote it, else the shipped clusters/tables/<kind>)")
    p.add_argument("--calibration", default=None, help="calibration JSON (default: $MOETUNE_HOME/calibration/<kind>.json "
                   "when fitted on the tables in use, else the shipped GPU fit / identity on CPU)")
    p.add_argument("--hbm-reserve", type=float, default=0.1, help="fraction of HBM kept free (default 0.1)")
    p.add_argument("--imbalance", type=float, default=1.0, help="routing imbalance factor (1.0 = balanced)")
    return p


def _sources(cost_model, w, args) -> tuple[str, str]:
    """(tables directory + whether measured, where the calibration came from) for the report."""
    from cost_model.calibration import DEFAULT_GPU_CALIBRATION, user_calibration_path
    t = cost_model.resolve_tables(w, args.tables)
    kind = "measured" if t.meta.get("measured") else "shipped defaults"
    tabs = f"{t.directory} ({kind}{', --tables' if args.tables else ''})"
    cal = cost_model.resolve_calibration(w, args.calibration, t)
    if args.calibration:
        src = args.calibration
    elif user_calibration_path(w.cluster.kind).is_file() and cal.provenance and \
            cal.provenance.get("tables_digest") == t.digest:
        src = str(user_calibration_path(w.cluster.kind))
    elif cal.id == "identity":
        src = "identity: no fit for these tables"
    else:
        src = f"shipped {DEFAULT_GPU_CALIBRATION.name}"
    return tabs, src


def run(args) -> int:
    import cost_model
    w = workload_from_args(args)
    plan, profile = completed_plan(args, w)
    realize_reasons = [str(r) for r in check(w, plan, profile)]
    try:
        pred = cost_model.predict(w, plan, tables=args.tables, calibration=args.calibration,
                                  hbm_reserve=args.hbm_reserve, imbalance=args.imbalance)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e)) from None
    if args.json:
        d = pred.to_dict()
        d["plan"] = plan.canonical()
        d["realize_reasons"] = realize_reasons
        print(json.dumps(d, indent=1))
        return 0
    print(f"plan           {plan.canonical()}")
    print(f"workload       {w.model.name} on {w.world}x {w.cluster.kind}, gbs {w.gbs}, seq {w.seq}")
    for r in realize_reasons:
        print(f"not realizable {r}")
    print(f"step time      {pred.step_time_s:.3f} s  ({pred.extra['microbatches']} microbatches, dp {pred.extra['dp']})")
    print(f"tokens/s/GPU   {pred.tokens_per_s_per_gpu:,.0f}")
    print(f"model TFLOP/s  {pred.model_tflops_per_gpu:.1f} per GPU, MFU {pred.mfu:.1%} (of bf16 peak)")
    print(f"memory         peak {pred.peak_memory_gib:.1f} GiB; by stage " +
          " ".join(f"{x:.1f}" for x in pred.memory_by_stage_gib) + (" (fits)" if pred.feasible else ""))
    for r in pred.reasons:
        print(f"note           {r}")
    print("breakdown (s per iteration):")
    for k, v in sorted(pred.breakdown_s.items(), key=lambda kv: -abs(kv[1])):
        if abs(v) > 0:
            print(f"  {k:24s} {v:9.3f}")
    tabs, cal_src = _sources(cost_model, w, args)
    print(f"tables         {tabs} sha256 {pred.tables_digest[:16]}")
    print(f"calibration    {pred.calibration_id} ({cal_src})")
    return 0
