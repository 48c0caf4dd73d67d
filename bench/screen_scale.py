"""Screening throughput (plans scored per second) against the number of screening actors, on a
local two-node Ray cluster (ray.cluster_utils.Cluster: two raylets on 127.0.0.1, token auth on),
and on which nodes the actors ran.

  python bench/screen_scale.py [--model tiny-moe --cluster h100-sxm --gpus 64 --gbs 256 --seq 4096]
      [--actors 1,2,4] [--cpus-per-node 1] [--out bench/results/screen_scale.json]

Each run screens the whole core space (tuner.rank.train.screen, the tuner's own screening) with N
named actors spread over the nodes; plans/s = realizable plans / wall seconds of that call.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep every Ray process on 127.0.0.1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--cluster", default="h100-sxm")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--gbs", type=int, default=256)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--actors", default="1,2,4")
    ap.add_argument("--cpus-per-node", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench/results/screen_scale.json"))
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from clusters import load_cluster
    from specs.models import load_model
    from specs.stack import profile_for
    from specs.workload import Workload
    from trials.ray_runtime import configure_auth
    from tuner.rank.train import screen

    configure_auth(joining=False)
    os.environ["PYTHONPATH"] = str(ROOT)
    wl = Workload(model=load_model(args.model), cluster=load_cluster(args.cluster, args.gpus), gbs=args.gbs,
                  seq=args.seq)
    profile = profile_for(wl.cluster)
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=args.cpus_per_node, node_ip_address="127.0.0.1",
                                                          include_dashboard=True, dashboard_port=8421,
                                                          gcs_server_port=6421,
                                                          dashboard_agent_listen_port=52421))
    c.add_node(num_cpus=args.cpus_per_node, node_ip_address="127.0.0.1", dashboard_agent_listen_port=52422)
    c.wait_for_nodes()
    from ray._private.utils import get_ray_address_file
    Path(get_ray_address_file(None)).unlink(missing_ok=True)  # or other processes' ray.init() joins it
    ray.init(address=c.address, log_to_driver=False)
    rows = []
    try:
        for n in [int(x) for x in args.actors.split(",")]:
            t0 = time.perf_counter()
            total, pool = screen(wl, profile, num_actors=n, progress=False)
            wall = time.perf_counter() - t0
            from ray.util.state import list_actors
            mine = f"moetune-screen-{os.getpid()}-"
            nodes = {a.node_id for a in list_actors(address="http://127.0.0.1:8421", limit=10000)
                     if (a.name or "").startswith(mine)}
            rows.append({"actors": n, "plans": total, "wall_s": round(wall, 3), "plans_per_s": round(total / wall, 1),
                         "nodes_used_so_far": len(nodes)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        ray.shutdown()
        c.shutdown()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workload": f"{args.model} on {args.gpus}x {args.cluster}, gbs {args.gbs}, seq {args.seq}",
                               "ray_nodes": 2, "cpus_per_node": args.cpus_per_node, "runs": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
