"""A persistent, Weave-style MoE kernel in Triton: N programs, c of them communication programs
(dispatch gather / combine scatter) and N - c compute programs (gemm0 -> SiLU*mul -> gemm1), the
tokens processed in K chunks, and communication programs stealing n_steal GEMM tiles per stage
after their dispatch (Weave sections 3.2.1-3.2.2, Figure 8(d)).

On one GPU the communication is the EP = 1 permutation traffic: gathering token rows into the
expert-sorted buffer (dispatch) and the weighted top-k reduction back to token order (combine).
Across GPUs the same programs would read / write peer memory instead; that path needs symmetric
memory (NVSHMEM or torch symmetric memory) and is not implemented here.

Chunk pipeline: the K token chunks are scheduled over K + 2 stages. In stage s the communication
programs dispatch chunk s, steal up to n_steal tiles of chunk s - 1, and combine chunk s - 2,
while the compute programs work through chunk s - 1; each stage is one launch of N programs.
Splitting stages across launches (instead of spinning on flags inside one launch) keeps the
kernel correct in the Triton CPU interpreter, which runs programs one after another; GEMM tiles
are still claimed dynamically through an atomic counter, as in Weave.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def plan_chunks(topk_ids, num_experts: int, chunks: int, block_m: int):
    """Routing-derived schedule data (what Weave computes after routing).

    Chunk g holds tokens [g*T/K, (g+1)*T/K); its pairs are sorted by expert and padded per expert to
    block_m rows, so every row block belongs to one expert and one chunk.

    Returns dict of int32 tensors: slot_pair (pair of each row, -1 on padding), pair_slot (row of
    each pair), block_expert, chunk_rows / chunk_blocks / chunk_tokens (K + 1 boundaries).
    """
    import torch

    from kernels.fused_moe import align_by_expert
    t, k = topk_ids.shape
    dev = topk_ids.device
    bounds = [round(g * t / chunks) for g in range(chunks + 1)]
    slot_pair, block_expert, rows, blocks = [], [], [0], [0]
    for g in range(chunks):
        ids = topk_ids[bounds[g]:bounds[g + 1]]
        sp, be = align_by_expert(ids, num_experts, block_m)
        sp = torch.where(sp >= 0, sp + bounds[g] * k, sp)
        slot_pair.append(sp)
        block_expert.append(be)
        rows.append(rows[-1] + sp.numel())
        blocks.append(blocks[-1] + be.numel())
    slot_pair = torch.cat(slot_pair) if slot_pair else torch.empty(0, dtype=torch.int32, device=dev)
    pair_slot = torch.empty(t * k, dtype=torch.int32, device=dev)
    valid = slot_pair >= 0
    pair_slot[slot_pair[valid].long()] = torch.nonzero(valid).flatten().to(torch.int32)
    i32 = {"dtype": torch.int32, "device": dev}
    return {"slot_pair": slot_pair.to(torch.int32), "pair_slot": pair_slot,
            "block_expert": torch.cat(block_expert).to(torch.int32),
            "chunk_rows": torch.tensor(rows, **i32), "chunk_blocks": torch.tensor(blocks, **i32),
            "chunk_tokens": torch.tensor(bounds, **i32)}


def weave_moe(x, w1, w2, topk_weights, topk_ids, num_programs: int, comm_programs: int, chunks: int,
              n_steal: int = 0, block_m: int = 16, block_n: int = 32, block_k: int = 32, block_h: int = 64):
    """Routed-expert output of one MoE layer through the Weave-style persistent kernel.

    Args:
        x: [T, H] activations; w1: [E, H, 2I] gate|up; w2: [E, I, H]; same dtype.
        topk_weights, topk_ids: [T, k] routing result.
        num_programs: N, the persistent grid (the SM count on a GPU).
        comm_programs: c, programs doing dispatch / combine (1 <= c < N).
        chunks: K, token chunks of the pipeline.
        n_steal: GEMM tiles each communication program may steal per stage.
        block_m/n/k: GEMM tile; block_h: row segment moved by dispatch / combine.
    Returns:
        [T, H] tensor in x's dtype.
    """
    import torch

    from kernels import _weave_triton
    from specs.errors import UsageError
    if not 1 <= comm_programs < num_programs:
        raise UsageError(f"need 1 <= c < N, got c={comm_programs}, N={num_programs}")
    if chunks < 1:
        raise UsageError(f"chunks must be >= 1, got {chunks}")
    t, hdim = x.shape
    e, _, two_i = w1.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    chunks = min(chunks, max(t, 1))
    p = plan_chunks(topk_ids, e, chunks, block_m)
    rows = int(p["slot_pair"].numel())
    xs = torch.empty((max(rows, 1), hdim), dtype=x.dtype, device=x.device)
    ys = torch.empty_like(xs)
    hs = torch.empty((max(rows, 1), inter), dtype=x.dtype, device=x.device)
    out = torch.zeros((t, hdim), dtype=x.dtype, device=x.device)
    counters = torch.zeros(chunks, dtype=torch.int32, device=x.device)
    w = topk_weights.reshape(-1).to(torch.float32).contiguous()
    x, w1, w2 = x.contiguous(), w1.contiguous(), w2.contiguous()
    for stage in range(chunks + 2):
        _weave_triton.weave_stage[(num_programs,)](
            x, xs, ys, hs, out, w1, w2, w, p["slot_pair"], p["pair_slot"], p["block_expert"], p["chunk_rows"],
            p["chunk_blocks"], p["chunk_tokens"], counters, stage, n_steal, chunks, comm_programs,
            TOPK=k, H=hdim, INTER=inter, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_H=block_h)
    return out


def random_inputs(shape, tokens: int, skew: float = 1.0, device: str = "cpu", dtype=None, seed: int = 0):
    """(x, w1, w2, topk_weights, topk_ids) for one layer; skew > 1 sends that much more of the
    routing mass to the first E / skew... experts (expert 0..E/4 weighted by skew)."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    dtype = dtype or torch.float32
    e, k, h, i = shape.num_experts, shape.topk, shape.hidden, shape.inter
    x = (torch.randn(tokens, h, generator=g) * 0.5).to(device=device, dtype=dtype)
    w1 = (torch.randn(e, h, 2 * i, generator=g) / h ** 0.5).to(device=device, dtype=dtype)
    w2 = (torch.randn(e, i, h, generator=g) / i ** 0.5).to(device=device, dtype=dtype)
    probs = torch.ones(e)
    probs[: max(1, e // 4)] *= skew
    ids = torch.stack([torch.multinomial(probs, k, replacement=False, generator=g) for _ in range(tokens)])
    wts = torch.softmax(torch.randn(tokens, k, generator=g), dim=-1)
    return x, w1, w2, wts.to(device), ids.to(device)
