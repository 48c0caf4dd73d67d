"""Ahead-of-time compilation of the kernels/ Triton kernels for a CUDA architecture, without a GPU.

The CPU interpreter checks the numerics but not what the compiler accepts (loop forms, atomics,
shared-memory size); compiling to a cubin for sm_90 here catches those before a GPU run.

    python -m kernels.aot [arch]      # prints {kernel: shared-memory bytes}
"""
from __future__ import annotations

import json
import sys


def compile_all(arch: int = 90, hidden: int = 2048, inter: int = 1408, topk: int = 6) -> dict:
    """Compile the three kernels (bf16, the DeepSeek-V2-Lite expert shape by default) for `arch`.

    Returns {kernel name: shared memory bytes}. Raises whatever Triton raises on a compile error.
    Must run without TRITON_INTERPRET set.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels import _fused_moe_triton as F
    from kernels import _weave_triton as W
    tgt = GPUTarget("cuda", arch, 32)
    out = {}

    def build(fn, ptrs, ints, const, **opts):
        sig = dict(ptrs)
        sig.update({n: "i32" for n in ints})
        sig.update({k: "constexpr" for k in const})
        ck = triton.compile(ASTSource(fn, sig, constexprs=const), target=tgt, options=opts or None)
        out[fn.__name__] = int(ck.metadata.shared)

    bf = "*bf16"
    i32p = "*i32"
    build(W.weave_stage,
          {**{n: bf for n in ("x", "xs", "ys", "hs", "out", "w1", "w2")}, "weights": "*fp32",
           **{n: i32p for n in ("slot_pair", "pair_slot", "block_expert", "chunk_rows", "chunk_blocks",
                                "chunk_tokens", "counters")}},
          ("stage", "n_steal", "num_chunks", "comm_programs"),
          {"TOPK": topk, "H": hidden, "INTER": inter, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "BLOCK_H": 256})
    build(F.gemm0_act, {"x": bf, "w1": bf, "h": bf, "sorted_pairs": i32p, "block_expert": i32p}, ("num_m",),
          {"TOPK": topk, "H": hidden, "INTER": inter, "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
          num_warps=4, num_stages=3)
    build(F.gemm1_weighted, {"h": bf, "w2": bf, "out_pairs": bf, "weights": "*fp32", "sorted_pairs": i32p,
                             "block_expert": i32p}, ("num_m",),
          {"H": hidden, "INTER": inter, "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8},
          num_warps=4, num_stages=3)
    return out


if __name__ == "__main__":
    print(json.dumps(compile_all(int(sys.argv[1]) if len(sys.argv) > 1 else 90)))
