"""Collectives over message and group sizes in spawned torch.distributed workers (gloo on CPU,
NCCL on GPU), one rank per device (pinned core, one thread on CPU), 127.0.0.1 + a free port.

Bus bandwidth is written in the cost model's convention (`cost_model/ops.py` TableOps.collective): time = vol / busbw
with vol = 2(n-1)/n * bytes (all_reduce), (n-1)/n * bytes (reduce_scatter, all_gather over the
full buffer; all_to_all as nccl-tests), bytes (send_recv). Rank sets: contiguous {0..g-1} and,
when g < world, strided {0, s, 2s, ...}; the table has no layout key, so the slower of the two
is written (the partial CSV keeps both). EP dispatch (Megatron's alltoall dispatcher pattern: an
all_to_all of the per-expert counts, then all_to_all_single of the tokens with split sizes) is
timed over payloads per EP group; latency and bandwidth are fitted (t = lat + sent/bw).

Workers: `python -m trials.profile.collectives SPEC.json`; each in its own session, all
killed by the driver in `finally`.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trials.processes import RankGroup

COLLS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")
CPU_BYTES = {"tiny": [4096, 262144], "small": [1024, 32768, 1048576, 16777216],
             "full": [1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216]}
GPU_BYTES = {"tiny": [65536, 67108864], "small": [65536, 4194304, 268435456],
             "full": [1024 * 4 ** i for i in range(11)]}
EP_BYTES = {"tiny": [16384, 262144], "small": [16384, 262144, 4194304],
            "full": [4096, 16384, 65536, 262144, 1048576, 4194304]}
REPO = Path(__file__).resolve().parents[2]


def world_for(ctx, devices: int, visible_gpus: int | None = None) -> int:
    """Ranks to spawn: one per device, at most 8. On GPU never more than the visible GPUs: two
    ranks on one GPU is not a measurement (NCCL rejects a communicator with duplicate devices).
    visible_gpus: torch.cuda.device_count() unless given (tests)."""
    world = max(1, min(devices, 8))
    if ctx.on_gpu:
        if visible_gpus is None:
            import torch
            visible_gpus = torch.cuda.device_count()
        world = max(1, min(world, visible_gpus))
    return world


def skip_reason(ctx, devices: int, visible_gpus: int | None = None):
    """None, or why no collective can be measured here (the driver logs it and writes it into
    the tables' notes; the shipped collective rows are kept)."""
    if ctx.on_gpu and visible_gpus is None:
        import torch
        visible_gpus = torch.cuda.device_count()
    world = world_for(ctx, devices, visible_gpus)
    if world < 2:
        if ctx.on_gpu:
            return (f"world size {world}: collectives need >= 2 GPUs, one rank per GPU (NCCL rejects two "
                    f"ranks on one GPU; {devices} device(s) asked, {visible_gpus} GPU(s) visible)")
        return f"world size {world}: collectives need >= 2 devices on this host"
    return None


def group_sizes(world: int) -> list[int]:
    g, out = 2, []
    while g <= world:
        out.append(g)
        g *= 2
    return out


def points(ctx, devices: int) -> list[dict]:
    world = world_for(ctx, devices)
    sizes = (GPU_BYTES if ctx.on_gpu else CPU_BYTES)[ctx.sweep]
    out = []
    for g in group_sizes(world):
        layouts = ["contiguous"] + (["strided"] if g < world else [])
        for lay in layouts:
            for coll in COLLS:
                if coll == "send_recv" and g != 2:
                    continue
                for b in sizes:
                    out.append(dict(id=f"coll|{coll}|{g}|{lay}|{b}", kind="coll", coll=coll, group=g, layout=lay,
                                    bytes=b))
        for b in EP_BYTES[ctx.sweep]:
            out.append(dict(id=f"ep|{g}|{b}", kind="ep", coll="ep_dispatch", group=g, layout="contiguous", bytes=b))
    return out


def ranks_of(g: int, layout: str, world: int) -> list[int]:
    if layout == "strided":
        s = world // g
        return [i * s for i in range(g)]
    return list(range(g))


def run(ctx, pts: list[dict], devices: int, deadline: float, on_result=None, poll_s: float = 0.2) -> dict:
    """Spawn the workers over `pts`; stream result rows to on_result(point_id, rows) as they land.
    Returns {"measured": n, "stopped": reason or None}."""
    world = world_for(ctx, devices)
    if not pts:
        return {"measured": 0, "stopped": None}
    tmp = tempfile.TemporaryDirectory(prefix="moetune-profile-coll-")
    d = Path(tmp.name)
    res = d / "results.jsonl"
    spec = {"points": pts, "deadline": deadline, "device": ctx.device, "results": str(res),
            "world": world, "sweep": ctx.sweep}
    (d / "spec.json").write_text(json.dumps(spec))
    seen, n, stopped = 0, 0, None

    def deliver(got):
        nonlocal n
        for pid, rows in got:
            n += 1
            if on_result:
                on_result(pid, rows)

    try:
        with RankGroup("trials.profile.collectives", d / "spec.json", world, d) as group:
            while True:
                seen, got = _drain(res, seen)
                deliver(got)
                codes = group.exit_codes()
                if all(c is not None for c in codes):
                    seen, got = _drain(res, seen)
                    deliver(got)
                    if any(codes):
                        tail = group.log_path(0).read_bytes()[-1500:].decode(errors="replace")
                        stopped = f"worker exit codes {codes}: {tail}"
                    break
                if time.time() > deadline + 30:
                    stopped = "deadline: workers killed"
                    break
                time.sleep(poll_s)
    finally:
        tmp.cleanup()
    return {"measured": n, "stopped": stopped}


def _drain(path: Path, seen: int):
    if not path.exists():
        return seen, []
    lines = path.read_text().splitlines()
    got = []
    complete = len(lines) if path.read_text().endswith("\n") else len(lines) - 1
    for line in lines[seen:complete]:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        got.append((rec["id"], [tuple(x) for x in rec["rows"]]))
    return max(seen, complete), got


# ---- worker ---------------------------------------------------------------------------------
def _iters(nbytes: float, on_gpu: bool) -> int:
    budget = 2e9 if on_gpu else 4e7  # bytes moved per timed batch
    return int(max(3, min(50, budget // max(nbytes, 1))))


def worker(spec_path: str) -> int:

    import torch
    import torch.distributed as dist
    spec = json.loads(Path(spec_path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    on_gpu = spec["device"].startswith("cuda")
    if on_gpu:
        if world > torch.cuda.device_count():  # world_for caps it; a hand-written spec must not share GPUs
            raise RuntimeError(f"{world} ranks but {torch.cuda.device_count()} visible GPU(s): one rank per GPU")
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        from trials.profile.common import pin_to_core
        pin_to_core(rank)
        dev = torch.device("cpu")
    from trials.rendezvous import init_process_group  # rank 0's store listens on MASTER_ADDR only
    init_process_group("nccl" if on_gpu else "gloo", rank, world, 120.0)
    groups = {}
    for p in spec["points"]:  # same order on every rank
        key = (p["group"], p["layout"])
        if key not in groups:
            rs = ranks_of(p["group"], p["layout"], world)
            groups[key] = (rs, dist.new_group(rs) if len(rs) < world else dist.group.WORLD)
    flag = torch.zeros(1, device=dev)
    sync = lambda: torch.cuda.synchronize() if on_gpu else None  # noqa: E731
    out = open(spec["results"], "a") if rank == 0 else None
    try:
        for p in spec["points"]:
            flag.fill_(1.0 if time.time() < spec["deadline"] else 0.0)
            dist.broadcast(flag, 0)
            if flag.item() == 0.0:
                break
            rs, grp = groups[(p["group"], p["layout"])]
            t = torch.zeros(1, device=dev)
            if rank in rs:
                t.fill_(_time_point(p, rs, grp, dev, on_gpu, sync, rank))
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            if rank == 0:
                out.write(json.dumps({"id": p["id"], "rows": _rows(p, float(t.item()), world)}) + "\n")
                out.flush()
    finally:
        if out:
            out.close()
    dist.barrier()
    return 0


def _time_point(p, rs, grp, dev, on_gpu, sync, rank) -> float:
    import torch
    import torch.distributed as dist
    g, b, coll = p["group"], int(p["bytes"]), p["coll"]
    n = max(1, b // 4)
    n -= n % g
    n = max(n, g)
    full = torch.ones(n, device=dev)
    part = torch.ones(n // g, device=dev)
    if coll == "all_reduce":
        fn = lambda: dist.all_reduce(full, group=grp)  # noqa: E731
    elif coll == "reduce_scatter":
        fn = lambda: dist.reduce_scatter_tensor(part, full, group=grp)  # noqa: E731
    elif coll == "all_gather":
        fn = lambda: dist.all_gather_into_tensor(full, part, group=grp)  # noqa: E731
    elif coll == "all_to_all":
        out = torch.empty_like(full)
        fn = lambda: dist.all_to_all_single(out, full, group=grp)  # noqa: E731
    elif coll == "send_recv":
        peer = rs[1] if rank == rs[0] else rs[0]
        buf = torch.ones(n, device=dev)

        def fn():
            # a round trip, one transfer each way, as a PP boundary runs them (the forward's
            # activation, the backward's gradient), timed per transfer (`transfers`)
            if rank == rs[0]:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
    else:  # ep_dispatch: counts all_to_all, then tokens with split sizes (Megatron alltoall dispatcher)
        counts = torch.full((g,), n // g, dtype=torch.int64, device=dev)
        rc = torch.empty_like(counts)
        out = torch.empty_like(full)
        splits = [n // g] * g

        def fn():
            dist.all_to_all_single(rc, counts, group=grp)
            dist.all_to_all_single(out, full, splits, splits, group=grp)
    for _ in range(2):
        fn()
    sync()
    dist.barrier(group=grp)
    it = _iters(b, on_gpu)
    transfers = 2 if coll == "send_recv" else 1  # per timed call (a round trip), so a row is one transfer
    if coll == "send_recv" and not on_gpu:
        # blocking gloo send/recv: each call is timed and the median kept. A batch mean carries
        # the host's scheduling tail (now and then a blocked rank's wake-up waits milliseconds on
        # a busy 2-core host: batch means of a round trip gave 0.66-2.2 ms per 1-256 KB transfer
        # where a standalone ping-pong's per-call medians were 83-290 us, issue 27), a tail the
        # cost model's p2p term would then charge to every one of a pipeline's 2(m + pp - 1)
        # transfers
        calls = []
        for _ in range(3 * it):
            t0 = time.perf_counter()
            fn()
            calls.append(time.perf_counter() - t0)
        return statistics.median(calls) / transfers
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(it):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / it / transfers)
    return min(times)  # least-interfered batch (shared hosts only add time)


def _rows(p, t: float, world: int) -> list:
    g, b, coll = p["group"], float(p["bytes"]), p["coll"]
    if coll == "ep_dispatch":
        return [("ep_sample", dict(ep=g, bytes=b, seconds=t, layout=p["layout"], source="measured:ep-alltoall"))]
    if coll == "all_reduce":
        vol = 2.0 * b * (g - 1) / g
    elif coll in ("reduce_scatter", "all_gather", "all_to_all"):
        vol = b * (g - 1) / g
    else:
        vol = b
    return [("collectives", dict(collective=coll, scope="scaleup", group=g, per_node=g, bytes=b,
                                 busbw_gbps=vol / t / 1e9, layout=p["layout"], seconds=t,
                                 source=f"measured:coll-{coll}"))]


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(worker(sys.argv[1]))  # skip gloo/NCCL teardown (aborts at exit) once results are written
