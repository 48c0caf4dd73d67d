"""A trial whose rendezvous port another process took between picking and binding it is launched
again on a new port; one the caller named, or a failure of another kind, is returned as it is."""
from __future__ import annotations

from trials.megatron import backend

TAKEN = {"ok": False, "kind": "crash", "message": "rank 0 (init): OSError: [Errno 98] Address already in use"}
OOM = {"ok": False, "kind": "oom", "message": "rank 0: out of memory"}
OK = {"ok": True, "ranks": []}


def _calls(monkeypatch, results):
    seen = []

    def once(*a, **kw):
        seen.append(kw["master_port"])
        return results[len(seen) - 1]
    monkeypatch.setattr(backend, "_launch_once", once)
    return seen


def test_a_taken_port_is_retried_on_a_new_one(monkeypatch):
    seen = _calls(monkeypatch, [TAKEN, OK])
    assert backend.launch("p", {}, 2, 16, 2)["ok"] and seen == [None, None]


def test_retries_are_bounded_and_the_last_failure_returned(monkeypatch):
    seen = _calls(monkeypatch, [TAKEN] * 10)
    assert backend.launch("p", {}, 2, 16, 2) is TAKEN and len(seen) == backend.PORT_RETRIES + 1


def test_a_named_port_or_another_failure_is_not_retried(monkeypatch):
    seen = _calls(monkeypatch, [TAKEN, OK])
    assert backend.launch("p", {}, 2, 16, 2, master_port=12345) is TAKEN and seen == [12345]
    seen = _calls(monkeypatch, [OOM, OK])
    assert backend.launch("p", {}, 2, 16, 2) is OOM and len(seen) == 1
