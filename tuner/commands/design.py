"""`moetune design`: MOSAIC co-design of MoE geometry, token budget and layout for a cluster and a
training window (see `tuner.design`)."""
from __future__ import annotations

import json
import sys
import time

from specs.errors import UsageError
from tuner.commands.common import MAX_COUNT, check_output_dir, count, devices, number


def add_parser(subparsers):
    p = subparsers.add_parser(
        "design", help="Pick the MoE geometry, token budget and layout that minimise predicted loss on a cluster.",
        description="Search the MOSAIC geometry ladder (q, E, K, G) for the configuration whose predicted loss "
                    "is lowest when trained for the tokens its best realizable layout delivers in the window "
                    "(deliverable model FLOPs, not model FLOPs).")
    p.add_argument("--cluster", required=True, help="Hardware kind (clusters/*.yaml) or a cluster YAML file.")
    p.add_argument("--gpus", type=devices, required=True, help="Number of devices in the cluster.")
    p.add_argument("--days", type=number(0.0, 36500.0, lo_open=True), required=True, help="Training window in days of wall clock.")
    p.add_argument("--law", default=None,
                   help="Law JSON written by `moetune law fit --out`; default: the shipped law with the "
                        "paper's eta and beta and labelled placeholder coefficients.")
    p.add_argument("--envelope", default=None,
                   help='Search envelope as a JSON/YAML file or inline "q=4..12;e=8,16,32;k=1,2;g=1,2,4,8;'
                        's=0.5..0.981;tpp=40..150;tp=1;cp=1;gbs=1024;seq=2048"; unset keys keep the published defaults.')
    p.add_argument("--stack", default="auto", help="Target stack profile: auto, gpu-full, gpu-full-te2.11, gpu-te or gpu-plain.")
    p.add_argument("--top", type=count(0, MAX_COUNT), default=10, help="Number of ranked runner-ups to report (default 10).")
    p.add_argument("--exhaustive", action="store_true",
                   help="Score every geometry instead of skipping those whose loss bound cannot make the top list.")
    p.add_argument("--frontier", type=count(0, MAX_COUNT), default=100,
                   help="Score at least this many lowest-loss geometries so the frontier plot shows them (default 100).")
    p.add_argument("--out", default=None,
                   help="Directory for design.json, frontier.png, the chosen model YAML and its launch script.")
    p.add_argument("--json", action="store_true", help="Print the result as JSON.")
    p.add_argument("--no-progress", action="store_true", help="Do not show a progress bar.")
    return p


class _Bar:
    """A tqdm bar on stderr over the geometries."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar = enabled, None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="geom", desc="geometries", file=sys.stderr)
        self.bar.update(done - self.bar.n)  # tqdm throttles the redraws

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _line(c) -> str:
    g = c.geometry
    return (f"q={g.q:<2d} L={g.layers:<3d} E={g.e:<3d} K={g.k} G={g.g}  N_act {g.n_act / 1e9:6.2f}B  "
            f"N_tot {g.n_tot / 1e9:7.1f}B  S {g.s:.3f}  MFU {c.mfu:5.1%} (6N {c.mfu_6n:5.1%})  "
            f"D {c.d / 1e9:7.0f}B  C {c.c_model:.2e}  L {c.loss:.4f}")


def _short(plan: str) -> str:
    keep = ("tp", "cp", "pp", "vpp", "ep", "mbs", "recompute", "dispatcher", "flex_backend", "a2a_overlap")
    parts = dict(x.split("=", 1) for x in plan.split(","))
    return ",".join(f"{k}={parts[k]}" for k in keep if k in parts and parts[k] not in ("-", ""))


def run(args) -> int:
    from cost_model.law import default_law, load_law
    from tuner.design import design, paper_optimum, parse_envelope, write_outputs
    if args.gpus <= 0:
        raise UsageError(f"--gpus must be positive, got {args.gpus}")
    if not args.days > 0:
        raise UsageError(f"--days must be positive, got {args.days:g}")
    if args.top < 0 or args.frontier < 0:
        raise UsageError("--top and --frontier must be zero or more")
    if args.out:  # before the search: a folder that cannot be written is one line, nothing made
        check_output_dir(args.out, "--out")
    law = load_law(args.law) if args.law else default_law()
    env = parse_envelope(args.envelope)
    bar = _Bar(not args.no_progress and not args.json)
    ref, _ = paper_optimum()
    t0 = time.perf_counter()
    try:
        res = design(args.cluster, args.gpus, args.days, law=law, envelope=env, stack=args.stack,
                     runner_ups=args.top, progress=bar, exhaustive=args.exhaustive,
                     always=(ref,), frontier=args.frontier if args.out else 0)
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    paths = write_outputs(res, args.out) if args.out else {}
    if args.json:
        d = res.to_dict(top=None if args.exhaustive else 0)
        d["wall_s"] = round(wall, 1)
        d["outputs"] = paths
        print(json.dumps(d, indent=1))
        return 0
    print(f"cluster        {res.gpus}x {res.cluster}, {res.days:g} days: C_peak {res.c_peak:.3e} FLOPs")
    st = res.stats
    print(f"searched       {st['geometries']} geometries: {st['scored']} scored, {st['pruned_by_bound']} "
          f"skipped by the loss bound, {st['over_cluster_memory']} over the cluster's memory, "
          f"{st['no_fitting_layout']} with no fitting layout, {st['below_tpp_min']} below the TPP floor "
          f"({wall:.0f} s)")
    if res.optimum is None:
        print("optimum        none: no geometry fits this cluster and window; widen --envelope")
        return 1
    o = res.optimum
    print(f"optimum        {_line(o)}")
    print(f"  layout       {_short(o.plan)}  peak memory {o.peak_memory_gib:.1f} GiB")
    print(f"  tokens       D {o.d:.3e} (TPP {o.tpp:.1f}{', capped' if o.d < o.d_star else ''})")
    if res.max_c_model is not None and res.max_c_model is not o:
        print(f"most C_model   {_line(res.max_c_model)}")
    for i, c in enumerate(res.runner_ups, start=2):
        print(f"  #{i:<3d}        {_line(c)}  [{_short(c.plan)}]")
    for c in res.forced.values():
        if c is not o:
            r = res.rank(c)
            where = f"#{r} among the scored geometries" if r else c.note or "not ranked"
            print(f"paper's Table 4 optimum ({where}):")
            print(f"               {_line(c)}  [{_short(c.plan)}]")
    if not res.forced:
        print(f"paper's Table 4 optimum (q={ref[0]} E={ref[1]} K={ref[2]} G={ref[3]}): not scored here "
              "(outside the envelope, over the cluster's memory, or no fitting layout)")
    placeholders = [k for k, v in res.law.provenance.items() if v.startswith("placeholder")]
    if placeholders:
        print(f"law            shipped default: eta, beta published; {', '.join(placeholders)} are placeholders "
              "(refit with `moetune law fit` and pass --law)")
    for path in paths.values():
        print(f"wrote          {path}")
    return 0
