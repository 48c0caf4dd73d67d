"""Complete a partial plan with documented defaults, so every command runs a whole plan.

Defaults (fields the user did not give):
- etp=1 (the published MoE recipes' choice; Megatron's own default would be etp=tp), cp=1, pp=1,
  vpp=1, ep=1, tp=1, mbs=1.
- pipeline split: even when pp*vpp divides the layers; otherwise, when layers + 2 does, the
  embedding and the loss counted as layers (pp_embedding=1, pp_loss=1: Megatron's
  `--account-for-embedding/loss-in-pipeline-split`, as NVIDIA's Qwen3-235B recipes set); otherwise
  the most balanced explicit layout (`specs.pipeline.balanced_layout`, embedding and loss weighing
  one layer each). A split given in any form (pp_layout, pp_first, pp_last, pp_embedding or
  pp_loss, even `pp_layout=-`) is kept, so a canonical string completes to exactly the plan it names.
- schedule: no recompute; distributed optimizer, overlap_grad_reduce and overlap_param_gather on
  where the stack has them (off on CPU); no shared-expert or EP-A2A overlap.
- kernels: grouped GEMM and TE's fused token permutation and router where the stack has them, alltoall dispatcher, and the precision of
  `--precision`: bf16, or for `fp8` the recipe the hardware runs best (mxfp8 on Blackwell,
  blockwise on Hopper, tensorwise elsewhere with fp8); `precision=fp8` in the plan means the same.

`short_form` is the inverse for printing: the fewest fields that complete back to the same plan.
`effective_plan` maps a plan to the one Megatron would actually run (fields it ignores reset), so
lists of plans can show each configuration once.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from clusters import precision_recipe
from specs.errors import InputError, LayoutError
from specs.pipeline import balanced_layout
from specs.plan import Plan, format_fields, parse_fields
from specs.stack import StackProfile, stack_defaults
from specs.workload import Workload


def complete_plan(given: str | dict, workload: Workload, profile: StackProfile,
                  precision: str = "bf16") -> Plan:
    """The plan `given` (a partial plan string or a dict of Plan fields) completed with the defaults
    above for `workload` on `profile`; `precision` is `--precision` (bf16, fp8 or one recipe)."""
    fields = parse_fields(given) if isinstance(given, str) else dict(given)
    d = dict(fields)
    # `precision=fp8` in a plan means what `--precision fp8` means: the hardware's best fp8 recipe
    if d.get("precision", "fp8") == "fp8":
        d["precision"] = precision_recipe(d.get("precision", precision), workload.cluster)
    for k, v in stack_defaults(profile, workload.model.is_moe).items():
        d.setdefault(k, v)
    # overlap_param_gather follows the user's own dist_opt / overlap_grad_reduce choices
    if "overlap_param_gather" not in fields:
        d["overlap_param_gather"] = bool(d["dist_opt"] and d["overlap_grad_reduce"])
    if d.get("dispatcher") == "flex" and "flex_backend" not in d:
        d["flex_backend"] = "hybridep" if profile.hybridep else "deepep"
    if d.get("recompute") == "full":
        d.setdefault("recompute_method", "uniform")
        d.setdefault("recompute_layers", 1)
    plan = Plan(**d)
    # a split the user wrote (even `pp_layout=-`, as canonical strings do) is kept as given
    if not _SPLIT_GIVEN & fields.keys() and plan.pp > 1:
        layers = workload.model.num_layers
        if layers % (plan.pp * plan.vpp) and (layers + 2) % (plan.pp * plan.vpp) == 0:
            # the same chunks as the balanced layout, in the flags NVIDIA's recipes use
            plan = plan.replace(pp_embedding=True, pp_loss=True)
        elif layers % (plan.pp * plan.vpp):
            try:
                plan = plan.replace(pp_layout=balanced_layout(layers, plan.pp, plan.vpp))
            except LayoutError:
                pass  # realizability reports the impossible split
    return plan


def short_form(plan: Plan, workload: Workload, profile: StackProfile) -> str:
    """The short form of `plan`: only the fields that differ from what `complete_plan` fills in for
    this workload and stack (with the bf16 default precision), so that
    `complete_plan(short_form(p, w, prof), w, prof) == p`. "" when the plan is the completion
    defaults. A plan no partial string completes to (e.g. an impossible even split without a
    layout) comes back as its canonical string, which round-trips as well.

    Fields are added in canonical order (parallel tier first), each time the first one the
    completion still gets wrong, because later defaults depend on earlier fields (the layout on
    pp/vpp, overlap_param_gather on dist_opt, flex_backend on the dispatcher)."""
    given: dict = {}
    names = list(plan.__dataclass_fields__)
    for _ in range(len(names) + 1):
        try:
            got = complete_plan(given, workload, profile)
        except (InputError, ValueError):
            break
        wrong = next((n for n in names if getattr(got, n) != getattr(plan, n)), None)
        if wrong is None:
            return format_fields(given)
        given[wrong] = getattr(plan, wrong)
    return plan.canonical()


def effective_plan(plan: Plan, model) -> Plan:
    """The plan with the fields Megatron ignores for it set to their defaults: plans with the same
    effective plan run identically, so ranked lists show one of them.

    Ignored by megatron-core 0.16 (transformer_config.py / arguments.py): recompute modules unless
    recompute is selective, and the order of the modules (a set); `core_attn` alone is the default
    module list; recompute method and layer count unless recompute is full; the flex backend unless
    the dispatcher is flex; the choice between the alltoall and allgather dispatchers when the
    expert group (ep x etp) is one rank, where both only permute tokens locally; shared-expert overlap without shared experts; stage layer counts and
    the layout with one pipeline stage; every MoE option on a dense model."""
    d: dict = {}
    if plan.recompute != "selective":
        d["recompute_modules"] = ()
    else:
        mods = tuple(sorted(set(plan.recompute_modules)))
        d["recompute_modules"] = () if mods == ("core_attn",) else mods
    if plan.recompute != "full":
        d.update(recompute_method="", recompute_layers=0)
    if plan.dispatcher != "flex":
        d["flex_backend"] = ""
        if plan.ep * plan.etp == 1:  # one rank per expert group: no dispatcher communicates
            d["dispatcher"] = "alltoall"
    if not getattr(model, "moe_shared_expert_ffn", 0):
        d["shared_expert_overlap"] = False
    if plan.pp == 1:
        d.update(pp_first=0, pp_last=0, pp_layout="", pp_embedding=False, pp_loss=False)
    if not getattr(model, "is_moe", True):
        d.update(grouped_gemm=False, permute_fusion=False, router_fusion=False, dispatcher="alltoall", flex_backend="",
                 shared_expert_overlap=False, a2a_overlap=False, delay_wgrad=False)
    if all(getattr(plan, k) == v for k, v in d.items()):
        return plan  # the common case, and cheap: rankers call this for thousands of plans
    return plan.replace(**d)


# ---- best completion --------------------------------------------------------------------------------
COMPLETIONS = ("best", "defaults")
# The tier-2/3 choices a best completion makes, in groups of fields chosen together (an option of a
# group sets all of its fields; a group with a field the user gave keeps only the options that agree).
_GROUPS = (("recompute", "recompute_modules", "recompute_method", "recompute_layers"),
           ("dist_opt", "overlap_grad_reduce", "overlap_param_gather"),
           ("shared_expert_overlap", "a2a_overlap", "delay_wgrad"),
           ("cuda_graph_impl", "cuda_graph_scope"),
           ("grouped_gemm", "dispatcher", "flex_backend", "precision"))
# (permute_fusion and router_fusion are in no group: never searched, each keeps what the user gave or
# the stack default)
_SPLIT = ("pp_first", "pp_last", "pp_layout", "pp_embedding", "pp_loss")
# Predicted throughputs this close (relative) are a tie; a tie goes to the plan nearest the defaults.
_TIE = 1e-9


@dataclass
class Completion:
    """How a partial plan was completed: `mode` (best or defaults), the plan, what the defaults
    would have given, and for a best completion how many candidates were scored and the fields
    it chose differently from the defaults (`chosen`)."""
    mode: str
    plan: Plan
    defaults_plan: Plan
    candidates: int = 0  # realizable completions scored
    feasible: int = 0  # of them, within the memory budget
    chosen: dict = field(default_factory=dict)  # field -> value where plan differs from defaults_plan
    tokens_per_s_per_gpu: float = float("nan")
    defaults_tokens_per_s_per_gpu: float = float("nan")  # nan: the defaults are not realizable or do not fit
    note: str = ""

    def describe(self) -> str:
        """One line for a command's output."""
        if self.mode == "defaults":
            return "defaults (the documented completion defaults of tuner/rank/complete.py)"
        head = f"best of {self.candidates:,} realizable completions ({self.feasible:,} fit in memory)"
        if self.note:
            return f"{head}: {self.note}"
        if not self.chosen:
            return f"{head}: the defaults are the best"
        gain = ""
        if self.defaults_tokens_per_s_per_gpu == self.defaults_tokens_per_s_per_gpu:  # not nan
            gain = f", {self.tokens_per_s_per_gpu / self.defaults_tokens_per_s_per_gpu - 1:+.1%} predicted tokens/s vs defaults"
        else:
            gain = ", the defaults are not realizable or do not fit"
        return f"{head}: chose {format_fields(self.chosen)}{gain}"

    def to_dict(self) -> dict:
        return {"mode": self.mode, "plan": self.plan.canonical(), "defaults_plan": self.defaults_plan.canonical(),
                "candidates": self.candidates, "feasible": self.feasible, "chosen": format_fields(self.chosen),
                "tokens_per_s_per_gpu": None if self.tokens_per_s_per_gpu != self.tokens_per_s_per_gpu else self.tokens_per_s_per_gpu,
                "defaults_tokens_per_s_per_gpu": None if self.defaults_tokens_per_s_per_gpu != self.defaults_tokens_per_s_per_gpu
                else self.defaults_tokens_per_s_per_gpu, "note": self.note}


def _group_options(space, given: dict) -> list[list[dict]]:
    """Per group of `_GROUPS`: the space's options that agree with the fields the user gave (a
    user value the space does not list, e.g. recompute_layers=3, is one option of its own)."""
    out = []
    for g in _GROUPS:
        src = space.kernels if g is _GROUPS[-1] else space.schedules
        opts, seen = [], set()
        for o in src:
            sub = {k: o[k] for k in g if k in o}
            key = tuple(sorted(sub.items()))
            if key not in seen and all(sub.get(k, v) == v for k, v in given.items() if k in g):
                seen.add(key)
                opts.append(sub)
        if not opts:
            opts = [{}]  # the user's values, completed by the defaults
        out.append(opts)
    return out


def _split_options(workload: Workload, plan: Plan, given: dict) -> list[dict]:
    from tuner.space.train import pipeline_splits
    if _SPLIT_GIVEN & given.keys() or plan.pp == 1:
        return [{}]
    even = dict(pp_first=0, pp_last=0, pp_layout="", pp_embedding=False, pp_loss=False)
    opts = [{**even, **s} for s in pipeline_splits(workload.model.num_layers, plan.pp, plan.vpp)]
    return opts or [{}]


_SPLIT_GIVEN = set(_SPLIT)


def best_completion(given: str | dict, workload: Workload, profile: StackProfile, precision: str = "bf16", *,
                    tables=None, calibration=None) -> Completion:
    """The realizable, memory-feasible completion of `given` with the highest predicted throughput.

    The fields the user gave are kept; the parallel fields not given take the defaults (tp=1, ...);
    every unspecified tier-2/3 field (recompute, the optimizer overlaps, shared-expert and EP-A2A
    overlap, grouped GEMM, dispatcher and flex backend, the precision recipe within the
    `--precision` family, the pipeline split) ranges over the options of the full plan space
    (`tuner.space.train.default_space`). Candidates are checked with `tuner.space.megatron_rules` and scored together
    with `cost_model.predict_arrays`; of predictions within 1e-9 (relative) of the best, the one
    with the fewest fields different from the defaults wins. When no candidate is realizable and
    fits, the defaults completion is returned with a note."""
    import numpy as np

    import cost_model
    from cost_model.plans import PlanArrays
    from tuner.space.megatron_rules import check, check_parallel, check_schedule_kernels
    from tuner.space.train import default_space
    fields = parse_fields(given) if isinstance(given, str) else dict(given)
    defaults = complete_plan(fields, workload, profile, precision)
    out = Completion("best", defaults, defaults)
    # the recipe family: `--precision fp8` (or precision=fp8 in the plan) lets the recipe vary
    family = fields.get("precision", precision)
    if "precision" in fields and fields["precision"] != "fp8":
        family = fields["precision"]
    space = default_space(workload, profile, family, level="full")
    fixed = {k: v for k, v in defaults.__dict__.items() if k in fields}
    if family == "fp8":
        fixed.pop("precision", None)
    groups = _group_options(space, fixed)
    plans: list[Plan] = []
    seen: set = set()
    for split in _split_options(workload, defaults, fields):
        base = defaults.replace(**split)
        if check_parallel(workload, base, profile):
            continue
        for opts in itertools.product(*groups):
            d = {k: v for o in opts for k, v in o.items()}
            p = base.replace(**d) if d else base
            if p in seen:
                continue
            seen.add(p)
            if not check_schedule_kernels(workload, p, profile):
                plans.append(p)
    if defaults not in seen and not check(workload, defaults, profile):
        plans.append(defaults)
    out.candidates = len(plans)
    if not plans:
        out.note = "no realizable completion; the defaults are shown"
        return out
    tables = cost_model.resolve_tables(workload, tables)
    calibration = cost_model.resolve_calibration(workload, calibration, tables)

    def score(cands):
        r = cost_model.predict_arrays(workload, PlanArrays.from_plans(cands), tables=tables, calibration=calibration)
        t = np.asarray(r["tokens_per_s_per_gpu"], float)
        return t, np.asarray(r["fits"], bool) & np.isfinite(t) & (t > 0)

    tps, ok = score(plans)
    out.feasible = int(ok.sum())
    try:
        j = plans.index(defaults)
        if ok[j]:
            out.defaults_tokens_per_s_per_gpu = float(tps[j])
    except ValueError:
        pass
    # nothing fits: the memory savers NVIDIA's own recipes train with, one step at a time (never
    # otherwise: they are numerics choices the user makes), said in the note
    for rescue, why in _memory_rescues(fields, profile):
        if ok.any():
            break
        alt = list(dict.fromkeys(q for q in (p.replace(**rescue) for p in plans)
                                 if not check_schedule_kernels(workload, q, profile)))
        if alt:
            plans = alt
            tps, ok = score(plans)
            out.feasible = int(ok.sum())
            if ok.any():
                out.note = why
    if not ok.any():
        out.note = "no realizable completion fits in memory; the defaults are shown"
        return out
    best = tps[ok].max()
    names = list(Plan.__dataclass_fields__)

    def distance(p: Plan) -> int:
        return sum(getattr(p, n) != getattr(defaults, n) for n in names)

    tied = [plans[i] for i in np.flatnonzero(ok & (tps >= best * (1 - _TIE)))]
    plan = min(tied, key=lambda p: (distance(p), p.canonical()))
    out.plan = plan
    out.tokens_per_s_per_gpu = float(tps[plans.index(plan)])
    out.chosen = {n: getattr(plan, n) for n in names if getattr(plan, n) != getattr(defaults, n)}
    return out


def _memory_rescues(fields: dict, profile: StackProfile):
    """(plan fields, note) to try, in order, when no completion fits: bf16 gradient reduction, then
    also fp8 parameters (fp8 plans; the rule fp8-param drops the others), then also Megatron FSDP,
    each only where the user did not set the field. GPU stacks only (CPU trials run fp32)."""
    if not profile.gpu or "grad_reduce_bf16" in fields:
        return []
    out = [({"grad_reduce_bf16": True}, "no completion fits with fp32 main gradients; chosen with bf16 gradient "
                                        "reduction (--grad-reduce-in-bf16, as NVIDIA's recipes train)")]
    if "fp8_param" not in fields:
        out.append(({"grad_reduce_bf16": True, "fp8_param": True},
                    "no completion fits with fp32 main gradients or bf16 parameters; chosen with bf16 gradient "
                    "reduction and fp8 parameters (--grad-reduce-in-bf16 --fp8-param-gather, as NVIDIA's fp8 "
                    "recipes train)"))
    if "fsdp" not in fields and fields.get("dist_opt", True):
        for saver, _ in list(out):
            out.append(({**saver, "fsdp": True},
                        "no completion fits with replicated weights and gradients; chosen with Megatron FSDP "
                        "(--use-megatron-fsdp, optim_grads_params: weights, gradients and optimizer state sharded "
                        "over data parallel, as NVIDIA's FSDP recipes train) and "
                        + ", ".join(f"{k}={int(v)}" for k, v in saver.items())))
    return out


def complete(given: str | dict, workload: Workload, profile: StackProfile, precision: str = "bf16",
             mode: str = "best", *, tables=None, calibration=None) -> Completion:
    """`best_completion` (mode "best") or the documented defaults (`complete_plan`, mode "defaults")."""
    if mode not in COMPLETIONS:
        raise InputError(f"--complete must be one of {', '.join(COMPLETIONS)}, got {mode!r}")
    if mode == "defaults":
        p = complete_plan(given, workload, profile, precision)
        return Completion("defaults", p, p)
    return best_completion(given, workload, profile, precision, tables=tables, calibration=calibration)
