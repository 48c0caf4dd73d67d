"""Emit the Megatron-LM training stack for a plan: a bash launch script for `pretrain_gpt.py`.

Flag names are Megatron-LM core_v0.16.1's (megatron/training/arguments.py and the flags generated
from TransformerConfig fields); `tests/test_emit.py` checks each one against that list.
"""
from __future__ import annotations

import shlex

from specs.plan import Plan
from specs.stack import FP8_RECIPES, HYBRIDEP_NUM_SMS, TE_FUSIONS, StackProfile, launch_env
from specs.workload import Workload

# plan precision -> (--fp8-format, --fp8-recipe): one table for the emitted script and the trial
FP8_RECIPE_FLAGS = FP8_RECIPES


# Boolean plan fields and the Megatron-LM flag that switches each on.
MOE_SWITCHES = (("grouped_gemm", "--moe-grouped-gemm"), *((name, f.flag) for name, f in TE_FUSIONS.items()),
                ("shared_expert_overlap", "--moe-shared-expert-overlap"),
                ("a2a_overlap", "--overlap-moe-expert-parallel-comm"), ("delay_wgrad", "--delay-wgrad-compute"))
DP_SWITCHES = (("dist_opt", "--use-distributed-optimizer"),
               ("overlap_grad_reduce", "--overlap-grad-reduce"),
               ("overlap_param_gather", "--overlap-param-gather"),
               ("grad_reduce_bf16", "--grad-reduce-in-bf16"))


def _num(x: float) -> str:
    """A float flag value as Megatron's argparse reads it back exactly (1e-06, 1000000, 2.5)."""
    return repr(int(x)) if float(x).is_integer() and abs(x) >= 1 else repr(float(x))


def model_args(w: Workload, profile: StackProfile | None = None) -> list[str]:
    """The architecture flags: what `core_transformer_config_from_args` turns into the model's
    TransformerConfig (tests/test_emit_architecture.py compares it with each HF config.json)."""
    m = w.model
    te = profile is None or bool(profile.transformer_engine)
    # Null tokenizer: vocab = --vocab-size + 1 (its EOD token); --padded-vocab-size pins the
    # embedding to exactly the model's vocabulary instead of rounding up to 128 * tp.
    a = ["--num-layers", m.num_layers, "--hidden-size", m.hidden_size,
         "--num-attention-heads", m.num_attention_heads, "--ffn-hidden-size", m.ffn_hidden_size,
         "--seq-length", w.seq, "--max-position-embeddings", max(m.max_position_embeddings, w.seq),
         "--vocab-size", m.vocab_size - 1, "--padded-vocab-size", m.vocab_size,
         "--tokenizer-type", "NullTokenizer",
         "--normalization", m.normalization, "--norm-epsilon", _num(m.norm_epsilon),
         "--position-embedding-type", "rope", "--rotary-base", int(m.rotary_base)]
    if m.activation == "quick-geglu":
        a += ["--quick-geglu"]
    elif m.gated_linear_unit:
        a += ["--swiglu"]
    if m.glu_linear_offset:
        a += ["--glu-linear-offset", _num(m.glu_linear_offset)]
    if m.activation_clamp:
        a += ["--activation-func-clamp-value", _num(m.activation_clamp)]
    if not m.attention_bias:
        a += ["--disable-bias-linear"]
    if not m.tie_embeddings:
        a += ["--untie-embeddings-and-output-weights"]
    if m.qk_layernorm:
        a += ["--qk-layernorm"]  # per-head q/k norms; under MLA the q and kv latent norms
    if m.mla:
        a += ["--multi-latent-attention", "--kv-lora-rank", m.kv_lora_rank,
              "--qk-head-dim", m.qk_head_dim, "--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim,
              "--v-head-dim", m.v_head_dim]
        if m.q_lora_rank:
            a += ["--q-lora-rank", m.q_lora_rank]
        if m.yarn_original_max_position:  # MLATransformerConfig's rope_type defaults to yarn
            a += ["--rotary-scaling-factor", _num(m.rope_scaling_factor), "--mscale", _num(m.yarn_mscale),
                  "--mscale-all-dim", _num(m.yarn_mscale_all_dim)]
    else:
        if m.query_groups != m.num_attention_heads:
            a += ["--group-query-attention", "--num-query-groups", m.query_groups]
        if m.kv_channels:
            a += ["--kv-channels", m.kv_channels]
    if m.window_size:
        # HF sliding_window counts the query itself; TE's (left, right) window does not
        a += ["--window-size", f"({m.window_size - 1},0)"]
        if m.window_attn_skip_freq:
            a += ["--window-attn-skip-freq", m.window_attn_skip_freq]
    if m.attention_sinks:
        a += ["--softmax-type", "learnable"]
    if m.mtp_num_layers:
        a += ["--mtp-num-layers", m.mtp_num_layers]
    if not te:
        a += ["--no-rope-fusion"]  # fused RoPE is TE's kernel: TransformerConfig raises without TE
    if m.is_moe:
        pattern = "[" + ",".join("1" if x else "0" for x in m.moe_layers) + "]"
        a += ["--num-experts", m.num_experts, "--moe-router-topk", m.moe_router_topk,
              "--moe-ffn-hidden-size", m.moe_ffn_hidden_size, "--moe-layer-freq", pattern,
              "--moe-router-score-function", m.moe_router_score_function,
              "--moe-router-load-balancing-type", m.moe_router_load_balancing_type,
              "--moe-aux-loss-coeff", _num(m.moe_aux_loss_coeff),
              # router logits in fp32, as every Megatron-Bridge MoE recipe sets
              "--moe-router-dtype", "fp32"]
        if m.moe_shared_expert_ffn:
            a += ["--moe-shared-expert-intermediate-size", m.moe_shared_expert_ffn]
        if m.moe_router_num_groups:
            a += ["--moe-router-num-groups", m.moe_router_num_groups,
                  "--moe-router-group-topk", m.moe_router_group_topk]
        if m.moe_router_pre_softmax or (m.moe_router_topk == 1 and m.moe_router_score_function == "softmax"):
            a += ["--moe-router-pre-softmax"]  # (TransformerConfig also requires it for top-1 softmax)
        if m.moe_router_topk_scaling_factor != 1.0:
            a += ["--moe-router-topk-scaling-factor", _num(m.moe_router_topk_scaling_factor)]
        if m.moe_router_enable_expert_bias:
            # DeepSeek-V3 report: bias update speed 0.001 (Megatron's default, stated for the record)
            a += ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "1e-3"]
    if te:
        a += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    return [str(x) for x in a]


def plan_args(w: Workload, p: Plan, profile: StackProfile) -> list[str]:
    a = ["--tensor-model-parallel-size", p.tp, "--pipeline-model-parallel-size", p.pp,
         "--context-parallel-size", p.cp, "--micro-batch-size", p.mbs, "--global-batch-size", w.gbs]
    if w.model.is_moe:
        a += ["--expert-model-parallel-size", p.ep, "--expert-tensor-parallel-size", p.etp,
              "--moe-token-dispatcher-type", p.dispatcher]
        if p.flex_backend:
            a += ["--moe-flex-dispatcher-backend", p.flex_backend]
        if p.dispatcher == "flex" and p.flex_backend == "hybridep":
            a += ["--moe-hybridep-num-sms", HYBRIDEP_NUM_SMS]  # the SMs the cost model prices
        a += [flag for field, flag in MOE_SWITCHES if getattr(p, field)]
        if p.capacity_factor:
            a += ["--moe-expert-capacity-factor", _num(p.capacity_factor)]
            if p.pad_to_capacity:
                a += ["--moe-pad-expert-input-to-capacity"]
    if p.tp > 1:
        a += ["--sequence-parallel"]  # required for MoE with TP > 1 (moe_layer.py), faster for dense
    if p.pp_layout:
        a += ["--pipeline-model-parallel-layout", layout_with_mtp(p.pp_layout, w.model.mtp_num_layers)]
    else:
        if p.vpp > 1:
            a += ["--num-virtual-stages-per-pipeline-rank", p.vpp]
        if p.pp_first:
            a += ["--decoder-first-pipeline-num-layers", p.pp_first]
        if p.pp_last:
            a += ["--decoder-last-pipeline-num-layers", p.pp_last]
        if p.pp_embedding:
            a += ["--account-for-embedding-in-pipeline-split"]
        if p.pp_loss:
            a += ["--account-for-loss-in-pipeline-split"]
    # Interleaved schedules keep Megatron-LM's default overlap_p2p_comm=True, which implies
    # batch_p2p_comm=False: batched p2p mixes up the two directions at PP=2 and corrupts
    # gradients (Megatron-LM issues 750 and 1450). Never pass --no-overlap-p2p-communication.
    if p.recompute != "none":
        a += ["--recompute-granularity", p.recompute]
        if p.recompute == "full":
            a += ["--recompute-method", p.recompute_method, "--recompute-num-layers", p.recompute_layers]
        elif p.recompute_modules:
            a += ["--recompute-modules", *p.recompute_modules]
    if p.cuda_graph_impl != "none":
        a += ["--cuda-graph-impl", p.cuda_graph_impl]
        if p.cuda_graph_scope:
            a += ["--cuda-graph-scope", *p.cuda_graph_scope]
        if "full_iteration" in p.cuda_graph_scope:  # arguments.py asserts it for full-iteration graphs
            a += ["--no-check-for-nan-in-loss-and-grad"]
    a += [flag for field, flag in DP_SWITCHES if getattr(p, field)]
    if p.fsdp:
        # Megatron-Bridge _set_megatron_fsdp_overrides: ZeRO-3 sharding; validate_args asserts the
        # fsdp_dtensor checkpoint format with Megatron FSDP
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
              "--ckpt-format", "fsdp_dtensor"]
    a += ["--bf16"]
    if p.fp8:
        fmt, recipe = FP8_RECIPE_FLAGS[p.precision]
        a += ["--fp8-format", fmt, "--fp8-recipe", recipe]
        if p.fp8_param:
            a += ["--fp8-param-gather"]
    a += ["--transformer-impl", "transformer_engine" if profile.transformer_engine else "local"]
    return [str(x) for x in a]


def layout_with_mtp(layout: str, mtp_layers: int) -> str:
    """Megatron's layout must place the MTP layers (`m`) in the last stage, before the loss
    (pipeline_parallel_layer_layout.py validate_layer_layout); plans omit them."""
    if not mtp_layers or "m" in layout:
        return layout
    return layout[:-1] + "m" * mtp_layers + "L" if layout.endswith("L") else layout


def env_vars(w: Workload, p: Plan) -> dict:
    """The launch environment of `p` (`specs.stack.launch_env`, which the GPU trial sets too)."""
    return launch_env(p, w.cluster)


def not_expressible(m) -> list[str]:
    """Architecture details of `m` that Megatron-LM core_v0.16.1's flags cannot set."""
    out = []
    if m.yarn_original_max_position and not m.mla:
        out.append(f"yarn (factor {m.rope_scaling_factor:g}): arguments.py allows rope_type yarn only with MLA")
    if m.mla and (m.yarn_beta_fast, m.yarn_beta_slow) != (32.0, 1.0):
        out.append(f"beta_fast {m.yarn_beta_fast:g} / beta_slow {m.yarn_beta_slow:g}: MLATransformerConfig "
                   "fields without a flag (the run uses 32 / 1)")
    return out


def megatron_script(w: Workload, p: Plan, profile: StackProfile, train_iters: int = 50,
                    header: list[str] | tuple = ()) -> str:
    """A bash script that launches this plan with torchrun on every node, or under Slurm with one
    `srun` task per node. `header`: comment lines (tuner.emit.header.megatron_header) placed after
    the plan line."""
    c = w.cluster
    per_node = c.devices_per_node
    nodes = max(1, w.world // per_node)
    bench = ["--moe-router-force-load-balancing"] if w.model.is_moe else []  # what the cost model prices
    args = model_args(w, profile) + plan_args(w, p, profile) + bench + [
        "--train-iters", str(train_iters), "--lr", "1e-4", "--min-lr", "1e-5",
        "--lr-decay-style", "cosine", "--weight-decay", "0.1", "--clip-grad", "1.0",
        "--mock-data", "--split", "99,1,0", "--log-interval", "1", "--eval-iters", "0",
        "--log-throughput"]
    gaps = not_expressible(w.model)
    lines = ["#!/usr/bin/env bash",
             f"# moetune plan: {p.canonical()}",
             f"# model {w.model.name} ({w.model.digest()[:12]}), cluster {c.kind} x {w.world}, "
             f"gbs {w.gbs}, seq {w.seq}, stack {profile.describe()}",
             *header,
             f"# not expressible: {'; '.join(gaps) if gaps else 'none'}",
             f"# launch: MEGATRON_LM=<Megatron-LM checkout matching megatron-core {profile.megatron_core}>, then",
             f"#   torchrun: run this script on each of the {nodes} node(s)"
             + (" with NODE_RANK (0..N-1) and MASTER_ADDR (node 0) set" if nodes > 1 else ""),
             f"#   Slurm:    sbatch --nodes={nodes} --ntasks-per-node=1 --gpus-per-node={per_node} "
             "--wrap \"srun bash THIS_SCRIPT\"",
             "set -euo pipefail"]
    for k, v in env_vars(w, p).items():
        lines.append(f"export {k}={shlex.quote(v)}")
    lines += [": \"${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout}\"",
              "if [ -n \"${SLURM_JOB_ID:-}\" ]; then  # one srun task per node: Slurm names the rank and node 0",
              "  NODE_RANK=${SLURM_NODEID}",
              "  MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)}",
              "fi"]
    if nodes > 1:  # a default of 127.0.0.1 would make every node wait for itself
        lines += [f": \"${{NODE_RANK:?set NODE_RANK (0..{nodes - 1}) on each node}}\"",
                  ": \"${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}\""]
    else:
        lines += ["NODE_RANK=${NODE_RANK:-0}", "MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}"]
    lines += ["MASTER_PORT=${MASTER_PORT:-6000}", "",
              f"torchrun --nproc-per-node {per_node} --nnodes {nodes} --node-rank \"$NODE_RANK\" \\",
              "  --master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" \\",
              "  \"$MEGATRON_LM/pretrain_gpt.py\" \\"]
    body = []
    i = 0
    while i < len(args):
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        body.append("  " + " ".join(shlex.quote(x) for x in args[i:j]))
        i = j
    lines.append(" \\\n".join(body))
    return "\n".join(lines) + "\n"
