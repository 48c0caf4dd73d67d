"""The emitted script builds the real architecture: its flags, read back the way Megatron-LM
core_v0.16.1 reads them (megatron/training/argument_utils.py ArgumentGroupFactory for the flags
generated from TransformerConfig fields, megatron/training/arguments.py
core_transformer_config_from_args for the hand-written ones), build megatron.core's own
TransformerConfig / MLATransformerConfig (whose __post_init__ validates), and each field equals
the model's Hugging Face config.json (tests/fixtures/hf/), read here independently of
specs/hf_config.py. Every preset with a config.json is covered."""
import dataclasses
import json
import shlex
import typing
from pathlib import Path

import pytest

from clusters import load_cluster
from specs.models import load_model, preset_names
from specs.plan import Plan
from specs.stack import GPU_FULL, GPU_NO_TE, stack_defaults
from specs.workload import Workload
from tuner.emit.megatron import megatron_script

HF = Path(__file__).parent / "fixtures" / "hf"
core = pytest.importorskip("megatron.core.transformer.transformer_config")

# flags arguments.py handles itself (not generated from a TransformerConfig field)
MODEL_LEVEL = {"--seq-length", "--max-position-embeddings", "--vocab-size", "--padded-vocab-size",
               "--tokenizer-type", "--position-embedding-type", "--rotary-base",
               "--untie-embeddings-and-output-weights", "--swiglu", "--quick-geglu", "--num-experts",
               "--group-query-attention", "--num-query-groups", "--no-rope-fusion",
               "--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--window-size",
               "--window-attn-skip-freq", "--moe-layer-freq", "--cross-entropy-fusion-impl",
               "--cross-entropy-loss-fusion", "--moe-router-load-balancing-type", "--moe-aux-loss-coeff",
               "--multi-latent-attention", "--no-bias-swiglu-fusion", "--no-bias-gelu-fusion"}
PLAN_FROM = "--tensor-model-parallel-size"  # model_args come first in the script, plan_args after


def script_flags(script: str) -> dict:
    body = script.split("pretrain_gpt.py\" \\\n", 1)[1].replace("\\\n", " ")
    out, key = {}, None
    for t in shlex.split(body):
        if t.startswith("--"):
            key = t
            out[key] = []
        else:
            out[key].append(t)
    keys = list(out)
    return {k: out[k] for k in keys[:keys.index(PLAN_FROM)]}


def _field_flags(cls) -> dict:
    """flag -> (field, value type or a bool constant), as ArgumentGroupFactory builds them."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("argparse_meta", {})
        t = hints[f.name]
        base = [a for a in typing.get_args(t) if a is not type(None)] if typing.get_origin(t) else [t]
        base = base[0] if base else t
        name = "--" + f.name.replace("_", "-")
        if base is bool:
            if f.default is True:
                out[meta.get("arg_names", ["--no-" + f.name.replace("_", "-")])[0]] = (f.name, False)
            else:
                out[meta.get("arg_names", [name])[0]] = (f.name, True)
        else:
            conv = base if base in (int, float, str) else str
            if typing.get_origin(base) is typing.Literal:
                conv = type(typing.get_args(base)[0])
            out[meta.get("arg_names", [name])[0]] = (f.name, conv)
    return out


def config_from_flags(flags: dict):
    """The Megatron config these flags build, plus what GPTModel takes beside it."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
    cls = MLATransformerConfig if "--multi-latent-attention" in flags else TransformerConfig
    table = _field_flags(cls)
    # Megatron-LM's own defaults where they differ from the dataclass's (arguments.py)
    kw = {"apply_rope_fusion": "--no-rope-fusion" not in flags, "num_query_groups": None,
          "add_bias_linear": True}
    model = {"vocab": None, "rotary_base": int(flags.get("--rotary-base", ["10000"])[0]),
             "untied": "--untie-embeddings-and-output-weights" in flags}
    for flag, vals in flags.items():
        if flag in MODEL_LEVEL:
            continue
        assert flag in table, f"{flag} is neither a TransformerConfig field flag nor mapped here"
        field, conv = table[flag]
        kw[field] = conv if isinstance(conv, bool) else conv(vals[0])
    # arguments.py: --swiglu -> silu, gated, bias_activation_fusion = bias_swiglu_fusion (default
    # on); otherwise bias_gelu_fusion (default on); --quick-geglu -> quick_gelu, gated
    import torch.nn.functional as F
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    if "--swiglu" in flags:
        kw.update(activation_func=F.silu, gated_linear_unit=True,
                  bias_activation_fusion="--no-bias-swiglu-fusion" not in flags)
    else:
        kw["bias_activation_fusion"] = "--no-bias-gelu-fusion" not in flags
    if "--quick-geglu" in flags:
        kw.update(activation_func=quick_gelu, gated_linear_unit=True)
    if "--group-query-attention" in flags:
        kw["num_query_groups"] = int(flags["--num-query-groups"][0])
    if "--num-experts" in flags:
        kw["num_moe_experts"] = int(flags["--num-experts"][0])
        kw["moe_layer_freq"] = json.loads(flags["--moe-layer-freq"][0])
        kw["moe_router_load_balancing_type"] = flags["--moe-router-load-balancing-type"][0]
        kw["moe_aux_loss_coeff"] = float(flags["--moe-aux-loss-coeff"][0])
    if "--window-size" in flags:  # arguments.py tuple_type / moe_freq_type
        kw["window_size"] = tuple(int(x) for x in flags["--window-size"][0].strip("()").split(","))
        kw["window_attn_skip_freq"] = int(flags["--window-attn-skip-freq"][0])
    if cls is MLATransformerConfig:
        # arguments.py _add_mla_args defaults, passed to the config whether given or not
        for k, v in dict(q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128, qk_pos_emb_head_dim=64,
                         v_head_dim=128).items():
            kw.setdefault(k, v)
        kw.update(rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=0.0)
        kw["rotary_base"] = model["rotary_base"]
        for f in ("rotary_scaling_factor", "mscale", "mscale_all_dim"):
            if "--" + f.replace("_", "-") in flags:
                kw[f] = float(flags["--" + f.replace("_", "-")][0])
    padded = flags.get("--padded-vocab-size")
    # NullTokenizer: vocab_size + 1 (EOD); padded to 128 * tp unless --padded-vocab-size is given
    model["vocab"] = int(padded[0]) if padded else -(-(int(flags["--vocab-size"][0]) + 1) // 128) * 128
    return cls(**kw), model


def hf_expect(name: str) -> dict:
    """What the model is, read straight from its config.json."""
    c = json.loads((HF / f"{name}.json").read_text())
    mt = c["model_type"]
    mla = mt in ("deepseek_v2", "deepseek_v3", "kimi_k2")
    heads = c["num_attention_heads"]
    L = c["num_hidden_layers"]
    e = {"num_layers": L, "hidden_size": c["hidden_size"], "num_attention_heads": heads,
         "vocab": c["vocab_size"], "rotary_base": int(c["rope_theta"]), "layernorm_epsilon": c["rms_norm_eps"],
         "untied": not c.get("tie_word_embeddings", False),
         "qk_layernorm": mla or mt in ("qwen3_moe", "olmoe"),
         "normalization": "LayerNorm" if mt == "phimoe" else "RMSNorm",
         "add_bias_linear": bool(c.get("attention_bias", False)),
         "moe_router_topk": c.get("num_experts_per_tok", c.get("experts_per_token")),
         "num_moe_experts": c.get("n_routed_experts") or c.get("num_local_experts") or c.get("num_experts"),
         "moe_router_score_function": c.get("scoring_func", "softmax"),
         "mtp_num_layers": c.get("num_nextn_predict_layers") or None}
    if mla:
        e.update(qk_head_dim=c["qk_nope_head_dim"], qk_pos_emb_head_dim=c["qk_rope_head_dim"],
                 v_head_dim=c["v_head_dim"], kv_lora_rank=c["kv_lora_rank"], q_lora_rank=c["q_lora_rank"],
                 ffn_hidden_size=c["intermediate_size"], moe_ffn_hidden_size=c["moe_intermediate_size"],
                 moe_shared_expert_intermediate_size=c["n_shared_experts"] * c["moe_intermediate_size"],
                 moe_layer_freq=[int(i >= c["first_k_dense_replace"]) for i in range(L)],
                 moe_router_topk_scaling_factor=c["routed_scaling_factor"] if c["routed_scaling_factor"] != 1 else None,
                 moe_router_enable_expert_bias=c.get("topk_method") == "noaux_tc",
                 moe_router_num_groups=c["n_group"] if c.get("n_group", 1) > 1 else None,
                 rotary_scaling_factor=c["rope_scaling"]["factor"], mscale=c["rope_scaling"]["mscale"],
                 mscale_all_dim=c["rope_scaling"]["mscale_all_dim"],
                 original_max_position_embeddings=c["rope_scaling"]["original_max_position_embeddings"])
        if c.get("topk_method") != "noaux_tc":
            e["moe_aux_loss_coeff"] = c["aux_loss_alpha"]
            e["moe_router_load_balancing_type"] = "seq_aux_loss" if c.get("seq_aux") else "aux_loss"
    else:
        kv = c.get("num_key_value_heads", heads)
        e.update(num_query_groups=kv,  # __post_init__ fills None with the head count
                 kv_channels=c.get("head_dim") or c["hidden_size"] // heads,
                 ffn_hidden_size=c["intermediate_size"],
                 moe_ffn_hidden_size=c.get("moe_intermediate_size", c["intermediate_size"]),
                 moe_aux_loss_coeff=c["router_aux_loss_coef"])
    if e["moe_router_score_function"] == "softmax":
        norm = c.get("norm_topk_prob", mt in ("mixtral", "phimoe", "gpt_oss"))
        e["moe_router_pre_softmax"] = not norm
    if c.get("sliding_window") and "sliding_attention" in (c.get("layer_types") or []):
        # HF: a query sees sliding_window keys, itself included; TE's window counts those to its left
        e["window_size"] = (c["sliding_window"] - 1, 0)
        full = [i + 1 for i, t in enumerate(c["layer_types"]) if t == "full_attention"]
        e["window_attn_skip_freq"] = full[0]
        e["softmax_type"] = "learnable"  # gpt-oss sinks
    return e


# What Megatron-LM core_v0.16.1's flags cannot express, said by the emitted script's header too.
NOT_EXPRESSIBLE = {
    "gpt-oss-20b": {"yarn"}, "gpt-oss-120b": {"yarn"},  # non-MLA rope_type must be "rope" (arguments.py)
    "kimi-k2": {"beta_fast"},  # MLATransformerConfig.beta_fast has no flag; Kimi uses 1, default 32
}
HF_PRESETS = sorted(n for n in preset_names() if (HF / f"{n}.json").exists())
# presets whose checkpoint publishes another preset's architecture: DeepSeek-R1's config.json has
# DeepSeek-V3's architecture fields (DeepseekV3ForCausalLM, the same dimensions, MTP and fp8 blocks)
SAME_ARCHITECTURE = {"deepseek-r1": "deepseek-v3"}


def test_every_real_preset_has_a_config_json():
    assert set(preset_names()) - set(HF_PRESETS) - set(SAME_ARCHITECTURE) == {"tiny-moe", "tiny-moe-shared"}


@pytest.mark.parametrize("name,twin", sorted(SAME_ARCHITECTURE.items()))
def test_same_architecture_presets_differ_only_in_name_and_source(name, twin):
    a, b = load_model(name), load_model(twin)
    assert dataclasses.replace(a, name=b.name, source=b.source) == b
    assert _script(name).split("pretrain_gpt.py", 1)[1] == _script(twin).split("pretrain_gpt.py", 1)[1]


def _script(name, profile=GPU_NO_TE):
    w = Workload(load_model(name), load_cluster("h100-sxm", 8), 8, 4096)
    # TE's fused permutation and router where the profile has them, as completion sets them (stack_defaults)
    sd = stack_defaults(profile)
    return megatron_script(w, Plan(permute_fusion=sd["permute_fusion"], router_fusion=sd["router_fusion"]), profile)


@pytest.mark.parametrize("name", HF_PRESETS)
def test_emitted_architecture_equals_hf_config(name):
    # gpu-plain flags: the config then validates here without TransformerEngine (the TE-only
    # fusions gpu-full adds are compared separately below)
    cfg, model = config_from_flags(script_flags(_script(name)))
    got = {**dataclasses.asdict(cfg), **model}
    for field, want in hf_expect(name).items():
        assert got[field] == pytest.approx(want) if isinstance(want, float) else got[field] == want, \
            f"{name}: {field} = {got[field]!r}, config.json says {want!r}"
    assert cfg.moe_router_dtype == "fp32"
    if cfg.multi_latent_attention:
        assert cfg.rope_type == "yarn"
        if "beta_fast" not in NOT_EXPRESSIBLE.get(name, ()):
            hf = json.loads((HF / f"{name}.json").read_text())["rope_scaling"]
            assert (cfg.beta_fast, cfg.beta_slow) == (hf["beta_fast"], hf["beta_slow"])
    for what in NOT_EXPRESSIBLE.get(name, ()):
        assert f"not expressible: {what}" in _script(name)


def test_gpt_oss_activation_and_sinks():
    import torch.nn.functional as F
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    flags = script_flags(_script("gpt-oss-20b"))
    cfg, _ = config_from_flags(flags)
    assert cfg.activation_func is quick_gelu and cfg.gated_linear_unit
    assert config_from_flags(script_flags(_script("mixtral-8x7b")))[0].activation_func is F.silu
    assert "--quick-geglu" in flags and cfg.glu_linear_offset == 1.0 and cfg.activation_func_clamp_value == 7.0
    assert cfg.softmax_type == "learnable" and cfg.add_bias_linear


def test_gpu_full_adds_only_te_fusions():
    for name in ("deepseek-v3", "qwen3-30b-a3b"):
        full, plain = script_flags(_script(name, GPU_FULL)), script_flags(_script(name, GPU_NO_TE))
        # (--moe-permute-fusion is the plan's permute_fusion field: a plan flag, tests/test_megatron_oracles.py)
        assert set(full) - set(plain) == {"--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl"}
        assert set(plain) - set(full) == {"--no-rope-fusion"}


def test_no_te_script_needs_no_rope_fusion():
    """gpu-plain passes --no-rope-fusion; without it Megatron-LM's default apply_rope_fusion=True
    makes TransformerConfig raise when TE is absent (transformer_config.py, fused RoPE check)."""
    from megatron.core.utils import is_te_min_version  # noqa: F401
    pytest.importorskip("torch")
    try:
        import transformer_engine  # noqa: F401
        pytest.skip("TransformerEngine is installed: the fused RoPE exists here")
    except ImportError:
        pass
    flags = script_flags(_script("mixtral-8x7b"))
    assert "--no-rope-fusion" in flags
    config_from_flags(flags)  # accepted
    del flags["--no-rope-fusion"]
    with pytest.raises(ValueError, match="apply_rope_fusion"):
        config_from_flags(flags)


def test_vocab_is_exact_for_every_tp():
    for tp in (1, 2, 4, 8):
        w = Workload(load_model("phi-3.5-moe"), load_cluster("h100-sxm", 8), 8, 4096)
        _, model = config_from_flags(script_flags(megatron_script(w, Plan(tp=tp, grouped_gemm=False), GPU_NO_TE)))
        assert model["vocab"] == 32064


def test_mtp_goes_into_the_explicit_layout():
    from specs.stack import GPU_FULL as prof
    from tuner.rank.complete import complete_plan
    w = Workload(load_model("deepseek-v3"), load_cluster("h100-sxm", 1024), 8192, 4096)
    p = complete_plan("tp=2,pp=8,vpp=4,ep=64,mbs=1", w, prof, "fp8")
    script = megatron_script(w, p, prof)
    assert "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'" in script and "--mtp-num-layers 1" in script
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    lay = PipelineParallelLayerLayout("Et|(tt|)*30mL", pipeline_model_parallel_size=8)
    lay.validate_layer_layout(num_layers=61, mtp_num_layers=1)
    with pytest.raises(AssertionError):
        PipelineParallelLayerLayout("Et|(tt|)*30L", 8).validate_layer_layout(num_layers=61, mtp_num_layers=1)
