"""Core attention forward and backward over (seq, head_dim, bh). TFLOPS are in causal flops (the
cost model's convention): fwd = bh*s^2*2*d, bwd = 2.5 x fwd. bh = batch x heads of one call.

GPU: torch SDPA, causal, bf16, with the backend forced (torch.nn.attention.sdpa_kernel): flash
first, then efficient, then math, the first that runs the shape is used and named in each row's
source (`measured:sdpa-<backend> b<batch>xh<heads>`), never silently. The call has the batch x
heads of a training micro-batch, not one small head group that underfills the SMs at short
seq: heads = ctx.extra["attn_heads"] (a model's heads per rank; default 32) and batch such that
batch x seq = ctx.extra["attn_tokens"] (default 8192 tokens per micro-batch, at least 1 sequence).
GPU rows write bh = those heads, one constant per table: the batch follows seq (tokens / seq), so
writing batch x heads would put every seq at its own bh (a diagonal, not a grid), and a fused
flash kernel's per-head rate does not depend on bh once the SMs are filled; one value keeps the
axis inert.
CPU: Megatron's local (non-TE) DotProductAttention op for op, which the CPU trials run
(`_cpu_attention`: unfused, full s^2), forward timed with autograd recording as in training, at
each bh of the sweep: the per-head cost grows with bh once the bh*s*s*4-byte score tensors spill
the last-level cache (on an 8 MiB L3 host, seq 1024, a call of 8 heads costs more per head than
one of 4, backward most). The bh values are every one tiny-moe's CPU trials use (2 or 4 heads per
rank x mbs 1, 2, 4, 8): the per-head cost is a step, not a line in log bh (the scores fit the L3
or not, and from 32 MiB, glibc's largest mmap threshold, each is mapped and page-faulted afresh on
every call, in the trial ranks too), so a cell between two measured bh values that straddle the
step is mispriced by the interpolation. Measured on the 2-core VM, quiet (fwd + bwd, one thread,
the trials' allocator; CPU time per call / bh, three runs of 12 calls, bench/cpu_attention_alloc_probe.py):
seq 1024 bh 2 11.6-13.1 ms, bh 4 13.4-15.1 ms, bh 8 18.8-25.5 ms (83-152 MiB page-faulted per call
against 3-6 MiB at bh 4), so bh 4 read between bh 2 and 8 is priced 10-24% slow (21-32% with bh 2
and 8 measured under glibc's malloc defaults, as the profile's workers ran before:
trials/profile/driver.py). (The one held-out plan of bench/heldout_cpu.py biased the same way
in every run of bench/results/heldout_cpu/runs, A-F, is the seq-1024, mbs-1 plan, bh 4 between
bh 2 and 8: predicted 12-32% slower than measured, relative to each run's other plans.) On CPU every
attention point is measured at the coarse levels (<= CPU_MAX_LEVEL): with seq 512 and 1024 at the
grid's finest level, a `--budget-min 4` profile ended before them and the trials' cells were
interpolated from seq 256 and 2048, where the scores spill the cache. Points whose score tensor
exceeds CPU_SCORE_CAP_BYTES are not measured (autograd holds several copies of it; minutes per
point on a small host); the table loader fills them from the measured neighbours
(`cost_model.tables._fill_holes`)."""
from __future__ import annotations

from trials.profile.common import Ctx, grid_points, timeit

NAME = "attention"
# CPU: largest bh*s*s*4-byte score tensor measured. The grid is kept small on purpose: at the
# README's `--budget-min 4` a 116-point attention grid (bh 2..32 in 5 steps, 4 head dims, a
# 256 MiB cap) got only its coarse levels measured, and the cells the CPU trials use (seq 512 and
# 1024) were interpolated from 256 and 2048, where the bh dependence does not show.
CPU_SCORE_CAP_BYTES = 64 * 2**20
CPU_MAX_LEVEL = 1  # CPU attention points are measured before the GEMM refinements (module docstring)
GPU_HEADS = 32  # default heads per rank on GPU (override: ctx.extra["attn_heads"])
GPU_TOKENS = 8192  # default tokens per micro-batch on GPU (override: ctx.extra["attn_tokens"])
SDPA_BACKENDS = ("flash", "efficient", "math")  # tried in this order (override: ctx.extra["sdpa_backends"])
CPU = {"tiny": dict(seq=[128, 256], head_dim=[16, 64], bh=[4, 16]),
       "small": dict(seq=[128, 512, 2048], head_dim=[16, 64, 128], bh=[2, 8, 32]),
       "full": dict(seq=[64, 128, 256, 512, 1024, 2048], head_dim=[16, 64, 128], bh=[2, 4, 8, 16, 32])}
GPU = {"tiny": dict(seq=[1024, 4096], head_dim=[128]),
       "small": dict(seq=[512, 2048, 8192], head_dim=[64, 128]),
       "full": dict(seq=[512, 1024, 2048, 4096, 8192, 16384], head_dim=[64, 128, 192, 256])}


def points(ctx: Ctx) -> list[dict]:
    if ctx.on_gpu:  # one bh per GPU table: the call's heads (module docstring)
        s = dict(GPU[ctx.sweep], bh=[int(ctx.extra.get("attn_heads", GPU_HEADS))])
    else:
        s = CPU[ctx.sweep]
    out = []
    for name, _, _ in ctx.dtypes():
        for p in grid_points(s, dtype=name):
            if not ctx.on_gpu and cpu_score_bytes(p) > CPU_SCORE_CAP_BYTES:
                continue
            if not ctx.on_gpu:
                p["level"] = min(p["level"], CPU_MAX_LEVEL)
            p["id"] = f"attention|{name}|{p['seq']}|{p['head_dim']}|{p['bh']}"
            out.append(p)
    return out


def cpu_score_bytes(p: dict) -> int:
    """Bytes of the fp32 [bh, s, s] score tensor of a CPU point."""
    return int(p["bh"]) * int(p["seq"]) ** 2 * 4


def gpu_shape(seq: int, head_dim: int, ctx: Ctx) -> tuple[int, int, int, int]:
    """(batch, heads, seq, head_dim) of the GPU call for a sweep point (see the module docstring)."""
    heads = int(ctx.extra.get("attn_heads", GPU_HEADS))
    batch = max(1, int(ctx.extra.get("attn_tokens", GPU_TOKENS)) // seq)
    return batch, heads, seq, head_dim


def sdpa_backend(name: str):
    """torch.nn.attention.SDPBackend member for "flash" | "efficient" | "math" | "cudnn"."""
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}[name]


def pick_sdpa_backend(shape, dtype, device, order=SDPA_BACKENDS):
    """(name, SDPBackend) of the first backend in `order` that runs causal SDPA on `shape`; raises
    RuntimeError listing each backend's refusal when none does (never a silent choice)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    probe = [torch.randn(*shape, dtype=dtype, device=device) for _ in range(3)]
    errs = []
    for name in order:
        try:
            with sdpa_kernel([sdpa_backend(name)]):
                F.scaled_dot_product_attention(*probe, is_causal=True)
            return name, sdpa_backend(name)
        except RuntimeError as e:  # this backend cannot run the shape: try the next, and say so
            errs.append(f"{name}: {str(e).splitlines()[0][:80]}")
    raise RuntimeError("no SDPA backend runs this shape: " + "; ".join(errs))


def _cpu_attention(q, k, v, mask, scale):
    """Megatron-core 0.16.1's local DotProductAttention op for op (transformer/
    dot_product_attention.py forward; fusions/fused_softmax.py forward_torch_softmax;
    transformer/utils.py attention_mask_func): baddbmm into a new buffer, the [b, np, sq, sk] view
    masked IN PLACE (in training autograd turns that into CopySlices: a clone of the scores in the
    forward and copies in the backward), softmax, bmm with V, the context permuted and made
    contiguous. q, k, v: [b*np, s, d]."""
    import torch
    scores = torch.baddbmm(torch.empty(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype),
                           q, k.transpose(1, 2), beta=0.0, alpha=scale)
    view = scores.view(1, *scores.shape)
    view.masked_fill_(mask, -10000.0)
    probs = torch.softmax(view, dim=-1).view(scores.shape)
    return torch.bmm(probs, v).transpose(0, 1).contiguous()


def measure(p: dict, ctx: Ctx) -> list[tuple[str, dict]]:
    """One point: fwd and bwd attention rows per table dtype key."""
    import torch
    tdt, keys = next((t, k) for n, t, k in ctx.dtypes() if n == p["dtype"])
    s, d = p["seq"], p["head_dim"]
    scale = d ** -0.5
    if ctx.on_gpu:
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel
        shape = gpu_shape(s, d, ctx)
        name, backend = pick_sdpa_backend(shape, tdt, ctx.device, ctx.extra.get("sdpa_backends", SDPA_BACKENDS))
        src = f"measured:sdpa-{name} b{shape[0]}xh{shape[1]}"

        def fwd(q, k, v):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        shape = (int(p["bh"]), s, d)
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
        src = "measured:megatron-local-attention"

        def fwd(q, k, v):
            return _cpu_attention(q, k, v, mask, scale)
    q, k, v = (torch.randn(*shape, dtype=tdt, device=ctx.device, requires_grad=True) for _ in range(3))
    out = fwd(q, k, v)
    go = torch.randn(*out.shape, dtype=tdt, device=ctx.device)
    if ctx.on_gpu:
        with torch.no_grad():
            tf_ = timeit(lambda: fwd(q, k, v), ctx)
    else:  # as training runs it: with autograd recording (the in-place mask's clone happens here)
        tf_ = timeit(lambda: fwd(q, k, v), ctx)

    # the backward is timed alone over a retained graph, not as (fwd + bwd) - fwd: the difference
    # of two noisy timings went near zero on a loaded CPU and wrote backward rates 100-1000x too
    # high (e.g. 3.6 TFLOPS next to a 0.001 TFLOPS forward at seq 128, head_dim 16)
    tb = timeit(lambda: torch.autograd.grad(out, (q, k, v), go, retain_graph=True), ctx)
    flops = (shape[0] * shape[1] if ctx.on_gpu else shape[0]) * s * s * 2.0 * d
    bh = shape[1] if ctx.on_gpu else shape[0]  # GPU: the constant heads (module docstring)
    rows = []
    for kk in keys:
        rows.append(("attention", dict(dtype=kk, direction="fwd", seq=s, head_dim=d, bh=bh, tflops=flops / tf_ / 1e12,
                                       source=src)))
        rows.append(("attention", dict(dtype=kk, direction="bwd", seq=s, head_dim=d, bh=bh,
                                       tflops=2.5 * flops / tb / 1e12, source=src)))
    return rows
