"""Where the serving path was a copy of the training path, the copies agree (issue 24; each test
failed on 04ad8e3): the serving report hides the storage password, `tune --mode serve` honours
`--ray-no-auth`, kernel measurement starts Ray with the token on loopback, screening uses
`--tables` and the pre-registration hashes the tables the predictions used, the code hash covers
every package that computes a prediction, and `emit sglang` writes the config.json a trial serves."""
from __future__ import annotations

import pytest

from clusters import load_cluster
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload

SECRET = "s3cret-pw-24"
PG_URL = f"postgresql://moetune:{SECRET}@127.0.0.1:5432/studies"


@pytest.fixture(scope="module")
def serve_task():
    from tuner.study.serve import make_task
    return make_task(load_model("tiny-moe"), load_cluster("cpu-local", 2), ServeWorkload(isl=128, osl=32, concurrency=16),
                     "vllm")


def test_serving_report_never_shows_the_storage_password(tmp_path, serve_task):
    from tuner.study.serve_report import write_serve_report
    plan = ServePlan(tp=2).canonical()
    prereg = {"study": "s", "sha256": "0" * 64, "acceptance": {"ratio": 0.98},
              "baseline": {"plan": plan, "source": "test"}, "plans": []}
    rows = [{"number": 0, "state": "COMPLETE", "plan": plan, "roles": "baseline", "measured_tokens_per_s_per_gpu": 300.0,
             "predicted_tokens_per_s_per_gpu": 280.0, "predicted_raw_ttft_p90_s": 0.1, "measured_ttft_p90_s": 0.3,
             "predicted_raw_tpot_p90_s": 0.02, "measured_tpot_p90_s": 0.05, "calibration_scale": 1.0}]
    path = write_serve_report(tmp_path, task=serve_task, prereg=prereg, rows=rows, wall_s=1.0, storage_url=PG_URL)
    assert "postgresql://moetune:***@127.0.0.1:5432/studies" in path.read_text()
    for f in tmp_path.iterdir():
        assert SECRET.encode() not in f.read_bytes(), f.name


def _watch_ray(monkeypatch) -> dict:
    """Wrap ray.shutdown to note, while the cluster is still up, the nodes' addresses and the auth mode."""
    import os

    import ray
    seen, real = {}, ray.shutdown

    def shutdown(*a, **kw):
        if ray.is_initialized():
            seen["nodes"] = sorted({n["NodeManagerAddress"] for n in ray.nodes()})
            seen["auth"] = (os.environ.get("RAY_AUTH_MODE"), os.environ.get("RAY_AUTH_TOKEN_PATH"))
        return real(*a, **kw)
    monkeypatch.setattr(ray, "shutdown", shutdown)
    return seen


def test_kernel_measurement_starts_ray_with_the_token_on_loopback(tmp_path, monkeypatch, capsys):
    from tuner.cli import main
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path))
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MOETUNE_RAY_AUTH"):
        monkeypatch.delenv(k, raising=False)  # a user's shell: nothing set
    seen = _watch_ray(monkeypatch)
    rc = main(["kernels", "tune", "--cluster", "h100-sxm", "--stand-in", "--tokens", "4096", "--json"])
    assert rc == 0, capsys.readouterr().err
    assert seen == {"nodes": ["127.0.0.1"], "auth": ("token", str(tmp_path / "ray" / "auth_token"))}


class _RayStarted(BaseException):
    """Stops a study once its Ray is up (what follows needs real serving trials)."""


@pytest.mark.parametrize("mode", ["train", "serve"])
def test_tune_honours_ray_no_auth_in_both_modes(tmp_path, monkeypatch, mode):
    import os

    import ray

    import trials.ray_runtime as rr
    from tuner.cli import main
    seen, real = {}, rr.init_ray

    def init_ray(*a, **kw):
        real(*a, **kw)
        seen["auth"] = os.environ.get("RAY_AUTH_MODE")
        raise _RayStarted
    monkeypatch.setattr(rr, "init_ray", init_ray)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # restored afterwards: --ray-no-auth turns it off
    argv = {"train": ["--gbs", "16", "--seq", "256", "--study", "t", "--backend", "predict-only"],
            "serve": ["--gpus", "2", "--isl", "128", "--osl", "32"]}[mode]
    try:
        with pytest.raises(_RayStarted):
            main(["tune", "--mode", mode, "--model", "tiny-moe", "--cluster", "cpu-local", "--trials", "1",
                  "--study-dir", str(tmp_path / "s"), "--no-progress", "--ray-no-auth", *argv])
    finally:
        ray.shutdown()
    assert seen == {"auth": "disabled"}


def test_screening_uses_tune_tables_and_preregisters_their_digest(tmp_path, capsys):
    """`tune --tables DIR`: the pre-registered predictions are the cost model's on DIR, and the
    digest recorded is DIR's (a copy of the shipped cpu-local tables with half the GEMM rate)."""
    import csv
    import shutil

    import cost_model
    from specs.plan import Plan
    from specs.workload import Workload
    from tuner.cli import main
    from tuner.study import prereg as prereg
    src = cost_model.resolve_tables(Workload(load_model("tiny-moe"), load_cluster("cpu-local", 2), gbs=16, seq=256))
    tdir = tmp_path / "tables"
    shutil.copytree(src.directory, tdir)
    rows = list(csv.DictReader(open(tdir / "gemm.csv")))
    with open(tdir / "gemm.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({**r, "tflops": float(r["tflops"]) / 2} for r in rows)
    rc = main(["tune", "--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "2", "--gbs", "16", "--seq", "256",
               "--study", "t", "--study-dir", str(tmp_path / "s"), "--backend", "predict-only", "--trials", "2",
               "--tables", str(tdir), "--screen-actors", "1", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    doc = prereg.load(tmp_path / "s")
    workload = Workload(load_model("tiny-moe"), load_cluster("cpu-local", 2), gbs=16, seq=256)
    tables = cost_model.resolve_tables(workload, str(tdir))
    assert tables.digest != src.digest and doc["hashes"]["tables_digest"] == tables.digest
    cal = cost_model.resolve_calibration(workload, None, tables)
    for p in doc["plans"]:
        want = cost_model.predict(workload, Plan.parse(p["plan"]), tables=tables, calibration=cal).step_time_s
        assert p["predicted_step_time_s"] == pytest.approx(want, rel=1e-6), p["plan"]


def test_code_hash_covers_every_package_that_predicts(tmp_path, monkeypatch):
    """A change to any package's code or data (a plan rule, a kernel model, a cluster's YAML, a
    preset, a shipped table) changes the pre-registration's code hash; the hashed packages are the
    distribution's."""
    import shutil
    import tomllib

    from tuner.study import prereg as prereg
    root = prereg.REPO_ROOT
    include = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(prereg.SOURCE_DIRS) == sorted(p.rstrip("*") for p in include)
    for d in prereg.SOURCE_DIRS:
        shutil.copytree(root / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(prereg, "REPO_ROOT", tmp_path)
    base = prereg.code_version()["source_sha256"]
    for rel in ("specs/serve_plan.py", "kernels/weave.py", "clusters/h100-sxm.yaml", "specs/presets/models/tiny-moe.yaml",
                "cost_model/blocks.py", "clusters/tables/cpu-local/gemm.csv", "trials/serving/vllm_args.py"):
        f = tmp_path / rel
        old = f.read_bytes()
        f.write_bytes(old + b"\n")
        assert prereg.code_version()["source_sha256"] != base, rel
        f.write_bytes(old)
    assert prereg.code_version()["source_sha256"] == base


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b"])
def test_emit_sglang_writes_the_config_a_trial_serves(tmp_path, capsys, name):
    """A model with no published checkpoint (the preset's YAML without its `source:` line) emitted
    for a benchmark writes its config-only directory beside --out: the same bytes a trial serves."""
    from specs.models import PRESET_DIR
    from trials.serving.model_dir import serve_model, write_model_dir
    from tuner.cli import main
    src = (PRESET_DIR / f"{name}.yaml").read_text()
    yaml_path = tmp_path / f"{name}.yaml"
    yaml_path.write_text("".join(line for line in src.splitlines(keepends=True) if not line.startswith("source:")))
    assert main(["emit", "sglang", "--model", str(yaml_path), "--cluster", "h200-sxm", "--gpus", "8", "--plan", "tp=8",
                 "--isl", "1024", "--osl", "1024", "--benchmark", "--out", str(tmp_path / "launch.sh")]) == 0, capsys.readouterr().err
    trial = write_model_dir(serve_model(load_model(str(yaml_path))), tmp_path / "trial", tokenizer=False)
    assert (tmp_path / f"{name}-config" / "config.json").read_bytes() == (trial / "config.json").read_bytes()


def test_sglang_trial_serves_the_one_config_writer_s_file(tmp_path):
    """The SGLang trial backend itself (a fake server process stands in for SGLang, no GPU here)."""
    import os
    import shutil
    from pathlib import Path

    from specs.hf_export import write_model_dir
    from trials import get_backend
    from trials.base import Resources
    from trials.serving.model_dir import serve_model
    root = Path(__file__).resolve().parents[1]
    env = {"PYTHONPATH": f"{root / 'tests' / 'serving_fake'}{os.pathsep}{root}", "FAKE_PID_FILE": str(tmp_path / "pids.json")}
    b = get_backend("sglang", server_module="fake_sglang_server", bench_module="fake_bench_serving", require_gpu=False,
                    keep_dir=True, env=env)
    r = b.run(ServePlan.parse("tp=2"), ServeWorkload(isl=32, osl=8, concurrency=2), Resources(devices=2, timeout_s=60))
    assert r.to_dict()["ok"], r
    emitted = write_model_dir(serve_model(load_model("tiny-moe")), tmp_path / "emit") / "config.json"
    try:
        assert (Path(b.last_dir) / "model" / "config.json").read_bytes() == emitted.read_bytes()
    finally:
        shutil.rmtree(b.last_dir)


class _Captured(BaseException):
    """Stops a command once the value a test looks at is known."""


@pytest.mark.parametrize("phase", ["both", "decode"])
def test_predict_and_tune_serve_default_to_one_concurrency(tmp_path, monkeypatch, capsys, phase):
    """The serving study runs at the concurrency `predict --mode serve` prices (4 devices: the
    8-per-device rule and the decode rule differ)."""
    import json

    import tuner.study
    from tuner.cli import main
    flags = ["--model", "tiny-moe", "--cluster", "cpu-local", "--gpus", "4", "--isl", "128", "--osl", "32", "--phase", phase]
    assert main(["predict", "--mode", "serve", *flags, "--plan", "tp=4", "--json"]) == 0
    priced = json.loads(capsys.readouterr().out)["concurrency"]
    seen = {}

    def run(options, mode):
        seen["concurrency"] = mode.task.workload.concurrency
        raise _Captured
    monkeypatch.setattr(tuner.study, "run", run)
    with pytest.raises(_Captured):
        main(["tune", "--mode", "serve", *flags, "--trials", "1", "--study-dir", str(tmp_path / "s"), "--no-progress"])
    assert seen["concurrency"] == priced == (16 if phase == "decode" else 32)


def test_one_ray_starter():
    """Only trials/ray_runtime.py calls ray.init (tuning, screening, profiling, kernel measurement
    all start Ray with its token, loopback and worker priority)."""
    import ast

    from tuner.study import prereg as prereg
    calls = []
    for d in prereg.SOURCE_DIRS:
        for p in sorted((prereg.REPO_ROOT / d).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "init" \
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "ray":
                    calls.append(str(p.relative_to(prereg.REPO_ROOT)))
    assert sorted(set(calls)) == ["trials/ray_runtime.py"]
