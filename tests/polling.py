"""Waiting on state in tests: poll until a condition holds instead of sleeping past a grace period."""
from __future__ import annotations

import time


def poll(get, timeout_s: float = 120.0):
    """get() until it returns something truthy; fails the test when `timeout_s` passes first."""
    t = time.monotonic()
    while not (got := get()):
        assert time.monotonic() - t < timeout_s, "state not reached"
        time.sleep(0.2)
    return got
