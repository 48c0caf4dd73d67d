"""A fused MoE expert kernel in Triton, in the style of SGLang/vLLM `fused_moe`:

    gather rows by expert -> gemm0 (H -> 2I, gate|up) -> SiLU(gate) * up -> gemm1 (I -> H)
    -> multiply by the routing weight -> scatter back per (token, choice) and sum over top-k

Token-expert pairs are sorted by expert and each expert's rows padded to a multiple of BLOCK_M
(`align_by_expert`); each row block belongs to one expert. Both GEMMs gather their A rows through
the sorted pair index, so no permuted copy of the activations is made. The block configuration
(BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages) comes from an SGLang-format table keyed
by M (`kernels.tables.block_config_for`, nearest M). torch and triton are imported inside
functions; the Triton kernels are built on first use.

Weights: w1 [E, H, 2I] (gate columns 0..I-1, up columns I..2I-1), w2 [E, I, H].
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def align_by_expert(topk_ids, num_experts: int, block_m: int):
    """Sort the token-expert pairs by expert and pad each expert's rows to a multiple of block_m.

    Args:
        topk_ids: [T, k] int tensor of chosen experts.
        num_experts: number of experts E.
        block_m: rows per block.
    Returns:
        (sorted_pairs [S] int32: pair index t*k+j, or -1 on padding rows;
         block_expert [S / block_m] int32: the expert of each row block).
    Experts that receive no token get no block.
    """
    import torch
    flat = topk_ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    total = int(padded.sum())
    sorted_pairs = torch.full((total,), -1, dtype=torch.int32, device=topk_ids.device)
    starts = torch.cumsum(padded, 0) - padded
    src_starts = torch.cumsum(counts, 0) - counts
    block_expert = torch.repeat_interleave(torch.arange(num_experts, device=topk_ids.device, dtype=torch.int32),
                                           (padded // block_m))
    # position of each sorted pair inside its expert segment
    rank = torch.arange(flat.numel(), device=flat.device) - src_starts[flat[order]]
    sorted_pairs[(starts[flat[order]] + rank)] = order.to(torch.int32)
    return sorted_pairs, block_expert


def _kernels():
    # The @triton.jit functions live in their own module (imported here, on first use) because
    # Triton resolves helper jit functions through module globals, not closures.
    from kernels import _fused_moe_triton as k
    return k.gemm0_act, k.gemm1_weighted


def fused_moe(x, w1, w2, topk_weights, topk_ids, config: dict | None = None, block_table: dict | None = None):
    """Routed-expert output of one MoE layer.

    Args:
        x: [T, H] activations (fp32 / fp16 / bf16).
        w1: [E, H, 2I] gate|up weights; w2: [E, I, H] down weights (same dtype as x).
        topk_weights: [T, k] routing weights; topk_ids: [T, k] chosen experts.
        config: one block configuration (SGLang keys); default from `block_table` at M = T.
        block_table: SGLang-format table {M: config}; None means the untuned default.
    Returns:
        [T, H] tensor in x's dtype.
    """
    import torch
    import triton

    from kernels.tables import block_config_for
    t, hdim = x.shape
    e, _, two_i = w1.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    cfg = config or block_config_for(block_table, t, e, k)
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    sorted_pairs, block_expert = align_by_expert(topk_ids, e, bm)
    num_m = block_expert.numel()
    out_pairs = torch.zeros((t * k, hdim), dtype=x.dtype, device=x.device)
    if num_m:
        gemm0_act, gemm1_weighted = _kernels()
        h = torch.empty((sorted_pairs.numel(), inter), dtype=x.dtype, device=x.device)
        launch = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
        gemm0_act[(num_m * triton.cdiv(inter, bn),)](
            x.contiguous(), w1.contiguous(), h, sorted_pairs, block_expert, num_m, TOPK=k, H=hdim, INTER=inter,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg["GROUP_SIZE_M"], **launch)
        gemm1_weighted[(num_m * triton.cdiv(hdim, bn),)](
            h, w2.contiguous(), out_pairs, topk_weights.reshape(-1).to(torch.float32).contiguous(), sorted_pairs,
            block_expert, num_m, H=hdim, INTER=inter, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
            GROUP_M=cfg["GROUP_SIZE_M"], **launch)
    return out_pairs.view(t, k, hdim).to(torch.float32).sum(1).to(x.dtype)


def torch_reference(x, w1, w2, topk_weights, topk_ids):
    """The same computation in plain torch, in fp32, one expert at a time."""
    import torch
    inter = w1.shape[2] // 2
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in range(w1.shape[0]):
        tok, j = torch.nonzero(topk_ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        g = xf[tok] @ w1[e].float()
        a = torch.nn.functional.silu(g[:, :inter]) * g[:, inter:]
        y = (a @ w2[e].float()) * topk_weights[tok, j].float()[:, None]
        out.index_add_(0, tok, y)
    return out.to(x.dtype)
