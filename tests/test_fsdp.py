"""Megatron FSDP as a plan field (`fsdp`: --use-megatron-fsdp, optim_grads_params): the rule it
needs, what the cost model charges for it (everything sharded, one layer's gathered working copy;
two all-gathers and a reduce-scatter every microbatch), the emitted flags and launch environment,
the trial backends' refusal, and completion taking it only when nothing fits without it."""
import pytest

from clusters import load_cluster
from cost_model import predict
from cost_model.calibration import IDENTITY
from cost_model.flops import param_counts
from specs.cpu_support import cpu_rejections
from specs.models import load_model
from specs.plan import Plan
from specs.stack import GPU_FULL
from specs.workload import Workload
from tuner.emit.megatron import megatron_script, plan_args
from tuner.rank.complete import best_completion
from tuner.space.megatron_rules import check


def _w(model="qwen3-30b-a3b", kind="h100-sxm", gpus=16, gbs=256, seq=4096):
    return Workload(load_model(model), load_cluster(kind, gpus), gbs, seq)


def test_fsdp_needs_the_distributed_optimizer():
    w = _w()
    assert not check(w, Plan(ep=8, fsdp=True), GPU_FULL)
    assert "fsdp" in {r.code for r in check(w, Plan(ep=8, fsdp=True, dist_opt=False, overlap_param_gather=False),
                                            GPU_FULL)}


def test_fsdp_shards_weights_and_gradients_and_keeps_one_layer_gathered():
    """Dense weights and main gradients go from replicated to 1/(DP x CP); experts to 1/EDP. The
    distributed optimizer already sharded Adam. A layer's gathered copy (two: computing and
    prefetched) and its unsharded gradients stay."""
    w = _w(gpus=16)
    base = Plan(ep=8, mbs=1, grad_reduce_bf16=True)
    a, b = (predict(w, base.replace(fsdp=f), calibration=IDENTITY) for f in (False, True))
    pc = param_counts(w.model)
    dense, experts = pc["total"] - pc["routed_experts"], pc["routed_experts"] / 8
    dp, edp = 16, 2
    saved = 4.0 * (dense * (1 - 1 / dp) + experts * (1 - 1 / edp))  # bf16 weight 2 + bf16 grad 2
    layer = (dense + experts) / w.model.num_layers
    working = layer * (2 * 2.0 + 2.0)
    assert a.peak_memory_gib - b.peak_memory_gib == pytest.approx((saved - working) / 2**30, rel=0.05)


def test_fsdp_moves_its_collectives_every_microbatch():
    """Twice the microbatches (gbs), twice the FSDP gathers and reduce-scatters; DDP's stay once per
    step."""
    runs = {}
    for gbs in (256, 512):
        w = _w(gpus=16, gbs=gbs)
        for f in (False, True):
            p = predict(w, Plan(ep=8, mbs=1, grad_reduce_bf16=True, fsdp=f), calibration=IDENTITY)
            runs[gbs, f] = p.breakdown_s["dp_param_all_gather"] + p.breakdown_s["dp_grad_reduce_scatter"] \
                + p.breakdown_s["dp_overlap_sm_share"]
    assert runs[512, True] > 1.8 * runs[256, True]
    assert runs[512, False] == pytest.approx(runs[256, False], rel=0.05)
    assert runs[256, True] > runs[256, False]


def test_fsdp_is_emitted_with_the_flags_megatron_asserts():
    w = _w()
    p = Plan(ep=8, fsdp=True, grad_reduce_bf16=True)
    args = plan_args(w, p, GPU_FULL)
    i = args.index("--use-megatron-fsdp")
    assert args[i + 1:i + 5] == ["--data-parallel-sharding-strategy", "optim_grads_params", "--ckpt-format", "fsdp_dtensor"]
    assert "--use-distributed-optimizer" in args
    assert "CUDA_DEVICE_MAX_CONNECTIONS=8" in megatron_script(w, p, GPU_FULL)  # validate_args: != 1
    assert "--use-megatron-fsdp" not in plan_args(w, p.replace(fsdp=False), GPU_FULL)


def test_the_trial_backends_refuse_fsdp():
    from specs.stack import Installed
    from trials.megatron.spec_choice import layer_spec_choice
    assert "fsdp" in {c for c, _ in cpu_rejections(Plan(fsdp=True))}
    gpu = Installed(cuda=True, devices=8, megatron_core="0.16.1", transformer_engine="2.9.0", grouped_gemm=True,
                    deepep=True, hybridep=True)
    assert "fsdp" in {c for c, _ in layer_spec_choice(Plan(ep=8, fsdp=True), gpu).refusals}
    assert "fsdp" not in {c for c, _ in layer_spec_choice(Plan(ep=8), gpu).refusals}


def test_completion_takes_fsdp_only_when_nothing_fits_without_it():
    """Megatron-MoE-ModelZoo's Qwen3-235B intra-node EP layout (TP2 EP8, PP1, MBS4 on 256 H100, run
    with FSDP): every completion without sharding the weights is over memory; with FSDP one fits.
    A layout that fits without it never gets it."""
    w = _w("qwen3-235b-a22b", gpus=256, gbs=2048)
    c = best_completion("tp=2,pp=1,ep=8,mbs=4", w, GPU_FULL)
    assert c.plan is not None and c.plan.fsdp and "Megatron FSDP" in c.note
    assert predict(w, c.plan).feasible
    small = best_completion("tp=1,pp=1,ep=16,mbs=1", _w(gpus=16, gbs=1024), GPU_FULL)
    assert not small.plan.fsdp
    pinned = best_completion("tp=2,pp=1,ep=8,mbs=4,fsdp=0", w, GPU_FULL)
    assert pinned.plan is None or not pinned.plan.fsdp
