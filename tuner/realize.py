"""Realizability: would the pinned Megatron stack build and run this plan?

Every rule below is one that megatron-core 0.16 / Megatron-LM enforce (the source line is named in
the rule's sentence's comment), or one the stack profile adds (a missing library, CPU limits).
A rejection is a `Reason(code, flag, sentence)`; codes are stable and documented in RULES.

What a stack cannot run has one source per kind of stack: for GPU profiles their capability flags
(`transformer_engine`, `deepep`, `grouped_gemm`, ...; code "stack-missing"); for the CPU profile its
own rules, `profile.extra`, built from `specs/cpu_support.py` (what the CPU trial backend was seen
to fail on; code "stack-cpu"), so each CPU rejection is reported once and agrees with the backend.
A CPU rule that fires whatever the schedule and kernel fields are (TP with MoE, CP) is reported by
the parallel tier, the others by the schedule/kernel tier.

`check(workload, plan, profile)` returns the list of reasons (empty = realizable).
"""
from __future__ import annotations

from dataclasses import dataclass

from clusters import is_hopper
from specs.errors import LayoutError
from specs.pipeline import split_layers
from specs.plan import Plan
from specs.stack import StackProfile
from specs.workload import Workload


@dataclass(frozen=True)
class Reason:
    code: str
    flag: str
    sentence: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.sentence}"

    def to_dict(self) -> dict:
        return {"code": self.code, "flag": self.flag, "sentence": self.sentence}


# code -> (flag, where the rule lives upstream). Tests assert one accept and one reject per code.
RULES = {
    "world-div-tp-cp-pp": ("--tensor/context/pipeline-model-parallel-size", "arguments.py validate_args; parallel_state.initialize_model_parallel"),
    "world-div-etp-ep-pp": ("--expert-tensor/expert-model-parallel-size", "parallel_state.initialize_model_parallel (expert grid)"),
    "ep-needs-moe": ("--expert-model-parallel-size", "transformer_config.py: num_moe_experts must be set for EP"),
    "experts-div-ep": ("--expert-model-parallel-size", "arguments.py: num_experts % expert_model_parallel_size"),
    "heads-div-tp": ("--tensor-model-parallel-size", "transformer_config.py: num_attention_heads % tp"),
    "groups-vs-tp": ("--num-query-groups", "transformer_config.py: num_query_groups multiple or divisor of tp"),
    "ffn-div-tp": ("--ffn-hidden-size", "tensor_parallel/layers.py: ColumnParallelLinear divides output by tp"),
    "moe-bias-etp": ("--expert-tensor-parallel-size", "transformer_config.py: bias in MoE only with ETP == 1"),
    "moe-ffn-div-etp": ("--expert-tensor-parallel-size", "experts: moe_ffn_hidden_size split over expert TP"),
    "seq-div-2cp": ("--context-parallel-size", "arguments.py: seq_length % (2 * cp)"),
    "seq-div-tp-sp": ("--sequence-parallel", "sequence parallel splits seq/cp over tp"),
    "seq-le-max-pos": ("--max-position-embeddings", "arguments.py: max_position_embeddings >= seq_length"),
    "gbs-div-mbs-dp": ("--global-batch-size", "num_microbatches_calculator: gbs % (mbs * dp)"),
    "pp-layers": ("--pipeline-model-parallel-size", "arguments.py / transformer_config.py: layer split over pipeline stages"),
    "vpp-needs-pp": ("--num-virtual-stages-per-pipeline-rank", "parallel_state: pp > 1 with interleaved schedule"),
    "layout-conflict": ("--pipeline-model-parallel-layout", "transformer_config.py: layout excludes first/last stage flags"),
    "interleave-microbatches": ("--num-virtual-stages-per-pipeline-rank", "schedules.py: microbatches >= pp and M % pp == 0 for interleaving"),
    "recompute-args": ("--recompute-granularity", "transformer_config.py: recompute method/num_layers rules"),
    "recompute-layers": ("--recompute-num-layers", "transformer_config.py: 1 <= recompute_num_layers <= layers per stage"),
    "recompute-module": ("--recompute-modules", "transformer_config.py: module preconditions"),
    "opg-needs-dist-opt": ("--overlap-param-gather", "arguments.py: needs --use-distributed-optimizer"),
    "opg-needs-ogr": ("--overlap-param-gather", "arguments.py: needs --overlap-grad-reduce"),
    "flex-backend": ("--moe-flex-dispatcher-backend", "transformer_config.py / token_dispatcher.py: flex needs deepep|hybridep"),
    "flex-needs-tp-ep": ("--moe-token-dispatcher-type", "token_dispatcher.py: flex requires expert TP x EP > 1"),
    "shared-overlap": ("--moe-shared-expert-overlap", "transformer_config.py: shared experts + alltoall dispatcher"),
    "a2a-overlap": ("--overlap-moe-expert-parallel-comm", "transformer_config.py: EP A2A overlap preconditions"),
    "fp8-hardware": ("--fp8-recipe", "TE recipes: fp8 needs Hopper/Ada+, mxfp8 needs Blackwell"),
    "fp8-delayed-recompute": ("--recompute-modules", "transformer_config.py: delayed scaling forbids moe_act/layernorm recompute"),
    "dispatcher-needs-moe": ("--moe-token-dispatcher-type", "dispatcher/grouped GEMM options only apply to MoE models"),
    "stack-missing": ("(stack)", "the target stack lacks a library this plan needs"),
    "stack-cpu": ("(stack)", "megatron-core on CPU (gloo) cannot run this feature"),
}


def _r(code: str, sentence: str) -> Reason:
    return Reason(code, RULES[code][0], sentence)


def check(workload: Workload, plan: Plan, profile: StackProfile) -> list[Reason]:
    """All rules, parallel tier first. Empty list = realizable on `profile`."""
    return check_parallel(workload, plan, profile) + check_schedule_kernels(workload, plan, profile)


def check_parallel(w: Workload, p: Plan, profile: StackProfile) -> list[Reason]:
    """Tier 1 rules: read only tp, cp, pp, vpp, ep, etp, mbs and the pipeline split fields."""
    m, world, out = w.model, w.world, []
    mp = p.tp * p.cp * p.pp
    if world % mp:
        out.append(_r("world-div-tp-cp-pp", f"world size {world} is not divisible by tp*cp*pp = {mp}"))
    egrid = p.etp * p.ep * p.pp
    if world % egrid:
        out.append(_r("world-div-etp-ep-pp", f"world size {world} is not divisible by etp*ep*pp = {egrid}"))
    if p.ep > 1 and not m.is_moe:
        out.append(_r("ep-needs-moe", f"ep={p.ep} but {m.name} has no experts"))
    elif m.is_moe and m.num_experts % p.ep:
        out.append(_r("experts-div-ep", f"{m.num_experts} experts are not divisible by ep={p.ep}"))
    if m.num_attention_heads % p.tp:
        out.append(_r("heads-div-tp", f"{m.num_attention_heads} attention heads are not divisible by tp={p.tp}"))
    g = m.query_groups
    if not m.mla and g % p.tp and p.tp % g:
        out.append(_r("groups-vs-tp", f"{g} query groups are neither a multiple nor a divisor of tp={p.tp}"))
    if m.num_dense_layers and m.ffn_hidden_size % p.tp:
        out.append(_r("ffn-div-tp", f"dense ffn {m.ffn_hidden_size} is not divisible by tp={p.tp}"))
    if m.moe_shared_expert_ffn and m.moe_shared_expert_ffn % p.tp:
        out.append(_r("ffn-div-tp", f"shared-expert ffn {m.moe_shared_expert_ffn} is not divisible by tp={p.tp}"))
    if m.is_moe and m.attention_bias and p.etp > 1:  # biased linears (GPT-OSS): --add-bias-linear
        out.append(_r("moe-bias-etp", f"{m.name} has biased linear layers; MoE bias needs etp=1, not {p.etp}"))
    if m.is_moe and m.moe_ffn_hidden_size % p.etp:
        out.append(_r("moe-ffn-div-etp", f"expert ffn {m.moe_ffn_hidden_size} is not divisible by etp={p.etp}"))
    if p.cp > 1 and w.seq % (2 * p.cp):
        out.append(_r("seq-div-2cp", f"seq {w.seq} is not a multiple of 2*cp = {2 * p.cp}"))
    if p.tp > 1 and (w.seq // p.cp) % p.tp:
        out.append(_r("seq-div-tp-sp", f"seq/cp = {w.seq // p.cp} is not divisible by tp={p.tp} under sequence parallel"))
    if m.max_position_embeddings and w.seq > m.max_position_embeddings:
        out.append(_r("seq-le-max-pos", f"seq {w.seq} exceeds max_position_embeddings {m.max_position_embeddings}"))
    dp = world // mp if world % mp == 0 else 0
    num_mb = 0
    if dp:
        if w.gbs % (p.mbs * dp):
            out.append(_r("gbs-div-mbs-dp", f"gbs {w.gbs} is not divisible by mbs*dp = {p.mbs}*{dp}"))
        else:
            num_mb = w.gbs // (p.mbs * dp)
    if p.vpp > 1 and p.pp == 1:
        out.append(_r("vpp-needs-pp", f"vpp={p.vpp} (interleaved schedule) needs pp > 1"))
    if p.pp_layout and (p.pp_first or p.pp_last):
        out.append(_r("layout-conflict", "an explicit pipeline layout cannot be combined with pp_first/pp_last"))
    elif not (p.vpp > 1 and p.pp == 1):
        try:
            split_layers(m.num_layers, p.pp, p.vpp, p.pp_first, p.pp_last, p.pp_layout)
        except LayoutError as e:
            out.append(_r("pp-layers", f"pipeline split: {e}"))
    if p.vpp > 1 and p.pp > 1 and num_mb and (num_mb < p.pp or num_mb % p.pp):
        out.append(_r("interleave-microbatches",
                      f"interleaving needs microbatches ({num_mb}) >= pp and a multiple of pp={p.pp}"))
    if not profile.gpu:
        out += [_extra_reason(code, sentence) for code, sentence, pred in profile.extra
                if pred(_neutral(p), m)]
        return out
    if p.tp > 1 and m.is_moe and not profile.sequence_parallel:
        out.append(_r("stack-missing", f"MoE with tp={p.tp} needs sequence parallel, which {profile.name} cannot run"))
    if p.cp > 1 and not profile.context_parallel:
        out.append(_r("stack-missing",
                      f"context parallel (cp={p.cp}) needs TransformerEngine attention, absent on {profile.name}"))
    return out


# Schedule and kernel fields at values every stack runs: a CPU rule that still fires on a plan with
# these is about its parallel tier alone.
_NEUTRAL = dict(recompute="none", recompute_modules=(), recompute_method="", recompute_layers=0, dist_opt=False,
                overlap_grad_reduce=False, overlap_param_gather=False, shared_expert_overlap=False,
                a2a_overlap=False, grouped_gemm=False, dispatcher="alltoall", flex_backend="", precision="bf16")


def _neutral(p: Plan) -> Plan:
    return p.replace(**_NEUTRAL)


def _extra_reason(code: str, sentence: str) -> Reason:
    return Reason(code if code in RULES else "stack-cpu", "(stack)", sentence)


def check_schedule_kernels(w: Workload, p: Plan, profile: StackProfile) -> list[Reason]:
    """Tier 2 and 3 rules. They read the parallel tier only through `schedule_context(p)`
    (used by the enumerator to cache verdicts)."""
    m, out = w.model, []
    # --- recompute (transformer_config.py) ---
    if p.recompute == "none":
        if p.recompute_modules or p.recompute_method or p.recompute_layers:
            out.append(_r("recompute-args", "recompute modules/method/layers given without recompute"))
    elif p.recompute == "selective":
        if p.recompute_method or p.recompute_layers:
            out.append(_r("recompute-args", "selective recompute takes no recompute method or layer count"))
        mods = p.recompute_modules or ("core_attn",)
        # (on CPU, where grouped GEMM never runs, the CPU rule recompute_moe_act says this once)
        if "moe_act" in mods and not p.grouped_gemm and profile.gpu:
            out.append(_r("recompute-module", "recompute module moe_act needs grouped GEMM"))
        if "mla_up_proj" in mods and not m.mla:
            out.append(_r("recompute-module", "recompute module mla_up_proj needs multi-latent attention"))
        if "shared_experts" in mods and p.shared_expert_overlap:
            out.append(_r("recompute-module", "shared_experts recompute cannot work with shared-expert overlap"))
        if {"moe_act", "moe", "shared_experts"} & set(mods) and not m.is_moe:
            out.append(_r("recompute-module", f"recompute modules {'+'.join(mods)} need a MoE model"))
        if p.fp8 and {"moe_act", "layernorm"} & set(mods):
            if p.precision == "fp8-delayed":
                out.append(_r("fp8-delayed-recompute", "delayed-scaling fp8 forbids moe_act/layernorm recompute"))
            elif not profile.te_at_least("2.6.0"):
                out.append(_r("stack-missing", "moe_act/layernorm recompute in fp8 needs TransformerEngine >= 2.6"))
    else:  # full
        if p.recompute_modules:
            out.append(_r("recompute-args", "full recompute takes no recompute modules"))
        if p.recompute_method not in ("uniform", "block"):
            out.append(_r("recompute-args", "full recompute needs recompute_method uniform or block"))
        if p.recompute_layers < 1:
            out.append(_r("recompute-layers", "full recompute needs recompute_layers >= 1"))
        else:
            chunk = _min_chunk_layers(w, p)
            if chunk is not None and p.recompute_layers > chunk:
                out.append(_r("recompute-layers",
                              f"recompute_layers={p.recompute_layers} exceeds the {chunk} layers of a pipeline chunk"))
    # --- optimizer and DP overlap (arguments.py) ---
    if p.overlap_param_gather and not p.dist_opt:
        out.append(_r("opg-needs-dist-opt", "overlap_param_gather needs the distributed optimizer"))
    if p.overlap_param_gather and not p.overlap_grad_reduce:
        out.append(_r("opg-needs-ogr", "overlap_param_gather needs overlap_grad_reduce"))
    # --- MoE kernels and dispatch ---
    if not m.is_moe and (p.dispatcher != "alltoall" or p.flex_backend or p.shared_expert_overlap or p.a2a_overlap):
        out.append(_r("dispatcher-needs-moe", f"{m.name} is dense: dispatcher and MoE overlap options do not apply"))
    if p.dispatcher == "flex" and not p.flex_backend:
        out.append(_r("flex-backend", "the flex dispatcher needs flex_backend deepep or hybridep"))
    if p.flex_backend and p.dispatcher != "flex":
        out.append(_r("flex-backend", f"flex_backend={p.flex_backend} only works with dispatcher=flex"))
    if p.dispatcher == "flex" and p.etp * p.ep <= 1:
        out.append(_r("flex-needs-tp-ep", "the flex dispatcher requires expert TP x EP > 1"))
    if p.shared_expert_overlap:
        if not m.moe_shared_expert_ffn:
            out.append(_r("shared-overlap", f"shared-expert overlap needs shared experts; {m.name} has none"))
        elif p.dispatcher != "alltoall":
            out.append(_r("shared-overlap", "shared-expert overlap only works with the alltoall dispatcher"))
    if p.a2a_overlap:
        why = []
        if p.ep <= 1:
            why.append("needs ep > 1")
        if p.dispatcher not in ("alltoall", "flex"):
            why.append("needs the alltoall or flex dispatcher")
        if p.recompute == "full":
            why.append("cannot run with full recompute")
        if p.pp > 1 and p.vpp == 1:
            why.append("needs vpp > 1 when pp > 1")
        if p.shared_expert_overlap:
            why.append("excludes shared-expert overlap")
        if why:
            out.append(_r("a2a-overlap", "EP all-to-all overlap " + "; ".join(why)))
    # --- precision vs hardware and stack ---
    hw = w.cluster
    if p.precision in ("fp8-tensorwise", "fp8-delayed", "fp8-blockwise") and not hw.fp8:
        out.append(_r("fp8-hardware", f"{p.precision} needs fp8 tensor cores; {hw.device_name} has none"))
    if p.precision == "fp8-blockwise" and hw.fp8 and not is_hopper(hw):
        out.append(_r("fp8-hardware", f"fp8-blockwise is TransformerEngine's Hopper recipe; {hw.device_name} is not Hopper"))
    if p.precision == "mxfp8" and not hw.mxfp8:
        out.append(_r("fp8-hardware", f"mxfp8 needs Blackwell microscaling; {hw.device_name} lacks it"))
    # --- what the stack has ---
    if not profile.gpu:  # the CPU profile's own rules; those of the parallel tier were reported there
        neutral = _neutral(p)
        out += [_extra_reason(code, sentence) for code, sentence, pred in profile.extra
                if pred(p, m) and not pred(neutral, m)]
        return out
    missing = []
    if p.fp8 and not profile.transformer_engine:
        missing.append(f"{p.precision} needs TransformerEngine")
    if p.precision == "fp8-blockwise" and profile.transformer_engine and not profile.te_at_least("2.3.0"):
        missing.append("fp8-blockwise needs TransformerEngine >= 2.3")
    if p.precision == "mxfp8" and profile.transformer_engine and not profile.te_at_least("2.1.0"):
        missing.append("mxfp8 needs TransformerEngine >= 2.1")
    if p.flex_backend == "deepep" and not profile.deepep:
        missing.append("flex/deepep needs DeepEP")
    if p.flex_backend == "hybridep" and not profile.hybridep:
        missing.append("flex/hybridep needs HybridEP")
    if p.grouped_gemm and m.is_moe and not profile.grouped_gemm:
        missing.append("grouped GEMM needs CUDA grouped-GEMM kernels")
    if p.dist_opt and not profile.dist_opt:
        missing.append("the distributed optimizer is CUDA-only")
    if p.overlap_grad_reduce and not profile.overlap_grad_reduce:
        missing.append("overlap_grad_reduce needs CUDA streams")
    for sentence in missing:
        out.append(_r("stack-missing", f"{sentence} ({profile.name})"))
    for code, sentence, pred in profile.extra:
        if pred(p, m):
            out.append(_extra_reason(code, sentence))
    return out


def _min_chunk_layers(w: Workload, p: Plan) -> int | None:
    try:
        split = split_layers(w.model.num_layers, p.pp, p.vpp, p.pp_first, p.pp_last, p.pp_layout)
    except LayoutError:
        return None
    sizes = [len(c) for rank in split.chunks for c in rank if len(c)]
    return min(sizes) if sizes else None


def schedule_context(w: Workload, p: Plan) -> tuple:
    """Everything check_schedule_kernels reads from the parallel tier: plans that agree on this
    key and on the schedule/kernel fields get the same verdict (the enumerator caches on it)."""
    return (p.pp > 1, p.vpp > 1, p.ep > 1, p.etp * p.ep > 1, _min_chunk_layers(w, p))


def is_realizable(workload: Workload, plan: Plan, profile: StackProfile) -> bool:
    return not check(workload, plan, profile)
