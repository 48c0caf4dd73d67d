"""Complete a partial plan with documented defaults, so every command runs a whole plan.

Defaults (fields the user did not give):
- etp=1 (the published MoE recipes' choice; Megatron's own default would be etp=tp), cp=1, pp=1,
  vpp=1, ep=1, tp=1, mbs=1.
- pipeline split: even when pp*vpp divides the layers; otherwise the most balanced explicit layout
  (`specs.pipeline.balanced_layout`, embedding and loss weighing one layer each). A split given in
  any form (pp_layout, pp_first or pp_last, even `pp_layout=-`) is kept, so a canonical string
  completes to exactly the plan it names.
- schedule: no recompute; distributed optimizer, overlap_grad_reduce and overlap_param_gather on
  where the stack has them (off on CPU); no shared-expert or EP-A2A overlap.
- kernels: grouped GEMM where the stack has it, alltoall dispatcher, and the precision of
  `--precision`: bf16, or for `fp8` the recipe the hardware runs best (mxfp8 on Blackwell,
  blockwise on Hopper, tensorwise elsewhere with fp8); `precision=fp8` in the plan means the same.

`short_form` is the inverse for printing: the fewest fields that complete back to the same plan.
`effective_plan` maps a plan to the one Megatron would actually run (fields it ignores reset), so
lists of plans can show each configuration once.
"""
from __future__ import annotations

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
    if not {"pp_layout", "pp_first", "pp_last"} & fields.keys() and plan.pp > 1:
        layers = workload.model.num_layers
        if layers % (plan.pp * plan.vpp):
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
        d.update(pp_first=0, pp_last=0, pp_layout="")
    if not getattr(model, "is_moe", True):
        d.update(grouped_gemm=False, dispatcher="alltoall", flex_backend="", shared_expert_overlap=False,
                 a2a_overlap=False)
    if all(getattr(plan, k) == v for k, v in d.items()):
        return plan  # the common case, and cheap: rankers call this for thousands of plans
    return plan.replace(**d)
