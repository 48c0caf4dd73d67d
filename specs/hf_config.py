"""Hugging Face `config.json` -> `ModelSpec`.

Supported architectures: MixtralForCausalLM, PhiMoEForCausalLM, OlmoeForCausalLM,
Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM (also
Kimi-K2, which ships that architecture), GptOssForCausalLM. A multimodal wrapper whose text model
sits under `text_config` is unwrapped.

Normalisations (shared with the YAML presets so both load to equal specs):
- num_query_groups = num_key_value_heads, or 0 when it equals the head count (MHA) or for MLA.
- kv_channels = head_dim only when it differs from hidden_size // num_attention_heads.
- tie_word_embeddings defaults to false (the default of every supported config class).
- mtp_num_layers = num_nextn_predict_layers (DeepSeek-V3: 1).
- Sliding window: window_size = sliding_window (tokens a query sees, itself included) when some
  layers use it (gpt-oss layer_types); window_attn_skip_freq = the period of full-attention layers.
- Numerics read for the emitted script: rope_theta, rms_norm_eps, QK norm (Qwen3, OLMoE; MLA's
  latent norms), YaRN rope_scaling, routed_scaling_factor, norm_topk_prob (-> pre-softmax),
  noaux_tc (-> expert bias), seq_aux / aux_loss_alpha / router_aux_loss_coef.
"""
from __future__ import annotations

import json
from pathlib import Path

from specs.errors import SpecError
from specs.inputs import as_bool, as_float, as_int, read_text
from specs.model_spec import ModelSpec, from_dict

_ARCH_BY_MODEL_TYPE = {
    "mixtral": "MixtralForCausalLM",
    "phimoe": "PhiMoEForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
_ALIASES = {"PhimoeForCausalLM": "PhiMoEForCausalLM"}
SUPPORTED = sorted(set(_ARCH_BY_MODEL_TYPE.values()))


class _Cfg:
    """Key access that raises a one-line SpecError naming the file and the missing key."""

    def __init__(self, d: dict, where: str, arch: str):
        self.d, self.where, self.arch = d, where, arch

    def req(self, *keys):
        for k in keys:
            if self.d.get(k) is not None:
                return self.d[k]
        raise SpecError(f"{self.where}: {self.arch} config is missing required key "
                        f"{' or '.join(repr(k) for k in keys)}")

    def get(self, key, default=None):
        v = self.d.get(key)
        return default if v is None else v

    def int(self, *keys) -> int:
        return as_int(self.req(*keys), f"key {keys[0]!r}", self.where, lo=0)

    # optional keys, type-checked (a config.json written by hand can hold "eight" or NaN)
    def opt_int(self, key, default: int = 0) -> int:
        return as_int(self.get(key, default), f"key {key!r}", self.where, lo=0)

    def opt_float(self, key, default: float) -> float:
        return as_float(self.get(key, default), f"key {key!r}", self.where)

    def opt_bool(self, key, default: bool) -> bool:
        return as_bool(self.get(key, default), f"key {key!r}", self.where)

    def opt_map(self, key) -> "_Cfg":
        v = self.get(key, {})
        if not isinstance(v, dict):
            raise SpecError(f"{self.where}: key {key!r} must be an object, got {v!r}")
        return _Cfg(v, f"{self.where} ({key})", self.arch)

    def opt_list(self, key) -> list:
        v = self.get(key, [])
        if not isinstance(v, list):
            raise SpecError(f"{self.where}: key {key!r} must be a list, got {v!r}")
        return v


def _architecture(cfg: dict, where: str) -> str:
    archs = cfg.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise SpecError(f"{where}: key 'architectures' must be a list of class names, got {archs!r}")
    for a in archs:
        a = _ALIASES.get(a, a)
        if a in SUPPORTED:
            return a
    mt = cfg.get("model_type")
    if mt in _ARCH_BY_MODEL_TYPE:
        return _ARCH_BY_MODEL_TYPE[mt]
    named = ", ".join(map(str, archs)) or f"model_type {mt!r}"
    raise SpecError(f"{where}: unsupported architecture {named}; supported: {', '.join(SUPPORTED)}")


def load_hf_config(path, name: str | None = None) -> ModelSpec:
    """Read a config.json (or a directory holding one) and return its ModelSpec."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    text = read_text(p, "Hugging Face config.json")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"malformed JSON in {p}: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"malformed config {p}: expected a JSON object")
    if name is None:
        name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
        name = name.lstrip(".") or "model"  # a folder name like ".cache" still names the model
    return hf_dict_to_spec(cfg, name=name, where=str(p))


def hf_dict_to_spec(cfg: dict, name: str, where: str = "config.json") -> ModelSpec:
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), dict):
        outer_archs = cfg.get("architectures")
        cfg = dict(cfg["text_config"])
        cfg.setdefault("architectures", outer_archs)
    arch = _architecture(cfg, where)
    c = _Cfg(cfg, where, arch)
    L = c.int("num_hidden_layers")
    h = c.int("hidden_size")
    heads = c.int("num_attention_heads")
    d: dict = {
        "name": name,
        "num_layers": L,
        "hidden_size": h,
        "num_attention_heads": heads,
        "vocab_size": c.int("vocab_size"),
        "tie_embeddings": c.opt_bool("tie_word_embeddings", False),
        "attention_bias": c.opt_bool("attention_bias", False),
        "max_position_embeddings": c.opt_int("max_position_embeddings", 0),
        "source": f"Hugging Face config.json ({arch}): {where}",
    }
    is_mla = arch in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
    if not is_mla:
        kv = c.opt_int("num_key_value_heads", heads)
        d["num_query_groups"] = 0 if kv == heads else kv
        hd = c.opt_int("head_dim", 0)
        d["kv_channels"] = hd if hd and hd != h // max(heads, 1) else 0

    if arch in ("MixtralForCausalLM", "PhiMoEForCausalLM"):
        ffn = c.int("intermediate_size")
        d.update(ffn_hidden_size=ffn, moe_ffn_hidden_size=ffn,
                 num_experts=c.int("num_local_experts"), moe_router_topk=c.int("num_experts_per_tok"),
                 first_k_dense=0)
    elif arch == "GptOssForCausalLM":
        ffn = c.int("intermediate_size")
        d.update(ffn_hidden_size=ffn, moe_ffn_hidden_size=ffn,
                 num_experts=c.int("num_local_experts", "num_experts"),
                 moe_router_topk=c.int("num_experts_per_tok", "experts_per_token"),
                 first_k_dense=0)
    elif arch == "OlmoeForCausalLM":
        ffn = c.int("intermediate_size")
        d.update(ffn_hidden_size=ffn, moe_ffn_hidden_size=ffn,
                 num_experts=c.int("num_experts"), moe_router_topk=c.int("num_experts_per_tok"),
                 first_k_dense=0)
    elif arch in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
        E = c.int("num_experts")
        step = c.opt_int("decoder_sparse_step", 1) or 1
        mlp_only = {as_int(i, "key 'mlp_only_layers' entry", where, lo=0) for i in c.opt_list("mlp_only_layers")}
        # transformers Qwen{2,3}MoeDecoderLayer: sparse iff not in mlp_only_layers and
        # num_experts > 0 and (layer_idx + 1) % decoder_sparse_step == 0
        d.update(ffn_hidden_size=c.int("intermediate_size"),
                 moe_ffn_hidden_size=c.int("moe_intermediate_size"),
                 num_experts=E, moe_router_topk=c.int("num_experts_per_tok"),
                 moe_layers=[int(i not in mlp_only and E > 0 and (i + 1) % step == 0)
                             for i in range(L)])
        shared = c.opt_int("shared_expert_intermediate_size", 0)
        if shared:
            d.update(moe_shared_expert_count=1, moe_shared_expert_ffn=shared)
    elif is_mla:
        moe_ffn = c.int("moe_intermediate_size")
        n_shared = c.opt_int("n_shared_experts", 0)
        n_group = c.opt_int("n_group", 1) or 1
        q_lora = c.opt_int("q_lora_rank", 0)
        d.update(ffn_hidden_size=c.int("intermediate_size"), moe_ffn_hidden_size=moe_ffn,
                 num_experts=c.int("n_routed_experts"), moe_router_topk=c.int("num_experts_per_tok"),
                 moe_shared_expert_count=n_shared, moe_shared_expert_ffn=n_shared * moe_ffn,
                 first_k_dense=c.opt_int("first_k_dense_replace", 0),
                 moe_layer_freq=c.opt_int("moe_layer_freq", 1) or 1,
                 moe_router_score_function=c.get("scoring_func", "softmax"),
                 moe_router_num_groups=n_group if n_group > 1 else 0,
                 moe_router_group_topk=c.opt_int("topk_group", 0) if n_group > 1 else 0,
                 mla=True, q_lora_rank=q_lora, kv_lora_rank=c.int("kv_lora_rank"),
                 qk_head_dim=c.int("qk_nope_head_dim"), qk_pos_emb_head_dim=c.int("qk_rope_head_dim"),
                 v_head_dim=c.int("v_head_dim"))
    d.update(_numerics(c, arch, is_mla, L))
    return from_dict(d, where=where)


# DeepSeek-V3 technical report (arXiv 2412.19437) section 2.1.2: sequence-wise balance loss
# alpha = 0.0001 alongside the bias update; config.json carries no value for it (Megatron-LM's
# own DeepSeek-R1 recipe, examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-R1.sh, uses
# --moe-aux-loss-coeff 1e-4 --moe-router-load-balancing-type seq_aux_loss).
NOAUX_SEQ_AUX_COEFF = 1e-4


def _numerics(c: _Cfg, arch: str, is_mla: bool, num_layers: int) -> dict:
    """The config.json fields that change numerics, not shapes (see the module docstring)."""
    d = {"rotary_base": c.opt_float("rope_theta", 10000.0),
         "norm_epsilon": c.opt_float("rms_norm_eps", c.get("layer_norm_eps", 1e-5)),
         "qk_layernorm": is_mla or arch in ("Qwen3MoeForCausalLM", "OlmoeForCausalLM")}
    if arch == "PhiMoEForCausalLM":  # PhiMoEDecoderLayer: nn.LayerNorm(eps=rms_norm_eps)
        d["normalization"] = "LayerNorm"
    rs = c.opt_map("rope_scaling")
    if (rs.get("type") or rs.get("rope_type")) == "yarn":
        d.update(rope_scaling_factor=rs.opt_float("factor", 1.0),
                 yarn_mscale=rs.opt_float("mscale", 1.0), yarn_mscale_all_dim=rs.opt_float("mscale_all_dim", 0.0),
                 yarn_original_max_position=rs.opt_int("original_max_position_embeddings", 0),
                 yarn_beta_fast=rs.opt_float("beta_fast", 32.0), yarn_beta_slow=rs.opt_float("beta_slow", 1.0))
    if arch == "GptOssForCausalLM":  # GptOssExperts: (up + 1) * gate * sigmoid(1.702 gate), clamped
        d.update(activation="quick-geglu", glu_linear_offset=1.0,
                 activation_clamp=c.opt_float("swiglu_limit", 7.0), attention_sinks=True,
                 moe_expert_bias=True)
    types = c.opt_list("layer_types")
    if c.get("sliding_window") and "sliding_attention" in types and len(types) == num_layers:
        full = [i + 1 for i, t in enumerate(types) if t != "sliding_attention"]  # 1-indexed
        freq = full[0] if full else 0
        if full != list(range(freq, num_layers + 1, freq)):
            raise SpecError(f"{c.where}: layer_types is not a periodic sliding/full pattern")
        d.update(window_size=c.opt_int("sliding_window", 0), window_attn_skip_freq=freq)
    d["mtp_num_layers"] = c.opt_int("num_nextn_predict_layers", 0)
    # routing numerics
    if is_mla:
        d["moe_router_topk_scaling_factor"] = c.opt_float("routed_scaling_factor", 1.0)
        if c.get("topk_method") == "noaux_tc":
            d.update(moe_router_enable_expert_bias=True, moe_router_load_balancing_type="seq_aux_loss",
                     moe_aux_loss_coeff=c.opt_float("aux_loss_alpha", NOAUX_SEQ_AUX_COEFF))
        else:
            d.update(moe_router_load_balancing_type="seq_aux_loss" if c.get("seq_aux") else "aux_loss",
                     moe_aux_loss_coeff=c.opt_float("aux_loss_alpha", 0.0))
    else:
        d["moe_aux_loss_coeff"] = c.opt_float("router_aux_loss_coef", 0.0)
    if c.get("scoring_func", "softmax") == "softmax":
        # HF norm_topk_prob false: softmax over all experts, top-k probabilities not renormalised
        # (Megatron's pre-softmax). Mixtral, PhiMoE and gpt-oss renormalise over the top-k.
        default_norm = arch in ("MixtralForCausalLM", "PhiMoEForCausalLM", "GptOssForCausalLM")
        d["moe_router_pre_softmax"] = not c.opt_bool("norm_topk_prob", default_norm)
    return d
