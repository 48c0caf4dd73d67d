import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# Without a GPU, Triton kernels run only in its interpreter, and Triton decides that when a
# function is decorated, its own standard library included (decorated when triton is imported).
# So, without a GPU only: import triton once under TRITON_INTERPRET=1, then unset it at once, so
# that it leaks into no later import or subprocess; tests/test_kernels_triton.py sets it again
# around its own tests, where our kernels are decorated.
if not Path("/dev/nvidiactl").exists() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
    except ImportError:
        pass
    finally:
        del os.environ["TRITON_INTERPRET"]

import pytest  # noqa: E402

# a skip outside the allow-list fails the run (the hooks, imported here so pytest finds them)
from tests.skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: E402,F401


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


@pytest.fixture(autouse=True)
def _own_moetune_home(_isolated_moetune_home, tmp_path_factory, monkeypatch):
    """Every test writes its own MOETUNE_HOME: what one test profiles, calibrates or caches is
    never read by another (a shared home made test outcomes depend on their order). It starts as a
    copy of the session's home, which holds only what module- and session-scoped fixtures wrote."""
    import shutil
    home = tmp_path_factory.mktemp("home")
    shutil.copytree(_isolated_moetune_home, home, dirs_exist_ok=True)
    monkeypatch.setenv("MOETUNE_HOME", str(home))
    yield home


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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into node ids
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`, the README's command): every slow test (real
    multi-process trials, Ray clusters, vLLM servers, tuner subprocesses) runs in one group, on one
    worker, one at a time, so two of them never compete for the cores; the CPU-bound fast tests
    take the other worker. A test's own xdist_group mark is kept."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("heavy"))
