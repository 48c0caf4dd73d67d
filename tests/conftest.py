import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Without a GPU, Triton kernels run only in its interpreter, and Triton decides that when a kernel
# is decorated: set it before any test module (torch, megatron and sglang all import triton) loads.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _isolated_moetune_home(tmp_path_factory):
    """Tests never read (or write) a user's measured tables and calibrations in ~/.moetune."""
    home = tmp_path_factory.mktemp("moetune-home")
    old = os.environ.get("MOETUNE_HOME")
    os.environ["MOETUNE_HOME"] = str(home)
    # Ray's token authentication stays on in tests, as for users: every Ray the tests start (the
    # tuner's, kernels' measurement's, a test's own ray.init) uses this session's token.
    from trials.ray_runtime import MODE_ENV, TOKEN_PATH_ENV, ensure_token
    os.environ[MODE_ENV] = "token"
    os.environ[TOKEN_PATH_ENV] = str(ensure_token())
    yield home
    if old is None:
        os.environ.pop("MOETUNE_HOME", None)
    else:
        os.environ["MOETUNE_HOME"] = old


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server on 127.0.0.1 for the session (tests/pg.py); `.url` logs in with a
    password. Skips with the reason when PostgreSQL or its Python driver is not installed."""
    from tests import pg
    why = pg.missing_reason()
    if why:
        pytest.skip(why)
    server = pg.start_server()
    yield server
    server.stop()
