"""SGLang 0.5.23's resolution of a `ServePlan`: the one copy of its silent rewrites and defaults.

`resolve(plan, model, cluster)` returns the `EffectivePlan` SGLang runs: every rewrite its argument
resolver makes to a plan's flags, and every default it fills from the GPU's memory, as
`ServerArgs.resolve_once()` computes them (file:line below, `SG` = sglang/srt). The realizability
rules (tuner/serve_realize) only add rejections on top of it; the serving cost model
(cost_model/serving) prices its output and re-applies nothing. tests/test_serve_oracle.py compares
every resolved field with SGLang's own resolver (tuner/space/sglang_oracle.py) on sampled plans.

`model` and `cluster` are read duck-typed (`model.mla`; `cluster.hbm_gib`, `devices_per_node`,
`device_name`), so this module stays below `clusters` in the layering.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from specs.errors import SpecError
from specs.serve_plan import A2A_BACKENDS, ServePlan

# backends in SGLang's "a2a forces ep = tp" set (SG/arg_groups/overrides.py:1578-1620): every
# all-to-all backend a ServePlan can name
EP_FORCING_A2A = frozenset(A2A_BACKENDS) - {"none"}

# the server roles whose memory SGLang sizes differently (--disaggregation-mode)
ROLES = ("agg", "prefill", "decode")

# SGLang's rewrites that change what runs (`EffectivePlan.rewrites` records those that fired)
REWRITES: dict[str, str] = {
    "a2a-forces-ep": "an a2a backend forces ep = tp (SG/arg_groups/overrides.py:1578)",
    "a2a-deepep-mode": "pplx runs deepep_mode=low_latency, mori normal; --deepep-mode is written only for deepep "
                       "(SG/arg_groups/moe_hook.py:545,581)",
    "deepep-normal-no-graphs": "deepep_mode=normal disables decode and prefill CUDA graphs (SG/arg_groups/moe_hook.py:383)",
    "attn-dp-chunk": "attention DP divides the chunked-prefill size by attn_dp (SG/arg_groups/parallel_hook.py:331)",
    "attn-dp-conservative": "attention DP multiplies schedule conservativeness by 0.3 (SG/arg_groups/parallel_hook.py:318)",
    "pp-no-overlap": "pp > 1 disables the overlap scheduler (SG/arg_groups/overrides.py:1624)",
    "default-chunk": "chunked_prefill=0 takes SGLang's default by GPU memory (SG/arg_groups/memory_hook.py:89)",
    "default-graph-bs": "cuda_graph_max_bs=0 takes SGLang's default by GPU memory and tp (SG/arg_groups/memory_hook.py:89)",
    "graph-bs-running": "a default decode graph batch is clamped to max_running (SG/arg_groups/memory_hook.py:182)",
    "default-mem-frac": "mem_frac=0 takes SGLang's formula: (GPU memory - activation, graph and DeepEP reserves) / GPU memory "
                        "(SG/arg_groups/memory_hook.py:245)",
    "backend-page-size": "the attention backend forces its page size (trtllm_mla: 32 or 64, else 64; "
                         "SG/arg_groups/overrides.py:1146)",
    "allreduce-fusion": "FlashInfer all-reduce fusion turns on by itself (all-reduce + residual add + RMSNorm in one "
                        "kernel; SG/arg_groups/overrides.py:956-1001 _flashinfer_allreduce_fusion_auto_enable)",
}

# the architectures SGLang turns FlashInfer all-reduce fusion on for (SG/arg_groups/overrides.py:929
# _FLASHINFER_ALLREDUCE_FUSION_ARCHS), of those a ServePlan's model can be (specs.hf_export.ARCHS;
# Mixtral is not among them)
ALLREDUCE_FUSION_ARCHS = frozenset({"DeepseekV3ForCausalLM", "GptOssForCausalLM", "Qwen3MoeForCausalLM"})


def context_length(model) -> int:
    """The context length SGLang serves `model` at without --context-length (0: the model names
    none). SG/utils/hf_transformers/common.py get_context_length reads the config's
    max_position_embeddings and multiplies it by a rope-scaling factor only when the scaling names
    no original_max_position_embeddings; the YaRN configs here always name it (DeepSeek-V3/R1,
    gpt-oss), so the product never applies."""
    return int(getattr(model, "max_position_embeddings", 0) or 0)


def check_request_fits_context(model, isl: int, osl: int) -> None:
    """Refuse a request SGLang refuses (SG/managers/tokenizer_manager.py _validate_one_request: an
    input of the context length or more; input + max_new_tokens beyond it, validate_total_tokens
    being on by default). Raises SpecError naming the lengths and the model's context length."""
    ctx = context_length(model)
    if ctx and (isl >= ctx or isl + osl > ctx):
        raise SpecError(f"--isl {isl:,} + --osl {osl:,} does not fit {getattr(model, 'name', 'the model')}'s context "
                        f"length of {ctx:,} tokens: SGLang refuses such requests (input below the context "
                        f"length, input + output within it)")


def memory_tier_defaults(gpu_mib: float | None, tp: int) -> tuple[int, int]:
    """SGLang 0.5.23's memory-tier defaults (chunked_prefill_size, decode CUDA-graph max batch) for a
    GPU of `gpu_mib` MiB (SG/arg_groups/memory_hook.py:89-170; the tier edges are MiB / 1024 = GiB);
    None = no GPU memory known (its fallback, memory_hook.py:171)."""
    if gpu_mib is None:
        return 4096, 160
    gib = gpu_mib / 1024
    if gib < 20:
        return 2048, 8
    if gib < 35:
        return 4096, 48 if tp < 4 else 160
    if gib < 60:
        return 4096, 32 if tp < 4 else 160
    if gib < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def is_blackwell(device_name: str) -> bool:
    name = device_name.upper()
    return "BLACKWELL" in name or any(t in name.replace("-", " ").split() for t in ("B200", "GB200", "B300", "GB300"))


def is_hopper(device_name: str) -> bool:
    """sm90 GPUs (H100, H200, H800, H20, GH200) by device name: what SGLang's `is_sm90` probe says on
    them, and the one rule `clusters.is_hopper` reads."""
    return any(tag in device_name.upper() for tag in ("H100", "H200", "H800", "H20", "GH200"))


def allreduce_fusion(model, cluster, plan: ServePlan, nnodes: int) -> bool:
    """Whether SGLang 0.5.23 turns FlashInfer all-reduce fusion on for `plan` by itself
    (SG/arg_groups/overrides.py:956-1001): the model's architecture in its list, an sm90 or sm100
    GPU, tp > 1, no attention DP, no all-to-all backend, and one node (Hopper) or any (Blackwell).
    Each tensor-parallel all-reduce then also adds the residual and runs the RMSNorm after it, in
    one kernel (SG/layers/layernorm.py _forward_with_allreduce_fusion)."""
    from specs.hf_export import pick_architecture
    bw = is_blackwell(cluster.device_name)
    return (pick_architecture(model) in ALLREDUCE_FUSION_ARCHS and (bw or is_hopper(cluster.device_name))
            and plan.tp > 1 and plan.attn_dp == 1 and plan.a2a == "none" and (nnodes == 1 or bw))


def attention_backend(model, cluster) -> str:
    """The attention backend a plan names explicitly (`--attention-backend`): the one SGLang would
    probe on the target GPU (a CPU host probes wrongly, so moetune names it). On sm100 SGLang 0.5.23
    runs trtllm_mha for MHA / GQA models without speculative decoding (SG/arg_groups/
    model_override_base.py:312-325; gpt-oss's own override, model_overrides/gpt_oss.py:28-33) and
    DeepSeek-V3's override names trtllm_mla (model_overrides/deepseek_v2.py:178-185)."""
    if is_blackwell(cluster.device_name):
        return "trtllm_mla" if model.mla else "trtllm_mha"
    return "fa3"  # Hopper (and older): SGLang's default for MLA and GQA models alike


# the page sizes an attention backend accepts; any other becomes 64 (SG/arg_groups/overrides.py:1144-1198)
BACKEND_PAGE_SIZES = {"trtllm_mla": (32, 64), "trtllm_mha": (16, 32, 64, 128)}


def backend_page_size(backend: str, page_size: int) -> int:
    """The page size an attention backend forces (`BACKEND_PAGE_SIZES`)."""
    ok = BACKEND_PAGE_SIZES.get(backend)
    return 64 if ok is not None and page_size not in ok else page_size


def server_nodes(plan: ServePlan, gpus_per_node: int) -> int:
    """Nodes one SGLang server spans (`--nnodes`): all its dp replicas for an aggregated plan, one
    instance with pd."""
    g = plan.instance_gpus * (1 if plan.pd else plan.dp)
    return max(1, math.ceil(g / gpus_per_node))


def static_mem_frac(gpu_mib: float | None, *, tp: int, pp: int, attn_dp: int, chunk_flag: int, max_running: int,
                    graph_bs: int, decode_graphs: bool, deepep: bool, role: str = "agg") -> float:
    """SGLang 0.5.23's `--mem-fraction-static` when not given (SG/arg_groups/memory_hook.py:245-300,
    `reserve_for_graph_mb`, `reserve_for_deepep_a2a_mb`), MiB:

        reserve = 512 + 1.5 * activation_tokens + tp*pp/8 * 1024 + graph reserve
        graph   = 2 * max_bs (decode graphs on) + 3 * max_bs * attn_dp (attention-DP padding)
                  + 1.5 * max_bs * attn_dp when max_bs > 300 (prefill graphs are off by default)
        reserve = max(reserve, 10240) on GPUs above 60 GiB; + 2048 for DeepEP with decode graphs
        mem_frac = round((gpu - reserve) / gpu, 3)   (not clipped: SGLang does not clip it)

    The decode graphs and DeepEP terms count as the memory hook sees them, before deepep normal
    turns the graphs off (moe_hook runs later). activation_tokens = max(chunked_prefill_size, 2048)
    (the flag, before attention DP divides it) or, on a pd decode server, max(max_running or max_bs,
    2048); a pd prefill server drops the decode-graph, attention-DP and DeepEP terms. No GPU memory
    known (None): 0.95."""
    if gpu_mib is None:
        return 0.95
    bs = float(graph_bs)
    if role == "decode":
        act = max(max_running or graph_bs or 1, 2048)
    else:
        act = max(chunk_flag, 2048)
    reserve = 512 + 1.5 * act + tp * pp / 8 * 1024
    if role != "prefill":
        if decode_graphs:
            reserve += 2.0 * bs
        if attn_dp > 1:
            reserve += 3.0 * bs * attn_dp + (1.5 * bs * attn_dp if bs > 300 else 0.0)
    if gpu_mib > 60 * 1024:
        reserve = max(reserve, 10240)
    if role != "prefill" and decode_graphs and deepep:
        reserve += 2048
    return round((gpu_mib - reserve) / gpu_mib, 3)


@dataclass(frozen=True)
class EffectivePlan:
    """What SGLang runs for `source`: its flags after the resolver's rewrites and defaults.

    plan: the resolved plan: ep (forced by an a2a backend), chunked_prefill (per attention-DP rank,
      as SGLang stores it), cuda_graph_max_bs (-1 = decode CUDA graphs off), page_size (forced by the
      attention backend), mem_frac (the flag, or SGLang's value clamped into ServePlan's range: the
      exact value, possibly <= 0, is `mem_frac`).
    chunk_flag: `--chunked-prefill-size` before the attention-DP division.
    graph_bs_mem: the decode graph max batch SGLang resolves (and sizes memory with), also when the
      graphs end up off.
    mem_frac / mem_frac_prefill / mem_frac_decode: the resolved static memory fraction of an
      aggregated server and of a pd prefill / decode server of this plan.
    """
    source: ServePlan
    plan: ServePlan
    chunk_flag: int
    graph_bs_mem: int
    mem_frac: float
    mem_frac_prefill: float
    mem_frac_decode: float
    nnodes: int
    attention_backend: str
    schedule_conservativeness: float
    overlap_schedule: bool
    prefill_cuda_graph: bool  # SGLang 0.5.23 leaves prefill CUDA graphs off unless asked (none of our flags asks)
    prefill_graph_max_bs: int  # their token cap, resolved all the same (the chunk flag; MLA: at most 8192)
    rewrites: tuple[str, ...]
    allreduce_fusion: bool = False  # FlashInfer all-reduce + residual + RMSNorm fusion on (`allreduce_fusion`)

    def mem_frac_for(self, role: str) -> float:
        return {"agg": self.mem_frac, "prefill": self.mem_frac_prefill, "decode": self.mem_frac_decode}[role]

    def pinned(self) -> ServePlan:
        """The source plan with every resolved flag written out (ep, chunk, decode graph batch, page
        size): it launches as this effective plan, and resolves to it again. mem_frac stays as given
        (SGLang re-derives the same value from the pinned flags)."""
        p = self.plan
        bs = p.cuda_graph_max_bs
        if bs == -1 and self.source.cuda_graph_max_bs != -1:
            bs = self.graph_bs_mem  # graphs off by deepep normal, not by the flag: keep the memory-time batch
        return self.source.replace(ep=p.ep, chunked_prefill=self.chunk_flag, cuda_graph_max_bs=bs,
                                   page_size=p.page_size)


def resolve(plan: ServePlan, model, cluster) -> EffectivePlan:
    """SGLang 0.5.23's resolution of `plan` for `model` on `cluster` (no rejections: see
    tuner/serve_realize for what SGLang refuses)."""
    p = plan
    gpu_mib = cluster.hbm_gib * 1024
    fired = []
    ep = p.ep
    if p.a2a in EP_FORCING_A2A and ep != p.tp:
        fired.append("a2a-forces-ep")
        ep = p.tp
    mode = p.deepep_mode if p.a2a == "deepep" else {"pplx": "low_latency", "mori": "normal"}.get(p.a2a, "auto")
    if mode != p.deepep_mode:
        fired.append("a2a-deepep-mode")
    default_chunk, default_bs = memory_tier_defaults(gpu_mib, p.tp)
    chunk_flag = p.chunked_prefill
    if not chunk_flag:
        fired.append("default-chunk")
        chunk_flag = default_chunk
    chunk = chunk_flag
    if p.attn_dp > 1:
        fired += ["attn-dp-chunk", "attn-dp-conservative"]
        chunk = chunk_flag // p.attn_dp
    bs_mem = p.cuda_graph_max_bs
    if bs_mem <= 0:  # 0 = default; -1 = graphs off by the flag, SGLang still resolves the default batch
        if bs_mem == 0:
            fired.append("default-graph-bs")
        bs_mem = default_bs
        if p.max_running and bs_mem > p.max_running:
            if p.cuda_graph_max_bs == 0:
                fired.append("graph-bs-running")
            bs_mem = p.max_running
    decode_graphs_mem = p.cuda_graph_max_bs != -1
    bs = bs_mem if decode_graphs_mem else -1
    graphs_off = p.a2a == "deepep" and p.deepep_mode == "normal"
    if graphs_off and bs != -1:
        fired.append("deepep-normal-no-graphs")
        bs = -1
    if p.pp > 1:
        fired.append("pp-no-overlap")
    backend = attention_backend(model, cluster)
    page = backend_page_size(backend, p.page_size)
    if page != p.page_size:
        fired.append("backend-page-size")
    # a host without GPUs (cpu-local, where vLLM-CPU serves from its own KV space) has no GPU memory
    # formula to apply: the fraction SGLang takes for an unknown capacity (memory_hook.py:292)
    mem_mib = gpu_mib if getattr(cluster, "is_gpu", True) else None
    kw = dict(tp=p.tp, pp=p.pp, attn_dp=p.attn_dp, chunk_flag=chunk_flag, max_running=p.max_running,
              graph_bs=bs_mem, decode_graphs=decode_graphs_mem, deepep=p.a2a == "deepep")
    if p.mem_frac:
        mf = mf_p = mf_d = p.mem_frac
    else:
        fired.append("default-mem-frac")
        mf, mf_p, mf_d = (static_mem_frac(mem_mib, role=r, **kw) for r in ROLES)
    eff = p.replace(ep=ep, deepep_mode=mode, chunked_prefill=chunk, cuda_graph_max_bs=bs, page_size=page,
                    mem_frac=min(max(mf, 0.0), 0.999))
    nnodes = server_nodes(p, cluster.devices_per_node)
    fusion = getattr(cluster, "is_gpu", True) and allreduce_fusion(model, cluster, eff, nnodes)
    if fusion:
        fired.append("allreduce-fusion")
    return EffectivePlan(
        source=p, plan=eff, chunk_flag=chunk_flag, graph_bs_mem=bs_mem, mem_frac=mf, mem_frac_prefill=mf_p,
        mem_frac_decode=mf_d, nnodes=nnodes, attention_backend=backend,
        schedule_conservativeness=0.3 if p.attn_dp > 1 else 1.0, overlap_schedule=p.pp == 1,
        prefill_cuda_graph=False, prefill_graph_max_bs=min(8192, chunk_flag) if model.mla else chunk_flag,
        rewrites=tuple(fired), allreduce_fusion=bool(fusion))
