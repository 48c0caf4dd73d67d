"""Triton kernels of `kernels.fused_moe` (imported on first use: this module imports triton)."""
import triton
import triton.language as tl


@triton.jit
def _grouped_pid(pid, num_m, num_n, GROUP_M: tl.constexpr):
    # GROUP_M row blocks share the same column sweep, for L2 reuse of the weight tiles.
    in_group = GROUP_M * num_n
    group = pid // in_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    return pid_m, pid_n

@triton.jit
def gemm0_act(x, w1, h, sorted_pairs, block_expert, num_m, TOPK: tl.constexpr, H: tl.constexpr,
              INTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr):
    num_n = tl.cdiv(INTER, BLOCK_N)
    pid_m, pid_n = _grouped_pid(tl.program_id(0), num_m, num_n, GROUP_M)
    e = tl.load(block_expert + pid_m).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_pairs + rm)
    valid = pair >= 0
    tok = tl.where(valid, pair // TOPK, 0).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        kk = k0 + rk
        a = tl.load(x + tok[:, None] * H + kk[None, :], mask=valid[:, None] & (kk[None, :] < H), other=0.0)
        wmask = (kk[:, None] < H) & (rn[None, :] < INTER)
        wbase = w1 + e * H * 2 * INTER + kk[:, None] * (2 * INTER) + rn[None, :]
        bg = tl.load(wbase, mask=wmask, other=0.0)
        bu = tl.load(wbase + INTER, mask=wmask, other=0.0)
        acc_g += tl.dot(a, bg)
        acc_u += tl.dot(a, bu)
    act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(h + rm[:, None].to(tl.int64) * INTER + rn[None, :], act.to(h.dtype.element_ty),
             mask=valid[:, None] & (rn[None, :] < INTER))

@triton.jit
def gemm1_weighted(h, w2, out_pairs, weights, sorted_pairs, block_expert, num_m, H: tl.constexpr,
                   INTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr):
    num_n = tl.cdiv(H, BLOCK_N)
    pid_m, pid_n = _grouped_pid(tl.program_id(0), num_m, num_n, GROUP_M)
    e = tl.load(block_expert + pid_m).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_pairs + rm)
    valid = pair >= 0
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        kk = k0 + rk
        a = tl.load(h + rm[:, None].to(tl.int64) * INTER + kk[None, :],
                    mask=valid[:, None] & (kk[None, :] < INTER), other=0.0)
        b = tl.load(w2 + e * INTER * H + kk[:, None] * H + rn[None, :],
                    mask=(kk[:, None] < INTER) & (rn[None, :] < H), other=0.0)
        acc += tl.dot(a, b)
    wt = tl.load(weights + tl.where(valid, pair, 0), mask=valid, other=0.0).to(tl.float32)
    acc = acc * wt[:, None]
    # Scatter: each row goes back to its (token, choice) slot; the top-k sum follows.
    tl.store(out_pairs + tl.where(valid, pair, 0).to(tl.int64)[:, None] * H + rn[None, :],
             acc.to(out_pairs.dtype.element_ty), mask=valid[:, None] & (rn[None, :] < H))
