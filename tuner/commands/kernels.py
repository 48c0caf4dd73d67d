"""`moetune kernels`: Weave's (c, K) megakernel model, its measurement job and its tables.

    moetune kernels grid   --model M --cluster C --ep E --tokens T [--skew S] [--json]
    moetune kernels select --model M --cluster C --ep E --tokens T [--skew S] [--json]
    moetune kernels tune   --cluster C [--model M --ep E --tokens T ...] [--stand-in]
    moetune kernels tables [--cluster C] [--json]
"""
from __future__ import annotations

import argparse
import json

from specs.errors import UsageError
from tuner.commands.common import count, devices, number

# skew: tokens of the busiest expert over the mean; 1.0 is uniform routing
_skew = number(1.0, 1e6, what="a routing skew (1.0 is uniform)")


def _layer_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, help="Model preset name, model YAML or HF config.json whose routed experts are priced.")
    p.add_argument("--cluster", required=True, help="Hardware kind from clusters/*.yaml (its SM count and curves are used).")
    p.add_argument("--ep", type=devices, required=required, help="Expert-parallel size; it must divide the number of experts.")
    p.add_argument("--tokens", type=count(1, 1 << 30), required=required, help="Tokens held by each GPU before dispatch.")
    p.add_argument("--skew", type=_skew, default=1.0,
                   help="Routing skew of the most loaded GPU, the ratio of its received token-expert pairs to the "
                        "balanced share (1.0 is uniform routing).")
    p.add_argument("--json", action="store_true", help="Print JSON instead of text.")


def add_parser(subparsers):
    p = subparsers.add_parser("kernels", help="Price, tune and list Weave-style MoE megakernel (c, K) schedules.",
                              description="Weave's (c, K) SM-partition model for one MoE layer: the grid of "
                                          "communication SMs c and chunks K, the chosen schedule, the measurement "
                                          "job that calibrates it and the installed tables.")
    sub = p.add_subparsers(dest="kernels_cmd", required=True)
    g = sub.add_parser("grid", help="Print the predicted layer time for every (c, K) of the search grid.",
                       description="Print the predicted MoE-layer time for every (c, K) the hardware allows.")
    _layer_args(g)
    s = sub.add_parser("select", help="Print the chosen (c*, K*, n_steal) and its predicted time.",
                       description="Print the (c*, K*) minimising the predicted layer time, n_steal and the time.")
    _layer_args(s)
    t = sub.add_parser("tune", help="Run the measurement job, refit the curves and regenerate the tables.",
                       description="Sweep the (c, K) grid with one Ray actor per GPU, keep the measured grids under "
                                   "$MOETUNE_HOME/kernels/<kind>/, refit the curves and regenerate the tables.")
    t.add_argument("--cluster", required=True, help="Hardware kind being measured (clusters/*.yaml).")
    t.add_argument("--model", default="deepseek-v2-lite", help="Model whose layer shape is measured (default deepseek-v2-lite).")
    t.add_argument("--ep", type=devices, default=None,
                   help="Expert-parallel size of the measured cases (default 1 on a GPU, whose kernel measures one "
                        "GPU, and 4 with --stand-in).")
    t.add_argument("--tokens", type=count(1, 1 << 30), nargs="+", default=[2048, 8192],
                   help="Tokens per GPU of the measured cases (default 2048 8192).")
    t.add_argument("--skew", type=_skew, nargs="+", default=[1.0], help="Routing skews of the measured cases (default 1.0).")
    t.add_argument("--stand-in", action="store_true",
                   help="Use the CPU stand-in timer that follows the default curves (for machines without a GPU).")
    t.add_argument("--workers", type=count(1, 4096), default=None, help="Actors to start (default: one per visible GPU).")
    t.add_argument("--json", action="store_true", help="Print the job report as JSON.")
    tb = sub.add_parser("tables", help="List the installed curves and tables and where they came from.",
                        description="List, per hardware kind, the curves in use (shipped defaults or a fit) and the "
                                    "Weave tables and measured grids under $MOETUNE_HOME/kernels/<kind>/.")
    tb.add_argument("--cluster", default=None, help="Only this hardware kind (default: every GPU kind of the catalog).")
    tb.add_argument("--json", action="store_true", help="Print JSON instead of text.")
    return p


def _shape_curves(args):
    from clusters import load_cluster
    from kernels.weave import LayerShape, load_curves
    from specs.models import load_model
    shape = LayerShape.from_model(load_model(args.model))
    load_cluster(args.cluster)  # unknown kinds: one-line SpecError
    return shape, load_curves(args.cluster)


def _grid(args) -> int:
    from kernels.weave import grid
    shape, curves = _shape_curves(args)
    rows = grid(shape, args.tokens, args.ep, args.skew, curves)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{shape.name} on {args.cluster}, EP {args.ep}, {args.tokens} tokens/GPU, skew {args.skew:g}")
    print(f"{'c':>4} {'K':>3} {'n_steal':>8} {'ms':>9}")
    for r in rows:
        print(f"{r['c']:>4} {r['K']:>3} {r['n_steal']:>8} {r['predicted_ms']:>9.4f}")
    return 0


def _select(args) -> int:
    from kernels.weave import select
    shape, curves = _shape_curves(args)
    s = select(shape, args.tokens, args.ep, args.skew, curves)
    fitted = any(v.startswith("fit to") for v in curves.sources.values())
    s["curves"] = "fitted ($MOETUNE_HOME)" if fitted else "shipped defaults"
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"c* {s['c']}  K* {s['K']}  n_steal {s['n_steal']}  predicted {s['predicted_ms']:.3f} ms "
          f"({s['regime']}; T_comp {s['T_comp_ms']:.3f}, T_comm {s['T_comm_ms']:.3f}, T_tail {s['T_tail_ms']:.3f} ms; "
          f"{s['curves']} curves)")
    return 0


def _tune(args) -> int:
    from clusters import load_cluster
    from kernels import measure
    from kernels.weave import LayerShape, default_curves
    from specs.models import load_model
    cl = load_cluster(args.cluster)
    shape = LayerShape.from_model(load_model(args.model))
    args.ep = args.ep or (4 if args.stand_in else 1)
    if not args.stand_in and args.ep != 1:
        raise UsageError("on a GPU `kernels tune` measures one GPU (--ep 1): cross-GPU dispatch is not implemented")
    if shape.num_experts % args.ep:
        raise UsageError(f"--ep {args.ep} must divide the {shape.num_experts} experts of {shape.name}")
    from trials.ray_runtime import ray_session
    cases = measure.cases_for(shape, args.tokens, args.ep, skews=args.skew)
    if args.stand_in:
        truth = default_curves(args.cluster)
        with ray_session(num_cpus=1):
            rep = measure.run_job(args.cluster, cases, timer="stand-in", workers=args.workers or 1,
                                  timer_args={"truth": truth.to_dict(), "noise": 0.0},
                                  c_step=truth.c_step, sm_count=cl.sm_count,
                                  source="stand-in timer following the shipped default curves (no GPU)")
    else:
        try:
            import torch
            has_gpu = torch.cuda.is_available()
        except ImportError:
            has_gpu = False
        if not has_gpu:
            raise UsageError("no CUDA GPU here: `kernels tune` measures on GPUs (add --stand-in to run the job with "
                             "the CPU stand-in timer)")
        with ray_session():
            rep = measure.run_job(args.cluster, cases, timer="gpu", workers=args.workers, sm_count=cl.sm_count)
        from kernels import store
        blocks = measure.sweep_block_configs(shape, (1, 16, 64, 256, 1024, 4096), store.kind_dir(args.cluster) / "sglang")
        rep["block_table"] = blocks["table"]
    if args.json:
        print(json.dumps(rep, default=str))
        return 0
    print(f"measured {len(rep['grids'])} grid(s) with {rep['workers']} worker(s) in {rep['seconds']:.1f} s")
    for p in rep["grids"]:
        print(f"  grid   {p}")
    if rep.get("block_table"):
        print(f"SGLang block table {rep['block_table']}")
    if rep["refit"]:
        print(f"refit rms log error {rep['refit']['fit']['rms_log_error']:.4f} -> {rep['refit']['curves_file']}")
        for p in rep["refit"]["tables"]:
            print(f"  table  {p}")
    return 0


def _tables(args) -> int:
    from clusters import kind_names, load_cluster
    from kernels import store
    from kernels.weave import DEFAULT_CURVES_FILE
    kinds = [args.cluster] if args.cluster else [k for k in kind_names() if load_cluster(k).is_gpu]
    if args.cluster:
        load_cluster(args.cluster)
    out = []
    for k in kinds:
        fitted = store.fitted_curves_path(k)
        entry = {"kind": k,
                 "curves": str(fitted) if fitted.is_file() else f"{DEFAULT_CURVES_FILE} (shipped defaults)",
                 "tables": sorted(str(p) for p in store.tables_dir(k).glob("*.json")),
                 "grids": [{"path": g["path"], "source": g["provenance"]["source"], "sha256": g["provenance"]["sha256"],
                            "intact": g["intact"]} for g in store.load_grids(k)]}
        out.append(entry)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for e in out:
        print(f"{e['kind']}: curves {e['curves']}")
        for t in e["tables"]:
            print(f"  table {t}")
        for g in e["grids"]:
            flag = "" if g["intact"] else "  (sha256 mismatch: ignored)"
            print(f"  grid  {g['path']}  sha256 {g['sha256'][:16]}  from {g['source']}{flag}")
        if not e["tables"] and not e["grids"]:
            print("  no measured grids or tables (run `moetune kernels tune`)")
    return 0


def run(args) -> int:
    return {"grid": _grid, "select": _select, "tune": _tune, "tables": _tables}[args.kernels_cmd](args)
