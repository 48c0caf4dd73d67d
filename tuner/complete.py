"""Complete a partial plan with documented defaults, so every command runs a whole plan.

Defaults (fields the user did not give):
- etp=1 (the published MoE recipes' choice; Megatron's own default would be etp=tp), cp=1, pp=1,
  vpp=1, ep=1, tp=1, mbs=1.
- pipeline split: even when pp*vpp divides the layers; otherwise the most balanced explicit layout
  (`specs.pipeline.balanced_layout`, embedding and loss weighing one layer each).
- schedule: no recompute; distributed optimizer, overlap_grad_reduce and overlap_param_gather on
  where the stack has them (off on CPU); no shared-expert or EP-A2A overlap.
- kernels: grouped GEMM where the stack has it, alltoall dispatcher, and the precision of
  `--precision`: bf16, or for `fp8` the recipe the hardware runs best (mxfp8 on Blackwell,
  blockwise on Hopper, tensorwise elsewhere with fp8).
"""
from __future__ import annotations

from clusters import precision_recipe
from specs.errors import LayoutError
from specs.pipeline import balanced_layout
from specs.plan import Plan, parse_fields
from specs.stack import StackProfile, stack_defaults
from specs.workload import Workload


def complete_plan(given: str | dict, workload: Workload, profile: StackProfile,
                  precision: str = "bf16") -> Plan:
    fields = parse_fields(given) if isinstance(given, str) else dict(given)
    d = dict(fields)
    if "precision" not in d:
        d["precision"] = precision_recipe(precision, workload.cluster)
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
    if not (plan.pp_layout or plan.pp_first or plan.pp_last) and plan.pp > 1:
        layers = workload.model.num_layers
        if layers % (plan.pp * plan.vpp):
            try:
                plan = plan.replace(pp_layout=balanced_layout(layers, plan.pp, plan.vpp))
            except LayoutError:
                pass  # realizability reports the impossible split
    return plan
