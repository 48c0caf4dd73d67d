"""A skip outside the allow-list fails the run (loaded by tests/conftest.py).

Every oracle of this suite (megatron-core, SGLang's resolver, vLLM, Ray, Optuna's storages,
PostgreSQL, optuna-dashboard) is a hard requirement of the `test` extra and of `.ci/run`: a test
skipped for one of them missing is a broken install that would otherwise pass CI in silence. Only
skips that depend on the machine's hardware are allowed: no CUDA device, TransformerEngine (GPU
only), the CPU or GPU variant of a test running instead, two visible GPUs. Both test-level skips
and whole-file skips at collection (`pytest.importorskip`) are checked.

MOETUNE_ALLOW_SKIPS=1 turns the policy off for a developer's partial install (never in CI)."""
from __future__ import annotations

import os
import re

import pytest

ALLOWED_SKIPS = (
    r"needs a CUDA device",
    r"TransformerEngine",
    r"a GPU is present",
    r"CPU \(gloo, fp32\) variant; the GPU variant runs instead",
    r"needs 2 ranks \(2 visible GPUs\)",
)
OFF_ENV = "MOETUNE_ALLOW_SKIPS"


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def forbidden(report) -> str | None:
    """The reason of a skip the policy forbids, else None."""
    if not report.skipped or hasattr(report, "wasxfail") or os.environ.get(OFF_ENV) == "1":
        return None
    why = _reason(report)
    return None if any(re.search(p, why) for p in ALLOWED_SKIPS) else why


def _fail(report, why: str) -> None:
    report.outcome = "failed"
    report.longrepr = (f"skipped outside the allow-list (tests/skip_policy.py ALLOWED_SKIPS): {why}\n"
                       f"Install what the test extra and .ci/run install, or set {OFF_ENV}=1 locally.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    why = forbidden(report)
    if why:
        _fail(report, why)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    why = forbidden(report)
    if why:
        _fail(report, why)
