"""What every emitted launch file says about itself, and when `emit` refuses to write one.

One header per target (`megatron_header`, `serving_header`): moetune's version, the stack versions
the file targets, the plan, the workload, what was assumed, the numbers the cost model predicts in
the target's own log units, and the `moetune predict` command that reproduces those numbers (the
header round-trips: tests/test_emit_header.py runs that command and compares). `does_not_fit` is
the one-line refusal of a plan the model predicts will not fit in memory (exit code
`EXIT_DOES_NOT_FIT`); `--force` writes the file anyway with `FORCED` in the header.
"""
from __future__ import annotations

import math
import shlex

from cost_model.constants import HBM_RESERVE_FRACTION
from tuner.conventions import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, moetune_version

__all__ = ["EXIT_BAD_INPUT", "EXIT_DOES_NOT_FIT", "moetune_version", "megatron_header", "serving_header",
           "megatron_does_not_fit", "serve_memory_problem", "what_would_fit", "train_predict_argv",
           "serve_predict_argv"]

# serving memory verdicts of cost_model.serving.memory.capacity / rank_arrays that mean "does not fit"
SERVE_MEMORY_CODES = ("weights_exceed_hbm", "weights_exceed_mem_fraction", "kv_pool_below_one_request",
                      "activations_exceed_reserve")


def predict_command(argv: list[str]) -> str:
    """`moetune predict ...` as a shell line."""
    return "moetune predict " + " ".join(shlex.quote(str(a)) for a in argv)


# ---- training (Megatron-LM) ---------------------------------------------------------------------

def train_predict_argv(args, plan) -> list[str]:
    """The `moetune predict` arguments that price exactly `plan` as `emit megatron` priced it: the
    canonical plan (nothing left to complete) and the same model, cluster, workload, stack, tables
    and calibration flags."""
    a = ["--model", args.model, "--cluster", args.cluster]
    if args.gpus is not None:
        a += ["--gpus", str(args.gpus)]
    a += ["--gbs", str(args.gbs)]
    if args.seq is not None:
        a += ["--seq", str(args.seq)]
    a += ["--precision", getattr(args, "precision", "bf16"), "--stack", getattr(args, "stack", "auto")]
    for flag in ("tables", "calibration"):
        if getattr(args, flag, None):
            a += [f"--{flag}", getattr(args, flag)]
    return a + ["--plan", plan.canonical(), "--complete", "defaults"]


def train_memory_line(pred) -> str:
    """`stage 1 needs 135.7 GiB > 72.0 GiB usable (...)` or the per-stage figures when it fits."""
    return pred.reasons[0] if not pred.feasible and pred.reasons else \
        "peak " + f"{pred.peak_memory_gib:.1f} GiB, fits"


def megatron_header(w, plan, profile, pred, tables, cal, predict_argv: list[str], *, train_iters: int,
                    forced: bool) -> list[str]:
    """Comment lines for the top of the Megatron launch script (after the shebang)."""
    stages = " ".join(f"{x:.1f}" for x in pred.memory_by_stage_gib)
    usable = w.cluster.hbm_gib * (1.0 - HBM_RESERVE_FRACTION)
    tables_kind = "measured" if tables.meta.get("measured") else "shipped defaults"
    lines = [f"# moetune {moetune_version()}: BENCHMARK launch of one plan (mock data; not a training recipe)"]
    if forced:
        lines.append(f"# FORCED (--force): the cost model predicts this plan does NOT fit in memory: "
                     f"{train_memory_line(pred)}")
    lines += [
        f"# target stack: {profile.describe()}",
        f"# workload: model {w.model.name} ({w.model.digest()[:12]}), {w.world}x {w.cluster.kind}, gbs {w.gbs}, "
        f"seq {w.seq}, precision {plan.precision}",
        "# assumed: --mock-data (synthetic tokens), NullTokenizer (no tokenizer files), "
        + ("--moe-router-force-load-balancing (the cost model prices balanced routing), " if w.model.is_moe else "")
        + f"no checkpoint save/load, {train_iters} iterations",
        f"# predicted by moetune (tables {tables.directory.name} {tables_kind} sha256 {tables.digest[:16]}, "
        f"calibration {cal.id}), in Megatron's log units:",
        f"#   elapsed time per iteration (ms): {pred.step_time_s * 1e3:.1f}",
        f"#   throughput per GPU (TFLOP/s/GPU): {pred.model_tflops_per_gpu:.1f}  (Megatron's num_floating_point_operations"
        + (f" without the {w.model.mtp_num_layers} MTP layer(s), which Megatron's log adds" if w.model.mtp_num_layers else "")
        + f"; MFU {pred.mfu:.1%} of bf16 peak)",
        f"#   tokens/s: {pred.tokens_per_s_per_gpu * w.world:,.0f}  (tokens/s/GPU {pred.tokens_per_s_per_gpu:,.1f})",
        f"#   memory per pipeline stage (GiB): {stages}  (usable {usable:.1f} GiB of {w.cluster.hbm_gib:g}; "
        f"{'fits' if pred.feasible else 'DOES NOT FIT'})",
        f"# reproduce: {predict_command(predict_argv)}",
    ]
    if plan.pp_layout and w.model.mtp_num_layers:
        lines.append(f"# layout: the plan's {plan.pp_layout} places the transformer layers; the "
                     f"--pipeline-model-parallel-layout flag also places the {w.model.mtp_num_layers} MTP layer(s) "
                     "('m') in the last stage, as Megatron requires")
    return lines


def megatron_does_not_fit(pred) -> str:
    return (f"does not fit: the cost model predicts {pred.peak_memory_gib:.1f} GiB peak; "
            f"{train_memory_line(pred)}; by stage " + " ".join(f"{x:.1f}" for x in pred.memory_by_stage_gib) +
            " GiB (--force writes it anyway, labelled)")


# ---- serving (SGLang, vLLM) ----------------------------------------------------------------------

def serve_predict_argv(args, plan_text: str, concurrency: int) -> list[str]:
    """The `moetune predict --mode serve` arguments that reproduce an emitted serving header."""
    a = ["--mode", "serve", "--model", args.model, "--cluster", args.cluster]
    if args.gpus is not None:
        a += ["--gpus", str(args.gpus)]
    a += ["--isl", str(args.isl), "--osl", str(args.osl), "--concurrency", str(concurrency),
          "--precision", getattr(args, "precision", "bf16"), "--weight-dtype", getattr(args, "weight_dtype", "auto")]
    for flag in ("tables", "calibration"):
        if getattr(args, flag, None):
            a += [f"--{flag}", getattr(args, flag)]
    return a + ["--plan", plan_text]


def serve_memory_problem(d: dict) -> str | None:
    """The memory verdict of a serving prediction (`serve_prediction`'s dict) as one clause, or None
    when it fits."""
    codes = [r for r in d["reasons"] if str(r) in SERVE_MEMORY_CODES]
    if not codes:
        return None
    x = d["extra"]
    hbm = d["hbm_gib"]
    return (f"{codes[0]}: weights {x['weights_gib']:.1f} GiB/GPU, SGLang's static share "
            f"{x['mem_frac'] * hbm:.1f} GiB (mem_frac {x['mem_frac']:.3f} of {hbm:g} GiB HBM), "
            f"KV pool {x['kv_pool_tokens_per_gpu']:,.0f} tokens/GPU for isl+osl {d['isl'] + d['osl']}")


def what_would_fit(d: dict, weight_dtype: str) -> str:
    """When a serving plan does not fit: what would (fp8 weights, more GPUs), from its own numbers.
    Weights per GPU scale as 1/GPUs of the instance to first order (replicated parts ignored), so
    the GPU count is an estimate and says so."""
    x, hbm = d["extra"], d["hbm_gib"]
    budget = x["mem_frac"] * hbm * 0.9  # leave a tenth of the static share for the KV pool
    if budget <= 0:
        return ""
    out = []
    if weight_dtype == "bf16" and x["weights_gib"] / 2 <= budget:
        out.append(f"fp8 weights ({x['weights_gib'] / 2:.1f} GiB/GPU; --weight-dtype fp8 or an fp8 checkpoint)")
    total = x["weights_gib"] * d["instance_gpus"]
    need = 2 ** math.ceil(math.log2(max(total / budget, 1.0)))
    if need > d["instance_gpus"]:
        out.append(f"about {need} GPUs per instance at {weight_dtype} ({total:,.0f} GiB of weights)")
    return "would fit: " + " or ".join(out) if out else ""


def serving_header(target: str, d: dict, *, stack: str, model_path: str, weight: dict, benchmark: bool,
                   predict_argv: list[str], bench_line: str, forced: bool) -> list[str]:
    """Comment lines for the top of an SGLang / vLLM launch file.

    d: `tuner.rank.serve_predict.serve_prediction`'s dict for the plan; weight: the resolved weight
    precision (`tuner.space.serve_precision.resolve`)."""
    def ms(v):
        return "n/a" if v is None else f"{v * 1e3:.1f}"
    gpus = d["gpus"]
    lines = [f"# moetune {moetune_version()}: {target} launch of one serving plan"]
    if forced:
        lines.append(f"# FORCED (--force): the cost model predicts this plan does NOT fit: {serve_memory_problem(d)}")
    lines += [
        f"# target stack: {stack}",
        f"# plan: {d['plan']}",
        *([f"# runs as: {d['effective_plan']}  (SGLang's rewrites: {', '.join(d['rewrites']) or 'none'})"]
          if target == "sglang" and "rewrites" in d else []),
        f"# workload: model {d['model']}, {gpus}x {d['cluster']}, isl {d['isl']}, osl {d['osl']}, "
        f"concurrency {d['concurrency']} (closed loop), phase {d['phase']}",
        f"# weights: {weight['dtype']} ({weight['source']}); KV cache bf16 (--kv-cache-dtype auto, priced at 2 B)",
        "# assumed: " + ("dummy weights (--benchmark: --load-format dummy; numbers are speed only), "
                         if benchmark else f"real weights from {model_path}, ")
        + "random prompts of exactly isl/osl tokens, balanced expert routing",
        f"# predicted by moetune (serving model of SGLang 0.5.23's scheduler, calibration "
        f"{d['extra']['calibration_id']}{'; vLLM schedules differently' if target == 'vllm' else ''}), "
        "in the benchmark's units:",
        f"#   Output token throughput (tok/s): {d['output_tokens_per_s_per_gpu'] * gpus:,.1f}  "
        f"(per GPU {d['output_tokens_per_s_per_gpu']:,.1f})",
        f"#   Input token throughput (tok/s): {d['input_tokens_per_s_per_gpu'] * gpus:,.1f}",
        f"#   P90 TTFT (ms): {ms(d['ttft_p90_s'])}",
        f"#   P90 TPOT (ms): {ms(d['tpot_p90_s'])}",
        f"#   memory {d['memory_gib']:.1f} GiB/GPU (weights {d['extra']['weights_gib']:.1f}), "
        f"max batch {d['max_batch']:.1f} requests/GPU; {'fits' if d['feasible'] else 'DOES NOT FIT'}",
        f"# reproduce: {predict_command(predict_argv)}",
        f"# measure:   {bench_line}",
    ]
    return lines
