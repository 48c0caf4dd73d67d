"""The model being trained: a MoE transformer described by the fields Megatron-core needs.

One frozen `ModelSpec` is used everywhere (plan space, realizability, cost model, trials, emitters).
Loaders live in `specs.models` (YAML presets in `specs/presets/models/`, any YAML file, a Hugging
Face `config.json` through `specs.hf_config`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from specs.errors import SpecError
from specs.inputs import as_bool, as_float, as_int, as_str, safe_name


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    ffn_hidden_size: int  # dense-layer FFN width (first-k-dense layers)
    num_query_groups: int = 0  # GQA KV heads; 0 means MHA (= num_attention_heads)
    kv_channels: int = 0  # per-head dim; 0 means hidden_size // num_attention_heads
    # Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2); q_lora_rank 0 = no q compression.
    mla: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_head_dim: int = 0  # "nope" part
    qk_pos_emb_head_dim: int = 0  # "rope" part
    v_head_dim: int = 0
    tie_embeddings: bool = False
    gated_linear_unit: bool = True  # SwiGLU: 3 matrices per MLP
    # MoE
    num_experts: int = 0
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0
    moe_shared_expert_count: int = 0
    moe_shared_expert_ffn: int = 0  # total width of the shared experts (Megatron's intermediate size)
    moe_layers: tuple[bool, ...] = ()  # per layer: True = MoE, False = dense
    moe_router_score_function: str = "softmax"
    moe_router_num_groups: int = 0
    moe_router_group_topk: int = 0
    attention_bias: bool = False
    moe_expert_bias: bool = False  # biases on the expert linears (GPT-OSS; Megatron add_bias_linear)
    seq_length: int = 4096
    max_position_embeddings: int = 0
    # Architecture details that change the cost or the emitted flags (0 / False = absent).
    mtp_num_layers: int = 0  # multi-token-prediction layers (DeepSeek-V3 num_nextn_predict_layers; Megatron --mtp-num-layers)
    window_size: int = 0  # sliding-window attention width in tokens (Megatron --window-size); 0 = full attention
    window_attn_skip_freq: int = 0  # every N-th layer keeps full attention (Megatron --window-attn-skip-freq); 0 = none
    attention_sinks: bool = False  # learned per-head softmax sinks (GPT-OSS)
    # Numerics that do not change the cost but must reach the emitted script (defaults are
    # Megatron-core 0.16.1's; values come from each model's config.json, see specs/hf_config.py).
    normalization: str = "RMSNorm"  # or LayerNorm (Phi-3.5-MoE)
    norm_epsilon: float = 1e-5  # rms_norm_eps
    rotary_base: float = 10000.0  # rope_theta
    qk_layernorm: bool = False  # Qwen3 q_norm/k_norm, OLMoE q/k norm, MLA's latent norms
    activation: str = "swiglu"  # swiglu | quick-geglu (GPT-OSS: sigmoid(1.702 x) gate)
    glu_linear_offset: float = 0.0  # GPT-OSS: (up + 1) * act(gate)
    activation_clamp: float = 0.0  # GPT-OSS swiglu_limit; 0 = no clamp
    rope_scaling_factor: float = 1.0  # YaRN factor; 1 = no scaling
    yarn_mscale: float = 1.0
    yarn_mscale_all_dim: float = 0.0
    yarn_original_max_position: int = 0  # 0 = no YaRN
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    moe_router_pre_softmax: bool = False  # softmax over all experts before top-k (HF norm_topk_prob false)
    moe_router_topk_scaling_factor: float = 1.0  # routed_scaling_factor
    moe_router_enable_expert_bias: bool = False  # aux-loss-free balancing (DeepSeek-V3 noaux_tc)
    moe_router_load_balancing_type: str = "aux_loss"  # aux_loss | seq_aux_loss | none
    moe_aux_loss_coeff: float = 0.0
    source: str = ""  # where the numbers come from

    def __post_init__(self) -> None:
        problems = []
        for f in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
            if getattr(self, f) <= 0:
                problems.append(f"{f} must be > 0")
        if self.num_experts:
            if self.moe_router_topk <= 0 or self.moe_router_topk > self.num_experts:
                problems.append("moe_router_topk must be in 1..num_experts")
            if self.moe_ffn_hidden_size <= 0:
                problems.append("moe_ffn_hidden_size must be > 0 for a MoE model")
        if len(self.moe_layers) != self.num_layers:
            problems.append(f"moe_layers has {len(self.moe_layers)} entries for {self.num_layers} layers")
        if self.num_query_groups and self.num_attention_heads % self.num_query_groups:
            problems.append("num_attention_heads must be a multiple of num_query_groups")
        if not self.mla and not self.kv_channels and self.num_attention_heads > 0 \
                and self.hidden_size % self.num_attention_heads:
            problems.append(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                            f"{self.num_attention_heads} (give kv_channels, the per-head size)")
        if self.normalization not in ("RMSNorm", "LayerNorm"):
            problems.append("normalization must be RMSNorm or LayerNorm")
        if self.activation not in ("swiglu", "quick-geglu"):
            problems.append("activation must be swiglu or quick-geglu")
        if self.moe_router_load_balancing_type not in ("aux_loss", "seq_aux_loss", "global_aux_loss", "none"):
            problems.append("moe_router_load_balancing_type must be aux_loss, seq_aux_loss, global_aux_loss or none")
        if self.moe_router_score_function not in ("softmax", "sigmoid"):
            problems.append("moe_router_score_function must be softmax or sigmoid")
        if problems:
            raise SpecError(f"model {self.name!r}: " + "; ".join(problems))

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and self.num_moe_layers > 0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["moe_layers"] = list(self.moe_layers)
        return d

    def digest(self) -> str:
        """sha256 of the canonical JSON form; quoted by pre-registrations and reports."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def moe_layer_pattern(num_layers: int, num_experts: int, *, first_k_dense: int = 0,
                      freq: int = 1, explicit: list | None = None) -> tuple[bool, ...]:
    """Which layers are MoE: an explicit 0/1 list, or first-k-dense then every `freq`-th layer."""
    if num_experts <= 0:
        return (False,) * num_layers
    if explicit is not None:
        if len(explicit) != num_layers:
            raise SpecError(f"moe layer list has {len(explicit)} entries for {num_layers} layers")
        return tuple(bool(x) for x in explicit)
    return tuple(i >= first_k_dense and (i % freq == 0) for i in range(num_layers))


# float fields that must be > 0 (the rest: any finite number >= 0, glu_linear_offset any finite number)
_POSITIVE_FLOATS = ("norm_epsilon", "rotary_base", "rope_scaling_factor", "moe_router_topk_scaling_factor")


def _typed(d: dict, where: str) -> dict:
    """`d` with every value checked against its ModelSpec field type: whole numbers >= 0 for int
    fields, finite numbers for float fields, true/false for flags, strings for names; one SpecError
    naming `where`, the field and what was expected otherwise."""
    types = {f.name: f.type for f in dataclasses.fields(ModelSpec)}
    out = {}
    for k, v in d.items():
        t = types[k]
        if k == "name":
            out[k] = safe_name(v, "name", where)
        elif t == "int":
            out[k] = as_int(v, k, where, lo=0)
        elif t == "float":
            out[k] = as_float(v, k, where, lo=None if k == "glu_linear_offset" else 0.0,
                              lo_open=k in _POSITIVE_FLOATS)
        elif t == "bool":
            out[k] = as_bool(v, k, where)
        elif t == "str":
            out[k] = as_str(v, k, where)
        else:
            out[k] = v
    return out


def from_dict(d: dict, name: str | None = None, where: str = "model spec") -> ModelSpec:
    """Build a spec from a YAML-style dict. MoE layers: `moe_layers` (explicit 0/1 list) or
    `first_k_dense` + `moe_layer_freq`. Every value is type- and range-checked (`_typed`); errors
    are one SpecError naming `where` (the file) and the field."""
    if not isinstance(d, dict):
        raise SpecError(f"{where}: a model spec must be a mapping of field: value, got {type(d).__name__}")
    d = dict(d)
    explicit = d.pop("moe_layers", None)
    first_k = as_int(d.pop("first_k_dense", 0), "first_k_dense", where, lo=0)
    freq = as_int(d.pop("moe_layer_freq", 1), "moe_layer_freq", where, lo=1)
    if explicit is not None:
        if not isinstance(explicit, (list, tuple)):
            raise SpecError(f"{where}: moe_layers must be a list of 0/1, got {explicit!r}")
        if not all(isinstance(x, bool) or x in (0, 1) for x in explicit):
            raise SpecError(f"{where}: moe_layers must be a list of 0/1 (or true/false), got {explicit!r}")
    known = {f.name for f in dataclasses.fields(ModelSpec)}
    unknown = sorted(str(k) for k in set(d) - known)
    if unknown:
        raise SpecError(f"{where}: unknown model field(s): {', '.join(unknown)}")
    if name is not None:
        d["name"] = name
    for req in ("name", "num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
        if req not in d:
            raise SpecError(f"{where}: model spec is missing required field {req!r}")
    d = _typed(d, where)
    d.setdefault("ffn_hidden_size", 4 * d["hidden_size"])
    try:
        d["moe_layers"] = moe_layer_pattern(d["num_layers"], d.get("num_experts", 0),
                                            first_k_dense=first_k, freq=freq, explicit=explicit)
        return ModelSpec(**d)
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None
