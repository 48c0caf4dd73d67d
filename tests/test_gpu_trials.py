"""The GPU trial path (issue 15): each finding of the GPU-path review has a test here.

CPU-runnable parts (decisions as pure functions, name patterns, error classification, refusals
before launch) run everywhere. The GPU parts run real one-rank NCCL trials and skip without CUDA."""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from specs.cpu_support import cpu_rejections  # noqa: E402
from specs.models import load_model  # noqa: E402
from specs.plan import Plan, parse_fields  # noqa: E402
from specs.stack import Installed, cpu_defaults, detect_installed  # noqa: E402
from trials.base import Failure, Measurement, Resources  # noqa: E402
from trials.megatron.backend import MegatronBackend  # noqa: E402
from trials.megatron.cpu_compat import shims_needed  # noqa: E402
from trials.megatron.model import expert_views, globalize, init_values  # noqa: E402
from trials.megatron.spec_choice import layer_spec_choice, ranks_fit  # noqa: E402
from trials.megatron.worker import _forward_step, _loss_func, classify_error  # noqa: E402
from trials.processes import RankGroup  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODEL = load_model("tiny-moe")
GPU = torch.cuda.is_available()
gpu_only = pytest.mark.skipif(not GPU, reason="needs a CUDA device (real NCCL trial)")

TE29 = Installed(megatron_core="0.16.1", transformer_engine="2.9.0", deepep=True, hybridep=True,
                 cuda=True, devices=8)
PLAIN = Installed(megatron_core="0.16.1", cuda=True, devices=8)
CPU = Installed(megatron_core="0.16.1")


class _Cluster:
    is_gpu = GPU
    nvlink_gbps = 900.0
    mxfp8 = False


class _Workload:
    def __init__(self, world, model=MODEL, gbs=8, seq=64):
        self.model, self.gbs, self.seq, self.world, self.cluster = model, gbs, seq, world, _Cluster()


def _codes(choice):
    return {c for c, _ in choice.refusals}


# ---- 1. te_general_gemm shim whenever TE is missing ----------------------------------------------
def test_shim_decision_is_a_function_of_te_and_gpu():
    assert shims_needed(te_present=False, gpu_present=True) == {"te_general_gemm"}  # the GPU blocker
    assert shims_needed(te_present=False, gpu_present=False) == {"te_general_gemm", "cpu"}
    assert shims_needed(te_present=True, gpu_present=True) == set()
    assert shims_needed(te_present=True, gpu_present=False) == {"cpu"}


def test_te_shim_alone_fixes_the_router_without_cpu_patches():
    """Without TE, megatron's router gating raises NameError; the TE shim alone (no CPU patches,
    as on a GPU without TE) makes it take its torch.mm path."""
    code = textwrap.dedent("""
        import torch
        from megatron.core.transformer.moe import moe_utils
        if moe_utils.HAVE_TE:
            print("HAVE_TE"); raise SystemExit
        x, w = torch.randn(3, 4), torch.randn(5, 4)
        try:
            moe_utils.RouterGatingLinearFunction.apply(x, w, None, torch.float32)
            print("no-error")
        except NameError as e:
            before = str(e)
        from trials.megatron import cpu_compat
        assert cpu_compat.apply_te_shim()
        out = moe_utils.RouterGatingLinearFunction.apply(x, w, None, torch.float32)
        assert torch.allclose(out, x @ w.t())
        print("ok " + before)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(REPO),
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:]
    if last == "HAVE_TE":
        pytest.skip("TransformerEngine installed: megatron defines te_general_gemm itself")
    assert last.startswith("ok ") and "te_general_gemm" in last, last


# ---- 2. the trial builds the emitted spec, refuses what the stack cannot build --------------------
def test_layer_spec_choice_with_te():
    c = layer_spec_choice(Plan(ep=8, grouped_gemm=True, precision="fp8-delayed"), TE29, MODEL)
    assert c.use_te and c.experts == "TEGroupedMLP" and (c.fp8_format, c.fp8_recipe) == ("hybrid", "delayed")
    assert c.realizable
    c = layer_spec_choice(Plan(tp=2, cp=2, ep=4, grouped_gemm=False, precision="fp8-blockwise"), TE29, MODEL)
    assert c.use_te and c.experts == "SequentialMLP" and c.fp8_format == "e4m3" and c.realizable
    old = Installed(megatron_core="0.16.1", transformer_engine="2.2.0", cuda=True, devices=8)
    assert "fp8" in _codes(layer_spec_choice(Plan(precision="fp8-blockwise"), old, MODEL))


def test_layer_spec_choice_without_te_refuses_what_would_run_differently():
    c = layer_spec_choice(Plan(precision="fp8-delayed", grouped_gemm=False), PLAIN, MODEL)
    assert not c.use_te and "fp8" in _codes(c) and "TransformerEngine" in c.reason()
    assert "grouped_gemm" in _codes(layer_spec_choice(Plan(grouped_gemm=True), PLAIN, MODEL))
    with_gg = Installed(megatron_core="0.16.1", grouped_gemm=True, cuda=True, devices=8)
    c = layer_spec_choice(Plan(grouped_gemm=True, permute_fusion=False, router_fusion=False), with_gg, MODEL)
    assert c.experts == "GroupedMLP" and c.realizable  # what `--transformer-impl local` builds too
    assert "tp_sequence_parallel" in _codes(layer_spec_choice(Plan(tp=2, grouped_gemm=False), PLAIN, MODEL))
    assert "context_parallel" in _codes(layer_spec_choice(Plan(cp=2, grouped_gemm=False), PLAIN, MODEL))
    flex = Plan(ep=8, grouped_gemm=False, dispatcher="flex", flex_backend="hybridep")
    assert "flex_dispatcher" in _codes(layer_spec_choice(flex, PLAIN, MODEL))
    assert layer_spec_choice(flex, TE29, MODEL).realizable
    assert layer_spec_choice(Plan(grouped_gemm=False, permute_fusion=False, router_fusion=False), PLAIN,
                             MODEL).realizable  # plain bf16 runs
    # TE's fused permutation needs TE >= 2.1 (TransformerConfig's own check)
    assert "permute_fusion" in _codes(layer_spec_choice(Plan(grouped_gemm=False), PLAIN, MODEL))
    # TE installed but no GPU: TE kernels cannot run, so the local spec (and the CPU table)
    te_cpu = Installed(megatron_core="0.16.1", transformer_engine="2.9.0")
    assert not layer_spec_choice(Plan(), te_cpu, MODEL).use_te


def test_layer_spec_choice_on_cpu_is_the_cpu_table():
    for text in ("", "tp=2,cp=2,dispatcher=flex,precision=fp8-delayed", "ep=2,grouped_gemm=1"):
        p = Plan(**cpu_defaults(parse_fields(text)))
        assert list(layer_spec_choice(p, CPU, MODEL).refusals) == cpu_rejections(p, MODEL)


def test_dense_model_has_no_experts_and_no_grouped_gemm_refusal():
    class _Dense:  # layer_spec_choice reads only is_moe
        is_moe = False
    c = layer_spec_choice(Plan(grouped_gemm=True), PLAIN, _Dense())
    assert c.experts == "" and c.realizable


def test_fp8_plan_on_this_cpu_stack_is_unrealizable_never_measured(tmp_path):
    if GPU and detect_installed().transformer_engine:
        pytest.skip("TransformerEngine on a GPU: fp8 is buildable here")
    r = MegatronBackend().run(Plan(**cpu_defaults(parse_fields("precision=fp8-delayed"))), _Workload(2),
                              Resources(2, 60))
    assert isinstance(r, Failure) and r.kind == "unrealizable" and "fp8" in r.message, r


def test_backend_refuses_against_an_injected_gpu_stack():
    """The backend checks against the installed stack (here a GPU without TE) before launching."""
    b = MegatronBackend(installed=PLAIN)
    r = b.run(Plan(precision="fp8-delayed", grouped_gemm=False), _Workload(1), Resources(1, 60))
    assert isinstance(r, Failure) and r.kind == "unrealizable" and "TransformerEngine" in r.message
    r = b.run(Plan(tp=2, grouped_gemm=False), _Workload(2), Resources(2, 60))
    assert r.kind == "unrealizable" and "sequence parallel" in r.message
    one = MegatronBackend(installed=Installed(megatron_core="0.16.1", cuda=True, devices=1))
    r = one.run(Plan(ep=2, grouped_gemm=False, permute_fusion=False, router_fusion=False), _Workload(2), Resources(2, 60))
    assert r.kind == "unrealizable" and "2 ranks need 2 GPUs, 1 visible" in r.message


def test_ranks_fit():
    assert ranks_fit(8, TE29) == "" and ranks_fit(9, TE29) != "" and ranks_fit(64, CPU) == ""


# ---- 3. grouped expert weights get per-expert, per-EP-rank init ----------------------------------
E, H, FFN = 4, 8, 6


def test_legacy_grouped_mlp_weights_map_to_per_expert_names():
    w1 = torch.zeros(H, E * 2 * FFN)  # GroupedMLP.weight1 (gated: [gate; up] per expert)
    w2 = torch.zeros(E * FFN, H)
    v1 = expert_views("decoder.layers.1.mlp.experts.weight1", w1, E, H)
    v2 = expert_views("decoder.layers.1.mlp.experts.weight2", w2, E, H)
    assert [n for n, _ in v1] == [f"decoder.layers.1.mlp.experts.local_experts.{e}.linear_fc1.weight" for e in range(E)]
    assert [n for n, _ in v2] == [f"decoder.layers.1.mlp.experts.local_experts.{e}.linear_fc2.weight" for e in range(E)]
    assert all(v.shape == (2 * FFN, H) for _, v in v1) and all(v.shape == (H, FFN) for _, v in v2)
    # views alias the parameter, and expert e's view is what GroupedMLP's forward multiplies by
    for name, v in v1:
        v.copy_(init_values(name, v.shape, 1234, gated_linear_unit=True))
    x = torch.randn(3, H)
    for e, (name, _) in enumerate(v1):
        ref = init_values(name, (2 * FFN, H), 1234, gated_linear_unit=True)  # SequentialMLP's fc1 weight
        torch.testing.assert_close(x @ w1.view(E, H, -1)[e], x @ ref.t())
    assert len({tuple(w1.view(E, H, -1)[e].flatten()[:4].tolist()) for e in range(E)}) == E  # experts differ


def test_te_grouped_weights_map_to_per_expert_names():
    w = torch.zeros(2 * FFN, H)
    [(n, v)] = expert_views("decoder.layers.0.mlp.experts.linear_fc1.weight3", w, E, H)
    assert n == "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight" and v is w
    assert expert_views("decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight", w, E, H)[0][1] is w
    assert expert_views("decoder.layers.0.self_attention.linear_qkv.weight", w, E, H) == [
        ("decoder.layers.0.self_attention.linear_qkv.weight", w)]


def test_ep_ranks_get_distinct_global_experts():
    local = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"
    g0, g1 = globalize(local, [3], 0, E), globalize(local, [3], 1, E)
    assert g0 == "decoder.layers.2.mlp.experts.local_experts.1.linear_fc1.weight"
    assert g1 == f"decoder.layers.2.mlp.experts.local_experts.{E + 1}.linear_fc1.weight"
    assert not torch.equal(init_values(g0, (4, 4), 1), init_values(g1, (4, 4), 1))


def test_grouped_layouts_match_the_installed_megatron_source():
    """The layouts expert_views assumes, read from the installed megatron-core."""
    from megatron.core.transformer.moe import experts
    src = inspect.getsource(experts.GroupedMLP)
    assert "self.weight1.view(self.num_local_experts, self.config.hidden_size, -1)" in src
    assert "self.weight2.view(self.num_local_experts, -1, self.config.hidden_size)" in src
    te_src = Path(inspect.getfile(experts)).parents[2] / "extensions" / "transformer_engine.py"
    assert 'full_state_dict[f"weight{gemm_idx}"]' in te_src.read_text()


# ---- 4. a2a_overlap: forward_step takes return_schedule_plan -------------------------------------
def test_forward_step_accepts_return_schedule_plan_as_megatron_calls_it():
    from megatron.core.pipeline_parallel import combined_1f1b
    src = inspect.getsource(combined_1f1b)
    call = re.search(r"forward_step_func\(\s*data_iterator,\s*unwrapped_model,\s*return_schedule_plan=True\s*\)", src)
    assert call, "megatron-core's combined 1F1B call changed"
    inspect.signature(_forward_step).bind(iter([]), object(), return_schedule_plan=True)

    class _Model:  # records which entry point the step used
        def build_schedule_plan(self, tokens, position_ids, attention_mask, labels=None):
            return ("schedule-plan", tokens, labels)

        def __call__(self, tokens, position_ids, attention_mask, labels=None):
            return ("output", tokens, labels)

    batch = {"tokens": torch.ones(1, 4), "labels": torch.zeros(1, 4), "position_ids": torch.arange(4)[None]}
    plan, lf = _forward_step(iter([batch]), _Model(), return_schedule_plan=True)
    assert plan[0] == "schedule-plan" and lf is _loss_func
    out, _ = _forward_step(iter([batch]), _Model())
    assert out[0] == "output"


# ---- 5. failure classes -------------------------------------------------------------------------
def _megatron_validation_error():
    from megatron.core.transformer.transformer_config import TransformerConfig
    try:
        # 3 + 3 layers asked of a 4-layer model over 2 stages (the slow test's stack-rejected case)
        TransformerConfig(num_layers=4, hidden_size=8, num_attention_heads=2, pipeline_model_parallel_size=2,
                          num_layers_in_first_pipeline_stage=3, num_layers_in_last_pipeline_stage=3,
                          pipeline_dtype=torch.float32)
    except (AssertionError, ValueError) as e:
        return e
    raise AssertionError("megatron accepted an invalid config")


def test_only_megatron_validation_during_setup_is_stack_rejected():
    e = _megatron_validation_error()
    assert classify_error(e, "setup")[0] == "stack-rejected"
    assert classify_error(e, "train")[0] == "crash"  # a megatron assert while training: not a refusal
    try:
        raise ValueError("our own bug")
    except ValueError as ours:
        assert classify_error(ours, "setup") == ("crash", "ValueError: our own bug")
    try:
        import moetune_no_such_library  # noqa: F401
    except ImportError as missing:
        kind, msg = classify_error(missing, "setup")
        assert kind == "crash" and "moetune_no_such_library" in msg
    from megatron.core.transformer.transformer_config import TransformerConfig
    try:
        TransformerConfig(num_layers=2, hidden_size=8, num_attention_heads=2, no_such_field=1)
    except TypeError as te:
        assert classify_error(te, "setup")[0] == "crash"
    from trials.megatron.worker import Unrealizable
    assert classify_error(Unrealizable("gbs"), "setup") == ("unrealizable", "gbs")
    assert classify_error(torch.cuda.OutOfMemoryError("CUDA out of memory"), "train")[0] == "oom"


# ---- 6. launch environment reaches the ranks ------------------------------------------------------
def test_rank_group_passes_the_launch_environment(tmp_path, monkeypatch):
    (tmp_path / "moetune_envdump.py").write_text(textwrap.dedent("""
        import json, os, sys
        keys = ("CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_NCCL_AVOID_RECORD_STREAMS", "RANK", "WORLD_SIZE")
        out = os.path.join(os.path.dirname(sys.argv[1]), "env%s.json" % os.environ["RANK"])
        json.dump({k: os.environ.get(k) for k in keys}, open(out, "w"))
    """))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    spec = tmp_path / "spec.json"
    spec.write_text("{}")
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}
    with RankGroup("moetune_envdump", spec, 2, tmp_path, env=env) as g:
        for p in g.procs:
            p.wait(timeout=60)
    for r in range(2):
        d = json.loads((tmp_path / f"env{r}.json").read_text())
        assert d == {**env, "RANK": str(r), "WORLD_SIZE": "2"}


# ---- GPU: real one-rank NCCL trials ---------------------------------------------------------------
def _gpu_run(text, world=1, cap=None, backend=None):
    r = (backend or MegatronBackend()).run(Plan(**{**cpu_defaults({}), **parse_fields(text)}) if text is not None
                                           else Plan(), _Workload(world), Resources(world, 300, cap),
                                           iters=3, warmup=1)
    return r


@gpu_only
def test_gpu_trial_measures_on_the_device():
    r = _gpu_run("")
    assert isinstance(r, Measurement), r
    v = r.versions
    assert v["device"] != "cpu" and not v["cpu_patched"]
    assert v["transformer_impl"] == ("transformer_engine" if detect_installed().transformer_engine else "local")
    assert v["env"].get("TORCH_NCCL_AVOID_RECORD_STREAMS") == "1"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in v["env"]  # tp=cp=1, as the emitted script
    assert v.get("cpu_affinity", 2) > 1 or os.cpu_count() == 1  # rank not pinned to one core
    assert "peak reserved" in v["memory"] and 0 < r.peak_memory_gib[0] < 140
    assert len(r.losses) == 4 and all(x == x for x in r.losses)


@gpu_only
def test_gpu_megatron_optimizer_and_dist_opt():
    r = _gpu_run("dist_opt=1,overlap_grad_reduce=1,overlap_param_gather=1")
    assert isinstance(r, Measurement), r


@gpu_only
def test_gpu_memory_cap_is_oom_on_the_device():
    r = _gpu_run("", cap=0.001)
    assert isinstance(r, Failure) and r.kind == "oom", r


@gpu_only
def test_gpu_ranks_beyond_visible_devices_are_unrealizable():
    n = torch.cuda.device_count()
    r = _gpu_run("", world=n + 1)
    assert isinstance(r, Failure) and r.kind == "unrealizable" and "visible" in r.message


@gpu_only
def test_gpu_stack_refusals_match_what_is_installed():
    inst = detect_installed()
    r = _gpu_run(None)  # GPU defaults: grouped GEMM, dist_opt, overlaps
    if inst.transformer_engine or inst.grouped_gemm:
        assert isinstance(r, Measurement), r
        assert r.versions["experts"] == ("TEGroupedMLP" if inst.transformer_engine else "GroupedMLP")
    else:
        assert isinstance(r, Failure) and r.kind == "unrealizable" and "grouped_gemm" in r.message
    f = _gpu_run("precision=fp8-delayed")
    if not inst.transformer_engine:
        assert isinstance(f, Failure) and f.kind == "unrealizable", f
    elif torch.cuda.get_device_capability() >= (8, 9):
        assert isinstance(f, Measurement) and f.versions["fp8_recipe"] == "delayed", f


# ---- 6. the timed region holds only the steps -----------------------------------------------------
@pytest.mark.slow
def test_batches_are_built_before_the_timed_loop(tmp_path):
    """A real one-rank trial worker (gloo on CPU, NCCL on GPU) whose batch building and steps
    are recorded: every batch exists (on the device) before the first timed step starts."""
    from specs.fileio import write_atomic
    from trials.processes import free_port
    spec = {"plan": Plan(**cpu_defaults({})).canonical(), "model": MODEL.to_dict(), "gbs": 4, "seq": 32,
            "iters": 2, "warmup": 1, "out_dir": str(tmp_path), "mode": "train", "pg_timeout_s": 60}
    write_atomic(tmp_path / "spec.json", json.dumps(spec))
    code = textwrap.dedent("""
        import json, sys
        from trials.megatron.worker import TrialWorker
        events = []
        class Recording(TrialWorker):
            def batches(self, it):
                out = super().batches(it)
                events.append(("batch", it, str(out[0]["tokens"].device)))
                return out
            def step(self, mbs_list):
                events.append(("step", None, str(mbs_list[0]["tokens"].device)))
                return super().step(mbs_list)
        w = TrialWorker.__new__(Recording)
        TrialWorker.__init__(w, json.load(open(sys.argv[1])), 0, 1)
        w.setup()
        res = w.measure()
        print(json.dumps({"events": events, "device": str(w.device), "n_times": len(res["step_times_s"])}))
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "spec.json")], capture_output=True, text=True,
                       timeout=300, cwd=str(REPO), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    kinds = [e[0] for e in out["events"]]
    # warmup 1 + 2 timed steps + the two untimed steps that record the step by calibration class
    # (issue 27: one under module hooks, one under the profiler): every step after every batch was built
    assert kinds == ["batch"] * 3 + ["step"] * 5, kinds
    assert all(e[2] == out["device"] for e in out["events"])  # already on the device when stepped
    assert out["n_times"] == 2
