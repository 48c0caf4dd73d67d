"""Without a cluster: how a trial's ranks are split over Ray nodes, and the Ray token's handling
(owner-only file under $MOETUNE_HOME, opt-out only when asked and then loudly)."""
from __future__ import annotations

import logging
import os
import stat

import pytest

from trials.placement import spread_layout
from trials.ray_runtime import INSECURE_WARNING, _refresh_ray_auth_cache, configure_auth, ensure_token


@pytest.mark.parametrize("world,capacity,want", [
    (2, [2, 1], None),          # fits on one node
    (2, [1, 1], [1, 1]),        # one rank per node
    (8, [4, 4, 4], [4, 4]),     # two full nodes
    (6, [4, 4], [3, 3]),        # equal shares: 3 + 3, not 4 + 2
    (16, [8, 8, 8, 8], [8, 8]),
])
def test_spread_layout(world, capacity, want):
    assert spread_layout(world, capacity) == want


def test_spread_layout_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        spread_layout(4, [1, 1])


def test_token_is_owner_only_and_stable(tmp_path, monkeypatch):
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    p = ensure_token()
    assert p == tmp_path / "ray" / "auth_token"
    assert stat.S_IMODE(p.stat().st_mode) == 0o600 and stat.S_IMODE(p.parent.stat().st_mode) == 0o700
    token = p.read_text()
    assert len(token) == 64 and ensure_token().read_text() == token
    os.chmod(p, 0o644)  # loosened by someone: tightened again
    assert stat.S_IMODE(ensure_token().stat().st_mode) == 0o600


def test_auth_on_by_default_and_off_only_loudly(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MOETUNE_RAY_AUTH"):
        monkeypatch.delenv(k, raising=False)
    assert configure_auth(joining=False) == "token"
    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "ray" / "auth_token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/elsewhere/cluster_token")  # a joined cluster's own token
    assert configure_auth(joining=True) == "token"
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == "/elsewhere/cluster_token"
    with caplog.at_level(logging.WARNING, logger="trials.ray_runtime"):
        monkeypatch.setenv("MOETUNE_RAY_AUTH", "disabled")
        assert configure_auth(joining=False) == "disabled"
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
    assert INSECURE_WARNING in caplog.text
    monkeypatch.undo()  # the session's token mode again, and Ray's per-process cache re-read
    _refresh_ray_auth_cache()
