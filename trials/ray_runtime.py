"""Starting or joining Ray with token authentication on: `init_ray(address, ...)`.

Ray 2.60 authenticates every gRPC and dashboard request with a shared token when
`RAY_AUTH_MODE=token`; the token comes from `RAY_AUTH_TOKEN`, else the file named by
`RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token`. Without it, anyone who can reach the ports of a
Ray started on a shared login node can run code as the person tuning. So:

- a local (embedded) cluster gets a generated token kept in `$MOETUNE_HOME/ray/auth_token`
  (folder 0700, file 0600) and every process of that cluster reads it through RAY_AUTH_TOKEN_PATH;
- joining an existing cluster (`--ray-address`) keeps token mode and uses the cluster's own token
  as Ray finds it (RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH / ~/.ray/auth_token); if none of those
  exists, the moetune token (a cluster started with it, as the README shows);
- turning authentication off is an explicit opt-in, `MOETUNE_RAY_AUTH=disabled` or the CLI's
  `--ray-no-auth`, and is logged as a warning every time.
Services bind to 127.0.0.1 (node address and dashboard) unless an address to join is given.
"""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from pathlib import Path

logger = logging.getLogger(__name__)

MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
OPT_OUT_ENV = "MOETUNE_RAY_AUTH"  # "disabled": no token authentication (explicit opt-in)
INSECURE_WARNING = ("Ray token authentication is DISABLED (--ray-no-auth / MOETUNE_RAY_AUTH=disabled): "
                    "any local user who can reach this Ray cluster or its dashboard can run code as you")


def token_path() -> Path:
    from cost_model.tables import moetune_home
    return moetune_home() / "ray" / "auth_token"


def ensure_token() -> Path:
    """The moetune Ray token file, generated on first use; owner-only permissions enforced."""
    path = token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    if not path.exists():
        # O_EXCL: two tuners starting at once must not overwrite each other's token
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
    if stat.S_IMODE(path.stat().st_mode) != 0o600:
        os.chmod(path, 0o600)
    return path


def auth_disabled(no_auth: bool = False) -> bool:
    return no_auth or os.environ.get(OPT_OUT_ENV, "").lower() in ("disabled", "0", "off", "no")


def configure_auth(*, joining: bool, no_auth: bool = False) -> str:
    """Set this process's (and its children's) Ray auth environment; returns "token" or "disabled"."""
    if auth_disabled(no_auth):
        os.environ[MODE_ENV] = "disabled"
        logger.warning(INSECURE_WARNING)
        mode = "disabled"
    else:
        os.environ[MODE_ENV] = "token"
        mode = "token"
        ray_default = Path.home() / ".ray" / "auth_token"
        has_own = os.environ.get(TOKEN_ENV) or os.environ.get(TOKEN_PATH_ENV) or ray_default.exists()
        if not joining or not has_own:
            os.environ.pop(TOKEN_ENV, None)
            os.environ[TOKEN_PATH_ENV] = str(ensure_token())
    _refresh_ray_auth_cache()
    return mode


def _refresh_ray_auth_cache() -> None:
    """Ray caches the auth mode and the token per process; re-read them after the environment
    changed (a process may start several clusters, e.g. a test session)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # another Ray version: it reads the environment when it starts
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def loopback_only() -> None:
    """Keep an embedded cluster on 127.0.0.1: Ray otherwise replaces the loopback address by the
    host's own (GCS included), reachable from the network. Its "cluster mode" switch is read from
    the environment by every Ray process at start, and by this one's already imported Ray here."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        import ray._private.ray_constants as ray_constants
        ray_constants.ENABLE_RAY_CLUSTER = False
    except ImportError:
        pass


def init_ray(address: str | None = None, *, num_cpus: int | None = None, dashboard: bool = False,
             no_auth: bool = False, runtime_env: dict | None = None, resources: dict | None = None, **local):
    """ray.init, joining `address` or starting a local cluster bound to 127.0.0.1; returns Ray's
    context. The one place moetune calls ray.init (tuning, screening, profiling, kernel
    measurement). Token authentication is on unless `no_auth` / MOETUNE_RAY_AUTH=disabled.
    `local`: further ray.init options of a local cluster (object_store_memory, configure_logging)."""
    import ray
    configure_auth(joining=bool(address), no_auth=no_auth)
    quiet = dict(log_to_driver=False, logging_level=logging.WARNING)
    if address == "auto" and os.environ.get("RAY_ADDRESS"):
        # inside a Ray job (or a shell told which cluster to use) RAY_ADDRESS names the cluster;
        # Ray's own "auto" reads the newest cluster started on this host, which may be another one
        address = os.environ["RAY_ADDRESS"]
    if address:
        return ray.init(address=address, runtime_env=runtime_env, **quiet)
    loopback_only()
    # Ray starts its workers at niceness 15 (raylet `worker_niceness`) unless told otherwise; a
    # trial task, a profiling actor and the ranks they launch inherit it. On a shared host that made
    # the study's trials run behind every other job while `moetune trial` did not, so the
    # calibration fitted on the study carried a contention factor the model's other plans never see
    # (and a niced profiling actor measures other jobs, not this machine). Embedded Ray: workers at
    # this process's priority.
    os.environ.setdefault("RAY_worker_niceness", "0")
    return ray.init(address="local", num_cpus=num_cpus, resources=resources, include_dashboard=dashboard,
                    dashboard_host="127.0.0.1", _node_ip_address="127.0.0.1", runtime_env=runtime_env,
                    **{**quiet, **local})


@contextlib.contextmanager
def ray_session(address: str | None = None, **kwargs):
    """`init_ray(address, **kwargs)` unless Ray is already initialised in this process (then that
    Ray is used as it is); yields Ray's context (None for a Ray already running), and shuts down
    only a Ray it started."""
    import ray
    started = not ray.is_initialized()
    ctx = init_ray(address, **kwargs) if started else None
    try:
        yield ctx
    finally:
        if started:
            ray.shutdown()
