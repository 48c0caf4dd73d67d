"""Launching a group of rank processes the way torchrun does, and always reaping them.

Used by the trial backends and by the collective microbenchmarks: each rank runs
`python -m <module> <spec>` in its own session (process group) with RANK / LOCAL_RANK /
WORLD_SIZE / MASTER_ADDR=127.0.0.1 / MASTER_PORT, one BLAS thread, its output in rank<r>.log.
`RankGroup` is a context manager: on exit every process group is SIGKILLed and waited for, so a
failing or hanging run never leaves processes or ports behind.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


TRIAL_DIR_PREFIX = "moetune-trial-"
OWNER_FILE = "owner"  # "<pid> <process start time>" of the launcher that made the folder


def sweep_orphan_trial_dirs(root: str | Path | None = None) -> list[Path]:
    """Remove this user's temporary trial folders whose launcher is gone: a launcher killed with
    SIGKILL (or with its Ray worker) cannot clean up after itself, so the next launch does. A folder
    without an owner file, or whose owner still runs, is left alone. Returns the folders removed."""
    import psutil
    removed = []
    for d in Path(root or tempfile.gettempdir()).glob(f"{TRIAL_DIR_PREFIX}*"):
        try:
            if d.stat().st_uid != os.getuid():
                continue
            pid, started = (d / OWNER_FILE).read_text().split()
            alive = abs(psutil.Process(int(pid)).create_time() - float(started)) < 1.0  # not a reused pid
        except psutil.NoSuchProcess:
            alive = False
        except (OSError, ValueError, psutil.Error):
            continue
        if not alive:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def trial_tempdir(owned: bool = True) -> tempfile.TemporaryDirectory:
    """A new temporary `moetune-trial-*` folder (after sweeping the orphans of dead launchers).
    `owned`: it names this process as its owner, so that it is swept if this process is killed
    before it removes the folder itself (a folder the caller keeps must not be owned)."""
    sweep_orphan_trial_dirs()
    tmp = tempfile.TemporaryDirectory(prefix=TRIAL_DIR_PREFIX)
    if owned:
        import psutil
        me = psutil.Process()
        (Path(tmp.name) / OWNER_FILE).write_text(f"{me.pid} {me.create_time()}\n")
    return tmp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pythonpath() -> str:
    prev = os.environ.get("PYTHONPATH", "")
    return str(REPO_ROOT) + (os.pathsep + prev if prev else "")


def _die_with_parent() -> None:
    """Runs in a rank between fork and exec: SIGKILL it when its launcher dies, so a launcher
    actor killed with its node (or cancelled) leaves no rank behind (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class RankGroup:
    def __init__(self, module: str, spec_path: Path, world: int, workdir: Path,
                 master_port: int | None = None, env: dict | None = None, *,
                 ranks: list[int] | None = None, master_addr: str = "127.0.0.1",
                 die_with_parent: bool = False):
        """module: run as `python -m module spec_path` per rank; env: extra environment
        variables for every rank (e.g. the launch environment of the emitted script).
        ranks: the global ranks this group starts (one node's share of a multi-node trial;
        default all of 0..world-1), with LOCAL_RANK their index here; master_addr: the
        rendezvous host; die_with_parent: ranks are killed when this process dies."""
        self.module, self.spec_path, self.world, self.workdir = module, spec_path, world, workdir
        self.ranks = list(range(world)) if ranks is None else list(ranks)
        self.master_addr, self.die_with_parent = master_addr, die_with_parent
        self.extra_env = dict(env or {})
        self.port = master_port or free_port()
        self.procs: list[subprocess.Popen] = []
        self._logs = []

    def log_path(self, rank: int) -> Path:
        return self.workdir / f"rank{rank}.log"

    def __enter__(self) -> "RankGroup":
        env = dict(os.environ, MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.port),
                   WORLD_SIZE=str(self.world), LOCAL_WORLD_SIZE=str(len(self.ranks)),
                   OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                   PYTHONPATH=_pythonpath(), **self.extra_env)
        try:
            for local, r in enumerate(self.ranks):
                log = open(self.log_path(r), "wb")
                self._logs.append(log)
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", self.module, str(self.spec_path)], cwd=str(REPO_ROOT),
                    env=dict(env, RANK=str(r), LOCAL_RANK=str(local)), stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=_die_with_parent if self.die_with_parent else None))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def exit_codes(self) -> list:
        return [p.poll() for p in self.procs]

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for log in self._logs:
            log.close()
