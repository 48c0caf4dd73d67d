"""Where a CPU Megatron trial's step goes, by the cost model's calibration classes
(`cost_model.calibration.TRAIN_CLASSES`): two extra, untimed steps. In the first, module hooks
time the forward and backward of the modules that hold one class whole (`timed_modules`: core
attention, the routed experts, the router, shared experts); the second runs under torch.profiler
and splits the rest of the step (`split_events`, `combine_shares`). The profiler's own cost
lands mostly on the ops that allocate the most, so the classes it can leave to hooks it does.

The Megatron modules whose time is one class (core attention -> attention, the routed experts ->
grouped_gemm, the router -> elementwise, shared experts -> gemm) are wrapped in
`record_function("moetune::<class>")` scopes, and the MoE layer in a `moetune::moe` scope. Each
profiled op's self CPU time goes to:
- the class of its innermost scope; a backward op (under autograd's `evaluate_function: XBackward`)
  to the scope of the forward op it differentiates (matched by sequence number and forward thread);
- a collective (c10d / gloo op): ep_comm inside an MoE layer (the dispatcher's all-to-all or
  all-gather, forward or backward), other_comm elsewhere (TP, DP, pipeline send/recv; a pipeline
  rank waiting in recv counts here, not as pipeline_bubble);
- the ops of Megatron's vocabulary-parallel cross entropy (FUNCTION_CLASS) -> gemm, as the model
  prices the LM head and its loss together (lm_head_ce);
- outside any scope, by op name: matrix products -> gemm, the rest -> elementwise;
- a backward node autograd numbered without a forward op of its own (CopySlices of an in-place
  op on a view) -> the scope of the forward op recorded just before it;
- the step's wall time not inside any op (Python and launch work between ops) -> host_launch.
The profiler slows the step it records, most where ops are many and small (an optimizer's
elementwise updates): its cost, the profiled step's wall time less the timed steps' median, is
taken off the ops evenly per recorded event, and the moetune:: scopes' own time is left out. The
result is each class's share of the unprofiled step; the backend multiplies the shares by the
measured median step.
"""
from __future__ import annotations

import bisect
import contextlib

MODULE_CLASS = {"DotProductAttention": "attention", "TEDotProductAttention": "attention",
                "SequentialMLP": "grouped_gemm", "GroupedMLP": "grouped_gemm", "TEGroupedMLP": "grouped_gemm",
                "TopKRouter": "elementwise", "SharedExpertMLP": "gemm"}
MOE_MODULES = ("MoELayer",)
# autograd Functions whose ops (and backward) are one class: the vocabulary-parallel cross entropy
# is priced with the LM head GEMM (the model's lm_head_ce term, class gemm)
FUNCTION_CLASS = {"_VocabParallelCrossEntropy": "gemm"}
PREFIX = "moetune::"
MOE = PREFIX + "moe"
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
            "aten::_grouped_mm")
# lower-case marks of a collective: the c10d ops, and the autograd Functions that wrap them (their
# self time is the wait for the peers: Megatron's _AllToAll, the *ParallelRegion mappings)
COMM_MARKS = ("c10d::", "gloo:", "nccl:", "record_param_comms", "all_to_all", "alltoall", "allreduce", "all_reduce",
              "allgather", "all_gather", "reduce_scatter", "parallelregion", "recv_", "send_")
BACKWARD = "autograd::engine::evaluate_function:"


@contextlib.contextmanager
def labelled(chunks):
    """Wrap the forward of the class-labelled modules of `chunks` in profiler scopes (restored after)."""
    from torch.autograd.profiler import record_function
    patched = []

    def wrap(mod, label):
        orig = mod.forward

        def forward(*a, **k):
            with record_function(label):
                return orig(*a, **k)
        mod.forward = forward
        patched.append(mod)

    for c in chunks:
        for m in c.modules():
            name = type(m).__name__
            if name in MODULE_CLASS:
                wrap(m, PREFIX + MODULE_CLASS[name])
            elif name in MOE_MODULES:
                wrap(m, MOE)
    try:
        yield
    finally:
        for m in patched:
            del m.forward  # the instance attribute; the class's forward shows again


def _forward_scope(fwd_scope: dict, fwd_seqs: dict, thread, seq: int, default):
    """The scope of the forward op a backward node differentiates: the op recorded with the node's
    sequence number, else the nearest one before it on that thread. Autograd numbers some nodes
    without a forward op of their own: an in-place op on a view (Megatron's local attention masks
    its scores' view in place) makes CopySlices and AsStridedBackward0 nodes numbered after the
    op, and their score-sized copies in the backward belong to that op's module."""
    if (thread, seq) in fwd_scope:
        return fwd_scope[(thread, seq)]
    seqs = fwd_seqs.get(thread, ())
    i = bisect.bisect_right(seqs, seq) - 1
    return fwd_scope[(thread, seqs[i])] if i >= 0 else default


def _is_comm(name: str) -> bool:
    n = name.lower()
    return any(k in n for k in COMM_MARKS)


def split_events(events, wall_us: float, step_us: float | None = None, by_op: dict | None = None,
                 scoped: dict | None = None) -> dict:
    """{class: share of the step} from a profiled step's FunctionEvents, its wall time (us) and the
    unprofiled step time (us; None: the profiled wall, no overhead correction). `by_op`, when
    given, is filled with {(class, op name): [us, calls]} (the trial's trace explains its split);
    `scoped` with {class: share of the step} of the ops inside a MODULE_CLASS module's scope (what
    `timed_modules` times without the profiler)."""
    scope_of: dict = {}  # id(event) -> (class or None, inside moe, class from a module scope)
    fwd_scope: dict = {}  # (thread, sequence_nr) of a forward op -> its scope
    fwd_seqs: dict = {}  # thread -> the sorted sequence numbers of its forward ops

    def scope(e):
        k = id(e)
        if k in scope_of:
            return scope_of[k]
        cls, moe, module = scope(e.cpu_parent) if e.cpu_parent is not None else (None, False, False)
        if e.name == MOE:
            moe = True
        elif e.name.startswith(PREFIX):
            cls, module = e.name[len(PREFIX):], True
        elif e.name in FUNCTION_CLASS:  # not a module: `timed_modules` does not time it
            cls, module = FUNCTION_CLASS[e.name], False
        elif e.name.startswith(BACKWARD):
            cls, moe, module = _forward_scope(fwd_scope, fwd_seqs, getattr(e, "fwd_thread", None), e.sequence_nr,
                                              (cls, moe, module))
        scope_of[k] = (cls, moe, module)
        return scope_of[k]

    events = sorted(events, key=lambda e: e.time_range.start)  # forward ops before their backward
    step_us = wall_us if step_us is None else min(step_us, wall_us)
    per_event = max(0.0, wall_us - step_us) / max(1, len(events))  # the profiler's cost of one event
    shares: dict = {}
    in_ops = 0.0
    for e in events:
        cls, moe, module = scope(e)
        if not e.name.startswith(BACKWARD) and e.sequence_nr is not None and e.sequence_nr >= 0:
            if (e.thread, e.sequence_nr) not in fwd_scope:
                fwd_scope[(e.thread, e.sequence_nr)] = (cls, moe, module)
                bisect.insort(fwd_seqs.setdefault(e.thread, []), e.sequence_nr)
        if e.name.startswith(PREFIX):
            continue
        t = max(0.0, float(e.self_cpu_time_total) - per_event)
        comm = _is_comm(e.name)
        if comm:
            c = "ep_comm" if moe else "other_comm"
        elif cls is not None:
            c = cls
        else:
            c = "gemm" if e.name in GEMM_OPS else "elementwise"
        shares[c] = shares.get(c, 0.0) + t
        in_ops += t
        if scoped is not None and module and not comm:
            scoped[c] = scoped.get(c, 0.0) + t
        if by_op is not None:
            acc = by_op.setdefault((c, e.name), [0.0, 0])
            acc[0] += t
            acc[1] += 1
    wall = max(step_us, in_ops, 1e-9)
    shares["host_launch"] = shares.get("host_launch", 0.0) + (wall - in_ops)
    if scoped is not None:
        for c in scoped:
            scoped[c] /= wall
    return {c: v / wall for c, v in shares.items()}


@contextlib.contextmanager
def timed_modules(chunks, out: dict):
    """Time the forward and backward of the class-labelled modules of `chunks` by module hooks
    (perf_counter at each pre- and post-hook, no profiler) into `out` ({class: seconds}, summed
    over calls). The profiler's own cost lands unevenly on the ops it records (most on the ones
    that allocate the most: a CPU trial's [bh, s, s] attention scores; a profiled tiny-moe step
    ran 347 ms against a 223 ms timed step, the attention taking most of the difference), so the
    classes a module holds whole are timed this way and the profiler splits only the rest
    (`combine_shares`). Restored after."""
    import time

    handles, starts = [], {}

    def pre(key):
        def hook(*_a):
            starts.setdefault(key, []).append(time.perf_counter())
        return hook

    def post(key, cls):
        def hook(*_a):
            if starts.get(key):
                out[cls] = out.get(cls, 0.0) + time.perf_counter() - starts[key].pop()
        return hook

    for c in chunks:
        for m in c.modules():
            cls = MODULE_CLASS.get(type(m).__name__)
            if cls is None:
                continue
            handles += [m.register_forward_pre_hook(pre((id(m), "f"))), m.register_forward_hook(post((id(m), "f"), cls)),
                        m.register_full_backward_pre_hook(pre((id(m), "b"))),
                        m.register_full_backward_hook(post((id(m), "b"), cls))]
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


def combine_shares(profiled: dict, scoped: dict, timed: dict, timed_step_s: float) -> dict:
    """{class: share of the step}: the module-held classes as `timed_modules` timed them in an
    unprofiled step of `timed_step_s`, the rest of the step split as the profiled step splits its
    ops outside those modules (`split_events`' shares less its `scoped` ones)."""
    hooked = {c: t / timed_step_s for c, t in timed.items() if t > 0}
    total_hooked = min(1.0, sum(hooked.values()))
    rest = {c: max(0.0, v - scoped.get(c, 0.0)) for c, v in profiled.items()}
    norm = sum(rest.values())
    out = dict(hooked)
    for c, v in rest.items():
        out[c] = out.get(c, 0.0) + (1.0 - total_hooked) * (v / norm if norm > 0 else 0.0)
    tot = sum(out.values())
    return {c: v / tot for c, v in out.items()} if tot > 0 else {}


# Collectives inside an MoE layer (the dispatcher's all-to-all / all-gather, expert-TP's): every
# rank enters them once per layer and microbatch, so a rank's time in them holds its wait for the
# last peer to arrive -- the other ranks' extra compute (routing imbalance, host jitter), which the
# cost model prices in those ranks' compute, not as communication. The rank that arrives last
# waits least: its time is the collective's own (`component_times`).
SKEW_CLASSES = ("ep_comm",)
COMM_CLASSES = ("ep_comm", "other_comm")


def component_times(rank_shares, step_s: float) -> dict:
    """{class: seconds of the step}: the ranks' mean share of each class times the measured median
    step (the profiled step itself runs slower under the profiler); {} without shares.

    A SKEW_CLASSES class is taken at its least rank (the one that waited least), and what the
    mean held beyond it -- the ranks' waits for each other -- goes to the compute and host classes
    in proportion to their time: the step is still the sum. Pipeline waits (other_comm: a stage
    waiting in recv) stay where they are: the model prices the bubble as such. Without it the ranks'
    waits inside the MoE layers' collectives read as slow EP communication (issue 27: the
    per-component fit put ep_comm at x1.2-2.05 over nine CPU studies while the held-out EP plans
    ran as the model's other classes did, and predicted them 12-24% slow)."""
    rank_shares = [s for s in (rank_shares or ()) if s]
    if not rank_shares:
        return {}
    classes = sorted({c for s in rank_shares for c in s})
    out = {c: step_s * sum(s.get(c, 0.0) for s in rank_shares) / len(rank_shares) for c in classes}
    if len(rank_shares) < 2:
        return out
    waits = 0.0
    for c in SKEW_CLASSES:
        if c in out:
            least = step_s * min(s.get(c, 0.0) for s in rank_shares)
            waits += out[c] - least
            out[c] = least
    work = {c: v for c, v in out.items() if c not in COMM_CLASSES}
    total = sum(work.values())
    if waits > 0 and total > 0:
        for c, v in work.items():
            out[c] = v + waits * v / total
    return out
