"""`ModelSpec` -> Hugging Face `config.json` (the inverse of specs/hf_config.py, the reader).

A serving engine reads a model's shape from its config.json: SGLang's argument resolver and a
`--load-format dummy` launch need nothing else. The architecture is chosen from the spec's
features (MLA -> DeepSeek-V3, attention sinks -> GPT-OSS, a Mixtral name -> Mixtral, otherwise
Qwen3-MoE, whose `mlp_only_layers` carries any dense layers); `arch=` overrides the choice.
`hf_dict_to_spec(model_to_hf_config(spec))` gives back the spec's shape (tests/test_serve_rules.py).

This is the one writer of a model's config.json: `emit sglang` and the serving trials
(trials/serving/model_dir.py adds the tokenizer) write the same file for the same spec, so an
emitted launch serves the model a trial measured. `unrepresented` names what a spec has that its
architecture's config cannot carry (a trial refuses such a spec: it would measure another model).
"""
from __future__ import annotations

import json
from pathlib import Path

from specs.errors import SpecError
from specs.fileio import write_atomic
from specs.model_spec import ModelSpec

ARCHS = ("DeepseekV3ForCausalLM", "GptOssForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM")


def pick_architecture(m: ModelSpec) -> str:
    if m.mla:
        return "DeepseekV3ForCausalLM"
    if m.attention_sinks or m.name.startswith("gpt-oss"):
        return "GptOssForCausalLM"
    if "mixtral" in m.name.lower():
        return "MixtralForCausalLM"
    return "Qwen3MoeForCausalLM"


def unrepresented(m: ModelSpec, arch: str | None = None) -> list[str]:
    """The features of `m` that the config.json of `arch` (default: `pick_architecture`) drops:
    only DeepSeek-V3's config carries shared experts and a sigmoid router."""
    if (arch or pick_architecture(m)) == "DeepseekV3ForCausalLM":
        return []
    why = []
    if m.moe_shared_expert_count:
        why.append("shared experts")
    if m.moe_router_score_function != "softmax":
        why.append(f"{m.moe_router_score_function} router")
    return why


def model_to_hf_config(m: ModelSpec, arch: str | None = None) -> dict:
    arch = arch or pick_architecture(m)
    if arch not in ARCHS:
        raise SpecError(f"cannot write a config.json for architecture {arch!r}; one of {', '.join(ARCHS)}")
    if not m.is_moe and arch != "Qwen3MoeForCausalLM":
        raise SpecError(f"{m.name}: {arch} needs experts (num_experts > 0)")
    kv = m.query_groups
    moe = list(m.moe_layers) if m.moe_layers else [m.num_experts > 0] * m.num_layers
    base = {
        "architectures": [arch],
        "hidden_size": m.hidden_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings or m.seq_length,
        "tie_word_embeddings": m.tie_embeddings,
        "attention_bias": m.attention_bias,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    if arch == "DeepseekV3ForCausalLM":
        first_dense = next((i for i, is_moe in enumerate(moe) if is_moe), m.num_layers)
        n_shared = m.moe_shared_expert_count
        base.update({
            "model_type": "deepseek_v3",
            "intermediate_size": m.ffn_hidden_size,
            "moe_intermediate_size": m.moe_ffn_hidden_size,
            "n_routed_experts": m.num_experts,
            "n_shared_experts": n_shared,
            "num_experts_per_tok": m.moe_router_topk,
            "first_k_dense_replace": first_dense,
            "moe_layer_freq": 1,
            "scoring_func": m.moe_router_score_function,
            "topk_method": "noaux_tc" if m.moe_router_score_function == "sigmoid" else "greedy",
            "n_group": m.moe_router_num_groups or 1,
            "topk_group": m.moe_router_group_topk or 1,
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.5,
            "num_key_value_heads": m.num_attention_heads,
            "q_lora_rank": m.q_lora_rank or None,
            "kv_lora_rank": m.kv_lora_rank,
            "qk_nope_head_dim": m.qk_head_dim,
            "qk_rope_head_dim": m.qk_pos_emb_head_dim,
            "v_head_dim": m.v_head_dim,
            "num_nextn_predict_layers": m.mtp_num_layers,
            "rope_theta": 10000,
        })
    elif arch == "GptOssForCausalLM":
        base.update({
            "model_type": "gpt_oss",
            "num_key_value_heads": kv,
            "head_dim": m.head_dim,
            "intermediate_size": m.moe_ffn_hidden_size,
            "num_local_experts": m.num_experts,
            "num_experts_per_tok": m.moe_router_topk,
            "experts_per_token": m.moe_router_topk,
            "sliding_window": m.window_size or 128,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(m.num_layers)],
            "rope_theta": 150000,
        })
    elif arch == "MixtralForCausalLM":
        base.update({
            "model_type": "mixtral",
            "num_key_value_heads": kv,
            "head_dim": m.head_dim,
            "intermediate_size": m.moe_ffn_hidden_size,
            "num_local_experts": m.num_experts,
            "num_experts_per_tok": m.moe_router_topk,
            "rope_theta": 1e6,
        })
    else:
        base.update({
            "model_type": "qwen3_moe",
            "num_key_value_heads": kv,
            "head_dim": m.head_dim,
            "intermediate_size": m.ffn_hidden_size,
            "moe_intermediate_size": m.moe_ffn_hidden_size,
            "num_experts": m.num_experts,
            "num_experts_per_tok": m.moe_router_topk,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i, is_moe in enumerate(moe) if not is_moe],
            "norm_topk_prob": True,
            "rope_theta": 1e6,
            # the rest of transformers' Qwen3MoeConfig a serving engine reads (inference: no router
            # loss is computed, but the coefficient is the model's, so the file loads back as it was)
            "output_router_logits": False,
            "router_aux_loss_coef": m.moe_aux_loss_coeff,
            "use_sliding_window": False,
            "use_cache": True,
        })
    return base


def write_model_dir(m: ModelSpec, directory, arch: str | None = None) -> Path:
    """A model directory without weights (config.json, generation_config.json) for a resolver or a
    `--load-format dummy` launch; returns the directory."""
    d = Path(directory)
    write_atomic(d / "config.json", json.dumps(model_to_hf_config(m, arch), indent=1, sort_keys=True) + "\n")
    write_atomic(d / "generation_config.json", json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")
    return d
