"""Serving-plan realizability: the rejections of SGLang 0.5.23's argument resolver, of model load and
of the cluster.

`realize(plan, model, cluster)` returns a `ServeVerdict`: the hard rejections (stable codes, one
sentence each) and, for a realizable plan, the *effective* plan SGLang actually runs
(`specs.serve_resolve.resolve`, the one copy of its silent rewrites and defaults), so the plan we
price is the plan that runs. The rules come from the installed sglang 0.5.23 source (file:line
below, `SG` = sglang/srt); tests/test_serve_oracle.py checks the verdicts and the resolution
against the resolver itself (tuner/space/sglang_oracle.py).

Codes by source:
- "sglang": what the resolver (`resolve_once` + `check_server_args`) rejects; the oracle agrees.
- "model": what fails later, at model load (head / expert sharding), which the resolver cannot see.
- "cluster": the deployment does not fit the GPUs given.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specs.serve_plan import ServePlan
from specs.serve_resolve import EffectivePlan, resolve, server_nodes

# the serving stack these rules stand for (error headers: "plan is not realizable on ...")
SERVING_STACK = "SGLang 0.5.23"

# code -> (source, what the rule says); the sentence of a rejection names the plan's numbers
RULES: dict[str, tuple[str, str]] = {
    "dp-with-attn-dp": ("sglang", "--dp-size replicas cannot be combined with --attn-dp-size (SG/arg_groups/parallel_hook.py:286)"),
    "attn-dp-divides-tp": ("sglang", "attn_dp must divide tp (SG/arg_groups/parallel_hook.py:326)"),
    "moe-dense-tp-values": ("sglang", "moe_dense_tp (--moe-dense-tp-size) must be SGLang's default, 1 or tp "
                            "(SG/arg_groups/validation_hook.py:207)"),
    "tbo-needs-a2a-or-attn-dp": ("sglang", "two-batch overlap needs an a2a backend or attention DP (SG/arg_groups/validation_hook.py:756)"),
    "eplb-needs-ep": ("sglang", "EPLB needs the resolved ep > 1 (SG/arg_groups/parallel_hook.py:791)"),
    "chunk-page": ("sglang", "the per-rank chunked-prefill size must be a multiple of page_size (SG/arg_groups/validation_hook.py:241)"),
    "multinode-dp": ("sglang", "--dp-size replicas must fit one node; use attention DP across nodes (SG/arg_groups/validation_hook.py:199)"),
    "instance-whole-nodes": ("sglang", "an instance spanning nodes must split evenly: (tp*pp) % nnodes == 0 "
                             "(SG/arg_groups/validation_hook.py:179)"),
    "flashinfer-a2a-attn-dp": ("sglang", "the flashinfer a2a backend needs attn_dp == tp (SG/arg_groups/moe_hook.py:471)"),
    "pplx-needs-attn-dp": ("sglang", "the pplx a2a backend needs attn_dp >= 2 (SG/arg_groups/moe_hook.py:578)"),
    "pplx-dispatch-tokens": ("sglang", "pplx dispatches at most 128 tokens per rank: per-rank chunk and decode graph batch <= 128 "
                             "(SG/arg_groups/moe_hook.py:611)"),
    "flashinfer-a2a-runner": ("sglang", "the flashinfer a2a backend needs a flashinfer or deep_gemm MoE runner; a plan leaves it at auto "
                              "(SG/arg_groups/moe_hook.py:526)"),
    "ep-divides-tp": ("model", "ep must divide tp: SGLang's MoE TP width is tp // ep (SG/runtime_context.py:154)"),
    "heads-attn-tp": ("model", "attention heads must split evenly over the attention TP ranks (tp / attn_dp)"),
    "kv-heads-attn-tp": ("model", "KV heads must split over, or replicate evenly onto, the attention TP ranks"),
    "experts-ep": ("model", "routed (plus redundant) experts must split evenly over ep ranks"),
    "moe-ffn-tp": ("model", "the expert FFN width must split evenly over the MoE TP ranks (tp / ep)"),
    "pp-layers": ("model", "pp cannot exceed the number of layers"),
    "pd-with-dp": ("cluster", "a prefill/decode deployment runs single instances per pool (dp must be 1)"),
    "gpus-exceed": ("cluster", "the deployment needs more GPUs than given"),
}

@dataclass(frozen=True)
class ServeReason:
    code: str
    sentence: str

    @property
    def source(self) -> str:
        return RULES[self.code][0]

    def __str__(self) -> str:
        return f"{self.code}: {self.sentence}"


@dataclass
class ServeVerdict:
    plan: ServePlan
    reasons: list[ServeReason] = field(default_factory=list)
    effective: EffectivePlan | None = None  # what SGLang runs (specs.serve_resolve), when realizable

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def codes(self) -> list[str]:
        return [r.code for r in self.reasons]

    def sglang_ok(self) -> bool:
        """The resolver's verdict alone (what the oracle can confirm)."""
        return not any(r.source == "sglang" for r in self.reasons)


def deployment_gpus(plan: ServePlan) -> int:
    if plan.pd_ratio:
        a, b = plan.pd_ratio
        return (a + b) * plan.instance_gpus
    return plan.gpus


def _r(code: str, detail: str) -> ServeReason:
    return ServeReason(code, f"{RULES[code][1].split(' (SG/')[0]}: {detail}")


def realize(plan: ServePlan, model, cluster, *, gpus: int | None = None) -> ServeVerdict:
    """Our verdict on `plan` for `model` on `cluster` (`gpus` defaults to the cluster's count)."""
    p = plan
    v = ServeVerdict(plan)
    rs = v.reasons
    gpn = cluster.devices_per_node
    total = gpus if gpus is not None else cluster.num_devices
    nnodes = server_nodes(p, gpn)
    eff = resolve(p, model, cluster)
    ep = eff.plan.ep

    # --- the resolver's rejections ---
    if p.dp > 1 and p.attn_dp > 1:
        rs.append(_r("dp-with-attn-dp", f"dp={p.dp} with attn_dp={p.attn_dp}"))
    if p.tp % p.attn_dp:
        rs.append(_r("attn-dp-divides-tp", f"tp={p.tp}, attn_dp={p.attn_dp}"))
    if p.moe_dense_tp not in (0, 1, p.tp):
        rs.append(_r("moe-dense-tp-values", f"moe_dense_tp={p.moe_dense_tp}, tp={p.tp}"))
    if p.tbo and p.a2a == "none" and p.attn_dp == 1:
        rs.append(_r("tbo-needs-a2a-or-attn-dp", "tbo=1 with a2a=none and attn_dp=1"))
    if p.eplb_redundant > 0 and ep == 1:
        rs.append(_r("eplb-needs-ep", f"eplb_redundant={p.eplb_redundant} with ep=1"))
    if p.a2a == "flashinfer" and p.attn_dp != p.tp:
        rs.append(_r("flashinfer-a2a-attn-dp", f"attn_dp={p.attn_dp}, tp={p.tp}"))
    if p.a2a == "pplx" and p.attn_dp < 2:
        rs.append(_r("pplx-needs-attn-dp", f"attn_dp={p.attn_dp}"))
    if p.a2a == "flashinfer":
        rs.append(_r("flashinfer-a2a-runner", "a2a=flashinfer with the auto MoE runner"))
    if p.dp > 1 and nnodes > 1 and not p.pd:
        rs.append(_r("multinode-dp", f"dp={p.dp} x {p.instance_gpus} GPUs spans {nnodes} nodes of {gpn}"))
    if nnodes > 1 and p.instance_gpus % nnodes:
        rs.append(_r("instance-whole-nodes", f"tp*pp={p.instance_gpus} over {nnodes} nodes of {gpn}"))
    chunk, page = eff.plan.chunked_prefill, eff.plan.page_size
    if chunk > 0 and chunk % page:
        rs.append(_r("chunk-page", f"chunked prefill {chunk} per rank, page_size={page}"))
    if p.a2a == "pplx" and max(chunk, p.cuda_graph_max_bs) > 128:
        rs.append(_r("pplx-dispatch-tokens", f"chunk {chunk} per rank, decode graph batch {p.cuda_graph_max_bs}"))

    # --- model-load rules (the resolver cannot see them) ---
    m = model
    attn_tp = p.tp // p.attn_dp if p.tp % p.attn_dp == 0 else p.tp
    if m.num_attention_heads % attn_tp:
        rs.append(_r("heads-attn-tp", f"{m.num_attention_heads} heads over attention TP {attn_tp}"))
    if not m.mla:
        kv = m.query_groups
        if kv % attn_tp and attn_tp % kv:
            rs.append(_r("kv-heads-attn-tp", f"{kv} KV heads over attention TP {attn_tp}"))
    if p.tp % ep:
        rs.append(_r("ep-divides-tp", f"tp={p.tp}, ep={ep}"))
    elif m.is_moe:
        if (m.num_experts + p.eplb_redundant) % ep:
            rs.append(_r("experts-ep", f"{m.num_experts}+{p.eplb_redundant} experts over ep={ep}"))
        moe_tp = p.tp // ep
        if m.moe_ffn_hidden_size % moe_tp:
            rs.append(_r("moe-ffn-tp", f"expert FFN {m.moe_ffn_hidden_size} over MoE TP {moe_tp}"))
    if p.pp > m.num_layers:
        rs.append(_r("pp-layers", f"pp={p.pp} > {m.num_layers} layers"))

    # --- the cluster ---
    if p.pd and p.dp > 1:
        rs.append(_r("pd-with-dp", f"pd={p.pd} with dp={p.dp}"))
    need = deployment_gpus(p)
    if need > total:
        rs.append(_r("gpus-exceed", f"{need} GPUs needed, {total} given"))
    if rs:
        return v

    v.effective = eff
    return v
