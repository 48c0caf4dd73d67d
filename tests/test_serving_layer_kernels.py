"""The kernels one decoder layer launches in an SGLang 0.5.23 decode step
(cost_model/serving/layer_kernels.py): the counts read from SGLang's source per architecture, GPU
family and kernel path, and what they do to a small-batch decode step (floor-bound: kernels x the
kernel minimum)."""
import numpy as np
import pytest

from clusters import load_cluster
from cost_model.serving.constants import KERNEL_MIN_S, KERNELS_PER_LAYER
from cost_model.serving.layer_kernels import GenericLayer
from cost_model.serving.plans import effective_plans, to_cols
from cost_model.serving.step import StepModel
from cost_model.tables import load_tables, tables_dir_for
from specs.models import load_model
from specs.serve_plan import ServePlan

B200 = load_cluster("b200", 8)
H200 = load_cluster("h200-sxm", 8)


def _sm(model, cluster, plan, precision):
    m = load_model(model)
    c = to_cols(effective_plans([ServePlan.parse(plan)], m, cluster))
    return StepModel.for_precision(m, cluster, load_tables(tables_dir_for(cluster.kind)), c, precision)


def _per_moe_layer(sm):
    priced, small = sm.kernels.per_step(1.0, 1.0, 0.0)
    return float(priced[0] + small[0])


@pytest.mark.parametrize("model, cluster, precision, kernels", [
    # all-reduce + norm fused x2, qkv, q/k norm, rope + KV store, trtllm_mha, o_proj, router GEMM,
    # trtllm-gen routing, FC1 (SwiGLU fused), FC2, finalize
    ("qwen3-235b-a22b", B200, "bf16", 12),
    # FA3 (+ its combine), Triton fused_moe: top-k, align, FC1, silu_and_mul, FC2, moe_sum_reduce
    ("qwen3-235b-a22b", H200, "bf16", 15),
    # fp8 block checkpoint on Hopper: one activation quantization before each fp8 GEMM (qkv, o, FC1, FC2)
    ("qwen3-235b-a22b", H200, "fp8", 19),
    # addmm's bias copies (qkv; o_proj on rank 0), rope, KV store apart (hybrid SWA pool), MXFP8
    # quantization of the experts' input, routing, FC1, FC2, finalize
    ("gpt-oss-120b", B200, "mxfp4", 15),
])
def test_gqa_layers_launch_sglangs_own_kernels(model, cluster, precision, kernels):
    sm = _sm(model, cluster, "tp=8", precision)
    assert sm.c.ar_fusion[0]
    assert _per_moe_layer(sm) == kernels


def test_mla_keeps_the_generic_layer():
    """MLA (DeepSeek-V3) keeps constants.KERNELS_PER_LAYER (module doc: SGLang 0.5.23's own 23-30 at
    the kernel minimum overshoot every public H200 DeepSeek TPOT)."""
    sm = _sm("deepseek-r1", H200, "tp=8", "fp8")
    assert isinstance(sm.kernels, GenericLayer)
    assert KERNELS_PER_LAYER == 22


def test_no_floor_for_a_shared_expert_the_model_lacks():
    """A MoE layer without a shared expert prices no shared-expert GEMMs: the generic layer charged
    two kernel minimums for them in every layer of Qwen3 (0.94 ms of a 94-layer batch-1 step)."""
    sm = _sm("qwen3-235b-a22b", B200, "tp=8", "bf16")
    _t, parts = sm.decode(1, 1100.0)
    assert float(np.ravel(parts["dense_shared"])[0]) < 1e-5
    # and a batch-1 step is its kernels' floors plus little else: between the floors and twice them
    t, _ = sm.decode(1, 1100.0)
    priced, small = sm.kernels.per_step(sm.layers, sm.L_moe, sm.L_dense)
    floors = float((priced + small)[0]) * KERNEL_MIN_S
    assert floors <= float(t[0]) < 2 * floors
    # far fewer than the generic layer's: a GQA batch-1 step is a third shorter
    gen = float(sm.layers[0]) * (KERNELS_PER_LAYER - 2) * KERNEL_MIN_S
    assert float(t[0]) < gen


@pytest.mark.parametrize("cluster, moe_layer, dense_layer", [(B200, 23, 19), (H200, 30, 21)])
def test_mla_source_count_is_kept_beside_the_generic_layer(cluster, moe_layer, dense_layer):
    """SGLang 0.5.23's own MLA list (the count the module doc sets against the public rows):
    DeepSeek-V3 fp8 TP8 on the main stream, a MoE layer 23 kernels on B200 (trtllm_mla; trtllm-gen
    routing in two kernels, the activation apart; the shared expert on the alternate stream) and 30
    on H200 (FA3's prepare and combine; the fused shared expert's pads and cat after top-k), a dense
    layer 19 / 21."""
    k = _sm("deepseek-r1", cluster, "tp=8", "fp8").sglang_kernels()
    moe = k.per_step(1.0, 1.0, 0.0)
    dense = k.per_step(1.0, 0.0, 1.0)
    assert float(moe[0][0] + moe[1][0]) == moe_layer
    assert float(dense[0][0] + dense[1][0]) == dense_layer
