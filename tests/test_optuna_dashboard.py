"""optuna-dashboard (PyPI) on a moetune study's storage serves the study and its trials with the plan
fields as parameters: its real WSGI app behind a real HTTP server on 127.0.0.1, read over HTTP."""
from __future__ import annotations

import json
import threading
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

from specs.plan import Plan

PLANS = ["ep=2,mbs=4", "pp=2,recompute=selective", "tp=2,mbs=2"]


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):  # keep pytest's output clean
        pass


def _get(base: str, path: str) -> dict:
    with urllib.request.urlopen(base + path, timeout=30) as r:
        assert r.status == 200
        return json.loads(r.read())


def _check_dashboard(storage_url: str, study_name: str) -> None:
    optuna_dashboard = pytest.importorskip("optuna_dashboard", reason="pip install optuna-dashboard (the test extra)")
    from tuner.study import storage as study_mod
    study = study_mod.open_study(study_name, study_mod.open_storage(storage_url, ".", heartbeat_interval=None))
    for i, text in enumerate(PLANS):
        plan = Plan.parse(text).canonical()
        t = study_mod.claim(study, plan, {"roles": "searched"})
        study_mod.record(study, t, {"ok": True, "step_time_s": 1.0 + i, "tokens_per_s_per_gpu": 100.0 - i})
    app = optuna_dashboard.wsgi(study_mod.open_storage(storage_url, ".", heartbeat_interval=None))
    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        summaries = _get(base, "/api/studies")["study_summaries"]
        mine = [s for s in summaries if s["study_name"] == study_name]
        assert len(mine) == 1
        detail = _get(base, f"/api/studies/{mine[0]['study_id']}")
        trials = detail["trials"]
        assert len(trials) == len(PLANS)
        for t, text in zip(sorted(trials, key=lambda t: t["number"]), PLANS):
            params = {p["name"]: p["param_external_value"] for p in t["params"]}
            assert {"tp", "ep", "pp", "mbs", "recompute", "dist_opt"} <= set(params)
            spelled = ",".join(f"{k}={v}" for k, v in params.items())
            assert Plan.parse(spelled).canonical() == Plan.parse(text).canonical()  # the params are the plan
            attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
            assert attrs["plan"] == Plan.parse(text).canonical()
            assert t["state"] == "Complete"
        # the plan fields are the study's search space in the dashboard (its parameter plots use it)
        assert {"tp", "ep", "pp", "mbs"} <= {p["name"] for p in detail["union_search_space"]}
    finally:
        server.shutdown()
        server.server_close()


def test_dashboard_serves_a_sqlite_study(tmp_path):
    _check_dashboard(f"sqlite:///{tmp_path / 'study.db'}", "dash-sqlite")


@pytest.mark.slow
def test_dashboard_serves_a_postgresql_study(postgres):
    _check_dashboard(postgres.url, "dash-postgres")
