"""A training plan: one point of the three-tier space (parallelism, schedule, kernels).

A `Plan` is a frozen, hashable value. Its canonical string lists every field in a fixed order,
`tp=2,cp=1,pp=8,vpp=4,ep=64,etp=1,mbs=1,...`, and `Plan.parse(p.canonical()) == p` exactly.
A partial string (`tp=2,pp=8`) parses to a plan whose other fields take the defaults below;
`tuner.rank.complete.complete_plan` then fills what depends on the model (pipeline split).

Conventions (Megatron's):
- vpp: virtual pipeline chunks per pipeline rank (Megatron-Bridge tables); 1 = no interleaving.
- DP is not a field: it is derived, world // (tp * cp * pp).
- pp_first / pp_last: layers on the first / last stage (0 = even split);
  pp_layout: an explicit `--pipeline-model-parallel-layout` string (e.g. "Et*3|(tt|)*29,mL")
  with `|` between virtual stages; written with `/` in place of `,` in the canonical string.
- pp_embedding / pp_loss: Megatron's `--account-for-embedding-in-pipeline-split` /
  `--account-for-loss-in-pipeline-split`: the embedding (loss) counts as one layer when the layers
  are split over pp*vpp chunks, so the first (last) chunk holds one transformer layer fewer.
- capacity_factor / pad_to_capacity: Megatron's `--moe-expert-capacity-factor` (0 = dropless, the
  default) and `--moe-pad-expert-input-to-capacity`: token drop, and every expert computing exactly
  its capacity (drop-and-pad: static shapes, no token counts to the host).
- cuda_graph_impl / cuda_graph_scope: Megatron's `--cuda-graph-impl` (none | local |
  transformer_engine) and `--cuda-graph-scope` (megatron-core 0.16.1 CudaGraphScope names; the
  empty scope with an impl captures whole transformer layers).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from specs.errors import PlanSyntaxError

RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_METHODS = ("", "uniform", "block")
# Megatron's --recompute-modules choices (transformer_config.py).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DISPATCHERS = ("alltoall", "allgather", "flex")
FLEX_BACKENDS = ("", "deepep", "hybridep")
PRECISIONS = ("bf16", "fp8-tensorwise", "fp8-delayed", "fp8-blockwise", "mxfp8")
# megatron-core 0.16.1 transformer_config.py cuda_graph_impl and enums.py CudaGraphScope (training
# scopes; `mamba` has no layer here)
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine")
CUDA_GRAPH_SCOPES = ("full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess")
# the token dispatchers (alltoall, allgather, or the flex backend) that, under drop-and-pad, size every
# buffer from the capacities and send no token counts to the host (megatron-core 0.16.1
# token_dispatcher.py: MoEAlltoAllTokenDispatcher and _HybridEPManager with drop_and_pad; DeepEP
# refuses padding; the allgather dispatcher keeps its counts on the device either way)
DROP_PAD_HOST_SIZED = ("alltoall", "hybridep")


@dataclass(frozen=True)
class Plan:
    # tier 1: parallelism
    tp: int = 1
    cp: int = 1
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int = 1
    mbs: int = 1
    # tier 2: schedule
    recompute: str = "none"
    recompute_modules: tuple[str, ...] = ()  # selective only; () = Megatron default (core_attn)
    recompute_method: str = ""  # full only: uniform | block
    recompute_layers: int = 0  # full only
    dist_opt: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    # --grad-reduce-in-bf16 (Megatron-LM arguments.py: DDP grad_reduce_in_fp32 False): bf16 main
    # gradients and gradient reduction instead of fp32, as NVIDIA's performance recipes train; a
    # numerics choice, so completion takes it only when nothing fits without it (default: Megatron's fp32)
    grad_reduce_bf16: bool = False
    # --use-megatron-fsdp with --data-parallel-sharding-strategy optim_grads_params (ZeRO-3, NVIDIA's
    # FSDP recipes: Megatron-Bridge scripts/performance/utils/overrides.py _set_megatron_fsdp_overrides):
    # weights, main gradients and optimizer state sharded over DP x CP (dense) / expert-DP (experts);
    # each microbatch all-gathers a layer's weights before its forward and again before its backward
    # and reduce-scatters its gradients after. Needs the distributed optimizer (its FSDP code paths).
    # Completion: only as a memory rescue (default off, Megatron's DDP)
    fsdp: bool = False
    shared_expert_overlap: bool = False
    a2a_overlap: bool = False
    # --delay-wgrad-compute (TransformerConfig.delay_wgrad_compute; needs a2a_overlap): under EP A2A
    # overlap each layer's weight gradients run as a node of their own after its data gradients, so
    # the backward dispatch and combine can start beside them (model_chunk_schedule_plan.py)
    delay_wgrad: bool = False
    pp_first: int = 0
    pp_last: int = 0
    pp_layout: str = ""
    pp_embedding: bool = False
    pp_loss: bool = False
    cuda_graph_impl: str = "none"
    cuda_graph_scope: tuple[str, ...] = ()  # () with an impl: whole layers
    # tier 3: kernels
    grouped_gemm: bool = True
    # --moe-permute-fusion (TransformerConfig.moe_permute_fusion; TE >= 2.1): TE's fused permute /
    # unpermute / chunk sort. Off, megatron-core's own default, the dispatcher permutes in PyTorch
    # ops (moe_utils.permute / unpermute: masked_select, index_select, a probability multiply and a
    # scatter_add), each masked_select a device-to-host sync. Default: on where the stack has TE (the
    # Megatron-Bridge MoE recipes set it); never searched (the fused kernels only save work)
    permute_fusion: bool = True
    # --moe-router-fusion (TransformerConfig.moe_router_fusion; TE >= 2.7, PR 1883): the router's
    # score function, (group-limited) top-k and routing map in one TE kernel, the aux-loss scores and
    # loss in two more (Megatron-LM's DeepSeek-V3 GB200 notes: 72 -> 31 router kernels). Default: on
    # where the stack has TE >= 2.7 (every Megatron-Bridge MoE perf config of the shared rows sets it);
    # never searched (the fused kernels only remove launches)
    router_fusion: bool = True
    dispatcher: str = "alltoall"
    flex_backend: str = ""
    # --moe-expert-capacity-factor (TransformerConfig.moe_expert_capacity_factor; 0 here = None, dropless):
    # each expert takes at most ceil(tokens x topk / experts x factor) tokens of a rank's microbatch,
    # the rest are dropped (moe_utils.apply_router_token_dropping). A training-semantics choice
    # (dropped tokens skip the experts), so completion and search never turn it on: a user pins it
    capacity_factor: float = 0.0
    # --moe-pad-expert-input-to-capacity (needs a capacity factor): every expert computes exactly
    # its capacity, padded, so the alltoall and HybridEP dispatchers know every size in advance
    # (token_dispatcher.py drop_and_pad: no token counts to the host, no count exchange) and the
    # moe CUDA graph scope becomes possible (transformer_config.py)
    pad_to_capacity: bool = False
    precision: str = "bf16"
    # --fp8-param-gather (TransformerConfig.fp8_param): the model's weights are kept in fp8 only (no
    # bf16 copy beside TE's quantised one) and the distributed optimizer all-gathers them in fp8;
    # NVIDIA's fp8 performance recipes set it. Completion: only as a memory rescue (default off, Megatron's)
    fp8_param: bool = False

    def __post_init__(self) -> None:
        bad = []
        for f in ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                bad.append(f"{f} must be a positive integer")
        for f, choices in (("recompute", RECOMPUTE), ("recompute_method", RECOMPUTE_METHODS),
                           ("dispatcher", DISPATCHERS), ("flex_backend", FLEX_BACKENDS),
                           ("precision", PRECISIONS), ("cuda_graph_impl", CUDA_GRAPH_IMPLS)):
            if getattr(self, f) not in choices:
                bad.append(f"{f}={getattr(self, f)!r} is not one of {'|'.join(c or '-' for c in choices)}")
        for m in self.recompute_modules:
            if m not in RECOMPUTE_MODULES:
                bad.append(f"recompute module {m!r} is not one of {'|'.join(RECOMPUTE_MODULES)}")
        for m in self.cuda_graph_scope:
            if m not in CUDA_GRAPH_SCOPES:
                bad.append(f"cuda graph scope {m!r} is not one of {'|'.join(CUDA_GRAPH_SCOPES)}")
        cf = self.capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not math.isfinite(cf) or cf < 0:
            bad.append(f"capacity_factor must be a finite number >= 0 (0 = dropless), not {cf!r}")
        else:
            object.__setattr__(self, "capacity_factor", float(cf))  # 1 and 1.0 are one plan, one string
        if self.recompute_layers < 0 or self.pp_first < 0 or self.pp_last < 0:
            bad.append("layer counts must be >= 0")
        if bad:
            raise PlanSyntaxError("; ".join(bad))

    @property
    def model_parallel(self) -> int:
        return self.tp * self.cp * self.pp

    def dp(self, world: int) -> int:
        return world // self.model_parallel

    @property
    def fp8(self) -> bool:
        return self.precision != "bf16"

    @property
    def drop_and_pad(self) -> bool:
        """Megatron's drop-and-pad MoE: a capacity factor with padding."""
        return bool(drop_and_pad(self.capacity_factor, self.pad_to_capacity))

    @property
    def dispatch(self) -> str:
        """The token dispatcher as it runs: alltoall, allgather, or the flex backend's name."""
        return self.flex_backend if self.dispatcher == "flex" else self.dispatcher

    # ---- canonical string ---------------------------------------------------------------------
    def canonical(self) -> str:
        return ",".join(f"{f.name}={format_value(getattr(self, f.name))}" for f in dataclasses.fields(self))

    __str__ = canonical

    @classmethod
    def parse(cls, text: str) -> "Plan":
        return cls(**parse_fields(text))

    def replace(self, **kw) -> "Plan":
        return dataclasses.replace(self, **kw)


def drop_and_pad(capacity_factor, pad_to_capacity):
    """Megatron's drop-and-pad MoE (token_dispatcher.py drop_and_pad): a capacity factor > 0 with
    padding. Scalars (a Plan's fields) or arrays (the cost model's PlanArrays columns)."""
    return (capacity_factor > 0) & (pad_to_capacity != 0)


_FIELDS = {f.name: f for f in dataclasses.fields(Plan)}
_ALIASES = {"dist-opt": "dist_opt", "do": "dist_opt", "ogr": "overlap_grad_reduce",
            "opg": "overlap_param_gather", "use_megatron_fsdp": "fsdp", "grad_bf16": "grad_reduce_bf16", "fp8_param_gather": "fp8_param",
            "delay_wgrad_compute": "delay_wgrad",
            "dispatch": "dispatcher", "gg": "grouped_gemm", "moe_permute_fusion": "permute_fusion",
            "moe_router_fusion": "router_fusion", "moe_expert_capacity_factor": "capacity_factor",
            "moe_pad_expert_input_to_capacity": "pad_to_capacity"}


def format_fields(fields: dict) -> str:
    """`k=v,...` for some of a plan's fields, in canonical order and canonical value syntax (so
    `parse_fields(format_fields(d)) == d`); "" for no fields."""
    return ",".join(f"{name}={format_value(fields[name])}" for name in _FIELDS if name in fields)


def format_value(v) -> str:
    """One field value in canonical syntax (shared by `ServePlan`)."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return "+".join(v) if v else "-"
    if isinstance(v, str):
        return v.replace(",", "/") if v else "-"
    return str(v)


def parse_fields(text: str) -> dict:
    """Parse `k=v,k=v` into typed Plan fields, rejecting unknown keys and bad values."""
    return parse_key_values(text, _FIELDS, _ALIASES, "plan")


MAX_PLAN_CHARS = 4096  # a canonical plan string is a few hundred characters
# keys whose values may contain commas: a pipeline layout as Megatron writes it ("Et|(tt|)*30,mL";
# pipeline_parallel_layer_layout.py parse_str_to_list removes them as "purely cosmetic"), so an item
# without "=" after one continues its value
COMMA_VALUED = ("pp_layout",)


def parse_key_values(text: str, fields: dict, aliases: dict, what: str) -> dict:
    """Parse `k=v,k=v` into the typed values of a frozen dataclass's `fields` (name -> Field, with
    string annotations: int, float, bool, tuple[...], str); `aliases` maps other spellings to field
    names; `what` names the kind of plan in error messages. Unknown keys, repeated keys and bad
    values raise PlanSyntaxError."""
    out: dict = {}
    text = text.strip()
    if not text:
        return out
    if len(text) > MAX_PLAN_CHARS:  # never echo a 100 kB string back on one line
        raise PlanSyntaxError(f"{what} string is {len(text):,} characters long (at most {MAX_PLAN_CHARS:,})")
    if not (text.isascii() and text.isprintable()):  # "tp=２" must not read as tp=2
        bad = next(c for c in text if not (c.isascii() and c.isprintable()))
        raise PlanSyntaxError(f"{what} string has a character that is not printable ASCII: {bad!r}")
    if not text.replace(",", "").strip():
        raise PlanSyntaxError(f"{what} string {text!r} has no key=value item")
    parts: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part and parts and parts[-1].split("=", 1)[0].strip() in COMMA_VALUED:
            parts[-1] += part  # Megatron's layout strings may hold commas, "purely cosmetic" (dropped)
            continue
        parts.append(part)
    for part in parts:
        if "=" not in part:
            raise PlanSyntaxError(f"{what} item {part!r} is not key=value")
        k, v = (s.strip() for s in part.split("=", 1))
        k = aliases.get(k, k.replace("-", "_"))
        if k not in fields:
            raise PlanSyntaxError(f"unknown {what} key {k!r}; keys: {', '.join(fields)}")
        if k in out:
            raise PlanSyntaxError(f"{what} key {k!r} given twice")
        typ = fields[k].type
        try:
            if typ == "int":
                out[k] = int(v)
            elif typ == "float":
                out[k] = float(v)
            elif typ == "bool":
                if v.lower() not in ("0", "1", "true", "false", "on", "off"):
                    raise ValueError(v)
                out[k] = v.lower() in ("1", "true", "on")
            elif typ.startswith("tuple"):
                out[k] = () if v in ("-", "") else tuple(v.split("+"))
            else:
                out[k] = "" if v == "-" else v.replace("/", ",")
        except ValueError:
            raise PlanSyntaxError(f"{what} key {k!r} has bad value {v!r}") from None
    return out
