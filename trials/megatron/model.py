"""Build megatron-core GPT MoE model chunks from a ModelSpec + Plan, with the layer spec the
emitted script would run (TE spec when TransformerEngine is installed, local spec otherwise;
`trials.megatron.spec_choice` decides and refuses what the installed stack cannot build).

Everything here runs inside a trial worker after `parallel_state.initialize_model_parallel`.
Weights are initialised deterministically from each parameter's *global* name (global layer
number, global expert index, full tensor sliced to the TP shard), so every plan of the same model
starts from the same weights as the unsharded single-process model: losses are comparable across
plans and gradients can be checked against a single-process reference. Grouped expert weights
(TE `linear_fc1.weight<i>`, legacy `GroupedMLP.weight1/weight2`) are initialised per expert under
the SequentialMLP name of that expert, so every implementation and every EP rank gets the same
logical experts.
"""
from __future__ import annotations

import re
import zlib

import torch

INIT_STD = 0.02


def transformer_config(model, plan, *, on_gpu: bool, seq: int, overrides: dict | None = None,
                       use_te: bool = False):
    """The TransformerConfig for this model and plan. Raises megatron's own validation errors
    (AssertionError / ValueError from __post_init__), which the worker reports as stack-rejected.

    use_te: the TE spec is built (spec_choice); then the kernel fusions Megatron-LM's arguments
    switch on by default (the emitted script does not turn them off) are switched on here too."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from specs.stack import FP8_RECIPES, HYBRIDEP_NUM_SMS

    dtype = torch.bfloat16 if on_gpu else torch.float32  # CPU: fp32 (see cpu_support)
    kw = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.query_groups,
        ffn_hidden_size=model.ffn_hidden_size,
        kv_channels=model.head_dim,
        gated_linear_unit=model.gated_linear_unit,
        activation_func=torch.nn.functional.silu if model.gated_linear_unit else torch.nn.functional.gelu,
        normalization="RMSNorm",
        add_bias_linear=model.attention_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=INIT_STD,
        use_cpu_initialization=True,
        perform_initialization=True,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        # parallelism
        tensor_model_parallel_size=plan.tp,
        context_parallel_size=plan.cp,
        pipeline_model_parallel_size=plan.pp,
        virtual_pipeline_model_parallel_size=plan.vpp if plan.vpp > 1 else None,
        expert_model_parallel_size=plan.ep,
        expert_tensor_parallel_size=plan.etp,
        sequence_parallel=plan.tp > 1,  # required by Megatron for MoE with TP>1
        num_layers_in_first_pipeline_stage=plan.pp_first or None,
        num_layers_in_last_pipeline_stage=plan.pp_last or None,
        account_for_embedding_in_pipeline_split=plan.pp_embedding,
        account_for_loss_in_pipeline_split=plan.pp_loss,
        # Interleaved 1F1B at PP=2 with batched p2p mixes send/recv directions in one batch and
        # deadlocks or corrupts (Megatron-LM issues #750, #1450): use overlapped, unbatched p2p
        # for every interleaved run.
        overlap_p2p_comm=plan.vpp > 1,
        batch_p2p_comm=plan.vpp == 1,
        # Pseudo-deallocation swaps a sent activation's storage right after isend. NCCL orders
        # that on the stream; gloo's isend is asynchronous on a host thread, so with the
        # overlapped p2p of interleaved schedules the peer received a corrupted tensor
        # (gradients of PP=2,VPP=2 off by 70x vs. unpipelined). On CPU keep the outputs.
        deallocate_pipeline_outputs=on_gpu,
        # recompute
        recompute_granularity=None if plan.recompute == "none" else plan.recompute,
    )
    if plan.pp_layout:
        kw["pipeline_model_parallel_layout"] = plan.pp_layout
    if plan.recompute == "full":
        kw["recompute_method"] = plan.recompute_method or "uniform"
        kw["recompute_num_layers"] = plan.recompute_layers or 1
    elif plan.recompute == "selective" and plan.recompute_modules:
        kw["recompute_modules"] = list(plan.recompute_modules)
    if model.is_moe:
        kw.update(
            num_moe_experts=model.num_experts,
            moe_router_topk=model.moe_router_topk,
            moe_ffn_hidden_size=model.moe_ffn_hidden_size,
            moe_layer_freq=[int(x) for x in model.moe_layers],
            moe_router_score_function=model.moe_router_score_function,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-2,
            moe_token_dispatcher_type=plan.dispatcher,
            moe_grouped_gemm=plan.grouped_gemm,
            # (a fused plan on a stack without TE is refused before this is built: spec_choice)
            moe_permute_fusion=plan.permute_fusion and use_te,
            moe_router_fusion=plan.router_fusion and use_te,
            moe_shared_expert_overlap=plan.shared_expert_overlap,
            overlap_moe_expert_parallel_comm=plan.a2a_overlap,
            delay_wgrad_compute=plan.delay_wgrad,
            moe_expert_capacity_factor=plan.capacity_factor or None,  # 0 = dropless (None)
            moe_pad_expert_input_to_capacity=plan.pad_to_capacity,
        )
        if model.moe_router_num_groups:
            kw.update(moe_router_num_groups=model.moe_router_num_groups,
                      moe_router_group_topk=model.moe_router_group_topk)
        if model.moe_shared_expert_count:
            kw["moe_shared_expert_intermediate_size"] = model.moe_shared_expert_ffn
        if plan.dispatcher == "flex":
            kw["moe_flex_dispatcher_backend"] = plan.flex_backend or "deepep"
            if kw["moe_flex_dispatcher_backend"] == "hybridep":
                kw["moe_hybridep_num_sms"] = HYBRIDEP_NUM_SMS  # as the emitted script
    if plan.fp8:
        # the --fp8-format/--fp8-recipe pair the emitted script passes for this precision
        fmt, recipe = FP8_RECIPES[plan.precision]
        kw.update(fp8=fmt, fp8_recipe=recipe)
    if use_te:
        # Megatron-LM defaults (arguments.py: --no-bias-swiglu-fusion, --no-rope-fusion,
        # --no-masked-softmax-fusion, --no-gradient-accumulation-fusion switch them off; the
        # emitted script passes none of them). TE provides the fused wgrad accumulation.
        kw.update(apply_rope_fusion=True, masked_softmax_fusion=True, gradient_accumulation_fusion=True,
                  bias_activation_fusion=model.gated_linear_unit)
    for k, v in (overrides or {}).items():
        # overrides travel as JSON: dtype fields are given by name ("float32", "bfloat16")
        kw[k] = getattr(torch, v) if k.endswith("_dtype") and isinstance(v, str) else v
    return TransformerConfig(**kw)


def build_chunks(model, config, *, on_gpu: bool, use_te: bool = False) -> list:
    """One GPTModel per virtual pipeline stage owned by this rank (one when vpp == 1), with
    the decoder block spec `pretrain_gpt.py` builds for `--transformer-impl transformer_engine`
    (use_te) or `local`."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    vpp = config.virtual_pipeline_model_parallel_size
    chunks = []
    for vp_stage in range(vpp or 1):
        stage = vp_stage if vpp else None
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=use_te, vp_stage=stage,
                                          normalization="RMSNorm")
        m = GPTModel(
            config=config,
            transformer_layer_spec=spec,
            vocab_size=model.vocab_size,
            max_sequence_length=max(model.max_position_embeddings, model.seq_length),
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            share_embeddings_and_output_weights=model.tie_embeddings,
            position_embedding_type="rope",
            vp_stage=stage,
        )
        if on_gpu:
            m.cuda(torch.cuda.current_device())
        chunks.append(m)
    return chunks


# ---- global names and deterministic init --------------------------------------------------------
_LAYER = re.compile(r"decoder\.layers\.(\d+)\.")
_EXPERT = re.compile(r"local_experts\.(\d+)\.")
# TEGroupedMLP: one TE GroupedLinear per fc, one weight<i> per local expert, each [out, in] like
# the SequentialMLP expert's ColumnParallel/RowParallel weight.
_TE_GROUPED = re.compile(r"experts\.(linear_fc[12])\.weight(\d+)$")
# Legacy GroupedMLP: all local experts in one tensor; forward views weight1 as [E, hidden, out]
# and weight2 as [E, in, hidden] (experts.py), i.e. each expert's matrix transposed.
_LEGACY_GROUPED = re.compile(r"experts\.weight([12])$")


def expert_views(name: str, param, num_local_experts: int, hidden_size: int) -> list:
    """[(local SequentialMLP-style name, tensor view)] for one parameter: one entry per local
    expert for grouped expert weights (views share storage with `param`, in SequentialMLP's
    [out, in] layout), else [(name, param)].

    name: the local parameter name; num_local_experts, hidden_size: of its experts module."""
    m = _TE_GROUPED.search(name)
    if m:
        prefix = name[:m.start()]
        return [(f"{prefix}experts.local_experts.{m.group(2)}.{m.group(1)}.weight", param)]
    m = _LEGACY_GROUPED.search(name)
    if m:
        prefix = name[:m.start()]
        if m.group(1) == "1":
            per = param.view(num_local_experts, hidden_size, -1)
            fc = "linear_fc1"
        else:
            per = param.view(num_local_experts, -1, hidden_size)
            fc = "linear_fc2"
        return [(f"{prefix}experts.local_experts.{e}.{fc}.weight", per[e].t()) for e in range(num_local_experts)]
    return [(name, param)]


def globalize(name: str, layer_numbers, ep_rank: int, num_local_experts: int) -> str:
    """The global name of a local (SequentialMLP-style) parameter name: global layer number
    (layer_numbers[local index] is megatron's 1-based layer_number) and global expert index
    ep_rank * num_local_experts + local index."""
    g = name
    m = _LAYER.search(g)
    if m:
        glob = layer_numbers[int(m.group(1))] - 1
        g = g[:m.start(1)] + str(glob) + g[m.end(1):]
    m = _EXPERT.search(g)
    if m:
        g = g[:m.start(1)] + str(ep_rank * num_local_experts + int(m.group(1))) + g[m.end(1):]
    return g


def _experts_module(chunk, name):
    """The experts module (SequentialMLP / GroupedMLP / TEGroupedMLP) a parameter belongs to."""
    mod = chunk
    for p in name.split("."):
        mod = mod[int(p)] if p.isdigit() else getattr(mod, p, None)
        if mod is None:
            return None
        if p == "experts":
            return mod
    return None


def _num_local_experts(chunk, name) -> int:
    mod = _experts_module(chunk, name)
    if mod is None:
        return 1
    n = getattr(mod, "num_local_experts", None)
    return int(n) if n else len(getattr(mod, "local_experts", [])) or 1


def _logical_tensors(chunk):
    """[(local param name, param, [(global name, view)])] for every parameter of `chunk`."""
    from megatron.core import parallel_state as ps

    layers = getattr(getattr(chunk, "decoder", None), "layers", [])
    numbers = [layer.layer_number for layer in layers]
    ep_rank = ps.get_expert_model_parallel_rank()
    hidden = chunk.config.hidden_size
    out = []
    for name, p in chunk.named_parameters():
        n = _num_local_experts(chunk, name) if ".experts." in name else 1
        views = [(globalize(local, numbers, ep_rank, n), v) for local, v in expert_views(name, p, n, hidden)]
        out.append((name, p, views))
    return out


def global_param_names(chunk) -> dict:
    """{local parameter name: global name} — global layer number and global expert index, so the
    same name denotes the same logical tensor in every plan. A grouped expert tensor holding
    several experts is named by its first expert's global name plus `+<count>`."""
    out = {}
    for name, _p, views in _logical_tensors(chunk):
        out[name] = views[0][0] if len(views) == 1 else f"{views[0][0]}+{len(views)}"
    return out


def _tp_coords(param, global_name: str):
    """(rank, size, partition_dim) of a TP-sharded tensor in its [out, in] layout, else None.
    Expert weights are recognised by name and sharded over the expert-tensor-parallel group
    (fc1 column-parallel: dim 0; fc2 row-parallel: dim 1). Their `tensor_model_parallel`
    attribute is not reliable in 0.16 SequentialMLP, and grouped tensors hold other layouts."""
    from megatron.core import parallel_state as ps
    if ".experts." in global_name:
        size = ps.get_expert_tensor_parallel_world_size()
        if size == 1:
            return None
        return ps.get_expert_tensor_parallel_rank(), size, 0 if "linear_fc1" in global_name else 1
    if not getattr(param, "tensor_model_parallel", False):
        return None
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(), param.partition_dim


def init_values(global_name: str, shape, seed: int, tp=None, gated_linear_unit: bool = False):
    """The deterministic values of one logical tensor (local shard `shape`, TP coords `tp` =
    (rank, size, dim) or None): drawn in full from a generator seeded by `global_name`, then
    sliced to the shard. SwiGLU fc1 is [gate; up]; a TP shard holds [gate_r; up_r]."""
    shape = list(shape)
    if tp and tp[1] > 1:
        shape[tp[2]] *= tp[1]
    gen = torch.Generator().manual_seed((zlib.crc32(global_name.encode()) + seed) % (2**63))
    full = torch.randn(shape, generator=gen, dtype=torch.float32) * INIT_STD
    if tp and tp[1] > 1:
        if global_name.endswith("linear_fc1.weight") and gated_linear_unit:
            full = torch.cat([h.chunk(tp[1], dim=0)[tp[0]] for h in full.chunk(2, dim=0)])
        else:
            full = full.chunk(tp[1], dim=tp[2])[tp[0]]
    return full


def deterministic_init(chunks, seed: int = 1234) -> None:
    """Overwrite every parameter with values drawn from a generator seeded by its global name;
    TP-sharded parameters take their slice of the full tensor; grouped expert weights are
    filled expert by expert (see expert_views). Norm weights 1, biases 0."""
    with torch.no_grad():
        for chunk in chunks:
            glu = chunk.config.gated_linear_unit
            for _local, p, views in _logical_tensors(chunk):
                for g, v in views:
                    if v.dim() == 1:
                        v.fill_(0.0 if g.rstrip("0123456789").endswith("bias") else 1.0)
                        continue
                    v.copy_(init_values(g, v.shape, seed, _tp_coords(p, g), glu).to(v.dtype))
