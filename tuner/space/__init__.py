"""The plan spaces and their rules, training and serving side by side. Public vocabulary:

    default_space, iter_realizable, summarize   Megatron's plan space (tuner/space/train.py)
    check, Reason                               Megatron / TE rules (tuner/space/megatron_rules.py)
    default_serve_space, ServeSpace             the serving grid (tuner/space/serve.py)
    realize, ServeVerdict                       SGLang's rules on a serving plan (tuner/space/sglang_rules.py)

Modules inside tuner/ import the defining module itself (the package's own modules load in any order).
"""
from tuner.space.megatron_rules import Reason, check
from tuner.space.serve import ServeSpace, default_serve_space
from tuner.space.sglang_rules import ServeVerdict, realize
from tuner.space.train import default_space, iter_realizable, summarize

__all__ = ["default_space", "iter_realizable", "summarize", "check", "Reason", "default_serve_space", "ServeSpace",
           "realize", "ServeVerdict"]
