"""`moetune predict --mode serve`: the serving cost model's prediction for one SGLang plan.

`serve_prediction(args, extra_reasons)` is the one entry point. It checks the plan with our SGLang
rules (tuner/serve_realize: reason codes in `reasons`, any reason makes it infeasible) and prices
the *effective* plan, the one SGLang runs after its silent rewrites (specs.serve_resolve); an
unrealizable plan is priced as SGLang would resolve it, indicative only. Callers that know more reasons pass them
in `extra_reasons`. `--what-if megakernel` adds the Weave megakernel what-if (tuner/rank/whatif.py)."""
from __future__ import annotations

from specs.errors import UsageError

SERVE_FIELDS = ("feasible", "reasons", "input_tokens_per_s_per_gpu", "output_tokens_per_s_per_gpu",
                "ttft_p90_s", "tpot_p90_s", "max_batch", "memory_gib")


def default_concurrency(phase: str, devices: int) -> int:
    """--concurrency's default, one rule for predict, plans, tune and serve-trial: 8 requests in
    flight per device over the deployment; with --phase decode (where the cost model reads
    concurrency as the decode batch per GPU) 16."""
    return 16 if phase == "decode" else 8 * devices


def serve_workload_from_args(args, devices: int, *, what: str = "--mode serve", model=None):
    """The serving workload of the flags, for every serving command: --isl, --osl, --concurrency
    (default `default_concurrency`), and where the command has them --phase, --request-rate,
    --ttft-slo / --tpot-slo. `devices`: the deployment's; `model`: the model served, whose context
    length a request must fit (`specs.serve_resolve.check_request_fits_context`). A bad value is
    one UsageError line."""
    from specs.errors import SpecError
    from specs.serve_plan import ServeWorkload
    from specs.serve_resolve import check_request_fits_context
    if args.isl is None or args.osl is None:
        raise UsageError(f"{what} needs --isl and --osl")
    if model is not None:
        try:
            check_request_fits_context(model, args.isl, args.osl)
        except SpecError as e:
            raise UsageError(str(e)) from None
    if args.concurrency is not None and args.concurrency <= 0:
        raise UsageError(f"--concurrency must be a positive whole number, got {args.concurrency}")
    phase = getattr(args, "phase", "both")
    try:
        return ServeWorkload(isl=args.isl, osl=args.osl, concurrency=args.concurrency or default_concurrency(phase, devices),
                             phase=phase, request_rate=getattr(args, "request_rate", 0.0),
                             ttft_p90_s=getattr(args, "ttft_slo", None) or 0.0, tpot_p90_s=getattr(args, "tpot_slo", None) or 0.0)
    except SpecError as e:
        raise UsageError(str(e)) from None


def serve_prediction(args, extra_reasons=(), *, strict: bool = False) -> dict:
    """The JSON-ready prediction of `--mode serve` (schema_version and the workload, then SERVE_FIELDS).
    `strict`: a plan SGLang cannot run raises `tuner.conventions.unrealizable` (its reasons, one a
    line) instead of being priced as SGLang would resolve it, indicative only."""
    from clusters import load_cluster
    from cost_model.serving import predict_serve
    from cost_model.tables import load_tables, tables_dir_for
    from specs.models import load_model
    from tuner.rank.serve_complete import complete_serve
    from tuner.space.sglang_rules import realize
    if args.isl is None or args.osl is None:
        raise UsageError("--mode serve needs --isl and --osl")
    if args.routing_skew < 0:
        raise UsageError(f"--routing-skew must be >= 0, got {args.routing_skew}")
    from tuner.space.serve_precision import resolve as resolve_weights
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpus)
    weights = resolve_weights(args, model, cluster)
    precision = weights["precision"]
    w = serve_workload_from_args(args, cluster.num_devices, model=model)
    tables = load_tables(args.tables or tables_dir_for(cluster.kind))
    cal = None
    if args.calibration:
        from cost_model.calibration import Calibration, CalibrationError
        try:
            cal = Calibration.load(args.calibration)
        except CalibrationError as e:
            raise UsageError(f"--calibration {args.calibration}: not a serving calibration file ({e})") from None
    completion = complete_serve(args.plan or "", model, cluster, w, getattr(args, "complete", None) or "defaults",
                                precision=precision, tables=tables, calibration=cal,
                                imbalance=args.imbalance, routing_skew=args.routing_skew)
    plan = completion.plan
    verdict = realize(plan, model, cluster)
    if strict and not verdict.ok:
        from tuner.conventions import unrealizable
        from tuner.space.sglang_rules import SERVING_STACK
        raise unrealizable(list(verdict.reasons), SERVING_STACK, hint="--force prints indicative numbers")
    reasons = list(extra_reasons) + [str(r) for r in verdict.reasons]
    priced = verdict.effective if verdict.ok else plan
    if not verdict.ok and priced.instance_gpus > cluster.num_devices:  # reasons say why; price what fits, flagged
        priced = priced.replace(tp=max(1, cluster.num_devices // priced.pp))
    pred = predict_serve(model, cluster, priced, w, precision=precision, tables=tables, calibration=cal,
                         imbalance=args.imbalance, routing_skew=args.routing_skew, extra_reasons=reasons)
    d = pred.to_dict()
    from tuner.conventions import workload_json
    out = workload_json("serve", model.name, cluster.kind, cluster.num_devices, precision, isl=args.isl,
                        osl=args.osl, concurrency=w.concurrency, phase=args.phase)
    out.update({k: d[k] for k in SERVE_FIELDS})
    out.update({k: v for k, v in d.items() if k not in SERVE_FIELDS})
    out["plan"] = plan.canonical()
    out["completion"] = completion.to_dict()
    if verdict.ok:  # what SGLang runs (chunked_prefill per attention-DP rank, -1 = no CUDA graphs)
        out["effective_plan"] = verdict.effective.plan.canonical()
        out["rewrites"] = list(verdict.effective.rewrites)
        out["pinned_plan"] = verdict.effective.pinned().canonical()
    out["realizable"] = verdict.ok
    slo = {"ttft_p90_s": getattr(args, "ttft_slo", None), "tpot_p90_s": getattr(args, "tpot_slo", None)}
    if any(slo.values()):  # None when a bound is given but the phase has no such latency
        out["slo_met"] = all(v is None or (out[k] is not None and out[k] <= v) for k, v in slo.items())
    if getattr(args, "what_if", None) == "megakernel":
        from tuner.rank.whatif import megakernel_serving
        out["what_if"] = megakernel_serving(model, cluster, priced, w, pred, precision=precision,
                                            tables=tables, calibration=cal, imbalance=args.imbalance,
                                            routing_skew=args.routing_skew)
    out.update({"mode": "serve", "phase": args.phase, "isl": args.isl, "osl": args.osl, "concurrency": w.concurrency,
                "model": model.name, "cluster": cluster.kind, "gpus": cluster.num_devices,
                "precision": precision, "weight_dtype": weights["dtype"], "weight_source": weights["source"],
                "hbm_gib": cluster.hbm_gib, "instance_gpus": (verdict.effective.plan if verdict.ok else priced).instance_gpus,
                "tables_digest": tables.digest})
    from tuner.emit.header import serve_memory_problem, what_would_fit
    if serve_memory_problem(out):
        out["would_fit"] = what_would_fit(out, weights["dtype"])
    return out


def exit_code(d: dict) -> int:
    """The CLI's exit code for a printed serving prediction: 3 when it does not fit in memory, else
    0 (README "Exit codes"; a plan SGLang cannot run never gets here without --force:
    `serve_prediction(strict=True)` raises it as exit 2)."""
    from tuner.emit.header import EXIT_DOES_NOT_FIT, serve_memory_problem
    return EXIT_DOES_NOT_FIT if serve_memory_problem(d) else 0
