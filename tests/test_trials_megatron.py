"""Megatron-core trial backend: on CPU (gloo, 2 ranks, tiny-moe, gbs 8, seq 64), and the same
tests on a GPU machine (NCCL, one rank per visible GPU up to 2, bf16).

Slow tests launch real megatron-core training steps (~5-10 s each on 2 cores); they are marked
`slow`. The fast ones check the CPU support table and argument handling. Tests that only make
sense on one device kind say so in their skip reason; tests needing two ranks skip on one GPU."""
from __future__ import annotations

import glob
import os
import tempfile

import psutil
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from specs.cpu_support import CPU_UNSUPPORTED, cpu_rejection_rules, cpu_rejections  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan, parse_fields  # noqa: E402
from specs.stack import cpu_defaults  # noqa: E402
from trials.base import Failure, Measurement, Resources  # noqa: E402
from trials.megatron.backend import MegatronBackend, launch  # noqa: E402

GPU = torch.cuda.is_available()
GBS, SEQ = 8, 64
WORLD = min(2, torch.cuda.device_count()) if GPU else 2
MODEL = load_model("tiny-moe")
slow = pytest.mark.slow
cpu_only = pytest.mark.skipif(GPU, reason="CPU (gloo, fp32) variant; the GPU variant runs instead")
two_ranks = pytest.mark.skipif(WORLD < 2, reason="needs 2 ranks (2 visible GPUs)")


class _Cluster:  # the backend reads the model/gbs/seq from a workload, and the launch env's fields
    num_devices = WORLD
    is_gpu = GPU
    nvlink_gbps = 900.0 if GPU else 0.0
    mxfp8 = False


class _Workload:
    def __init__(self, model=MODEL, gbs=GBS, seq=SEQ):
        self.model, self.gbs, self.seq, self.cluster = model, gbs, seq, _Cluster()

    @property
    def world(self):
        return WORLD


def plan(text=""):
    return Plan(**cpu_defaults(parse_fields(text)))


def no_strays():
    me = psutil.Process()
    kids = [c for c in me.children(recursive=True) if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    return kids


def run(text, *, iters=3, warmup=1, timeout=120.0, cap=None, model=MODEL, gbs=GBS):
    r = MegatronBackend().run(plan(text), _Workload(model, gbs), Resources(WORLD, timeout, cap),
                              iters=iters, warmup=warmup)
    assert not no_strays(), "trial left processes behind"
    return r


# ---- fast ------------------------------------------------------------------------------------
def test_cpu_rejections_table():
    assert cpu_rejections(plan(""), MODEL) == []
    codes = {c for c, _ in cpu_rejections(Plan(), MODEL)}  # GPU defaults: dist_opt, opg, grouped gemm
    assert {"dist_opt", "overlap_param_gather", "grouped_gemm"} <= codes
    assert {c for c, _ in cpu_rejections(plan("tp=2,cp=2,dispatcher=flex,precision=fp8-delayed"), MODEL)} == {
        "tp_sequence_parallel", "context_parallel", "flex_dispatcher", "fp8"}
    assert all(code in CPU_UNSUPPORTED for code, _ in cpu_rejections(Plan(tp=2, cp=2), MODEL))
    rules = cpu_rejection_rules()
    assert any(pred(plan("tp=2"), MODEL) for _, _, pred in rules)
    assert not any(pred(plan("ep=2,pp=2,vpp=2"), MODEL) for _, _, pred in rules)


@cpu_only
def test_backend_refuses_cpu_unsupported_without_launching():
    r = MegatronBackend().run(plan("grouped_gemm=1"), _Workload(), Resources(WORLD, 30))
    assert isinstance(r, Failure) and r.kind == "unrealizable" and "grouped_gemm" in r.message


# ---- measurements ------------------------------------------------------------------------------
PLANS = ["", "ep=2", "ep=2,dispatcher=allgather", "pp=2", "pp=2,vpp=2", "mbs=2",
         "ep=2,recompute=full", "pp=2,recompute=selective,recompute_modules=core_attn+moe",
         "overlap_grad_reduce=1", "ep=2,capacity_factor=1,pad_to_capacity=1", "ep=2,capacity_factor=0.5"]
if WORLD < 2:  # one GPU: the plans that fit one rank
    PLANS = [t.replace("ep=2,", "") for t in PLANS if not t.startswith("pp=2") and t not in ("ep=2",)]
    PLANS = list(dict.fromkeys(PLANS))
if GPU:
    PLANS.append("dist_opt=1,overlap_grad_reduce=1,overlap_param_gather=1")  # Megatron's optimizer


@pytest.fixture(scope="module")
def measured():
    """One trial per plan of PLANS, shared by the tests below (each launch costs ranks' start-up)."""
    return {text: run(text) for text in PLANS}


@slow
def test_trials_across_plans(measured):
    for text in PLANS:
        m = measured[text]
        assert isinstance(m, Measurement), (text, m)
        assert m.step_time_s > 0 and all(t > 0 for t in m.step_times_s) and len(m.step_times_s) == 3
        assert min(m.step_times_s) <= m.step_time_s <= max(m.step_times_s)
        assert m.step_time_spread_s == pytest.approx(max(m.step_times_s) - min(m.step_times_s))
        assert m.tokens_per_s_per_gpu == pytest.approx(GBS * SEQ / m.step_time_s / WORLD)
        assert len(m.peak_memory_gib) == WORLD and all(x > 0 for x in m.peak_memory_gib)
        assert len(m.losses) == 4 and m.losses[-1] < m.losses[0]  # learning
        assert m.plan == plan(text).canonical()
        assert (m.versions["device"] != "cpu") == GPU and m.versions["cpu_patched"] == (not GPU)
        # CPU ranks keep freed memory (trials/megatron/backend.py CPU_ALLOCATOR_TUNABLES)
        assert ("mmap_threshold=33554432" in m.versions["env"].get("GLIBC_TUNABLES", "")) == (not GPU)


@slow
def test_same_model_same_first_loss_across_plans(measured):
    """Name-based init and shared synthetic data: every plan starts from the same loss (the first
    step's, warm-up included, of the trials above)."""
    texts = ("", "pp=2", "ep=2") if WORLD >= 2 else ("", "mbs=2", "recompute=full")
    first = [measured[t].losses[0] for t in texts]
    assert max(first) - min(first) < (2e-2 if GPU else 1e-4)  # GPU: bf16 reductions in another order


@slow
@cpu_only
def test_token_drop_reaches_megatron(measured):
    """capacity_factor 0.5 drops routed tokens in megatron-core's router: the first step's loss moves
    off the dropless one (the plans above share init and data to 1e-4); drop-and-pad runs."""
    drop = measured["ep=2,capacity_factor=0.5"].losses[0]
    assert abs(drop - measured["ep=2"].losses[0]) > 1e-4
    assert isinstance(measured["ep=2,capacity_factor=1,pad_to_capacity=1"], Measurement)


# ---- gradient equality --------------------------------------------------------------------------
# On GPU the gradient runs use fp32 parameters (bf16 reductions in different orders are not
# comparable at these tolerances); TF32 matmuls stay off (torch's default).
FP32 = {"config_overrides": {"params_dtype": "float32", "pipeline_dtype": "float32", "bf16": False}} if GPU else {}


def _grads(text, world):
    d = tempfile.mkdtemp(prefix="moetune-grads-")
    r = launch(plan(text).canonical(), MODEL.to_dict(), GBS, SEQ, world, timeout_s=120, mode="grads",
               out_dir=d, extra=FP32)
    assert r["ok"], r
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "grads_rank*.pt"))):
        for k, v in torch.load(f).items():
            if k in out:  # DP replicas hold identical parameters and (all-reduced) gradients
                assert torch.equal(out[k]["param"], v["param"]) and torch.allclose(out[k]["grad"], v["grad"])
            out[k] = v
    return out


@pytest.fixture(scope="module")
def reference_grads():
    return _grads("", 1)  # unpipelined, one process, same 8 microbatches


@slow
@two_ranks
@pytest.mark.parametrize("text", ["pp=2", "pp=2,vpp=2", "ep=2", "pp=2,pp_embedding=1,pp_loss=1"])
def test_gradients_equal_unpipelined_reference(reference_grads, text):
    got = _grads(text, WORLD)
    assert set(got) == set(reference_grads)
    tol = dict(rtol=1e-3, atol=1e-5) if GPU else dict(rtol=1e-4, atol=1e-6)
    for k, ref in reference_grads.items():
        assert torch.equal(got[k]["param"], ref["param"]), k  # identical init
        torch.testing.assert_close(got[k]["grad"], ref["grad"], msg=k, **tol)
    assert any(".local_experts." in k for k in got) and any("layers.3." in k for k in got)


# ---- failures -----------------------------------------------------------------------------------
@slow
@two_ranks
def test_megatron_rejection_is_stack_rejected():
    r = run("pp=2,pp_first=3,pp_last=3")  # 6 layers requested of a 4-layer model
    assert isinstance(r, Failure) and r.kind == "stack-rejected", r
    assert "layer" in r.message.lower()


@slow
def test_memory_cap_is_oom():
    # CPU: host RSS watched by the launcher; GPU: the device allocator capped by each rank
    r = run("", cap=0.05 if not GPU else 0.001)
    assert isinstance(r, Failure) and r.kind == "oom", r


@slow
def test_timeout_kills_everything():
    r = run("", timeout=2.0)  # no wall-clock bound here: the kind says the backend's timeout fired
    assert isinstance(r, Failure) and r.kind == "timeout", r


# ---- CLI --------------------------------------------------------------------------------------
def _cli(*args):
    from tuner.cli import main
    where = (["--cluster", "h200-sxm", "--gpus", str(WORLD), "--stack", "installed"] if GPU
             else ["--cluster", "cpu-local", "--gpus", "2"])
    return main(["trial", "--model", "tiny-moe", *where, "--gbs", str(GBS), "--seq", str(SEQ), *args])


def test_cli_bad_input_exit_2(capsys):
    assert _cli("--plan", "bogus=1") == 2
    assert _cli("--plan", "ep=2", "--iters", "0") == 2


@cpu_only
def test_cli_unrealizable_on_cpu_exit_2(capsys):
    assert _cli("--plan", "ep=2,grouped_gemm=1") == 2
    assert "not realizable" in capsys.readouterr().err


@slow
def test_cli_measurement_json(capsys):
    import json
    ep = f"ep={WORLD}"
    assert _cli("--plan", ep, "--iters", "2", "--warmup", "1", "--json") == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] and d["plan"].startswith(f"tp=1,cp=1,pp=1,vpp=1,{ep}") and d["tokens_per_s_per_gpu"] > 0
    if not GPU:  # cpu-local defaults
        assert "dist_opt=0" in d["plan"] and "grouped_gemm=0" in d["plan"]


@slow
def test_trace_step_writes_per_rank_op_tables(tmp_path):
    """MOETUNE_TRIAL_TRACE: one extra, untimed step under torch.profiler, per rank an op table
    (sorted by self time) and a Chrome trace; the timed steps are unchanged in number."""
    world = 2
    r = launch(plan("ep=2").canonical(), MODEL.to_dict(), GBS, SEQ, world, timeout_s=180, iters=2, warmup=1,
               env={"MOETUNE_TRIAL_TRACE": str(tmp_path)})
    assert r["ok"], r
    assert all(len(rk["step_times_s"]) == 2 for rk in r["ranks"])
    for rank in range(world):
        table = (tmp_path / f"trace_rank{rank}.txt").read_text()
        assert "Self CPU" in table and "aten::mm" in table
        assert (tmp_path / f"trace_rank{rank}.json").stat().st_size > 0


def test_cpu_allocator_env_keeps_user_tunables(monkeypatch):
    from trials.megatron.backend import CPU_ALLOCATOR_TUNABLES, cpu_allocator_env
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert cpu_allocator_env() == {"GLIBC_TUNABLES": CPU_ALLOCATOR_TUNABLES}
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
    assert cpu_allocator_env()["GLIBC_TUNABLES"] == "glibc.pthread.rseq=0:" + CPU_ALLOCATOR_TUNABLES
