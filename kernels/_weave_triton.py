"""Triton kernel of `kernels.weave_kernel` (imported on first use: this module imports triton)."""
import triton
import triton.language as tl


@triton.jit
def _expert_rows(tile, xs, ys, hs, w1, w2, block_expert, H: tl.constexpr, INTER: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One GEMM tile = one row block of one expert through the whole expert MLP:
    # gemm0 (gate|up) -> SiLU*mul into the scratch rows hs, then gemm1 into ys.
    e = tl.load(block_expert + tile).to(tl.int64)
    rm = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    rn = tl.arange(0, BLOCK_N)
    for n0 in range(0, INTER, BLOCK_N):
        nn = n0 + rn
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            kk = k0 + rk
            a = tl.load(xs + rm[:, None] * H + kk[None, :], mask=kk[None, :] < H, other=0.0)
            wmask = (kk[:, None] < H) & (nn[None, :] < INTER)
            wb = w1 + e * H * 2 * INTER + kk[:, None] * (2 * INTER) + nn[None, :]
            acc_g += tl.dot(a, tl.load(wb, mask=wmask, other=0.0))
            acc_u += tl.dot(a, tl.load(wb + INTER, mask=wmask, other=0.0))
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        tl.store(hs + rm[:, None] * INTER + nn[None, :], act.to(hs.dtype.element_ty), mask=nn[None, :] < INTER)
    tl.debug_barrier()  # the scratch rows written above are read by other threads of this program
    for n0 in range(0, H, BLOCK_N):
        nn = n0 + rn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            kk = k0 + rk
            a = tl.load(hs + rm[:, None] * INTER + kk[None, :], mask=kk[None, :] < INTER, other=0.0)
            b = tl.load(w2 + e * INTER * H + kk[:, None] * H + nn[None, :],
                        mask=(kk[:, None] < INTER) & (nn[None, :] < H), other=0.0)
            acc += tl.dot(a, b)
        tl.store(ys + rm[:, None] * H + nn[None, :], acc.to(ys.dtype.element_ty), mask=nn[None, :] < H)


@triton.jit
def weave_stage(x, xs, ys, hs, out, w1, w2, weights, slot_pair, pair_slot, block_expert, chunk_rows,
                chunk_blocks, chunk_tokens, counters, stage, n_steal, num_chunks, comm_programs,
                TOPK: tl.constexpr, H: tl.constexpr, INTER: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    # Stage s of the chunk pipeline, all N programs resident:
    #   comm programs (pid < c): dispatch chunk s, steal up to n_steal GEMM tiles of chunk s-1,
    #                            then combine chunk s-2;
    #   comp programs (pid >= c): claim GEMM tiles of chunk s-1 until none is left.
    # GEMM tiles are claimed through an atomic counter per chunk (dynamic scheduling), so the
    # result does not depend on which programs run first or concurrently.
    pid = tl.program_id(0)
    rh = tl.arange(0, BLOCK_H)
    if pid < comm_programs:
        if stage < num_chunks:  # dispatch: gather each slot's token row into the expert-sorted buffer
            r0 = tl.load(chunk_rows + stage)
            r1 = tl.load(chunk_rows + stage + 1)
            for r in range(r0 + pid, r1, comm_programs):
                p = tl.load(slot_pair + r)
                tok = tl.where(p >= 0, p // TOPK, 0).to(tl.int64)
                for h0 in range(0, H, BLOCK_H):
                    hh = h0 + rh
                    pv = tl.zeros((BLOCK_H,), dtype=tl.int32) + p  # broadcast: a scalar mask is not accepted
                    v = tl.load(x + tok * H + hh, mask=(hh < H) & (pv >= 0), other=0.0)
                    tl.store(xs + r * H + hh, v, mask=hh < H)  # int32 offsets: rows * H < 2**31
        if stage >= 1 and stage <= num_chunks:  # bubble stealing
            g = stage - 1
            b0 = tl.load(chunk_blocks + g)
            nb = tl.load(chunk_blocks + g + 1) - b0
            for _ in range(0, n_steal):
                t = tl.atomic_add(counters + g, 1)
                if t < nb:
                    _expert_rows(b0 + t, xs, ys, hs, w1, w2, block_expert, H, INTER, BLOCK_M, BLOCK_N, BLOCK_K)
        if stage >= 2:  # combine: weighted sum of each token's top-k rows
            g = stage - 2
            t0 = tl.load(chunk_tokens + g)
            t1 = tl.load(chunk_tokens + g + 1)
            for tok in range(t0 + pid, t1, comm_programs):
                for h0 in range(0, H, BLOCK_H):
                    hh = h0 + rh
                    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
                    for j in range(0, TOPK):
                        s = tl.load(pair_slot + tok * TOPK + j).to(tl.int64)
                        w = tl.load(weights + tok * TOPK + j)
                        acc += w * tl.load(ys + s * H + hh, mask=hh < H, other=0.0).to(tl.float32)
                    tl.store(out + tok * H + hh, acc.to(out.dtype.element_ty), mask=hh < H)
    else:
        if stage >= 1 and stage <= num_chunks:
            g = stage - 1
            b0 = tl.load(chunk_blocks + g)
            nb = tl.load(chunk_blocks + g + 1) - b0
            t = tl.atomic_add(counters + g, 1)
            while t < nb:
                _expert_rows(b0 + t, xs, ys, hs, w1, w2, block_expert, H, INTER, BLOCK_M, BLOCK_N, BLOCK_K)
                t = tl.atomic_add(counters + g, 1)
