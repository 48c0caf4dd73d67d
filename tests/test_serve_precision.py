"""Serving precision as its own noun (tuner/space/serve_precision.py, specs/quantization.py): the weight
format comes from the checkpoint's quantization_config unless --weight-dtype says otherwise, is
shown, and when nothing fits the output says what would."""
import pytest

from tuner.cli import main

DS = ["--model", "deepseek-v3", "--cluster", "h200-sxm", "--gpus", "8", "--isl", "1024", "--osl", "1024"]


@pytest.mark.parametrize("model,want", [("deepseek-v3", "fp8"), ("kimi-k2", "fp8"), ("gpt-oss-120b", "mxfp4"),
                                        ("qwen3-30b-a3b", None), ("tiny-moe", None)])
def test_published_quantization_of_the_presets(model, want):
    from specs.quantization import checkpoint_quantization
    q = checkpoint_quantization(model, model)
    assert (q.method if q else None) == want
    if q:
        assert q.source.startswith("huggingface.co/")


def test_serve_ranking_prices_the_checkpoints_weights_and_says_what_would_fit(capsys):
    """DeepSeek-V3 on 8 H200: its fp8 checkpoint fits (the reference SGLang deployment); bf16 weights
    do not, and the ranking says so with what would."""
    assert main(["plans", "--mode", "serve", *DS, "--rank", "--top", "3", "--examples", "0"]) == 0
    out = capsys.readouterr().out
    assert "weights fp8 (checkpoint quantization_config" in out and "aggregated, top 3" in out
    assert main(["plans", "--mode", "serve", *DS, "--rank", "--top", "3", "--examples", "0", "--weight-dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "aggregated: none" in out and "nothing fits: 1,250 GiB of bf16 weights" in out and "--weight-dtype fp8" in out
