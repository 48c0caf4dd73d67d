"""The rendezvous of a trial's ranks: rank 0's TCPStore, listening on MASTER_ADDR only.

torch's own env:// rendezvous (and `TCPStore(addr, port, is_master=True)`) listens on every
interface, whatever MASTER_ADDR says, so an unauthenticated key-value store would be reachable
from the network for the length of each trial. Here rank 0 binds a socket to exactly MASTER_ADDR
and hands it to the store (`master_listen_fd`). `trials.processes.RankGroup` sets MASTER_ADDR to
127.0.0.1 when the whole world runs on one host, so the store is loopback-only there; a multi-node
trial (trials/placement.py) sets the first node's own address, the only one the other nodes can
reach.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta

_LISTENERS: list[socket.socket] = []  # rank 0's bound sockets, kept open while the store serves


def listening_socket(addr: str, port: int) -> socket.socket:
    """A TCP socket bound to `addr`:`port` (that address only) and listening."""
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(sockaddr)
    s.listen(1024)
    return s


def store(rank: int, world: int, timeout_s: float):
    """Rank `rank`'s TCPStore at MASTER_ADDR:MASTER_PORT: the server on rank 0 (bound to
    MASTER_ADDR only), a client elsewhere. Pass it to `init_process_group(store=...)`."""
    import torch.distributed as dist
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"])
    timeout = timedelta(seconds=float(timeout_s))
    if rank != 0:
        return dist.TCPStore(addr, port, world, False, timeout=timeout)
    sock = listening_socket(addr, port)
    _LISTENERS.append(sock)
    return dist.TCPStore(addr, port, world, True, timeout=timeout, master_listen_fd=sock.fileno())


def init_process_group(backend: str, rank: int, world: int, timeout_s: float) -> None:
    """`torch.distributed.init_process_group` over `store(...)` (instead of env://)."""
    import torch.distributed as dist
    dist.init_process_group(backend, store=store(rank, world, timeout_s), rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(timeout_s)))
