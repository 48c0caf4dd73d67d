"""A scripted trial backend for the trial-loop tests (tests/test_trial_loop.py), registered through
the real backend registry (`trials._REGISTRY`, what `trials.get_backend` reads) in the test process
and, via Ray's `worker_process_setup_hook`, in every Ray worker, so the loop's real Ray task body
(`tuner.study.train.run_train_trial`) runs it.

The script is a JSON file named by $MOETUNE_TEST_SCRIPT: {plan canonical string: [action, ...]},
the n-th run of a plan taking the n-th action (the last one repeats; a plan not listed: "ok"). Each
run first creates `<script dir>/runs/<digest>.<n>` (exclusively), so a test counts real runs.
Actions: "ok" (a Measurement with a step time from the plan's text), "oom" (a Failure), "crash"
(the worker process exits: Ray reports the task dead), "hang" (sleeps until killed), "wait" (runs
until `<script dir>/release` exists, then measures)."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from trials.base import Failure, Measurement, TrialBackend

NAME = "test-double"
SCRIPT_ENV = "MOETUNE_TEST_SCRIPT"


def register() -> None:
    import trials
    trials._REGISTRY[NAME] = "tests.trial_double:ScriptedBackend"


def digest(plan: str) -> str:
    return hashlib.sha256(plan.encode()).hexdigest()[:16]


def runs_of(script_dir: Path, plan: str) -> int:
    return len(list((Path(script_dir) / "runs").glob(digest(plan) + ".*")))


def step_time(plan: str) -> float:
    return 0.1 + int(digest(plan), 16) % 1000 / 1e4


class ScriptedBackend(TrialBackend):
    name = NAME

    def run(self, plan, workload, resources, *, iters=5, warmup=1, **kw):
        text = plan.canonical()
        path = Path(os.environ[SCRIPT_ENV])
        actions = json.loads(path.read_text()).get(text, ["ok"])
        runs = path.parent / "runs"
        runs.mkdir(exist_ok=True)
        n = 0
        while True:
            try:
                os.close(os.open(runs / f"{digest(text)}.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                break
            except FileExistsError:
                n += 1
        action = actions[min(n, len(actions) - 1)]
        if action == "crash":
            os._exit(3)
        if action == "hang":
            time.sleep(3600)
        if action == "wait":
            while not (path.parent / "release").exists():
                time.sleep(0.05)
        if action == "oom":
            return Failure(text, "oom", "scripted out of memory")
        t = step_time(text)
        return Measurement(text, t, 0.0, (t,) * iters, workload.tokens_per_step / (t * workload.world),
                           (1.0,) * workload.world, backend=NAME)


def serve_trial(backend: str, plan_text: str, task, iters: int, warmup: int, timeout_s: float,
                memory_cap_gib: float | None, layout=None) -> dict:
    """A scripted serving trial: the serving mode's Ray task body without a server (the study
    records seconds per objective token per GPU; TTFT / TPOT as attributes)."""
    s = step_time(plan_text) / 1000
    return {"ok": True, "step_time_s": s, "tokens_per_s_per_gpu": 1.0 / s, "step_times_s": [s], "peak_memory_gib": [],
            "attrs": {"measured_ttft_p90_s": 0.2, "measured_tpot_p90_s": 0.02}}
