"""`moetune predict`: the cost model's prediction for one plan of one workload."""
from __future__ import annotations

import json

from tuner.commands._serving import add_serve_args
from tuner.commands.common import (
    UsageError,
    add_cost_model_args,
    add_plan_args,
    add_stack_arg,
    add_workload_args,
    cost_model_inputs,
    fmt_flops,
    fmt_gib,
    fmt_seconds,
    number,
    plan_completion,
    plan_text,
    unrealizable,
    workload_from_args,
)
from tuner.rank.serve_predict import exit_code, serve_prediction
from tuner.space.megatron_rules import check

SUMMARY = "Predict the step time, throughput, MFU and memory of one plan with the cost model."
DESCRIPTION = ("Complete a partial plan (--complete best: the fastest realizable completion the cost model "
               "predicts; defaults: the documented defaults), check that the target stack can run "
               "it, and print the cost model's prediction: step time and its breakdown, tokens/s per GPU, "
               "MFU, memory per pipeline stage, and which tables and calibration were used. A plan the "
               "stack cannot run exits with code 2 and its reasons, unless --force; a plan predicted not to fit in "
               "memory is printed and exits with code 3.")

# |scale - 1| above this and `predict` says in one line how much of the step time the term is (a
# tenth: the shipped GPU fit, x1.135, is a tenth of every GPU step; a user should see that)
LARGE_CALIBRATION = 0.10


def add_parser(subparsers):
    p = subparsers.add_parser("predict", help=SUMMARY, description=DESCRIPTION)
    p.add_argument("--mode", default="train", choices=("train", "serve"),
                   help="What the plan is: train (a Megatron training plan; default) or serve (an SGLang serving plan).")
    add_workload_args(p)
    for a in p._actions:  # --gbs is a training flag; required only with --mode train (checked in run)
        if a.dest == "gbs":
            a.required = False
            a.default = None
    add_serve_args(p)
    from tuner.commands._serving import add_weight_dtype_arg
    add_weight_dtype_arg(p)
    add_stack_arg(p)
    add_plan_args(p)
    add_cost_model_args(p)
    p.add_argument("--force", action="store_true",
                   help="Print indicative numbers even for a plan the stack cannot run (labelled as such).")
    p.add_argument("--json", action="store_true", help="Print the prediction as one JSON object.")
    p.add_argument("--hbm-reserve", type=number(0.0, 1.0, hi_open=True), default=0.1,
                   help="Fraction of device memory kept free when judging whether the plan fits (default 0.1).")
    p.add_argument("--what-if", dest="what_if", choices=["megakernel"], default=None,
                   help="Also price a kernel the pinned stacks do not have: megakernel = Weave's fused "
                        "dispatch + experts + combine kernel with a per-layer (c, K) SM split (a what-if, never a plan to run).")
    p.add_argument("--imbalance", type=number(1.0, 1e6), default=1.0,
                   help="Routing imbalance factor: tokens of the busiest expert over the mean (default 1.0, balanced).")
    return p


def _calibration_source(args, w, cal) -> tuple[str, str]:
    """(where the calibration came from, a short name of it) for the report. The lookup itself is
    `cost_model.resolve_calibration`'s; this only names its answer."""
    from cost_model.calibration import DEFAULT_GPU_CALIBRATION, default_calibration, user_calibration_path
    if args.calibration:
        return args.calibration, "--calibration"
    if cal.id == "identity":
        return "identity: no fit for these tables", "identity"
    if cal.id == default_calibration(w.cluster).id:
        return f"shipped {DEFAULT_GPU_CALIBRATION.name}", "shipped GPU fit"
    return str(user_calibration_path(w.cluster.kind)), "installed fit"


def run(args) -> int:
    if args.mode == "serve":
        return run_serve(args)
    if args.gbs is None:
        raise UsageError("--gbs is required with --mode train")
    import cost_model
    if not 0.0 <= args.hbm_reserve < 1.0:
        raise UsageError(f"--hbm-reserve must be a fraction in [0, 1), got {args.hbm_reserve}")
    if not args.imbalance >= 1.0:
        raise UsageError(f"--imbalance must be >= 1.0 (1.0 = balanced routing), got {args.imbalance}")
    w = workload_from_args(args)
    tables, cal = cost_model_inputs(args, w)
    completion, profile = plan_completion(args, w, tables, cal)
    plan = completion.plan
    reasons = check(w, plan, profile)
    if reasons and not args.force:
        raise unrealizable(reasons, profile, hint="--force prints indicative numbers")
    realize_reasons = [str(r) for r in reasons]
    pred = cost_model.predict(w, plan, tables=tables, calibration=cal,
                              hbm_reserve=args.hbm_reserve, imbalance=args.imbalance)
    what_if = None
    if args.what_if == "megakernel":
        from tuner.rank.whatif import megakernel_training
        what_if = megakernel_training(w, plan, pred, imbalance=args.imbalance)
    if args.json:
        from tuner.conventions import workload_json
        d = workload_json("train", w.model.name, w.cluster.kind, w.world, args.precision, gbs=w.gbs, seq=w.seq,
                          stack=profile.name)
        d.update(pred.to_dict())
        if what_if is not None:
            d["what_if"] = what_if
        d["plan"] = plan.canonical()
        d["realizable"] = not realize_reasons
        d["realize_reasons"] = realize_reasons
        d["calibration_scale"] = cal.scale
        d["completion"] = completion.to_dict()
        print(json.dumps(d, indent=1))
        return _exit_code(pred)
    if realize_reasons:
        print(f"NOT REALIZABLE — indicative only: {profile.name} cannot run this plan (--force)")
    print(f"plan           {plan_text(plan, w, profile, args.canonical)}")
    print(f"completion     {completion.describe()}")
    print(f"workload       {w.model.name} on {w.world}x {w.cluster.kind}, gbs {w.gbs}, seq {w.seq}, stack {profile.name}")
    for r in realize_reasons:
        print(f"not realizable {r}")
    tag = "  [NOT REALIZABLE — indicative only]" if realize_reasons else ""
    print(f"step time      {fmt_seconds(pred.step_time_s)}  ({pred.extra['microbatches']} microbatches, "
          f"dp {pred.extra['dp']}){tag}")
    print(f"tokens/s/GPU   {pred.tokens_per_s_per_gpu:,.0f}")
    print(f"model FLOP/s   {fmt_flops(pred.model_tflops_per_gpu)} per GPU, MFU {pred.mfu:.1%} (of bf16 peak)")
    stages = pred.memory_by_stage_gib
    by_stage = ""
    if len(stages) > 1:  # (stage figures are rounded to 1 MiB by the cost model)
        mib = pred.peak_memory_gib < 1.0
        by_stage = "; by stage " + " ".join(f"{x * 1024:.0f}" if mib else f"{x:.1f}" for x in stages) + \
            (" MiB" if mib else " GiB")
    print(f"memory         peak {fmt_gib(pred.peak_memory_gib)}{by_stage}" +
          (" (fits)" if pred.feasible else " (does not fit)"))
    for r in pred.reasons:
        print(f"note           {r}")
    if what_if is not None:
        from tuner.rank.whatif import describe
        print(f"what-if        {describe(what_if)}")
    cal_src, cal_name = _calibration_source(args, w, cal)
    if abs(cal.scale - 1.0) > LARGE_CALIBRATION and pred.step_time_s > 0:
        share = pred.breakdown_s.get("calibration", pred.step_time_s * (1 - 1 / cal.scale)) / pred.step_time_s
        what = (f"{share:.0%} of this step time is the single fitted correction term" if share >= 0 else
                f"the single fitted correction term takes {-share:.0%} off this step time")
        print(f"note           calibration scale {cal.scale:.2f} ({cal_name}): {what}, for {cal.label}")
    print("breakdown (per iteration):")
    for name, v in sorted(pred.breakdown_s.items(), key=lambda kv: -abs(kv[1])):
        if abs(v) > 0:
            print(f"  {name:24s} {fmt_seconds(v, 9)}")
    t = tables
    kind = "measured" if t.meta.get("measured") else "shipped defaults"
    print(f"tables         {t.directory} ({kind}{', --tables' if args.tables else ''}) sha256 {pred.tables_digest[:16]}")
    print(f"calibration    {pred.calibration_id} ({cal_src})")
    return _exit_code(pred)


def _exit_code(pred) -> int:
    """3 when the plan does not fit in memory (printed first, so scripts can branch on it), else 0."""
    from tuner.emit.header import EXIT_DOES_NOT_FIT
    return 0 if pred.feasible else EXIT_DOES_NOT_FIT


def _describe_serve_completion(c: dict) -> str:
    from tuner.rank.serve_complete import ServeCompletion
    return ServeCompletion(None, c["how"], tuple(c["given"]), c["completed"], c["candidates"], c["note"]).describe()


def run_serve(args, extra_reasons=()) -> int:
    force = getattr(args, "force", False)
    d = serve_prediction(args, extra_reasons, strict=not force)
    rc = exit_code(d)
    if args.json:
        print(json.dumps(d, indent=1))
        return rc

    def f(x, unit="s"):
        return "n/a" if x is None else f"{x * 1e3:.1f} ms" if unit == "s" else f"{x:,.0f}"
    if not d["realizable"]:
        print("NOT REALIZABLE — indicative only: SGLang cannot run this plan (--force)")
    print(f"plan           {d['plan']}")
    print(f"completion     {_describe_serve_completion(d['completion'])}")
    # what SGLang changes by itself, as `emit sglang`'s header says it (e.g. its own all-reduce fusion)
    rewrites = f"  (SGLang's rewrites: {', '.join(d['rewrites']) or 'none'})" if "rewrites" in d else ""
    print(f"priced as      {d.get('effective_plan', d['plan'])}{rewrites}")
    print(f"workload       {d['model']} on {d['gpus']}x {d['cluster']}, phase {d['phase']}, isl {d['isl']}, "
          f"osl {d['osl']}, concurrency {d['concurrency']}")
    print(f"weights        {d['weight_dtype']} ({d['weight_source']})")
    print(f"feasible       {'yes' if d['feasible'] else 'no'}")
    for r in d["reasons"]:
        print(f"reason         {r}")
    if d.get("would_fit"):
        print(f"hint           {d['would_fit']}")
    print(f"input tok/s/GPU  {d['input_tokens_per_s_per_gpu']:,.0f}")
    print(f"output tok/s/GPU {d['output_tokens_per_s_per_gpu']:,.0f}")
    x = d["extra"]
    print(f"TTFT p90       {f(d['ttft_p90_s'])}" + (f"   p50 {f(x['ttft_p50_s'])}   mean with warm-up {f(x['ttft_mean_with_warmup_s'])}"
                                                     if "ttft_p50_s" in x else ""))
    print(f"TPOT p90       {f(d['tpot_p90_s'])}" + (f"   p50 {f(x['tpot_p50_s'])}" if x.get("tpot_p50_s") is not None else ""))
    print(f"max batch/GPU  {d['max_batch']:.1f}   memory {d['memory_gib']:.1f} GiB/GPU "
          f"(weights {d['extra']['weights_gib']:.1f}, mem_frac {d['extra']['mem_frac']:.3f})")
    if "what_if" in d:
        from tuner.rank.whatif import describe
        print(f"what-if        {describe(d['what_if'])}")
    print(f"method         {d['extra']['method']}; calibration {d['extra']['calibration_id']}: "
          + ", ".join(f"{k} x{v:.2f}" for k, v in d['extra']['calibration_factors'].items()))
    return rc
