"""A real two-node Ray cluster on this machine (ray.cluster_utils.Cluster: a head and a worker
raylet, one CPU each, a custom resource naming each "node", everything on 127.0.0.1, token
authentication on): multi-node trials through a placement group, `moetune tune --ray-address`,
`ray job submit`, the dashboard's state API and the Prometheus metrics, a client without the
token refused, and a node dying mid-trial."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

# Ray turns 127.0.0.1 into this host's address unless clusters are "disabled": keep every process
# of the test cluster (and its clients) on loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")

from clusters import load_cluster  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan, parse_fields  # noqa: E402
from specs.stack import cpu_defaults  # noqa: E402
from specs.workload import Workload  # noqa: E402
from trials.base import Failure, Measurement, Resources  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _free_ports(n: int) -> list[int]:
    """n distinct ports free now (held together while chosen): fixed ports collide with another
    CI job or a developer's Ray on the same host."""
    import socket
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


GCS_PORT, DASHBOARD_PORT, METRICS_PORT, METRICS_PORT_1, CLIENT_PORT, AGENT_PORT_0, AGENT_PORT_1 = _free_ports(7)
ADDRESS = f"127.0.0.1:{GCS_PORT}"
DASHBOARD = f"http://127.0.0.1:{DASHBOARD_PORT}"
PLAN = Plan(**cpu_defaults(parse_fields("ep=2")))

pytestmark = pytest.mark.slow


def _workload():
    return Workload(model=load_model("tiny-moe"), cluster=load_cluster("cpu-local", 2), gbs=4, seq=64)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import ray._private.ray_constants as ray_constants
    from ray.cluster_utils import Cluster

    from trials.ray_runtime import configure_auth
    ray_constants.ENABLE_RAY_CLUSTER = False  # in case ray was imported before this module
    configure_auth(joining=False)  # token mode; every process of the cluster inherits it
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_metrics_report_interval_ms")}
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    os.environ["RAY_metrics_report_interval_ms"] = "1000"
    # its own Ray temp dir: the cluster's address file stays out of the shared /tmp/ray, where a
    # plain ray.init() (or a Ray job's "auto") of any other process on this host would join it. A
    # short path: Ray's unix sockets live under it (107-byte limit).
    temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    # Cluster.add_node still records the head's address in Ray's default temp dir (/tmp/ray), which a
    # fresh machine has not made yet when this is the first Ray of the run
    from ray._private.utils import get_ray_address_file
    os.makedirs(os.path.dirname(get_ray_address_file(None)), exist_ok=True)
    c = Cluster(initialize_head=True, head_node_args=dict(
        temp_dir=temp_dir, gcs_server_port=GCS_PORT, num_cpus=1, resources={"moetune_node0": 1}, node_ip_address="127.0.0.1",
        include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=DASHBOARD_PORT,
        metrics_export_port=METRICS_PORT, ray_client_server_port=CLIENT_PORT,
        dashboard_agent_listen_port=AGENT_PORT_0,  # the default 52365 may be another Ray's on a shared host
        _system_config={"health_check_period_ms": 1000, "health_check_failure_threshold": 3}))
    worker = c.add_node(temp_dir=temp_dir, num_cpus=1, resources={"moetune_node1": 1}, node_ip_address="127.0.0.1",
                        metrics_export_port=METRICS_PORT_1, dashboard_agent_listen_port=AGENT_PORT_1)
    c.wait_for_nodes()
    ray.init(address=ADDRESS, log_to_driver=False)
    c.worker = worker
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def _token() -> str:
    from trials.ray_runtime import token_path
    return token_path().read_text().strip()


def _get(url: str, token: str | None = None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read().decode()


def _env(**extra) -> dict:
    from trials.ray_runtime import token_path
    return dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path()), RAY_ADDRESS=ADDRESS,
                PYTHONPATH=str(ROOT), **extra)


def test_two_rank_trial_runs_one_rank_on_each_node(cluster):
    from trials.megatron.backend import MegatronBackend
    from trials.placement import alive_capacity, spread_layout
    layout = spread_layout(2, alive_capacity(False))
    assert layout == [1, 1]  # one CPU per node: the world of 2 must span both
    res = MegatronBackend().run(PLAN, _workload(), Resources(devices=2, timeout_s=400, layout=tuple(layout)),
                                iters=2, warmup=1)
    assert isinstance(res, Measurement), res
    assert len(res.nodes) == 2 and set(res.nodes) == _alive_nodes(), res.nodes
    assert res.step_time_s > 0 and res.step_times_s and res.losses


STUDY_METRICS = ("moetune_trials_completed", "moetune_best_tokens_per_s_per_gpu", "moetune_last_prediction_error",
                 "moetune_plans_screened_per_s")


def _metrics_text() -> str:
    text = ""
    for n in ray.nodes():
        if n["Alive"]:
            try:
                text += _get(f"http://127.0.0.1:{n['MetricsExportPort']}/metrics")[1]
            except OSError:
                pass
    return text


@pytest.mark.timeout(1200)
def test_tune_with_ray_address_auto_runs_a_study_on_the_cluster(cluster, tmp_path):
    study_dir = tmp_path / "study"
    cmd = [sys.executable, "-m", "tuner.cli", "tune", "--model", "tiny-moe", "--cluster", "cpu-local",
           "--gpus", "2", "--gbs", "4", "--seq", "64", "--study", "cluster", "--study-dir", str(study_dir),
           "--trials", "2", "--preregister", "2", "--iters", "2", "--warmup", "1", "--screen-actors", "2",
           "--trial-timeout", "400", "--adjudicate-rounds", "2", "--ray-address", "auto", "--no-progress"]
    log = tmp_path / "tune.log"
    with log.open("w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT, text=True)
        seen = set()  # the study's metrics in the nodes' Prometheus export, while it runs
        deadline = time.monotonic() + 1500
        while p.poll() is None and time.monotonic() < deadline:
            text = _metrics_text()
            seen |= {m for m in STUDY_METRICS if f"ray_{m}" in text}
            time.sleep(2)
        rc = p.wait(timeout=60)
    out = log.read_text()
    assert rc == 0, out[-4000:]
    assert "trials span 2 Ray nodes" in out
    import csv
    rows = list(csv.DictReader((study_dir / "trials.csv").open()))
    assert rows and all(r["state"] == "COMPLETE" for r in rows), rows
    for r in rows:
        assert set(r["nodes"].split()) == _alive_nodes(), r["nodes"]
    # the dashboard's state API saw the named screening actors and the trials' launchers
    status, body = _get(f"{DASHBOARD}/api/v0/actors?limit=1000&detail=1", _token())
    actors = json.loads(body)["data"]["result"]["result"]
    names = {a.get("name") for a in actors}
    assert any(n.startswith("moetune-screen-") for n in names), names
    assert any(n.startswith("moetune-trial-") and n.endswith("-node1") for n in names), names
    screen_nodes = {a["node_id"] for a in actors if a.get("name", "").startswith("moetune-screen-")}
    assert screen_nodes == _alive_nodes()  # shards spread over both nodes
    assert seen == set(STUDY_METRICS), seen


@pytest.mark.timeout(1200)  # a whole study through the job agent: minutes when the other worker is busy
def test_ray_job_submit_runs_a_study(cluster, tmp_path):
    study_dir = tmp_path / "jobstudy"
    # the job's driver gets RAY_ADDRESS from Ray's job supervisor, which resolves it as "auto": the
    # address file of its temp dir, else ANY GCS on the host (a stale file or another test's Ray:
    # the job then joined a dead or foreign cluster). A user's one cluster per host never sees that;
    # here the entrypoint names the cluster as the supervisor means to, and moetune's "auto" reads it.
    entry = (f"env RAY_ADDRESS={ADDRESS} {sys.executable} -m tuner.cli tune --model tiny-moe --cluster cpu-local --gpus 2 --gbs 4 --seq 64 "
             f"--study job --study-dir {study_dir} --trials 1 --preregister 1 --iters 2 --warmup 1 "
             f"--screen-actors 2 --trial-timeout 400 --adjudicate-rounds 2 --ray-address auto --no-progress")
    for _ in range(6):  # a just-started node's job agent may not be up yet (Ray: "try again later")
        p = subprocess.run(["ray", "job", "submit", "--address", DASHBOARD, "--", *entry.split()], cwd=ROOT,
                           env=_env(), capture_output=True, text=True, timeout=1500)
        if "No available agent to submit job" not in p.stderr + p.stdout:
            break
        time.sleep(10)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert (study_dir / "report.md").exists()
    status, body = _get(f"{DASHBOARD}/api/jobs/", _token())
    jobs = json.loads(body)
    assert any("tuner.cli tune" in j.get("entrypoint", "") and j["status"] == "SUCCEEDED" for j in jobs), jobs


def test_a_client_without_the_token_is_refused(cluster, tmp_path):
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(f"{DASHBOARD}/api/v0/actors")
    assert e.value.code in (401, 403)
    assert _get(f"{DASHBOARD}/api/v0/actors", _token())[0] == 200
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token either
    code = f"import ray; ray.init(address='{ADDRESS}'); print('CONNECTED')"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "CONNECTED" not in p.stdout
    assert "auth" in (p.stdout + p.stderr).lower()


def test_a_dead_node_fails_the_trial_as_crash_naming_it(cluster):
    from trials.megatron.backend import MegatronBackend
    worker_id = cluster.worker.node_id
    out = {}
    t = threading.Thread(target=lambda: out.update(res=MegatronBackend().run(
        PLAN, _workload(), Resources(devices=2, timeout_s=400, layout=(1, 1)), iters=100000, warmup=1)))
    t.start()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # wait until both launchers run their ranks
        body = _get(f"{DASHBOARD}/api/v0/actors?limit=1000&filter_keys=state&filter_predicates=%3D"
                    f"&filter_values=ALIVE", _token())[1]
        live = [a for a in json.loads(body)["data"]["result"]["result"]
                if (a.get("name") or "").startswith("moetune-trial-")]
        if len(live) == 2:
            break
        time.sleep(1)
    # no sleep against the host's speed: the trial asks for far more steps than it can finish
    # before the node goes (it was 50 steps and a 5 s sleep, which a fast host finished first)
    cluster.remove_node(cluster.worker)
    t.join(300)
    res = out.get("res")
    assert isinstance(res, Failure), res
    assert res.kind == "crash" and worker_id in res.message, res.message
