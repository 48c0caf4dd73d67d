"""`moetune profile`: measure this machine's performance tables (MOSAIC §5.3 microbenchmarks).

One small runner module per operator family (Vidur-style), each exposing
`points(ctx) -> list[dict]` (a dict per sweep point with a unique "id"), optionally
`skip_reason(ctx)` (None, or why the family cannot be measured here; absent = always measurable) and `measure(point, ctx) -> list[(family, row)]`
with rows in the `cost_model.tables` format:

    gemm.py          dense GEMM (F.linear as nn layers run it) over (M, N, K, dtype); fp8 via
                     torch._scaled_mm where the GPU has fp8 (sm89+)
    grouped_mlp.py   the expert linears fwd, dgrad and wgrad as the stack executes them: TE
                     GroupedLinear on GPU (torch._grouped_mm, labelled, when TE is missing),
                     Megatron's SequentialMLP loop (split, one GEMM per local expert, cat) on CPU
    attention.py     core attention fwd/bwd: SDPA on GPU at a micro-batch's batch x heads with the
                     backend forced and recorded, Megatron's local unfused DotProductAttention
                     math on CPU (what the CPU trials run)
    elementwise.py   router (fp32 softmax + top-k), permute/unpermute, elementwise (RMSNorm, SiLU,
                     residual add), Adam step: achieved memory bandwidth (`membw`)
    cross_entropy.py cross-entropy over the vocabulary on fp32 logits (`membw` op cross_entropy)
    dispatch_gap.py  steady-state per-op CPU dispatch gap between small kernels
    collectives.py   all_reduce, reduce_scatter, all_gather, all_to_all_single, send/recv and the
                     alltoall EP dispatch pattern, in spawned torch.distributed workers (gloo on
                     CPU, NCCL on GPU) over message and group sizes, contiguous and strided ranks
    driver.py        orchestration (Ray actors per device, budget, resume, atomic table writes)

On CPU each per-device sweep runs one thread per rank, pinned to a core, as the trials run
(the cost model predicts per-device work), timed with perf_counter (minimum of batches). On GPU:
CUDA events per call, L2 flushed before each call, after a sustained-clock warm-up (median); see
common.timeit. Each table's statistic is written into meta.json. Per-device sweep points are spread over one Ray actor
per device (per core on CPU, per GPU on GPU).
"""
