"""Which megatron-core layer spec a trial builds for a plan on the installed stack, and what the
installed stack cannot build (pure functions: no torch, no megatron import; unit-tested on CPU).

The rule is "build what the emitted script would run": `tuner.emit.megatron` launches Megatron-LM with
`--transformer-impl transformer_engine` when the target has TE, and `pretrain_gpt.py` then builds
`get_gpt_decoder_block_spec(config, use_transformer_engine=True)`: TE linears and norms, TE
attention, `TEGroupedMLP` experts for `--moe-grouped-gemm`, and fp8 autocast contexts that
`TransformerBlock` enters itself whenever `config.fp8` is set (`fp8_utils.get_fp8_context`).
Without TE it builds the local spec (torch RMSNorm, local linears, `SequentialMLP`, or the legacy
`GroupedMLP` on the `grouped_gemm` package).

A plan the installed stack cannot build that way is refused (Failure "unrealizable", with the
reasons) instead of running something else: a trial that ran another implementation than the
plan is a defect, not a measurement.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specs.cpu_support import cpu_rejections
from specs.stack import FP8_RECIPES, TE_FUSIONS, Installed


@dataclass(frozen=True)
class LayerSpecChoice:
    """What the trial builds. experts: "TEGroupedMLP" | "GroupedMLP" | "SequentialMLP" | "" (dense)."""
    use_te: bool
    experts: str
    fp8_format: str = ""  # "" = bf16 (fp32 on CPU)
    fp8_recipe: str = ""
    refusals: tuple = field(default=())  # ((code, sentence), ...): non-empty = do not launch

    @property
    def realizable(self) -> bool:
        return not self.refusals

    def reason(self) -> str:
        return "; ".join(f"{c}: {s}" for c, s in self.refusals)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["refusals"] = [list(r) for r in self.refusals]
        return d


def layer_spec_choice(plan, installed: Installed, model=None) -> LayerSpecChoice:
    """The spec the trial builds for `plan` on `installed`, with every reason it cannot.

    plan: a specs.plan.Plan; installed: specs.stack.Installed (what this machine has);
    model: the ModelSpec (only `is_moe` is read; None = MoE)."""
    is_moe = model is None or getattr(model, "is_moe", True)
    use_te = bool(installed.transformer_engine) and installed.cuda  # TE kernels need a GPU
    fmt, recipe = FP8_RECIPES.get(plan.precision, ("", "")) if plan.fp8 else ("", "")
    if not is_moe:
        experts = ""
    elif not plan.grouped_gemm:
        experts = "SequentialMLP"
    else:
        experts = "TEGroupedMLP" if use_te else "GroupedMLP"
    out: list[tuple[str, str]] = []

    def add(code, sentence):
        if code not in [c for c, _ in out]:
            out.append((code, sentence))

    if not installed.cuda:
        # The CPU stack: its measured table (specs/cpu_support.py) is the whole answer.
        for code, sentence in cpu_rejections(plan, model):
            add(code, sentence)
        return LayerSpecChoice(use_te=False, experts=experts, fp8_format=fmt, fp8_recipe=recipe,
                               refusals=tuple(out))
    te = installed.transformer_engine
    if not installed.megatron_core:
        add("megatron_core", "megatron-core is not installed")
    if plan.fp8 and not te:
        add("fp8", f"{plan.precision} needs TransformerEngine (not installed): the local spec would run bf16")
    if plan.fp8 and te and plan.precision == "fp8-blockwise" and _vt(te) < (2, 3):
        add("fp8", f"fp8-blockwise needs TransformerEngine >= 2.3 (installed {te})")
    if plan.fp8 and te and plan.precision == "mxfp8" and _vt(te) < (2, 1):
        add("fp8", f"mxfp8 needs TransformerEngine >= 2.1 (installed {te})")
    for name, f in TE_FUSIONS.items():
        if is_moe and getattr(plan, name) and (not te or _vt(te) < _vt(f.min_te)):
            add(name, f"{name} ({f.flag}) needs TransformerEngine >= {f.min_te} "
                      f"({'installed ' + te if te else 'not installed'})")
    if experts == "GroupedMLP" and not installed.grouped_gemm:
        add("grouped_gemm", "grouped GEMM experts need TransformerEngine (TEGroupedMLP) or the "
                            "grouped_gemm package (GroupedMLP); neither is installed")
    if plan.tp > 1 and not te:
        add("tp_sequence_parallel", f"tp={plan.tp} runs with sequence parallel, whose RMSNorm needs "
                                    "TransformerEngine (torch's norm refuses SP)")
    if plan.cp > 1 and not te:
        add("context_parallel", "context parallelism (CP>1) is only implemented by TEDotProductAttention")
    if is_moe and plan.dispatcher == "flex":
        backend = plan.flex_backend or "deepep"
        if backend == "deepep" and not installed.deepep:
            add("flex_dispatcher", "flex/deepep needs DeepEP (not installed)")
        if backend == "hybridep" and not installed.hybridep:
            add("flex_dispatcher", "flex/hybridep needs HybridEP (deep_ep.HybridEPBuffer; not installed)")
    if plan.fsdp:
        add("fsdp", "Megatron FSDP trials are not wired: the trial backend wraps the model in megatron-core's "
                    "DDP, not FullyShardedDataParallel (the emitted script runs it)")
    if plan.recompute == "selective" and "layernorm" in plan.recompute_modules and not te:
        add("recompute_layernorm", "selective recompute of layernorm uses TE's FP8 state (CheckpointWithoutOutput)")
    return LayerSpecChoice(use_te=use_te, experts=experts, fp8_format=fmt, fp8_recipe=recipe,
                           refusals=tuple(out))


def ranks_fit(world: int, installed: Installed) -> str:
    """"" when `world` ranks fit this machine, else the reason (GPU only: one rank per device;
    CPU ranks share cores)."""
    if installed.cuda and world > installed.devices:
        return (f"{world} ranks need {world} GPUs, {installed.devices} visible "
                "(CUDA_VISIBLE_DEVICES / device count)")
    return ""


def _vt(v: str) -> tuple:
    out = []
    for p in v.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)
