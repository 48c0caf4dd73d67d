"""Hostile and careless input (issue 26): every command refuses it in one line with exit code 2,
prints no traceback, writes nothing (neither in the working folder nor in MOETUNE_HOME nor anywhere
above them) and checks before it starts anything.

The matrix below walks every command through the categories of the reliability review: numbers
that are NaN, infinite, negative or absurd; model / config.json / cluster files of the wrong types,
not UTF-8, folders, missing fields, unphysical values; tables and CSVs that cannot be used; output
paths that cannot be written; storages that do not parse or answer; names that would climb out of
their folder; a trial that cannot fit in the host's memory. Then one test each for the bugs that
were: the NaN hang of the serving simulator, the storage checked after Ray started, path traversal
through a study / model / cluster name, and the trial rendezvous listening on every interface.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny-moe", "--cluster", "cpu-local"]
TRAIN = [*TINY, "--gbs", "16", "--seq", "256"]
SERVE = [*TINY, "--isl", "16", "--osl", "4"]
TUNE = ["tune", *TRAIN, "--backend", "predict-only", "--no-progress"]


# ---- the inputs the cases refer to: made in a folder beside the working folder ------------------

def _yaml_model(**over) -> str:
    d = {"name": "bad-model", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
         "ffn_hidden_size": 128, "num_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32, "seq_length": 256}
    d.update(over)
    return "".join(f"{k}: {v}\n" for k, v in d.items())


def _hf(**over) -> str:
    d = {"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "intermediate_size": 128,
         "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 256}
    d.update(over)
    return json.dumps(d, allow_nan=True)


def _cluster(drop: str = "", **over) -> str:
    text = (ROOT / "clusters" / "h100-sxm.yaml").read_text()
    lines = [ln for ln in text.splitlines() if not (drop and ln.startswith(f"{drop}:"))]
    for k, v in over.items():
        if k.startswith("peak_") and k != "peak_tflops":
            lines = [f"  {k[5:]}: {v}" if ln.startswith(f"  {k[5:]}:") else ln for ln in lines]
        else:
            lines = [f"{k}: {v}" if ln.startswith(f"{k}:") else ln for ln in lines]
    return "\n".join(lines) + "\n"


def _tables(d: Path, how: str) -> None:
    from cost_model.tables import write_meta
    shutil.copytree(ROOT / "clusters" / "tables" / "cpu-local", d)
    gemm = d / "gemm.csv"
    lines = gemm.read_text().splitlines()
    if how in ("nan", "negative"):
        head, first = lines[0], lines[1].split(",")
        first[4] = "nan" if how == "nan" else "-1"
        gemm.write_text("\n".join([head, ",".join(first), *lines[2:]]) + "\n")
        write_meta(d, "cpu-local", "test", [])
    else:  # cut short at a row boundary after meta.json recorded the rows: two thirds gone
        write_meta(d, "cpu-local", "test", [])
        gemm.write_text("\n".join(lines[: len(lines) // 3]) + "\n")


def _make_inputs(d: Path) -> None:
    d.mkdir()
    (d / "afile").write_text("x\n")
    (d / "adir.yaml").mkdir()
    (d / "outdir").mkdir()
    files = {
        "layers-four.yaml": _yaml_model(num_layers="four"),
        "layers-nan.yaml": _yaml_model(num_layers=".nan"),
        "hidden-inf.yaml": _yaml_model(hidden_size=".inf"),
        "neg-ffn.yaml": _yaml_model(ffn_hidden_size=-128),
        "heads-indivisible.yaml": _yaml_model(hidden_size=66),
        "dup-key.yaml": _yaml_model() + "num_layers: 3\n",
        "escape-name.yaml": _yaml_model(name="../../../escape-model"),
        "kv-eight/config.json": _hf(num_key_value_heads="eight"),
        "rope-yarn/config.json": _hf(rope_scaling="yarn"),
        "qwen-mlp-only/config.json": _hf(architectures=["Qwen3MoeForCausalLM"], num_experts=4,
                                         moe_intermediate_size=32, mlp_only_layers=5),
        "layers-nan-json/config.json": _hf(num_hidden_layers=float("nan")),
        "no-devices.yaml": _cluster(drop="devices_per_node"),
        "devices-eight.yaml": _cluster(devices_per_node="eight"),
        "peak-scalar.yaml": _cluster(peak_tflops=5).replace("\n  bf16:", "\n#  bf16:").replace(
            "\n  fp8:", "\n#  fp8:").replace("\n  fp32:", "\n#  fp32:"),
        "hbm-negative.yaml": _cluster(hbm_gib=-80),
        "peak-nan.yaml": _cluster(peak_bf16=".nan"),
        "nvlink-negative.yaml": _cluster(nvlink_gbps=-450),
        "escape-kind.yaml": _cluster(kind="../../../escape-kind", is_gpu="false"),
        "calibration.json": "{not json",
        "runs.csv": "n_tot,n_act,s,g,d,loss\n1,1,0.5,1,1,2.0\n",
        "header-only.csv": "x,y\n",
        "empty.csv": "",
    }
    for name, text in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    for name in ("latin1.yaml", "latin1.csv"):
        (d / name).write_bytes("name: caf\xe9\n".encode("latin-1"))
    for how in ("nan", "negative", "cut"):
        _tables(d / f"tables-{how}", how)


# (id, argv with {in} for the inputs folder, what the one line must mention)
CASES = [
    # numbers: NaN, inf, negative, absurd
    ("trial-timeout-nan", ["trial", *TRAIN, "--plan", "ep=2", "--timeout", "nan"], "--timeout"),
    ("serve-trial-timeout-nan", ["serve-trial", *SERVE, "--plan", "tp=1", "--timeout", "nan"], "--timeout"),
    ("profile-budget-nan", ["profile", "--cluster", "cpu-local", "--budget-min", "nan"], "--budget-min"),
    ("predict-gpus-1e15", ["predict", "--model", "tiny-moe", "--cluster", "h100-sxm", "--gpus", str(10**15),
                           "--gbs", "64"], "--gpus"),
    ("predict-gbs-1e20", ["predict", *TINY, "--gbs", "1e20"], "--gbs"),
    ("predict-serve-skew-nan", ["predict", "--mode", "serve", *SERVE, "--routing-skew", "nan"], "--routing-skew"),
    ("plans-serve-skew-inf", ["plans", "--mode", "serve", *SERVE, "--rank", "--routing-skew", "inf"],
     "--routing-skew"),
    ("tune-serve-skew-nan", ["tune", "--mode", "serve", *SERVE, "--routing-skew", "nan"], "--routing-skew"),
    # a misspelt --precision is refused even where a checkpoint's own format would win over it
    ("predict-serve-precision-typo", ["predict", "--mode", "serve", "--model", "deepseek-v3", "--cluster", "h200-sxm",
                                      "--isl", "16", "--osl", "4", "--precision", "fp9"], "--precision"),
    ("emit-sglang-precision-typo", ["emit", "sglang", *SERVE, "--plan", "tp=1", "--precision", "int3",
                                    "--out", "s.sh"], "--precision"),
    ("trial-memcap-nan", ["trial", *TRAIN, "--plan", "ep=2", "--memory-cap-gib", "nan"], "--memory-cap-gib"),
    ("serve-trial-rate-nan", ["serve-trial", *SERVE, "--plan", "tp=1", "--request-rate", "nan"], "--request-rate"),
    ("design-days-inf", ["design", "--cluster", "h100-sxm", "--gpus", "8", "--days", "inf"], "--days"),
    ("kernels-skew-inf", ["kernels", "grid", "--model", "deepseek-v2-lite", "--cluster", "h100-sxm", "--ep", "8",
                          "--tokens", "4096", "--skew", "inf"], "--skew"),
    ("kernels-tokens-1e20", ["kernels", "grid", "--model", "deepseek-v2-lite", "--cluster", "h100-sxm", "--ep", "8",
                             "--tokens", "1e20"], "--tokens"),
    ("calibrate-gpus-negative", ["calibrate", "--measurements", "{in}/runs.csv", "--gpus", "-2"], "--gpus"),
    ("tune-trial-timeout-inf", [*TUNE, "--study", "s", "--trial-timeout", "inf"], "--trial-timeout"),
    ("law-rel-tol-nan", ["law", "fit", "--runs", "{in}/runs.csv", "--rel-tol", "nan"], "--rel-tol"),
    ("predict-hbm-reserve", ["predict", *TRAIN, "--hbm-reserve", "1.5"], "--hbm-reserve"),
    # model YAML
    ("model-layers-four", ["predict", "--model", "{in}/layers-four.yaml", "--cluster", "cpu-local", "--gbs", "16"],
     "num_layers"),
    ("model-layers-nan", ["plans", "--model", "{in}/layers-nan.yaml", "--cluster", "cpu-local", "--gbs", "16"],
     "num_layers"),
    ("model-hidden-inf", ["emit", "megatron", "--model", "{in}/hidden-inf.yaml", "--cluster", "cpu-local",
                          "--gbs", "16", "--plan", "ep=2"], "hidden_size"),
    ("model-latin1", ["predict", "--model", "{in}/latin1.yaml", "--cluster", "cpu-local", "--gbs", "16"], "UTF-8"),
    ("model-folder", ["predict", "--model", "{in}/adir.yaml", "--cluster", "cpu-local", "--gbs", "16"], "folder"),
    ("model-negative-ffn", ["trial", "--model", "{in}/neg-ffn.yaml", "--cluster", "cpu-local", "--gbs", "16",
                            "--plan", "ep=2"], "ffn_hidden_size"),
    ("model-heads-indivisible", ["predict", "--model", "{in}/heads-indivisible.yaml", "--cluster", "cpu-local",
                                 "--gbs", "16"], "num_attention_heads"),
    ("model-duplicate-key", ["predict", "--model", "{in}/dup-key.yaml", "--cluster", "cpu-local", "--gbs", "16"],
     "twice"),
    ("model-preset-traversal", ["predict", "--model", "../specs/presets/models/tiny-moe", "--cluster", "cpu-local",
                                "--gbs", "16"], "unknown model"),
    # Hugging Face config.json
    ("hf-kv-eight", ["predict", "--model", "{in}/kv-eight/config.json", "--cluster", "cpu-local", "--gbs", "16"],
     "num_key_value_heads"),
    ("hf-rope-yarn", ["plans", "--model", "{in}/rope-yarn/config.json", "--cluster", "cpu-local", "--gbs", "16"],
     "rope_scaling"),
    ("hf-mlp-only-5", ["predict", "--model", "{in}/qwen-mlp-only/config.json", "--cluster", "cpu-local",
                       "--gbs", "16"], "mlp_only_layers"),
    ("hf-layers-nan", ["predict", "--model", "{in}/layers-nan-json/config.json", "--cluster", "cpu-local",
                       "--gbs", "16"], "num_hidden_layers"),
    # cluster YAML
    ("cluster-missing-field", ["predict", "--model", "tiny-moe", "--cluster", "{in}/no-devices.yaml", "--gbs", "64"],
     "devices_per_node"),
    ("cluster-devices-eight", ["plans", "--model", "tiny-moe", "--cluster", "{in}/devices-eight.yaml", "--gbs", "64"],
     "devices_per_node"),
    ("cluster-peak-scalar", ["predict", "--model", "tiny-moe", "--cluster", "{in}/peak-scalar.yaml", "--gbs", "64"],
     "peak_tflops"),
    ("cluster-hbm-negative", ["predict", "--model", "tiny-moe", "--cluster", "{in}/hbm-negative.yaml", "--gbs", "64"],
     "hbm_gib"),
    ("cluster-peak-nan", ["predict", "--model", "tiny-moe", "--cluster", "{in}/peak-nan.yaml", "--gbs", "64"],
     "peak_tflops.bf16"),
    ("cluster-nvlink-negative", ["design", "--cluster", "{in}/nvlink-negative.yaml", "--gpus", "8", "--days", "1"],
     "nvlink_gbps"),
    ("cluster-model-file", ["predict", "--model", "tiny-moe", "--cluster", "../specs/presets/models/tiny-moe",
                            "--gbs", "16"], "unknown cluster"),
    ("cluster-kind-traversal", ["profile", "--cluster", "{in}/escape-kind.yaml", "--budget-min", "0.1"], "kind"),
    # tables, calibration, CSVs
    ("tables-nan", ["predict", *TRAIN, "--tables", "{in}/tables-nan"], "tflops"),
    ("tables-negative", ["predict", *TRAIN, "--tables", "{in}/tables-negative"], "tflops"),
    ("tables-cut-short", ["predict", *TRAIN, "--tables", "{in}/tables-cut"], "rows"),
    ("calibration-not-json", ["predict", *TRAIN, "--calibration", "{in}/calibration.json"], "calibration"),
    ("calibrate-csv-latin1", ["calibrate", "--measurements", "{in}/latin1.csv"], "UTF-8"),
    # a measurements file of the wrong kind names what it lacks (its header decides, rows or not)
    ("calibrate-csv-header-only", ["calibrate", "--measurements", "{in}/header-only.csv"], "'plan' column"),
    ("calibrate-measurements-json", ["calibrate", "--measurements", "{in}/calibration.json"], "'plan' column"),
    ("calibrate-csv-empty", ["calibrate", "--measurements", "{in}/empty.csv"], "empty"),
    ("law-runs-latin1", ["law", "fit", "--runs", "{in}/latin1.csv"], "UTF-8"),
    # output paths that cannot be written
    ("emit-out-under-file", ["emit", "megatron", *TRAIN, "--plan", "ep=2", "--out", "{in}/afile/run.sh"], "afile"),
    ("emit-out-is-folder", ["emit", "megatron", *TRAIN, "--plan", "ep=2", "--out", "{in}/outdir"], "folder"),
    ("emit-sglang-out-under-file", ["emit", "sglang", *TINY, "--plan", "tp=1", "--out", "{in}/afile/s.sh"], "afile"),
    ("profile-out-under-file", ["profile", "--cluster", "cpu-local", "--out", "{in}/afile/t"], "afile"),
    ("calibrate-out-under-file", ["calibrate", "--measurements", "{in}/runs.csv", "--out", "{in}/afile/c"], "afile"),
    ("law-out-under-file", ["law", "fit", "--runs", "{in}/runs.csv", "--out", "{in}/afile/law.json"], "afile"),
    ("law-plot-under-file", ["law", "fit", "--runs", "{in}/runs.csv", "--out", "law.json",
                             "--plot", "{in}/afile/p.png"], "afile"),
    ("design-out-under-file", ["design", "--cluster", "h100-sxm", "--gpus", "8", "--days", "1",
                               "--out", "{in}/afile/d"], "afile"),
    ("tune-study-dir-under-file", [*TUNE, "--study", "s", "--study-dir", "{in}/afile/s"], "afile"),
    # storages
    ("tune-storage-not-url", [*TUNE, "--study", "s", "--storage", "not a url"], "--storage"),
    ("tune-storage-refused", [*TUNE, "--study", "s", "--storage", "postgresql+psycopg://u:secret@127.0.0.1:1/db"],
     "cannot connect"),
    ("tune-storage-journal-under-file", [*TUNE, "--study", "s", "--storage", "journal:{in}/afile/s.journal"], "afile"),
    ("calibrate-storage-malformed", ["calibrate", "--study", "s", "--storage", "mysql://u:secret@[::1/db"],
     "--storage"),
    ("tune-serve-storage-not-url", ["tune", "--mode", "serve", *SERVE, "--storage", "nope://"], "--storage"),
    # names that would become paths outside their folder
    ("tune-study-traversal", [*TUNE, "--study", "../../escape"], "--study"),
    ("tune-study-empty", [*TUNE, "--study", ""], "--study"),
    ("tune-study-newline", [*TUNE, "--study", "a\nb"], "--study"),
    ("adjudicate-study-traversal", ["adjudicate", "../../escape"], "study"),
    ("emit-sglang-model-name-traversal", ["emit", "sglang", "--model", "{in}/escape-name.yaml",
                                          "--cluster", "cpu-local", "--plan", "tp=1", "--isl", "128", "--osl", "32"], "name"),
    # plan strings
    ("plan-fullwidth-digit", ["predict", *TRAIN, "--plan", "tp=\uff12"], "ASCII"),
    ("plan-only-commas", ["trial", *TRAIN, "--plan", ",,,"], "key=value"),
    ("plan-100kB", ["predict", *TRAIN, "--plan", "tp=1," * 20000], "characters long"),
    # checks before anything starts
    ("serve-trial-sglang-on-cpu", ["serve-trial", "--backend", "sglang", *SERVE, "--plan", "tp=1"], "GPUs"),
    ("tune-baseline-malformed", [*TUNE, "--study", "s", "--baseline", "tp=banana"], "tp"),
    ("trial-does-not-fit-host", ["trial", "--model", "mixtral-8x7b", "--cluster", "cpu-local", "--gbs", "16",
                                 "--seq", "256", "--plan", "ep=2"], "GiB per rank"),
]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def arena(tmp_path, monkeypatch):
    """tmp/in (inputs), tmp/home (MOETUNE_HOME), tmp/w/a/b (the working folder, deep enough that
    "../../../x" still lands inside tmp, where the listing sees it)."""
    _make_inputs(tmp_path / "in")
    home, cwd = tmp_path / "home", tmp_path / "w" / "a" / "b"
    home.mkdir()
    cwd.mkdir(parents=True)
    monkeypatch.setenv("MOETUNE_HOME", str(home))
    monkeypatch.chdir(cwd)
    return tmp_path


def _refused(argv, capsys) -> str:
    """Run the CLI; assert exit 2, exactly one stderr line, no traceback; return the line."""
    capsys.readouterr()
    t0 = time.monotonic()
    rc = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err and "secret" not in err, err
    assert time.monotonic() - t0 < 60
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_refused_in_one_line_and_nothing_written(case, arena, capsys):
    _, argv, needle = case
    argv = [a.replace("{in}", str(arena / "in")) for a in argv]
    before = _tree(arena)
    line = _refused(argv, capsys)
    assert needle in line, line
    assert _tree(arena) == before, sorted(_tree(arena) ^ before)


def test_moetune_home_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "home").write_text("x")
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for argv in ([*TUNE, "--study", "s"], ["profile", "--cluster", "cpu-local"], ["predict", *TRAIN]):
        assert "MOETUNE_HOME" in _refused(argv, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # no studies/s left behind


# ---- numeric flags: one set of types, nothing non-finite or absurd gets through ----------------

def _numeric_actions():
    """(command path, flag, type) of every flag of every command whose value is a number."""
    import argparse
    out = []

    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, (*path, name))
            elif a.option_strings and a.type is not None:
                out.append((" ".join(path), a.option_strings[0], a.type))
    walk(build_parser(), ())
    return out


def test_every_numeric_flag_uses_the_shared_types():
    from tuner.commands import common
    acts = _numeric_actions()
    assert len(acts) > 40
    raw = [(c, f) for c, f, t in acts if t in (int, float)]
    assert not raw, f"flags parsed with bare int/float (NaN, inf and negatives get through): {raw}"
    assert common.MAX_DEVICES == 1_000_000


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "", " ", "1e20", "-1",
                                  "10**15", "0x10", "four"]),
                 st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not math.isfinite(x) or x < 0)
                 .map(repr),
                 st.integers(min_value=2**32, max_value=10**30).map(str)))
def test_numeric_flags_refuse_non_finite_negative_and_absurd(text):
    import argparse
    for cmd, flag, typ in _numeric_actions():
        with pytest.raises(argparse.ArgumentTypeError):
            typ(text)
            raise AssertionError(f"{cmd} {flag} accepted {text!r}")


# ---- the bugs that were, one test each (each fails on 04ad8e3) ----------------------------------

def _cli(args, timeout, cwd=None, env=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=e)


def test_routing_skew_nan_does_not_hang():
    """04ad8e3: `predict --mode serve --routing-skew nan` never returned (the simulator's clock
    became NaN). Now the flag refuses it, and the model and the simulator refuse it too."""
    r = _cli(["predict", "--mode", "serve", *SERVE, "--routing-skew", "nan"], timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # the cost model's own boundary (callers that bypass the CLI) and the simulator's loop
    code = (
        "import math\n"
        "from cost_model.serving.sim import simulate\n"
        "try:\n"
        "    simulate(lambda n, p: math.nan, lambda b, c: 1e-3, [(0.0, 16, 4)] * 4, chunk=64, max_batch=4,"
        " kv_tokens=1e6)\n"
        "except ValueError as e:\n"
        "    print('refused', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.stdout.startswith("refused"), (r.stdout, r.stderr)
    from clusters import load_cluster
    from cost_model.serving.step import StepModel
    from specs.errors import InputError
    from specs.models import load_model
    with pytest.raises(InputError):
        StepModel(load_model("tiny-moe"), load_cluster("cpu-local"), None, None, fp8=False, routing_skew=math.nan)


def test_tune_checks_storage_before_ray_and_leaves_nothing(tmp_path):
    """04ad8e3: tune started Ray, screened and wrote the pre-registration, then failed on the
    storage with a traceback, leaving preregistration.json behind."""
    home = tmp_path / "home"
    t0 = time.monotonic()
    r = _cli([*TUNE, "--study", "s", "--storage", "postgresql+psycopg://u:secret@127.0.0.1:1/db"], timeout=120,
             cwd=tmp_path, env={"MOETUNE_HOME": str(home), "RAY_ADDRESS": ""})
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "secret" not in r.stderr + r.stdout
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "studies").exists()
    assert "ray" not in r.stdout.lower()
    assert not home.exists() or not any(home.rglob("*session*"))


def test_names_cannot_climb_out(arena, capsys):
    """04ad8e3: `--study ../../x` wrote the pre-registration two folders above studies/; a
    model's `name: ../../../x` made `emit sglang` write its config folder above the working
    folder; a cluster's `kind: ../../../x` made `profile` write outside MOETUNE_HOME."""
    before = _tree(arena)
    _refused([*TUNE, "--study", "../../escape"], capsys)
    _refused(["emit", "sglang", "--model", str(arena / "in" / "escape-name.yaml"), "--cluster", "cpu-local",
              "--plan", "tp=1"], capsys)
    _refused(["profile", "--cluster", str(arena / "in" / "escape-kind.yaml"), "--budget-min", "0.1"], capsys)
    assert _tree(arena) == before
    assert not any("escape" in p for p in _tree(arena) - before)


def test_trial_rendezvous_listens_on_loopback_only(tmp_path):
    """04ad8e3: rank 0 of every Megatron trial listened on *:<port> (torch's TCPStore binds every
    interface whatever MASTER_ADDR says). A real two-rank tiny-moe trial; every listening socket of
    its rank processes is sampled while it runs."""
    import psutil

    from specs.models import load_model
    from specs.plan import Plan
    from specs.stack import cpu_defaults
    from trials.megatron.backend import launch
    res, seen = {}, {}

    def run():
        res.update(launch(Plan(**cpu_defaults({"ep": 2})).canonical(), load_model("tiny-moe").to_dict(), 4, 64, 2,
                          timeout_s=300, iters=1, warmup=0, out_dir=str(tmp_path / "t")))
    th = threading.Thread(target=run)
    th.start()
    me = psutil.Process()
    while th.is_alive():
        for child in me.children(recursive=True):
            try:
                if "trials.megatron.worker" not in " ".join(child.cmdline()):
                    continue
                for c in child.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        seen.setdefault(child.pid, set()).add(c.laddr.ip)
            except psutil.Error:
                continue
        time.sleep(0.2)
    th.join()
    assert res.get("ok"), res
    assert seen, "no listening socket of a rank was seen"
    ips = set().union(*seen.values())
    assert ips <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, ips


def test_orphan_trial_folders_are_swept(tmp_path):
    """A launcher killed with SIGKILL cannot remove its moetune-trial-* folder; the next launch
    does, and leaves alone the folders of launchers still running and folders it did not make."""
    import psutil

    from trials.processes import OWNER_FILE, TRIAL_DIR_PREFIX, sweep_orphan_trial_dirs
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = psutil.Process()
    for name, owner in (("dead", f"{dead.pid} 1.0"), ("alive", f"{me.pid} {me.create_time()}"), ("foreign", None)):
        d = tmp_path / f"{TRIAL_DIR_PREFIX}{name}"
        d.mkdir()
        if owner:
            (d / OWNER_FILE).write_text(owner)
    removed = sweep_orphan_trial_dirs(tmp_path)
    assert [p.name for p in removed] == [f"{TRIAL_DIR_PREFIX}dead"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{TRIAL_DIR_PREFIX}alive", f"{TRIAL_DIR_PREFIX}foreign"]


def test_broken_pipe_and_internal_errors(tmp_path):
    """`moetune predict ... | head -1` exits quietly; an unexpected error is one line naming a
    log file (exit 1) and the traceback is in that file."""
    r = subprocess.run(f"{sys.executable} -m tuner.cli predict {' '.join(TRAIN)} | head -1", shell=True,
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), MOETUNE_HOME=str(tmp_path / "h")))
    assert r.stdout.count("\n") == 1 and r.stderr == "", r.stderr
    code = ("import sys, tuner.commands.predict as p\n"
            "p.run = lambda args: 1 / 0\n"
            "from tuner.cli import main\n"
            "sys.exit(main(['predict', '--model', 'tiny-moe', '--cluster', 'cpu-local', '--gbs', '16']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), MOETUNE_HOME=str(tmp_path / "h3")))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "ZeroDivisionError" in lines[0], r.stderr
    logs = list((tmp_path / "h3" / "logs").glob("moetune-predict-*.log"))
    assert len(logs) == 1 and "Traceback" in logs[0].read_text()
