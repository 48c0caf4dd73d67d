"""The skip policy (tests/skip_policy.py) fails a run that skips for a missing dependency: shown on
a real oracle file with megatron made unimportable (a stand-in package first on PYTHONPATH), and on
test-level skips, allowed and not, in a subprocess pytest run each."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pytest(args, tmp_path, extra_path=(), **env):
    e = {k: v for k, v in os.environ.items() if k != "MOETUNE_ALLOW_SKIPS"}
    e.update(env, MOETUNE_HOME=str(tmp_path / "home"),
             PYTHONPATH=os.pathsep.join([*map(str, extra_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
                       cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def test_a_missing_oracle_dependency_fails_the_run(tmp_path):
    fake = tmp_path / "fake" / "megatron"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("simulated: megatron-core is not installed")\n')
    args = ["--co", "tests/test_megatron_crosscheck.py"]
    rc, out = _pytest(args, tmp_path, [fake.parent])
    assert rc != 0 and "skipped outside the allow-list" in out and "megatron" in out, out[-2000:]
    # the policy is what fails it: turned off, the same run only skips
    rc, out = _pytest(args, tmp_path, [fake.parent], MOETUNE_ALLOW_SKIPS="1")
    assert rc in (0, 5) and "skipped outside" not in out, out[-2000:]


def test_only_hardware_skips_are_allowed(tmp_path):
    t = tmp_path / "test_skips.py"
    t.write_text("import pytest\n"
                 "def test_gpu():\n    pytest.skip('needs a CUDA device (runs on the GPU machine)')\n"
                 "def test_pg():\n    pytest.skip('psycopg absent')\n"
                 "@pytest.mark.xfail(reason='known')\ndef test_xfail():\n    assert False\n")
    rc, out = _pytest(["-p", "tests.skip_policy", str(t)], tmp_path)
    assert rc == 1 and "1 failed" in out and "1 skipped" in out and "1 xfailed" in out, out[-2000:]
    assert "test_pg" in out and "psycopg absent" in out
