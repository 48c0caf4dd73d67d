"""`moetune list models|clusters|stacks`: what the other commands accept by name, without having to
cause an error to find out."""
from __future__ import annotations

import json

SUMMARY = "List the model presets, cluster kinds and stack profiles the other commands accept by name."
DESCRIPTION = ("List what --model, --cluster and --stack accept by name: the model presets (with their "
               "size and source checkpoint), the cluster kinds (devices per node, HBM, network) and the "
               "stack profiles (the software each targets). --model also takes a model YAML, a Hugging Face "
               "config.json or its directory, or a Hugging Face id found in the local Hugging Face cache; "
               "--cluster also takes a cluster YAML.")


def add_parser(subparsers):
    p = subparsers.add_parser("list", help=SUMMARY, description=DESCRIPTION)
    p.add_argument("what", choices=["models", "clusters", "stacks"], help="What to list.")
    p.add_argument("--json", action="store_true", help="Print the list as one JSON object.")
    return p


def _models() -> list[dict]:
    from specs.models import hf_id, load_model, preset_names
    from specs.quantization import checkpoint_quantization
    out = []
    for name in preset_names():
        m = load_model(name)
        q = checkpoint_quantization(name, name)
        out.append({"name": name, "experts": m.num_experts, "top_k": m.moe_router_topk, "layers": m.num_layers,
                    "hidden": m.hidden_size, "hf_id": hf_id(m), "checkpoint_weights": q.method if q else "bf16"})
    return out


def _clusters() -> list[dict]:
    from clusters import kind_names, load_cluster
    out = []
    for kind in kind_names():
        c = load_cluster(kind)
        out.append({"name": kind, "device": c.device_name, "devices_per_node": c.devices_per_node,
                    "hbm_gib": c.hbm_gib, "scaleup_domain": c.scaleup_domain, "nvlink_gbps": c.nvlink_gbps,
                    "scaleout_gbps": c.scaleout_gbps})
    return out


def _stacks() -> list[dict]:
    from specs.stack import PROFILES
    rows = [{"name": "auto", "targets": "gpu-full on a GPU cluster kind, cpu-local on a CPU one"},
            {"name": "installed", "targets": "exactly what this machine has installed"},
            {"name": "cpu-local", "targets": "megatron-core on CPU (gloo), no TransformerEngine"}]
    return rows + [{"name": n, "targets": p.describe().split(" ", 1)[1].strip("()")} for n, p in PROFILES.items()]


def run(args) -> int:
    rows = {"models": _models, "clusters": _clusters, "stacks": _stacks}[args.what]()
    if args.json:
        from tuner.conventions import SCHEMA_VERSION
        print(json.dumps({"schema_version": SCHEMA_VERSION, args.what: rows}, indent=1))
        return 0
    if args.what == "models":
        print(f"{'preset':18s} {'experts':>7s} {'top-k':>5s} {'layers':>6s} {'hidden':>6s}  {'weights':8s} source")
        for r in rows:
            print(f"{r['name']:18s} {r['experts']:7d} {r['top_k']:5d} {r['layers']:6d} {r['hidden']:6d}  "
                  f"{r['checkpoint_weights']:8s} {r['hf_id'] or '(synthetic)'}")
    elif args.what == "clusters":
        print(f"{'kind':14s} {'GPUs/node':>9s} {'HBM GiB':>7s} {'NVLink GB/s':>11s} {'net Gb/s':>8s}  device")
        for r in rows:
            print(f"{r['name']:14s} {r['devices_per_node']:9d} {r['hbm_gib']:7g} {r['nvlink_gbps']:11g} "
                  f"{r['scaleout_gbps']:8g}  {r['device']}")
    else:
        print(f"{'stack':10s} targets")
        for r in rows:
            print(f"{r['name']:10s} {r['targets']}")
    return 0
