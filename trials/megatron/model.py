"""Build megatron-core GPT MoE model chunks from a ModelSpec + Plan (local, non-TE layer spec).

Everything here runs inside a trial worker after `parallel_state.initialize_model_parallel`.
Weights are initialised deterministically from each parameter's *global* name (global layer
number, global expert index, full tensor sliced to the TP shard), so every plan of the same model
starts from the same weights as the unsharded single-process model: losses are comparable across
plans and gradients can be checked against a single-process reference.
"""
from __future__ import annotations

import re
import zlib

import torch

INIT_STD = 0.02


def transformer_config(model, plan, *, on_gpu: bool, seq: int, overrides: dict | None = None):
    """The TransformerConfig for this model and plan. Raises megatron's own validation errors
    (AssertionError / ValueError from __post_init__), which the worker reports as stack-rejected."""
    from megatron.core.transformer.transformer_config import TransformerConfig

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
            moe_shared_expert_overlap=plan.shared_expert_overlap,
            overlap_moe_expert_parallel_comm=plan.a2a_overlap,
        )
        if model.moe_router_num_groups:
            kw.update(moe_router_num_groups=model.moe_router_num_groups,
                      moe_router_group_topk=model.moe_router_group_topk)
        if model.moe_shared_expert_count:
            kw["moe_shared_expert_intermediate_size"] = model.moe_shared_expert_ffn
        if plan.dispatcher == "flex":
            kw["moe_flex_dispatcher_backend"] = plan.flex_backend or "deepep"
    if plan.fp8:
        kw.update(fp8="hybrid", fp8_recipe=plan.precision.split("-", 1)[-1])
    kw.update(overrides or {})
    return TransformerConfig(**kw)


def build_chunks(model, config, *, on_gpu: bool) -> list:
    """One GPTModel per virtual pipeline stage owned by this rank (one when vpp == 1)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    vpp = config.virtual_pipeline_model_parallel_size
    chunks = []
    for vp_stage in range(vpp or 1):
        stage = vp_stage if vpp else None
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, vp_stage=stage,
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


def global_param_names(chunk) -> dict:
    """{local parameter name: global name} — global layer number and global expert index, so the
    same name denotes the same logical tensor in every plan."""
    from megatron.core import parallel_state as ps

    layers = getattr(getattr(chunk, "decoder", None), "layers", [])
    ep_rank = ps.get_expert_model_parallel_rank()
    out = {}
    for name, _ in chunk.named_parameters():
        g = name
        m = _LAYER.search(g)
        if m:
            glob = layers[int(m.group(1))].layer_number - 1
            g = g[:m.start(1)] + str(glob) + g[m.end(1):]
        m = _EXPERT.search(g)
        if m:
            experts = _local_expert_count(chunk, name)
            g = g[:m.start(1)] + str(ep_rank * experts + int(m.group(1))) + g[m.end(1):]
        out[name] = g
    return out


def _local_expert_count(chunk, name):
    mod = chunk
    parts = name.split(".")
    for p in parts:
        if p == "local_experts":
            return len(mod.local_experts)
        mod = getattr(mod, p) if not p.isdigit() else mod[int(p)]
    return 1


def _tp_coords(param, global_name: str):
    """(rank, size, partition_dim) of a TP-sharded parameter, else None. Expert weights are
    recognised by name and sharded over the expert-tensor-parallel group (their
    `tensor_model_parallel` attribute is not reliable in 0.16 SequentialMLP)."""
    from megatron.core import parallel_state as ps
    if ".experts." in global_name:
        size = ps.get_expert_tensor_parallel_world_size()
        if size == 1:
            return None
        dim = getattr(param, "partition_dim", None)
        if dim is None or not getattr(param, "tensor_model_parallel", False):
            dim = 0 if "linear_fc1" in global_name else 1
        return ps.get_expert_tensor_parallel_rank(), size, dim
    if not getattr(param, "tensor_model_parallel", False):
        return None
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(), param.partition_dim


def deterministic_init(chunks, seed: int = 1234) -> None:
    """Overwrite every parameter with values drawn from a generator seeded by its global name;
    TP-sharded parameters take their slice of the full tensor. Norm weights 1, biases 0."""
    with torch.no_grad():
        for chunk in chunks:
            names = global_param_names(chunk)
            for local, p in chunk.named_parameters():
                g = names[local]
                if p.dim() == 1:
                    p.fill_(0.0 if g.endswith("bias") else 1.0)  # norm weights 1, biases 0
                    continue
                shape = list(p.shape)
                tp = _tp_coords(p, g)
                if tp and tp[1] > 1:
                    shape[tp[2]] *= tp[1]
                gen = torch.Generator().manual_seed((zlib.crc32(g.encode()) + seed) % (2**63))
                full = torch.randn(shape, generator=gen, dtype=torch.float32) * INIT_STD
                if tp and tp[1] > 1:
                    if g.endswith("linear_fc1.weight") and chunk.config.gated_linear_unit:
                        # SwiGLU fc1 is [gate; up]; a TP shard holds [gate_r; up_r].
                        full = torch.cat([h.chunk(tp[1], dim=0)[tp[0]] for h in full.chunk(2, dim=0)])
                    else:
                        full = full.chunk(tp[1], dim=tp[2])[tp[0]]
                p.copy_(full.to(p.dtype))
