"""`moetune predict --mode serve`: the serving cost model's prediction for one SGLang plan.

`serve_prediction(args, extra_reasons)` is the one entry point. It checks the plan with our SGLang
rules (tuner/serve_realize: reason codes in `reasons`, any reason makes it infeasible) and prices
the *effective* plan, the one SGLang runs after its silent rewrites (tuner/serve_price); an
unrealizable plan is priced as written, indicative only. Callers that know more reasons pass them
in `extra_reasons`. `--what-if megakernel` adds the Weave megakernel what-if (tuner/whatif.py)."""
from __future__ import annotations

import json

from specs.errors import UsageError

SERVE_FIELDS = ("feasible", "reasons", "input_tokens_per_s_per_gpu", "output_tokens_per_s_per_gpu",
                "ttft_p90_s", "tpot_p90_s", "max_batch", "memory_gib")


def add_serve_args(p) -> None:
    g = p.add_argument_group("serving (--mode serve)")
    g.add_argument("--phase", default="both", choices=("both", "prefill", "decode"),
                   help="Serving phase: both (aggregated), or prefill or decode (one pool of a disaggregated deployment).")
    g.add_argument("--isl", type=int, default=None, help="Input tokens per request.")
    g.add_argument("--osl", type=int, default=None, help="Output tokens per request.")
    g.add_argument("--concurrency", type=int, default=None,
                   help="Requests in flight over the whole deployment (default 8 per GPU); with --phase decode, "
                        "the decode batch per GPU (default 16).")
    g.add_argument("--routing-skew", type=float, default=0.0,
                   help="Zipf exponent of expert popularity for the distinct-experts term (0 = uniform).")
    g.add_argument("--ttft-slo", type=float, default=None,
                   help="TTFT p90 bound in seconds; plans above it are excluded from rankings.")
    g.add_argument("--tpot-slo", type=float, default=None,
                   help="TPOT p90 bound in seconds; plans above it are excluded from rankings.")


def serve_prediction(args, extra_reasons=()) -> dict:
    """The JSON-ready prediction of `--mode serve` (the fields of SERVE_FIELDS first)."""
    from clusters import load_cluster
    from cost_model.serving import predict_serve
    from cost_model.tables import load_tables, tables_dir_for
    from specs.models import load_model
    from specs.serve_plan import ServePlan, ServeWorkload
    from tuner.serve_price import priced_plan
    from tuner.serve_realize import realize
    if args.isl is None or args.osl is None:
        raise UsageError("--mode serve needs --isl and --osl")
    if args.routing_skew < 0:
        raise UsageError(f"--routing-skew must be >= 0, got {args.routing_skew}")
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpus)
    if args.concurrency is not None and args.concurrency <= 0:
        raise UsageError(f"--concurrency must be a positive whole number, got {args.concurrency}")
    conc = args.concurrency or (16 if args.phase == "decode" else 8 * cluster.num_devices)
    w = ServeWorkload(isl=args.isl, osl=args.osl, concurrency=conc, phase=args.phase)
    plan = ServePlan.parse(args.plan or "")
    verdict = realize(plan, model, cluster)
    reasons = list(extra_reasons) + [str(r) for r in verdict.reasons]
    priced = priced_plan(verdict.effective) if verdict.ok else plan
    if priced.instance_gpus > cluster.num_devices:  # reasons say why; price what fits, flagged
        priced = priced.replace(tp=max(1, cluster.num_devices // priced.pp))
    tables = load_tables(args.tables or tables_dir_for(cluster.kind))
    cal = None
    if args.calibration:
        from cost_model.calibration import Calibration, CalibrationError
        try:
            cal = Calibration.load(args.calibration)
        except CalibrationError as e:
            raise UsageError(f"--calibration {args.calibration}: not a serving calibration file ({e})") from None
    pred = predict_serve(model, cluster, priced, w, precision=args.precision, tables=tables, calibration=cal,
                         imbalance=args.imbalance, routing_skew=args.routing_skew, extra_reasons=reasons)
    d = pred.to_dict()
    out = {k: d[k] for k in SERVE_FIELDS}
    out.update({k: v for k, v in d.items() if k not in SERVE_FIELDS})
    out["plan"] = plan.canonical()
    if verdict.ok:  # what SGLang runs (chunked_prefill per attention-DP rank, -1 = no CUDA graphs)
        out["effective_plan"] = verdict.effective.plan.canonical()
        out["rewrites"] = list(verdict.effective.rewrites)
    out["realizable"] = verdict.ok
    slo = {"ttft_p90_s": getattr(args, "ttft_slo", None), "tpot_p90_s": getattr(args, "tpot_slo", None)}
    if any(slo.values()):  # None when a bound is given but the phase has no such latency
        out["slo_met"] = all(v is None or (out[k] is not None and out[k] <= v) for k, v in slo.items())
    if getattr(args, "what_if", None) == "megakernel":
        from tuner.whatif import megakernel_serving
        out["what_if"] = megakernel_serving(model, cluster, priced, w, pred, precision=args.precision,
                                            tables=tables, calibration=cal, imbalance=args.imbalance,
                                            routing_skew=args.routing_skew)
    out.update({"mode": "serve", "phase": args.phase, "isl": args.isl, "osl": args.osl, "concurrency": conc,
                "model": model.name, "cluster": cluster.kind, "gpus": cluster.num_devices,
                "precision": args.precision, "tables_digest": tables.digest})
    return out


def run_serve(args, extra_reasons=()) -> int:
    d = serve_prediction(args, extra_reasons)
    if args.json:
        print(json.dumps(d, indent=1))
        return 0

    def f(x, unit="s"):
        return "n/a" if x is None else f"{x * 1e3:.1f} ms" if unit == "s" else f"{x:,.0f}"
    print(f"plan           {d['plan']}")
    print(f"priced as      {d['effective_plan']}")
    print(f"workload       {d['model']} on {d['gpus']}x {d['cluster']}, phase {d['phase']}, isl {d['isl']}, "
          f"osl {d['osl']}, concurrency {d['concurrency']}")
    print(f"feasible       {'yes' if d['feasible'] else 'no'}")
    for r in d["reasons"]:
        print(f"reason         {r}")
    print(f"input tok/s/GPU  {d['input_tokens_per_s_per_gpu']:,.0f}")
    print(f"output tok/s/GPU {d['output_tokens_per_s_per_gpu']:,.0f}")
    print(f"TTFT p90       {f(d['ttft_p90_s'])}")
    print(f"TPOT p90       {f(d['tpot_p90_s'])}")
    print(f"max batch/GPU  {d['max_batch']:.1f}   memory {d['memory_gib']:.1f} GiB/GPU "
          f"(weights {d['extra']['weights_gib']:.1f}, mem_frac {d['extra']['mem_frac']:.3f})")
    if "what_if" in d:
        from tuner.whatif import describe
        print(f"what-if        {describe(d['what_if'])}")
    print(f"method         {d['extra']['method']}; calibration {d['extra']['calibration_id']} "
          f"(scale {d['extra']['calibration_scale']:.2f})")
    return 0
