"""One inference server process: launch in its own session, wait for /health, always reap.

`ServerProcess` is a context manager around `python -m <engine module> ...`. The server and
every process it forks (engine cores, TP workers) share one new session / process group, so on
exit a SIGTERM, a short grace period, then SIGKILL of the whole group leaves nothing behind —
also when the trial failed, timed out or was interrupted.

`wait_healthy()` polls GET /health until it answers 200; it returns a `Failure`-shaped
(kind, message) pair instead when the process exits first (classified from its log tail) or the
start-up deadline passes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

# Log patterns -> failure kind. Order matters: the first match wins, the most specific first.
# "stack-rejected": the engine's own argument / config validation refused the plan.
_PATTERNS = (
    ("oom", ("OutOfMemoryError", "CUDA out of memory", "out of memory", "Not enough memory",
             "insufficient memory", "No available memory for the cache blocks",
             "larger than the available KV cache memory", "MemoryError", "Cannot allocate memory")),
    ("stack-rejected", ("error: argument", "error: unrecognized arguments", "usage: ", "ValidationError",
                        "ValueError", "NotImplementedError", "AssertionError", "is not supported",
                        "not divisible", "must be divisible")),
)


def classify_log(text: str, returncode: int | None) -> tuple[str, str]:
    """(kind, one-line message) for a server that died: oom, stack-rejected or crash."""
    for kind, needles in _PATTERNS:
        for n in needles:
            i = text.rfind(n)
            if i >= 0:
                line = text[text.rfind("\n", 0, i) + 1: text.find("\n", i) if text.find("\n", i) >= 0 else None]
                return kind, line.strip()[-400:]
    sig = f" (signal {-returncode})" if returncode is not None and returncode < 0 else ""
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-3:]
    return "crash", f"server exited with code {returncode}{sig}: " + " | ".join(s.strip()[-200:] for s in last)


def tail(path: Path, n: int = 20000) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""


def http_get(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, ValueError):
        return None


class ServerProcess:
    def __init__(self, argv: list[str], log_path: Path, *, env: dict | None = None, cwd: str | None = None,
                 grace_s: float = 10.0):
        self.argv, self.log_path, self.env, self.cwd, self.grace_s = argv, Path(log_path), env, cwd, grace_s
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.started_at = 0.0

    def __enter__(self) -> "ServerProcess":
        self._log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                         env=self.env, start_new_session=True)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def wait_healthy(self, url: str, timeout_s: float, poll_s: float = 1.0) -> tuple[str, str] | None:
        """None once `url` answers 200; else (kind, message): the classified exit or "timeout"."""
        deadline = self.started_at + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                return classify_log(tail(self.log_path), code)
            if http_get(url) == 200:
                return None
            if time.monotonic() > deadline:
                return "timeout", f"server did not become healthy within {timeout_s:g} s"
            time.sleep(poll_s)

    def died(self) -> tuple[str, str] | None:
        """The classified exit if the server is gone, else None."""
        code = self.proc.poll() if self.proc else None
        return None if code is None else classify_log(tail(self.log_path), code)

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            pgid = self.proc.pid  # its own session: pgid == pid, children included
            for sig, wait in ((signal.SIGTERM, self.grace_s), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(pgid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                try:
                    self.proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    continue
                # the leader is gone; its children may not be: kill what is left of the group
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                break
        if self._log is not None:
            self._log.close()
            self._log = None


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` still exists (tests use it to check reaping)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
