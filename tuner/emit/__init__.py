"""The launchers a plan emits. Public vocabulary:

    megatron_script   a Megatron-LM training launch script (tuner/emit/megatron.py)
    launch_commands   SGLang server (and router) commands of a serving plan (tuner/emit/sglang.py)
    vllm_command      the vLLM server command of a serving plan (tuner/emit/vllm.py)

Modules inside tuner/ import the defining module itself (the package's own modules load in any order).
"""
from tuner.emit.megatron import megatron_script
from tuner.emit.sglang import launch_commands
from tuner.emit.vllm import vllm_command

__all__ = ["megatron_script", "launch_commands", "vllm_command"]
