"""Multi-node trials: one Ray placement group per trial, one launcher actor per node.

A trial whose world does not fit on one Ray node (`spread_layout`) reserves a placement group of
one bundle per node (`STRICT_SPREAD`: no two bundles on one node), each bundle holding that
node's devices (GPUs, or cores on cpu-local). One `NodeLauncher` actor per bundle starts that
node's ranks with the same `RankGroup` as a one-node trial; the rendezvous (MASTER_ADDR /
MASTER_PORT) is the first bundle's node. The caller (a Ray task) polls the launchers through the
same `rank_watch.watch` loop as a local trial, so failure classification, the memory cap and the
timeout are the same; a launcher that dies (its node died, or it was killed) is a `crash` whose
message names the node. Reaping: every launcher kills its ranks when told, its ranks die with it
(PR_SET_PDEATHSIG), and the placement group goes away when the trial ends or its task dies.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from trials.processes import RankGroup, free_port, trial_tempdir
from trials.rank_watch import NodeLost, reports, rss_gib, tail_of, watch

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "moetune-trial"  # launcher actors are named <prefix>-<trial tag>-node<i>
POLL_TIMEOUT_S = 60.0  # a launcher silent this long is treated as lost


def alive_capacity(is_gpu: bool) -> list[int]:
    """Devices (GPUs, or CPU cores) on each alive Ray node, largest first."""
    import ray
    key = "GPU" if is_gpu else "CPU"
    return sorted((int(n["Resources"].get(key, 0)) for n in ray.nodes() if n.get("Alive")), reverse=True)


def spread_layout(world: int, capacity: list[int]) -> list[int] | None:
    """Ranks per node for a trial of `world` ranks on nodes of `capacity` devices: None when it fits
    on one node; else equal shares (the largest divisor of world that enough nodes hold), so every
    node runs the same number of ranks as Megatron's rank layout assumes. ValueError if impossible."""
    if capacity and capacity[0] >= world:
        return None
    for per in range(min(world, capacity[0] if capacity else 0), 0, -1):
        if world % per == 0 and sum(1 for c in capacity if c >= per) >= world // per:
            return [per] * (world // per)
    raise ValueError(f"a trial of {world} ranks does not fit on the alive Ray nodes (devices per node: {capacity})")


class NodeLauncher:
    """One node's share of a trial (a Ray actor in its placement-group bundle)."""

    def __init__(self):
        self.group = None
        self.tmp = None
        self.ranks: list[int] = []

    def where(self) -> tuple[str, str]:
        """(Ray node id, node IP address) of this launcher."""
        import ray
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        return free_port()

    def start(self, module: str, spec: dict, ranks: list[int], world: int, master_addr: str,
              master_port: int, env: dict | None) -> None:
        self.tmp = trial_tempdir()
        d = Path(self.tmp.name)
        (d / "spec.json").write_text(json.dumps(dict(spec, out_dir=str(d))))
        self.ranks = list(ranks)
        self.group = RankGroup(module, d / "spec.json", world, d, master_port, env=env, ranks=ranks,
                               master_addr=master_addr, die_with_parent=True).__enter__()

    def poll(self, cap_gib: float | None) -> tuple[dict, dict, dict]:
        """({rank: report}, {rank: exit code or None}, {rank: resident GiB}) of this node's ranks."""
        codes = {r: p.poll() for r, p in zip(self.ranks, self.group.procs)}
        rss = {r: rss_gib(p.pid) for r, p in zip(self.ranks, self.group.procs)} if cap_gib is not None else {}
        got = reports(Path(self.tmp.name), self.group.world)
        return {r: got[r] for r in self.ranks if r in got}, codes, rss

    def tail(self, rank: int) -> str:
        return tail_of(self.group.log_path(rank)) if self.group else ""

    def stop(self) -> None:
        if self.group is not None:
            self.group.__exit__(None, None, None)
        if self.tmp is not None:
            self.tmp.cleanup()
        self.group = self.tmp = None


def launch_spread(module: str, spec: dict, world: int, layout: list[int], *, is_gpu: bool,
                  timeout_s: float, memory_cap_gib: float | None = None, env: dict | None = None,
                  tag: str = "") -> dict:
    """Run a trial's ranks over len(layout) nodes (layout[i] ranks on the i-th); returns the
    result dict of `rank_watch.watch` with "nodes": the Ray node id of every rank."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    key = "GPU" if is_gpu else "CPU"
    pg = placement_group([{key: per} for per in layout], strategy="STRICT_SPREAD")
    actors, where = [], []
    try:
        ray.get(pg.ready(), timeout=max(60.0, timeout_s))
        tag = tag or pg.id.hex()[:12]
        cls = ray.remote(NodeLauncher)
        for i, per in enumerate(layout):
            need = {"num_gpus": per, "num_cpus": 0} if is_gpu else {"num_cpus": per}
            actors.append(cls.options(
                name=f"{ACTOR_PREFIX}-{tag}-node{i}", max_restarts=0, max_concurrency=1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                **need).remote())
        where = ray.get([a.where.remote() for a in actors], timeout=POLL_TIMEOUT_S)
        master_addr = where[0][1]
        port = ray.get(actors[0].free_port.remote(), timeout=POLL_TIMEOUT_S)
        share, start = [], 0
        for per in layout:
            share.append(list(range(start, start + per)))
            start += per
        ray.get([a.start.remote(module, spec, share[i], world, master_addr, port, env)
                 for i, a in enumerate(actors)], timeout=POLL_TIMEOUT_S)
        node_of_rank = [where[i][0] for i, ranks in enumerate(share) for _ in ranks]

        def lost(i: int, e: Exception) -> NodeLost:
            return NodeLost(f"node {where[i][0]} ({where[i][1]}) lost: its launcher of ranks "
                            f"{share[i][0]}-{share[i][-1]} died ({type(e).__name__}: {str(e)[:300]})")

        def poll():
            out_reports, codes, rss = {}, [None] * world, {}
            for i, a in enumerate(actors):
                try:
                    rep, c, m = ray.get(a.poll.remote(memory_cap_gib), timeout=POLL_TIMEOUT_S)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                    raise lost(i, e) from None
                out_reports.update(rep)
                rss.update(m)
                for r, code in c.items():
                    codes[r] = code
            return out_reports, codes, rss

        def tail(rank: int) -> str:
            i = next(i for i, ranks in enumerate(share) if rank in ranks)
            try:
                return ray.get(actors[i].tail.remote(rank), timeout=POLL_TIMEOUT_S)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                return f"(node {where[i][0]} unreachable)"

        result = watch(poll, tail, world, timeout_s, memory_cap_gib)
        result["nodes"] = node_of_rank
        return result
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
        known = ", ".join(w[0] for w in where) or "not yet placed"
        return {"ok": False, "kind": "crash", "nodes": [w[0] for w in where],
                "message": f"multi-node trial could not start on nodes {known}: {type(e).__name__}: {str(e)[:500]}"}
    finally:
        for a in actors:
            try:
                ray.get(a.stop.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead node's launcher: its ranks died with it
                pass
            ray.kill(a)
        remove_placement_group(pg)
