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
from specs.plan import DROP_PAD_HOST_SIZED, Plan
from specs.stack import GPU_FULL_TE211, TE_FUSIONS, StackProfile
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
    "vocab-div-tp": ("--padded-vocab-size", "tensor_parallel/layers.py VocabParallelEmbedding: vocab divided over tp"),
    "ffn-div-tp": ("--ffn-hidden-size", "tensor_parallel/layers.py: ColumnParallelLinear divides output by tp"),
    "moe-bias-etp": ("--expert-tensor-parallel-size", "transformer_config.py: bias in MoE only with ETP == 1"),
    "moe-ffn-div-etp": ("--expert-tensor-parallel-size", "experts: moe_ffn_hidden_size split over expert TP"),
    "seq-div-2cp": ("--context-parallel-size", "arguments.py: seq_length % (2 * cp)"),
    "seq-div-tp-sp": ("--sequence-parallel", "sequence parallel splits seq/cp over tp"),
    "policy-seq-le-max-pos": ("--max-position-embeddings", "moetune policy, not a Megatron rule: train within the model's context"),
    "gbs-div-mbs-dp": ("--global-batch-size", "num_microbatches_calculator: gbs % (mbs * dp)"),
    "pp-layers": ("--pipeline-model-parallel-size", "arguments.py / transformer_config.py: layer split over pipeline stages"),
    "vpp-needs-pp": ("--num-virtual-stages-per-pipeline-rank", "parallel_state: pp > 1 with interleaved schedule"),
    "layout-conflict": ("--pipeline-model-parallel-layout", "transformer_config.py: layout, first/last counts, embedding/loss split: exclusive"),
    "interleave-microbatches": ("--num-virtual-stages-per-pipeline-rank", "schedules.py: microbatches >= pp and M % pp == 0 for interleaving"),
    "recompute-args": ("--recompute-granularity", "transformer_config.py: recompute method/num_layers rules"),
    "recompute-layers": ("--recompute-num-layers", "transformer_block.py _checkpointed_forward: uniform steps n layers per chunk"),
    "recompute-module": ("--recompute-modules", "transformer_config.py: module preconditions"),
    "opg-needs-dist-opt": ("--overlap-param-gather", "arguments.py: needs --use-distributed-optimizer"),
    "opg-needs-ogr": ("--overlap-param-gather", "arguments.py: needs --overlap-grad-reduce"),
    "flex-backend": ("--moe-flex-dispatcher-backend", "transformer_config.py / token_dispatcher.py: flex needs deepep|hybridep"),
    "flex-needs-tp-ep": ("--moe-token-dispatcher-type", "token_dispatcher.py: flex requires expert TP x EP > 1"),
    "shared-overlap": ("--moe-shared-expert-overlap", "transformer_config.py: shared experts + alltoall dispatcher"),
    "a2a-overlap": ("--overlap-moe-expert-parallel-comm", "transformer_config.py: EP A2A overlap preconditions"),
    "delay-wgrad": ("--delay-wgrad-compute", "transformer_config.py: delay_wgrad_compute needs "
                                             "overlap_moe_expert_parallel_comm, and TE >= 2.10 with TE CUDA graphs; "
                                             "arguments.py: only with transformer_impl=transformer_engine"),
    "fp8-hardware": ("--fp8-recipe", "TE check_recipe_support: fp8 cc >= 8.9, blockwise cc >= 9.0 (CUDA >= 12.9), mxfp8 cc 10.x"),
    "fp8-delayed-recompute": ("--recompute-modules", "transformer_config.py: delayed scaling forbids moe_act/layernorm recompute"),
    "fp8-param": ("--fp8-param-gather", "transformer_config.py: fp8_param needs fp8; arguments.py: --fp8-param-gather needs "
                                        "--use-distributed-optimizer"),
    "token-drop": ("--moe-expert-capacity-factor", "transformer_config.py: moe_pad_expert_input_to_capacity needs "
                                                   "moe_expert_capacity_factor, and the DeepEP flex backend refuses it"),
    "fsdp": ("--use-megatron-fsdp", "optimizer/__init__.py + distrib_optimizer.py: Megatron FSDP's optimizer is the "
                                    "DistributedOptimizer (Megatron-Bridge: 'need use_distributed_optimizer=True')"),
    "dispatcher-needs-moe": ("--moe-token-dispatcher-type", "plan hygiene: dispatcher/grouped GEMM options only apply to MoE models"),
    "shared-expert-bias": ("--disable-bias-linear", "shared_experts.py: bias is not supported in the shared experts (add_bias_linear must be False)"),
    "fp8-gemm-dims": ("--fp8-recipe", "TE pytorch/utils.py assert_dim_for_fp8_exec: fp8 GEMM inputs need prod(leading dims) % 8, last dim % 16"),
    "fp8-blockwise-sp": ("--fp8-recipe", "TE float8_blockwise_tensor.py is_quantizable: the all-gathered input needs dims % 128"),
    "cuda-graph": ("--cuda-graph-scope", "transformer_config.py / arguments.py: CUDA graph impl and scope rules"),
    "cuda-graph-sync": ("--cuda-graph-scope", "token_dispatcher.py: dropless MoE copies token counts to the host; a graph cannot capture it"),
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
    if m.vocab_size % p.tp:  # the script pins the padded vocab to the model's own (tuner/emit/megatron.py)
        out.append(_r("vocab-div-tp", f"vocabulary {m.vocab_size} is not divisible by tp={p.tp}"))
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
        out.append(_r("policy-seq-le-max-pos",
                      f"moetune policy (Megatron would run it): seq {w.seq} exceeds the model's "
                      f"max_position_embeddings {m.max_position_embeddings}"))
    if m.moe_shared_expert_ffn and m.attention_bias:
        out.append(_r("shared-expert-bias", f"{m.name} has shared experts and biased linears; Megatron's "
                                            "shared experts need add_bias_linear=False"))
    dp = world // mp if world % mp == 0 else 0
    num_mb = 0
    if dp:
        if w.gbs % (p.mbs * dp):
            out.append(_r("gbs-div-mbs-dp", f"gbs {w.gbs} is not divisible by mbs*dp = {p.mbs}*{dp}"))
        else:
            num_mb = w.gbs // (p.mbs * dp)
    if p.vpp > 1 and p.pp == 1:
        out.append(_r("vpp-needs-pp", f"vpp={p.vpp} (interleaved schedule) needs pp > 1"))
    accounted = p.pp_embedding or p.pp_loss
    if p.pp_layout and (p.pp_first or p.pp_last or accounted):
        out.append(_r("layout-conflict", "an explicit pipeline layout cannot be combined with pp_first/pp_last "
                                         "or pp_embedding/pp_loss"))
    elif accounted and (p.pp_first or p.pp_last):
        out.append(_r("layout-conflict", "pp_embedding/pp_loss (the embedding/loss in the pipeline split) cannot "
                                         "be combined with pp_first/pp_last"))
    elif not (p.vpp > 1 and p.pp == 1):
        try:
            split = split_layers(m.num_layers, p.pp, p.vpp, p.pp_first, p.pp_last, p.pp_layout, p.pp_embedding,
                                 p.pp_loss)
        except LayoutError as e:
            out.append(_r("pp-layers", f"pipeline split: {e}"))
        else:
            # pipeline_parallel_layer_layout.py validate_layer_layout: "Number of mtp layers in layout
            # must match mtp_num_layers" (a layout naming none gets the model's from the emitter)
            if split.mtp and split.mtp != (m.mtp_num_layers or 0):
                out.append(_r("pp-layers", f"pipeline split: the layout places {split.mtp} MTP layer(s) (m), the "
                                           f"model has mtp_num_layers={m.mtp_num_layers or 0}"))
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
                overlap_grad_reduce=False, overlap_param_gather=False, fp8_param=False, shared_expert_overlap=False,
                a2a_overlap=False, delay_wgrad=False, grouped_gemm=False, permute_fusion=False, router_fusion=False,
                dispatcher="alltoall", flex_backend="", precision="bf16",
                cuda_graph_impl="none", cuda_graph_scope=())


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
        elif p.recompute_method == "uniform":
            # uniform checkpoints layers [i, i + n) for i = 0, n, 2n, ... < chunk: a chunk whose
            # size n does not divide indexes past its last layer. `block` recomputes
            # min(n, chunk) layers, so any n >= 1 runs there.
            bad = [c for c in _chunk_sizes(w, p) if c % p.recompute_layers]
            if bad:
                out.append(_r("recompute-layers",
                              f"uniform recompute of {p.recompute_layers} layers needs it to divide every "
                              f"pipeline chunk's layer count ({', '.join(map(str, bad))} is not a multiple)"))
    # --- optimizer and DP overlap (arguments.py) ---
    if p.fp8_param and not p.fp8:  # transformer_config.py: "fp8_param must be used together with fp8 mode."
        out.append(_r("fp8-param", "fp8_param (--fp8-param-gather) needs an fp8 precision recipe"))
    if p.fp8_param and not p.dist_opt:  # arguments.py validate_args
        out.append(_r("fp8-param", "fp8_param (--fp8-param-gather) needs the distributed optimizer"))
    if p.fsdp and not p.dist_opt:
        out.append(_r("fsdp", "fsdp (--use-megatron-fsdp) needs the distributed optimizer"))
    if p.overlap_param_gather and not p.dist_opt:
        out.append(_r("opg-needs-dist-opt", "overlap_param_gather needs the distributed optimizer"))
    if p.overlap_param_gather and not p.overlap_grad_reduce:
        out.append(_r("opg-needs-ogr", "overlap_param_gather needs overlap_grad_reduce"))
    # --- MoE kernels and dispatch ---
    if not m.is_moe and (p.dispatcher != "alltoall" or p.flex_backend or p.shared_expert_overlap or p.a2a_overlap):
        out.append(_r("dispatcher-needs-moe", f"plan hygiene: {m.name} is dense, so Megatron ignores dispatcher "
                                              "and MoE overlap options; the plan without them is the same run"))
    if p.dispatcher == "flex" and not p.flex_backend:
        out.append(_r("flex-backend", "the flex dispatcher needs flex_backend deepep or hybridep"))
    if p.flex_backend and p.dispatcher != "flex":
        out.append(_r("flex-backend", f"plan hygiene: Megatron ignores flex_backend={p.flex_backend} with "
                                      f"dispatcher={p.dispatcher}; the plan without it is the same run"))
    if p.dispatcher == "flex" and p.etp * p.ep <= 1:
        out.append(_r("flex-needs-tp-ep", "the flex dispatcher requires expert TP x EP > 1"))
    # --- token drop (transformer_config.py; the load-balancing types it allows are the only ones
    # specs.model_spec accepts, so that rule cannot fire here) ---
    if (p.capacity_factor or p.pad_to_capacity) and not m.is_moe:
        out.append(_r("token-drop", f"plan hygiene: {m.name} is dense, so Megatron ignores capacity_factor and "
                                    "pad_to_capacity; the plan without them is the same run"))
    if p.pad_to_capacity and not p.capacity_factor:
        out.append(_r("token-drop", "pad_to_capacity (--moe-pad-expert-input-to-capacity) needs a capacity_factor > 0"))
    if p.pad_to_capacity and p.dispatcher == "flex" and p.flex_backend == "deepep":
        out.append(_r("token-drop", "the DeepEP flex backend does not support pad_to_capacity "
                                    "(use alltoall or flex_backend=hybridep, or no padding)"))
    if p.shared_expert_overlap:
        if not m.moe_shared_expert_ffn:
            out.append(_r("shared-overlap", f"plan hygiene: {m.name} has no shared experts, so Megatron ignores "
                                            "shared-expert overlap; the plan without it is the same run"))
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
    if p.delay_wgrad:
        why = []
        if not p.a2a_overlap:  # transformer_config.py: "overlap_moe_expert_parallel_comm must be enabled ..."
            why.append("needs EP all-to-all overlap (a2a_overlap)")
        if not profile.transformer_engine:  # arguments.py validate_args
            why.append("needs TransformerEngine (transformer_impl=transformer_engine)")
        elif p.cuda_graph_impl == "transformer_engine" and not profile.te_at_least("2.10.0"):
            # transformer_config.py: "TE version >= 2.10.0 is required for delay_wgrad_compute with partial cuda graph"
            why.append(f"with TE CUDA graphs needs TE >= 2.10.0 (stack {profile.name} has TE "
                       f"{profile.transformer_engine}; {GPU_FULL_TE211.name} has it)")
        if why:
            out.append(_r("delay-wgrad", "delay_wgrad (--delay-wgrad-compute) " + "; ".join(why)))
    out += _cuda_graph_reasons(m, p)
    # --- precision vs hardware and stack ---
    hw = w.cluster
    if p.precision in ("fp8-tensorwise", "fp8-delayed", "fp8-blockwise") and not hw.fp8:
        out.append(_r("fp8-hardware", f"{p.precision} needs fp8 tensor cores; {hw.device_name} has none"))
    if p.precision == "fp8-blockwise" and hw.fp8 and not (is_hopper(hw) or hw.mxfp8):
        # TE 2.9 check_fp8_block_scaling_support: cc >= 9.0 and CUDA >= 12.9 (Hopper and Blackwell;
        # the gpu-full container ships CUDA 12.9+), so only Ada (cc 8.9) is out
        out.append(_r("fp8-hardware", f"fp8-blockwise needs compute capability >= 9.0; {hw.device_name} is below"))
    if p.fp8:
        dims, block_sp = _fp8_dim_problems(w, p)
        if dims:
            out.append(_r("fp8-gemm-dims", f"{p.precision}: TE fp8 GEMMs need leading dims % 8 and last dim % 16; "
                                           + "; ".join(dims)))
        if block_sp and p.precision == "fp8-blockwise":
            out.append(_r("fp8-blockwise-sp", "fp8-blockwise with sequence parallel all-gathers fp8 inputs in "
                                              "128-blocks; " + "; ".join(block_sp)))
    if p.precision == "mxfp8" and not hw.mxfp8:
        out.append(_r("fp8-hardware", f"mxfp8 needs Blackwell microscaling; {hw.device_name} lacks it"))
    # --- what the stack has ---
    if not profile.gpu and p.cuda_graph_impl != "none":
        out.append(_r("stack-cpu", f"CUDA graphs (cuda_graph_impl={p.cuda_graph_impl}) need CUDA"))
    if not profile.gpu:  # the CPU profile's own rules; those of the parallel tier were reported there
        neutral = _neutral(p)
        out += [_extra_reason(code, sentence) for code, sentence, pred in profile.extra
                if pred(p, m) and not pred(neutral, m)]
        return out
    missing = []
    if p.fp8 and not profile.transformer_engine:
        missing.append(f"{p.precision} needs TransformerEngine")
    if p.cuda_graph_impl == "transformer_engine" and not profile.transformer_engine:
        missing.append("cuda_graph_impl=transformer_engine needs TransformerEngine (make_graphed_callables)")
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
    for name, f in TE_FUSIONS.items():
        if getattr(p, name) and m.is_moe and not profile.te_at_least(f.min_te):
            missing.append(f"{name} ({f.flag}) needs TransformerEngine >= {f.min_te} ({f.kernels}; {f.without})")
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


def _cuda_graph_reasons(m, p: Plan) -> list[Reason]:
    """megatron-core 0.16.1's CUDA graph rules (transformer_config.py __post_init__, lines
    1716-1830 and 1898-1905; arguments.py validate_args), plus the dropless dispatcher's host sync."""
    impl, scope = p.cuda_graph_impl, set(p.cuda_graph_scope)
    if impl == "none":
        if scope:
            return [_r("cuda-graph", "plan hygiene: Megatron ignores cuda_graph_scope without a cuda_graph_impl; "
                                     "the plan without it is the same run")]
        return []
    why = []
    if impl == "transformer_engine" and "full_iteration" in scope:
        why.append("full_iteration needs cuda_graph_impl=local")
    if "full_iteration" in scope and len(scope) > 1:
        why.append("full_iteration is the whole iteration: no other scope beside it")
    if impl == "local" and scope and "full_iteration" not in scope:
        # arguments.py --cuda-graph-scope help: the partial scopes are only supported with TE
        why.append("partial scopes are only supported with cuda_graph_impl=transformer_engine")
    if impl == "local" and p.ep > 1:
        # arguments.py: local graphs with EP need --moe-pad-experts-for-cuda-graph-inference (inference only)
        why.append("cuda_graph_impl=local with ep > 1 is an inference-only setup in Megatron-LM (it needs "
                   "--moe-pad-experts-for-cuda-graph-inference)")
    if {"moe", "moe_router"} <= scope:
        why.append("moe and moe_router cannot both be graphed")
    if "moe_preprocess" in scope and "moe_router" not in scope and impl == "transformer_engine":
        why.append("moe_preprocess needs moe_router")
    if not m.is_moe and scope & {"moe", "moe_router", "moe_preprocess"}:
        why.append(f"moe scopes need a MoE model; {m.name} is dense")
    drop_pad = p.drop_and_pad
    if m.is_moe and "moe" in scope and not drop_pad:
        why.append("the moe scope needs drop-and-pad MoE (capacity_factor > 0 with pad_to_capacity=1)")
    if (m.is_moe and "moe_preprocess" in scope and p.dispatcher == "alltoall" and p.capacity_factor
            and not drop_pad):
        why.append("moe_preprocess cannot be graphed with token drop unpadded on the alltoall dispatcher (its "
                   "token counts go to the host)")
    if m.is_moe and "mlp" in scope and not m.num_dense_layers:
        why.append(f"the mlp scope graphs dense MLPs; every layer of {m.name} is MoE")
    if p.recompute == "full" and scope != {"full_iteration"}:
        why.append("full recompute is only supported with the full_iteration graph")
    if (p.recompute == "selective" and impl == "transformer_engine" and "moe" in p.recompute_modules
            and "moe_router" in scope):
        why.append("moe recompute cannot run with the moe_router graph")
    if p.recompute == "selective":
        # the emitted script keeps Megatron-LM's default attention and hidden dropout (0.1), which a
        # graphed recompute cannot draw (transformer_config.py "Graphed recompute module doesn't
        # accept random number")
        mods = set(p.recompute_modules or ("core_attn",))
        whole = not scope or "full_iteration" in scope
        if "core_attn" in mods and (whole or "attn" in scope):
            why.append("core_attn recompute inside an attention graph cannot draw its dropout")
        if ("mlp" in mods and (whole or "mlp" in scope)) or ("moe" in mods and (whole or "moe" in scope)):
            why.append("mlp/moe recompute inside an MLP/MoE graph cannot draw its dropout")
    if p.a2a_overlap and (impl != "transformer_engine" or scope & {"moe", "mlp"}):
        why.append("EP all-to-all overlap needs cuda_graph_impl=transformer_engine without the moe/mlp scopes")
    out = [_r("cuda-graph", "CUDA graphs: " + "; ".join(why))] if why else []
    # drop-and-pad on the alltoall or HybridEP dispatcher keeps every size on the host: nothing to sync
    sync_free = drop_pad and p.dispatch in DROP_PAD_HOST_SIZED
    if m.is_moe and (not scope or "full_iteration" in scope) and not sync_free:
        out.append(_r("cuda-graph-sync", f"CUDA graphs of {'whole layers' if not scope else 'the whole iteration'} "
                                         "capture the dropless MoE dispatcher, whose token counts go to the host "
                                         "(a device-to-host sync a graph cannot hold; the sync-free dropless dispatch "
                                         "that NVIDIA's newer full-iteration recipes use, moe_expert_rank_capacity_factor "
                                         "with moe_paged_stash, is not in megatron-core 0.16.1; drop-and-pad, "
                                         "capacity_factor > 0 with pad_to_capacity=1 on the alltoall or HybridEP "
                                         "dispatcher, has no such sync)"))
    if (m.is_moe and "moe_preprocess" in scope and not p.permute_fusion
            and not (p.dispatcher == "flex" and p.flex_backend == "hybridep")):
        # moe_layer.py: the moe_preprocess graph holds dispatch_preprocess, which permutes the tokens;
        # unfused (moe_utils.permute) that is masked_select, whose output size the host must read
        out.append(_r("cuda-graph-sync", "the moe_preprocess CUDA graph captures the token permutation, and the "
                                         "unfused one (permute_fusion=0: masked_select) syncs with the host, which a "
                                         "graph cannot hold: permute_fusion=1 or no moe_preprocess scope"))
    return out


def _chunk_sizes(w: Workload, p: Plan) -> tuple[int, ...]:
    """The distinct decoder-layer counts of the non-empty pipeline chunks (() if the split fails)."""
    try:
        split = split_layers(w.model.num_layers, p.pp, p.vpp, p.pp_first, p.pp_last, p.pp_layout,
                             p.pp_embedding, p.pp_loss)
    except LayoutError:
        return ()
    return tuple(sorted({len(c) for rank in split.chunks for c in rank if len(c)}))


# _fp8_dim_problems by (model, seq, mbs, tp, cp): the enumerator asks it for every schedule/kernel
# option of a parallel point, and the answer is the same for all of them
_FP8_DIMS: dict = {}


def _fp8_dim_problems(w: Workload, p: Plan) -> tuple[tuple[str, ...], tuple[str, ...]]:
    key = (id(w.model), w.seq, p.mbs, p.tp, p.cp)
    hit = _FP8_DIMS.get(key)
    if hit is not None and hit[0] is w.model:  # the model object is held, so its id is not reused
        return hit[1]
    if len(_FP8_DIMS) > 4096:
        _FP8_DIMS.clear()
    out = _fp8_dim_problems_uncached(w, p)
    _FP8_DIMS[key] = (w.model, out)
    return out


def _fp8_dim_problems_uncached(w: Workload, p: Plan) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(fp8 GEMM shapes that break TE's assert_dim_for_fp8_exec, shapes that break blockwise
    all-gather under sequence parallel). Reads seq, mbs, tp, cp and the model only.

    TE Linear / LayerNormLinear / LayerNormMLP assert on each fp8 GEMM's input and weight:
    prod(shape[:-1]) % 8 and shape[-1] % 16. Megatron passes them [tokens, in] inputs and
    [out/tp, in] or [out, in/tp] weights. Column-parallel inputs are the sequence-parallel shard
    (seq/cp/tp * mbs tokens), row-parallel inputs the full seq/cp * mbs. The grouped expert GEMMs
    (TE GroupedLinear) do not assert, and the output layer is not an fp8 module."""
    m, tp = w.model, p.tp
    tok_col = w.seq * p.mbs // (p.cp * tp)
    tok_row = w.seq * p.mbs // p.cp
    gemms = []  # (name, in_features per rank, out_features per rank)
    if m.mla:
        q_out = m.num_attention_heads * (m.qk_head_dim + m.qk_pos_emb_head_dim)
        if m.q_lora_rank:
            gemms += [("linear_q_down_proj", m.hidden_size, m.q_lora_rank),
                      ("linear_q_up_proj", m.q_lora_rank, q_out // tp)]
        else:
            gemms.append(("linear_q_proj", m.hidden_size, q_out // tp))
        gemms += [("linear_kv_down_proj", m.hidden_size, m.kv_lora_rank + m.qk_pos_emb_head_dim),
                  ("linear_kv_up_proj", m.kv_lora_rank,
                   m.num_attention_heads * (m.qk_head_dim + m.v_head_dim) // tp),
                  ("linear_proj", m.num_attention_heads * m.v_head_dim // tp, m.hidden_size)]
    else:
        qkv = (m.num_attention_heads + 2 * m.query_groups) * m.head_dim
        gemms += [("linear_qkv", m.hidden_size, qkv // tp),
                  ("linear_proj", m.num_attention_heads * m.head_dim // tp, m.hidden_size)]
    glu = 2 if m.gated_linear_unit else 1
    for name, width, present in (("dense fc", m.ffn_hidden_size, m.num_dense_layers),
                                 ("shared-expert fc", m.moe_shared_expert_ffn, m.moe_shared_expert_ffn)):
        if present and width:
            gemms += [(f"{name}1", m.hidden_size, glu * width // tp), (f"{name}2", width // tp, m.hidden_size)]
    bad = []
    for name, k, n in gemms:
        row = name in ("linear_proj", "dense fc2", "shared-expert fc2")
        tokens = tok_row if row else tok_col
        if tokens % 8 or k % 16 or n % 8:
            bad.append(f"{name} input [{tokens}, {k}] x weight [{n}, {k}]")
    block = []
    if tp > 1 and (m.hidden_size % 128 or tok_col % 128):
        block.append(f"sequence-parallel input [{tok_col}, {m.hidden_size}] is not a multiple of 128 in both dims")
    return tuple(bad), tuple(block)


def schedule_context(w: Workload, p: Plan) -> tuple:
    """Everything check_schedule_kernels reads from the parallel tier: plans that agree on this
    key and on the schedule/kernel fields get the same verdict (the enumerator caches on it)."""
    return (p.pp > 1, p.vpp > 1, p.ep > 1, p.etp * p.ep > 1, _chunk_sizes(w, p), _fp8_dim_problems(w, p))


def is_realizable(workload: Workload, plan: Plan, profile: StackProfile) -> bool:
    return not check(workload, plan, profile)
