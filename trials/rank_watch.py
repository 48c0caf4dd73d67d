"""Watching a trial's rank processes and classifying how it ended (the worker report protocol).

Each rank writes `rank<N>.json` into its trial folder: {"ok": true, ...measurements} or
{"ok": false, "kind", "phase", "message", "traceback", "time"} (trials/megatron/worker.py).
`watch(poll, tail, world, timeout_s, cap_gib)` turns the ranks' reports, exit codes and memory
into one result: measured, or the earliest root cause (stack-rejected / unrealizable / oom beat a
peer's secondary error), a rank dead without a report (crash, or oom when SIGKILLed), the memory
cap (oom), the timeout, or a lost node (crash naming it). `watch_local` is it for one RankGroup on
this machine; trials/placement.py polls launcher actors on several nodes through the same loop.
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

POLL_S = 0.1


def tail_of(path: Path, n: int = 3000) -> str:
    try:
        data = path.read_bytes()[-n:]
        return data.decode(errors="replace")
    except OSError:
        return ""


def rss_gib(pid: int) -> float:
    try:
        import psutil
        p = psutil.Process(pid)
        return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)]) / 2**30
    except Exception:  # noqa: BLE001 - process gone
        return 0.0


class NodeLost(Exception):
    """A node of a multi-node trial went away (its launcher actor died); the message names it."""


def watch_local(procs, d: Path, world: int, timeout_s: float, cap_gib: float | None) -> dict:
    def poll():
        codes = [p.poll() for p in procs]  # before the reports: a rank writes its report, then exits
        rss = {r: rss_gib(p.pid) for r, p in enumerate(procs)} if cap_gib is not None else {}
        return reports(d, world), codes, rss
    return watch(poll, lambda r: tail_of(d / f"rank{r}.log"), world, timeout_s, cap_gib)


def watch(poll, tail, world: int, timeout_s: float, cap_gib: float | None) -> dict:
    """Watch a trial's ranks until they all report, one fails, the memory cap or the timeout.

    poll() -> (reports {rank: dict}, exit codes by rank (None: running), resident GiB {rank: x});
    it raises NodeLost when part of the trial vanished (multi-node trials: trials/multinode.py).
    tail(rank) -> the end of that rank's log. Returns launch()'s result dict."""
    t0 = time.monotonic()
    first_exit = None
    while True:
        try:
            reports, codes, rss = poll()
            errors = [r for r in reports.values() if not r.get("ok")]
            if errors:
                # give peers a moment to write their own reports, then pick the root cause
                time.sleep(0.5)
                return classify_error(poll()[0], tail)
        except NodeLost as e:
            return {"ok": False, "kind": "crash", "message": str(e)}
        if all(c is not None for c in codes):
            if len(reports) == world and all(r.get("ok") for r in reports.values()):
                return {"ok": True, "ranks": [reports[r] for r in range(world)]}
            return classify_error(reports, tail, codes=codes)
        if any(c not in (None, 0) for c in codes):
            first_exit = first_exit or time.monotonic()
            if time.monotonic() - first_exit > 2.0:
                return classify_error(reports, tail, codes=codes)
        if cap_gib is not None:
            for r, gib in sorted(rss.items()):
                if gib > cap_gib:
                    return {"ok": False, "kind": "oom",
                            "message": f"rank {r} resident memory {gib:.2f} GiB exceeded the "
                                       f"per-rank cap {cap_gib:g} GiB"}
        if time.monotonic() - t0 > timeout_s:
            return {"ok": False, "kind": "timeout",
                    "message": f"trial exceeded {timeout_s:g} s; all {world} ranks killed"}
        time.sleep(POLL_S)


def reports(d: Path, world: int) -> dict:
    out = {}
    for r in range(world):
        f = d / f"rank{r}.json"
        if f.exists():
            try:
                out[r] = json.loads(f.read_text())
            except (OSError, json.JSONDecodeError):
                pass
    return out


def classify_error(reports: dict, tail, codes=None) -> dict:
    errors = sorted((r for r in reports.values() if not r.get("ok")), key=lambda r: r["time"])
    # a rank's own validation error beats peers' secondary errors (connection closed etc.)
    for pref in ("stack-rejected", "unrealizable", "oom"):
        for e in errors:
            if e["kind"] == pref:
                return {"ok": False, "kind": pref, "message": f"rank {e['rank']}: {e['message']}"}
    if errors:
        e = errors[0]
        return {"ok": False, "kind": "crash",
                "message": f"rank {e['rank']} ({e['phase']}): {e['message']}\n{e.get('traceback', '')[-1500:]}"}
    # died without a report (signal, hard crash)
    bad = [r for r, c in enumerate(codes or []) if c not in (None, 0)] or [0]
    r = bad[0]
    code = (codes or [None])[r] if codes else None
    text = tail(r)
    kind = "oom" if code == -signal.SIGKILL or "out of memory" in text.lower() else "crash"
    return {"ok": False, "kind": kind, "message": f"rank {r} exited with code {code}; stderr tail:\n{text}"}
