"""The plan space: the three tiers of the moefs paper, enumerated as a stream, shard i of n.

Tier 1 (parallelism) is enumerated point by point; tier 2 (schedule) x tier 3 (kernels) is a fixed
list of options crossed with every parallel point. Nothing materialises the cross product:
`iter_plans` yields plans one at a time, `summarize` counts realizable plans and rejection reasons by
checking each parallel point once and caching the schedule/kernel verdicts on the few parallel facts
they read (`tuner.space.megatron_rules.schedule_context`), so DeepSeek-V3 on 1024 GPUs (~10^9 plans) is counted in
seconds and in bounded memory.

Bounds of the space (design choices, not realizability rules): TP within the scale-up domain and
<= 8; CP <= 8; PP any divisor of the world up to the layer count; VPP 1..8 with pp*vpp <= layers;
EP any divisor of the expert count; ETP powers of two <= max TP; MBS in {1, 2, 4, 8}. Pipeline split
per (pp, vpp): even when it divides, else the balanced explicit layout; plus, when it divides and
pp > 2, the uneven variant that moves one layer per chunk off the first and last stages (they also
hold the embedding and the LM head); plus the even splits that count the embedding and/or the loss
as a layer where those divide (`accounted_splits`).
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

from clusters import precision_recipe
from specs.errors import LayoutError
from specs.pipeline import balanced_layout, split_layers
from specs.plan import Plan
from specs.stack import StackProfile, stack_defaults
from specs.workload import Workload
from tuner.space.megatron_rules import check_parallel, check_schedule_kernels, schedule_context

FP8_RECIPES = ("fp8-tensorwise", "fp8-delayed", "fp8-blockwise", "mxfp8")


@dataclass(frozen=True)
class Space:
    tp: tuple[int, ...]
    cp: tuple[int, ...]
    pp: tuple[int, ...]
    vpp: tuple[int, ...]
    ep: tuple[int, ...]
    etp: tuple[int, ...]
    mbs: tuple[int, ...]
    schedules: tuple[dict, ...]
    kernels: tuple[dict, ...]
    num_layers: int

    @property
    def options_per_point(self) -> int:
        return len(self.schedules) * len(self.kernels)


def _pow2_upto(n: int) -> tuple[int, ...]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return tuple(out)


def _divisors(n: int, cap: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def recompute_options(model) -> list[dict]:
    opts = [dict(recompute="none"), dict(recompute="selective")]
    if model.is_moe:
        opts += [dict(recompute="selective", recompute_modules=("core_attn", "moe_act")),
                 dict(recompute="selective", recompute_modules=("layernorm", "moe_act")),
                 dict(recompute="selective", recompute_modules=("moe",))]
        if model.moe_shared_expert_ffn:
            opts.append(dict(recompute="selective", recompute_modules=("shared_experts",)))
    if model.mla:
        opts.append(dict(recompute="selective", recompute_modules=("mla_up_proj", "moe_act")))
    opts += [dict(recompute="full", recompute_method="uniform", recompute_layers=1),
             dict(recompute="full", recompute_method="block", recompute_layers=1),
             dict(recompute="full", recompute_method="block", recompute_layers=2)]
    return opts


def default_space(workload: Workload, profile: StackProfile, precision: str = "bf16",
                  level: str = "full") -> Space:
    """level="full": every option of every tier. level="core": the options that matter most for
    speed (used to rank with the cost model): schedule flags at their best realizable values."""
    m, c, world = workload.model, workload.cluster, workload.world
    tp = tuple(t for t in _pow2_upto(min(8, c.scaleup_size, world)) if t <= m.num_attention_heads)
    cp = _pow2_upto(min(8, world))
    pp = _divisors(world, m.num_layers)
    vpp = tuple(range(1, 9))
    ep = _divisors(m.num_experts, world) if m.is_moe else (1,)
    etp = _pow2_upto(max(tp)) if m.is_moe else (1,)
    mbs = (1, 2, 4, 8)
    recs = recompute_options(m)
    if level == "core":
        recs = [r for r in recs if r.get("recompute_modules", ()) == () and r.get("recompute_method") != "block"]
        dist = [dict(dist_opt=profile.dist_opt, overlap_grad_reduce=profile.overlap_grad_reduce,
                     overlap_param_gather=profile.dist_opt and profile.overlap_grad_reduce)]
    else:
        dist = [dict(dist_opt=a, overlap_grad_reduce=b, overlap_param_gather=g)
                for a, b, g in itertools.product((True, False), repeat=3)]
    # delay_wgrad only beside a2a_overlap and on TE GPU stacks (megatron_rules delay-wgrad)
    delays = (False, True) if (level == "full" and profile.gpu and profile.transformer_engine) else (False,)
    overlaps = [dict(shared_expert_overlap=s, a2a_overlap=a, delay_wgrad=d)
                for s, a in itertools.product((False, True), repeat=2)
                for d in (delays if a else (False,))] if m.is_moe else [{}]
    graphs = cuda_graph_options(m, profile, level)
    schedules = tuple({**r, **d, **o, **g} for r in recs for d in dist for o in overlaps for g in graphs)
    if precision == "fp8":
        precs = FP8_RECIPES if level == "full" else (precision_recipe("fp8", c),)
    else:
        precs = (precision_recipe(precision, c),)
    if m.is_moe:
        dispatch = [("alltoall", ""), ("allgather", ""), ("flex", "deepep"), ("flex", "hybridep")]
        ggs = (True, False) if level == "full" else (profile.grouped_gemm,)
    else:
        dispatch, ggs = [("alltoall", "")], (False,)
    # TE's fused permutation and router where the stack has them: never searched (the PyTorch ops only
    # add kernels, bytes and host syncs; `permute_fusion=0` / `router_fusion=0` price them when a user
    # runs them)
    sd = stack_defaults(profile, m.is_moe)
    pf, rf = sd["permute_fusion"], sd["router_fusion"]
    kernels = tuple(dict(grouped_gemm=g, permute_fusion=pf, router_fusion=rf, dispatcher=d, flex_backend=b, precision=pr)
                    for g in ggs for d, b in dispatch for pr in precs)
    return Space(tp, cp, pp, vpp, ep, etp, mbs, schedules, kernels, m.num_layers)


def cuda_graph_options(model, profile: StackProfile, level: str = "full") -> list[dict]:
    """CUDA graph settings searched (megatron-core 0.16.1 `--cuda-graph-impl/--cuda-graph-scope`):
    none; for MoE models TE partial graphs of attention + router + preprocess (the scope NVIDIA's
    MoE recipes set, Megatron-MoE-ModelZoo best_practice/qwen3; attention alone graphs a subset of
    it, for more launches and less memory: not listed, a plan may still name it); for dense models
    whole layers (TE) and the whole iteration (local). Whole-layer and full-iteration graphs of
    dropless MoE layers are never realizable (`tuner.space.megatron_rules` cuda-graph-sync), so not listed.
    GPU stacks only; the core level keeps none."""
    none = dict(cuda_graph_impl="none", cuda_graph_scope=())
    if level != "full" or not profile.gpu:
        return [none]
    te = "transformer_engine"
    if model.is_moe:
        return [none, dict(cuda_graph_impl=te, cuda_graph_scope=("attn", "moe_router", "moe_preprocess"))]
    return [none, dict(cuda_graph_impl=te, cuda_graph_scope=()),
            dict(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",))]


LOSS_STAGE_WEIGHTS = (1, 3)  # layers the loss stage's extras weigh in the balanced layouts offered


def pipeline_splits(num_layers: int, pp: int, vpp: int) -> list[dict]:
    if pp == 1:
        return [{}] if vpp == 1 else []
    out = accounted_splits(num_layers, pp, vpp)
    if pp * vpp > num_layers:
        return out
    if num_layers % (pp * vpp):
        # the balanced explicit layouts with the loss stage weighing 1 or 3 layers (the LM head and
        # any MTP layers sit there: NVIDIA's DeepSeek-V3 B200 layout is the weight-3 one); the cost
        # model ranks them
        layouts = []
        for w in LOSS_STAGE_WEIGHTS:
            try:
                layouts.append(balanced_layout(num_layers, pp, vpp, loss_weight=w))
            except LayoutError:
                continue
        return [dict(pp_layout=x) for x in dict.fromkeys(layouts)] + out
    out = [{}] + out
    per = num_layers // pp
    if pp > 2 and per > vpp:
        edge = per - vpp
        try:
            split_layers(num_layers, pp, vpp, edge, edge)
            out.append(dict(pp_first=edge, pp_last=edge))
        except LayoutError:
            pass
    return out


def accounted_splits(num_layers: int, pp: int, vpp: int) -> list[dict]:
    """The even splits that count the embedding and/or the loss as a layer
    (`--account-for-embedding/loss-in-pipeline-split`, NVIDIA's Qwen3-235B PP32 x VPP3 layout) where
    Megatron accepts them: both when L + 2 divides over pp*vpp chunks, one (each) when L + 1 does."""
    out = []
    for emb, loss in ((True, True), (False, True), (True, False)):
        try:
            split_layers(num_layers, pp, vpp, embedding=emb, loss=loss)
        except LayoutError:
            continue
        out.append(dict(pp_embedding=emb, pp_loss=loss))
    return out


def parallel_points(space: Space):
    """Tier-1 points in a fixed order (the order sharding relies on)."""
    for tp, cp, pp, vpp in itertools.product(space.tp, space.cp, space.pp, space.vpp):
        splits = pipeline_splits(space.num_layers, pp, vpp)
        if not splits:
            continue
        for ep, etp, mbs in itertools.product(space.ep, space.etp, space.mbs):
            for split in splits:
                yield dict(tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep, etp=etp, mbs=mbs, **split)


def iter_plans(space: Space, shard: int = 0, num_shards: int = 1):
    """Every plan of the space (realizable or not), shard `shard` of `num_shards`."""
    for i, par in enumerate(parallel_points(space)):
        if i % num_shards == shard:
            for sched in space.schedules:
                for kern in space.kernels:
                    yield Plan(**par, **sched, **kern)


@dataclass
class SpaceSummary:
    total: int = 0
    realizable: int = 0
    parallel_points: int = 0
    # code -> plans rejected for it. A plan may count under several codes; a plan whose parallel
    # tier is already unrealizable counts under its tier-1 codes only (its schedule and kernel
    # options are never looked at, which is what keeps counting 10^9 plans cheap).
    rejections: Counter = field(default_factory=Counter)
    examples: list = field(default_factory=list)  # realizable plans
    rejected_examples: dict = field(default_factory=dict)  # code -> (plan, sentence)

    def merge(self, other: "SpaceSummary", max_examples: int = 5) -> None:
        self.total += other.total
        self.realizable += other.realizable
        self.parallel_points += other.parallel_points
        self.rejections.update(other.rejections)
        self.examples = (self.examples + other.examples)[:max_examples]
        for k, v in other.rejected_examples.items():
            self.rejected_examples.setdefault(k, v)


class _Verdicts:
    """Schedule x kernel verdicts for one schedule_context: per option the reasons, plus the
    aggregates `summarize` needs, so a parallel point costs O(1) once its context was seen."""

    def __init__(self, reasons: list):
        self.reasons = reasons
        self.ok = [i for i, r in enumerate(reasons) if not r]
        self.counts = Counter()
        self.first: dict = {}
        for i, rs in enumerate(reasons):
            for r in {r.code: r for r in rs}.values():
                self.counts[r.code] += 1
                self.first.setdefault(r.code, (i, r.sentence))


def _with(base: Plan, sched: dict, kern: dict) -> Plan:
    """`base.replace(**sched, **kern)` without re-validating: the space's own options are valid
    field values, and checking thousands of them per schedule context is the walk's hot loop."""
    p = object.__new__(Plan)
    d = p.__dict__
    d.update(base.__dict__)
    d.update(sched)
    d.update(kern)
    return p


class _Walker:
    """Checks parallel points once and schedule/kernel options once per schedule_context."""

    def __init__(self, space: Space, workload: Workload, profile: StackProfile):
        self.space, self.w, self.profile = space, workload, profile
        self.sk = [(s, k) for s in space.schedules for k in space.kernels]
        self.cache: dict = {}
        # Profiles with extra predicates (CPU) may read any field: cache per parallel point then.
        self.exact = bool(profile.extra)

    def verdicts(self, par_plan: Plan) -> _Verdicts:
        key = (par_plan,) if self.exact else schedule_context(self.w, par_plan)
        hit = self.cache.get(key)
        if hit is None:
            hit = _Verdicts([check_schedule_kernels(self.w, _with(par_plan, s, k), self.profile)
                             for s, k in self.sk])
            self.cache[key] = hit
        return hit

    def plan(self, base: Plan, i: int) -> Plan:
        s, k = self.sk[i]
        return base.replace(**s, **k)


# the last walker, by the identity of its (space, workload, profile): `moetune plans --rank` walks
# one space to count it and again to rank it; the second walk reuses the first's verdicts. Only one
# is held: a DeepSeek-V3 walker holds ~900K verdict lists, and screening actors walk a new space
# per shard.
_WALKERS: list = []


def _walker(space: Space, workload: Workload, profile: StackProfile) -> _Walker:
    for s, w, p, walker in _WALKERS:
        if s is space and w is workload and p is profile:
            return walker
    walker = _Walker(space, workload, profile)
    _WALKERS.insert(0, (space, workload, profile, walker))
    del _WALKERS[1:]
    return walker


def iter_realizable(space: Space, workload: Workload, profile: StackProfile,
                    shard: int = 0, num_shards: int = 1):
    for base, ok, options in iter_realizable_points(space, workload, profile, shard, num_shards):
        for j in ok:
            s, k = options[j]
            yield base.replace(**s, **k)


def iter_realizable_points(space: Space, workload: Workload, profile: StackProfile,
                           shard: int = 0, num_shards: int = 1):
    """The realizable plans of the shard grouped by parallel point: (base plan, indices of its
    realizable options, options), where option j is a (schedule, kernel) pair of field dicts and
    the plan is `base.replace(**schedule, **kernel)`. For callers that want the plans as columns
    (the vectorised ranker) without building a Plan per plan."""
    walker = _walker(space, workload, profile)
    for i, par in enumerate(parallel_points(space)):
        if i % num_shards != shard:
            continue
        base = Plan(**par)
        if check_parallel(workload, base, profile):
            continue
        ok = walker.verdicts(base).ok
        if ok:
            yield base, ok, walker.sk


def summarize(space: Space, workload: Workload, profile: StackProfile, shard: int = 0,
              num_shards: int = 1, max_examples: int = 5, progress=None,
              example_stride: int = 1) -> SpaceSummary:
    """Counts over the shard; examples are one realizable plan per `example_stride`-th parallel
    point, so they show different layouts (topped up from other points when too few of those are
    realizable)."""
    walker = _walker(space, workload, profile)
    out = SpaceSummary()
    spare: list = []
    per_point = space.options_per_point
    for i, par in enumerate(parallel_points(space)):
        if progress is not None and i % 1024 == 0:
            progress(i)
        if i % num_shards != shard:
            continue
        out.parallel_points += 1
        out.total += per_point
        base = Plan(**par)
        par_reasons = check_parallel(workload, base, profile)
        if par_reasons:
            for r in {r.code: r for r in par_reasons}.values():
                out.rejections[r.code] += per_point
                out.rejected_examples.setdefault(r.code, (base.canonical(), r.sentence))
            continue
        v = walker.verdicts(base)
        out.realizable += len(v.ok)
        out.rejections.update(v.counts)
        for code, (j, sentence) in v.first.items():
            if code not in out.rejected_examples:
                out.rejected_examples[code] = (walker.plan(base, j).canonical(), sentence)
        if v.ok and len(out.examples) < max_examples and i % example_stride == 0:
            out.examples.append(walker.plan(base, v.ok[0]))
        elif v.ok and len(spare) < max_examples:
            spare.append(walker.plan(base, v.ok[0]))
    # too few realizable points on the stride: top up with the first others
    out.examples += spare[:max_examples - len(out.examples)]
    return out


def count_parallel_points(space: Space) -> int:
    return sum(1 for _ in parallel_points(space))
