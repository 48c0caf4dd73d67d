"""Triton kernels of kernels/ against a torch reference, in the Triton CPU interpreter.

fp32 and fp16 only: the interpreter's bf16 `tl.dot` is wrong, so bf16 is left to the GPU sweep
(bench/kernels_gpu_sweep.py). Shapes are tiny: the interpreter runs programs one by one.
"""
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels import tables  # noqa: E402
from kernels.fused_moe import align_by_expert, fused_moe, torch_reference  # noqa: E402
from kernels.weave_kernel import plan_chunks, weave_moe  # noqa: E402

TOL = {torch.float32: 1e-4, torch.float16: 2e-2}
_JIT_MODULES = ("kernels._fused_moe_triton", "kernels._weave_triton")


@pytest.fixture(autouse=True, scope="module")
def _triton_interpreter_without_a_gpu():
    """Without a GPU the kernels run in Triton's interpreter, which Triton picks when a kernel is
    decorated: set TRITON_INTERPRET for this module's tests only, (re)importing the jit modules
    under it, and leave neither the variable nor interpreted kernels behind."""
    if torch.cuda.is_available():
        yield
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    for m in _JIT_MODULES:
        sys.modules.pop(m, None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old
        for m in _JIT_MODULES:
            sys.modules.pop(m, None)
SMALL = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 2, "num_warps": 4, "num_stages": 2}


def _inputs(tokens, hidden, inter, experts, topk, dtype, seed=0):
    """Uneven routing with empty experts: the last two experts are never chosen, expert 0 is hot."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, hidden, generator=g) * 0.5).to(dtype)
    w1 = (torch.randn(experts, hidden, 2 * inter, generator=g) * 0.2).to(dtype)
    w2 = (torch.randn(experts, inter, hidden, generator=g) * 0.2).to(dtype)
    live = max(topk, experts - 2)
    probs = torch.ones(live)
    probs[0] = 4.0
    ids = torch.stack([torch.multinomial(probs, topk, replacement=False, generator=g) for _ in range(tokens)])
    w = torch.softmax(torch.randn(tokens, topk, generator=g), dim=-1)
    return x, w1, w2, w, ids


def _close(out, ref, dtype):
    assert out.dtype == dtype and out.shape == ref.shape
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= TOL[dtype] * max(1.0, ref.float().abs().max().item()), err


def test_align_by_expert_pads_each_expert_to_block_m():
    ids = torch.tensor([[0, 2], [2, 0], [2, 3]])
    sp, be = align_by_expert(ids, 5, 4)
    assert be.tolist() == [0, 2, 3]  # experts 1 and 4 are empty: no block
    assert sorted(p for p in sp.tolist() if p >= 0) == list(range(6))
    for b, e in enumerate(be.tolist()):
        assert all(ids.reshape(-1)[p].item() == e for p in sp[b * 4:(b + 1) * 4].tolist() if p >= 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("topk", [1, 2, 8])
def test_fused_moe_matches_torch(dtype, topk):
    experts = 10 if topk == 8 else 6
    x, w1, w2, w, ids = _inputs(12, 32, 16, experts, topk, dtype, seed=topk)
    _close(fused_moe(x, w1, w2, w, ids, config=SMALL), torch_reference(x, w1, w2, w, ids), dtype)


def test_block_config_comes_from_the_table_at_the_nearest_m():
    table = {"1": dict(SMALL, BLOCK_SIZE_N=32), "64": SMALL}
    assert tables.block_config_for(table, 40, 8, 2)["BLOCK_SIZE_N"] == 16
    assert tables.block_config_for(table, 20, 8, 2)["BLOCK_SIZE_N"] == 32
    x, w1, w2, w, ids = _inputs(20, 32, 16, 6, 2, torch.float32)
    _close(fused_moe(x, w1, w2, w, ids, block_table=table), torch_reference(x, w1, w2, w, ids), torch.float32)


def test_plan_chunks_covers_every_pair_once():
    ids = torch.tensor([[0, 1], [1, 2], [0, 2], [3, 1], [2, 0]])
    p = plan_chunks(ids, 4, 2, 16)
    sp, ps = p["slot_pair"], p["pair_slot"]
    assert sorted(v for v in sp.tolist() if v >= 0) == list(range(10))
    assert all(sp[ps[i]].item() == i for i in range(10))
    assert p["chunk_tokens"].tolist() == [0, 2, 5]
    assert p["chunk_blocks"][-1].item() == p["block_expert"].numel()


@pytest.mark.parametrize("dtype,topk,chunks,comm,n_steal", [
    (torch.float32, 1, 1, 1, 0),
    (torch.float32, 2, 3, 2, 1),
    (torch.float32, 8, 2, 1, 2),
    (torch.float16, 1, 2, 2, 0),
    (torch.float16, 2, 1, 1, 3),
    (torch.float16, 8, 3, 2, 1),
])
def test_weave_kernel_matches_torch(dtype, topk, chunks, comm, n_steal):
    experts = 10 if topk == 8 else 6
    x, w1, w2, w, ids = _inputs(9, 32, 16, experts, topk, dtype, seed=10 + topk)
    out = weave_moe(x, w1, w2, w, ids, num_programs=4, comm_programs=comm, chunks=chunks, n_steal=n_steal,
                    block_m=16, block_n=16, block_k=16, block_h=32)
    _close(out, torch_reference(x, w1, w2, w, ids), dtype)


def test_weave_kernel_rejects_a_bad_partition():
    from specs.errors import InputError
    x, w1, w2, w, ids = _inputs(4, 32, 16, 4, 1, torch.float32)
    with pytest.raises(InputError):
        weave_moe(x, w1, w2, w, ids, num_programs=4, comm_programs=4, chunks=1)


def test_kernels_compile_for_sm90_without_a_gpu():
    """What the interpreter cannot check: the compiler accepts the kernels for Hopper (cubin)."""
    import json
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "kernels.aot", "90"], capture_output=True, text=True, env=env,
                       cwd=root, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    shared = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(shared) == {"weave_stage", "gemm0_act", "gemm1_weighted"}
    assert all(0 < v <= 227 * 1024 for v in shared.values())  # H100: 227 KiB shared memory per block
