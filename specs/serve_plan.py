"""A serving plan and a serving workload: the nouns of the serving half (SGLang 0.5.23 semantics).

A `ServePlan` is a frozen, hashable value with a canonical string in a fixed field order,
`tp=8,pp=1,dp=1,attn_dp=8,ep=8,a2a=deepep,deepep_mode=auto,tbo=1,...`, and
`ServePlan.parse(p.canonical()) == p` exactly. A partial string parses to a plan whose other
fields take the defaults below (SGLang's own defaults where it has one).

Field meanings (the SGLang 0.5.23 flag each one becomes):
- tp: `--tp-size`, GPUs of one model instance (times pp).
- pp: `--pp-size`.
- dp: `--dp-size`, independent replicas of the instance (data-parallel serving), each tp*pp GPUs.
- attn_dp: `--attn-dp-size`, attention data-parallel size inside one instance (1 = off);
  must divide tp.
- ep: `--ep-size`; an all-to-all backend forces ep = tp (SGLang rewrites it: specs/serve_resolve.py
  holds every such rewrite).
- moe_dense_tp: `--moe-dense-tp-size`, the TP width of the dense (non-MoE) MLP layers; 0 = SGLang's
  default (None: TP over the whole tp group, tokens gathered). 1 = each rank runs the dense MLP on its
  own tokens with the full weights (no dense-layer collective, more weight memory; LMSYS's large-scale
  EP deployments). SGLang accepts only None, 1 or tp (tuner/space/sglang_rules.py rejects the rest).
- a2a: `--moe-a2a-backend` (none | deepep | mooncake | …).
- deepep_mode: `--deepep-mode` (auto | normal | low_latency).
- tbo: `--enable-two-batch-overlap`.
- eplb_redundant: `--ep-num-redundant-experts` with `--enable-eplb`; 0 = no EPLB.
- chunked_prefill: `--chunked-prefill-size`; 0 = SGLang picks by GPU memory.
- max_running: `--max-running-requests`; 0 = SGLang picks from the KV pool.
- cuda_graph_max_bs: `--cuda-graph-max-bs-decode`; 0 = SGLang's default, -1 = CUDA graphs off.
- mem_frac: `--mem-fraction-static`; 0 = SGLang picks by GPU memory.
- page_size: `--page-size`.
- kv_cache_dtype: `--kv-cache-dtype` (auto = the model's dtype, bf16 | fp8_e4m3: one byte per KV element).
- pd: prefill:decode instance ratio of a disaggregated deployment ("" = aggregated), e.g. "1:2".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from specs.errors import PlanSyntaxError, SpecError
from specs.plan import format_value, parse_key_values

A2A_BACKENDS = ("none", "deepep", "mooncake", "nixl", "mori", "flashinfer", "pplx")
DEEPEP_MODES = ("auto", "normal", "low_latency")
PHASES = ("both", "prefill", "decode")
KV_CACHE_DTYPES = ("auto", "bf16", "fp8_e4m3")


@dataclass(frozen=True)
class ServePlan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    attn_dp: int = 1
    ep: int = 1
    moe_dense_tp: int = 0
    a2a: str = "none"
    deepep_mode: str = "auto"
    tbo: bool = False
    eplb_redundant: int = 0
    chunked_prefill: int = 0
    max_running: int = 0
    cuda_graph_max_bs: int = 0
    mem_frac: float = 0.0
    page_size: int = 1
    pd: str = ""
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        bad = []
        for f in ("tp", "pp", "dp", "attn_dp", "ep", "page_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad.append(f"{f} must be a positive integer")
        for f in ("moe_dense_tp", "eplb_redundant", "chunked_prefill", "max_running"):
            if getattr(self, f) < 0:
                bad.append(f"{f} must be >= 0")
        if self.cuda_graph_max_bs < -1:
            bad.append("cuda_graph_max_bs must be >= -1 (-1 = CUDA graphs off, 0 = SGLang's default)")
        if not 0.0 <= self.mem_frac < 1.0:
            bad.append("mem_frac must be in [0, 1) (0 = SGLang's default)")
        if self.a2a not in A2A_BACKENDS:
            bad.append(f"a2a={self.a2a!r} is not one of {'|'.join(A2A_BACKENDS)}")
        if self.deepep_mode not in DEEPEP_MODES:
            bad.append(f"deepep_mode={self.deepep_mode!r} is not one of {'|'.join(DEEPEP_MODES)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            bad.append(f"kv_cache_dtype={self.kv_cache_dtype!r} is not one of {'|'.join(KV_CACHE_DTYPES)}")
        if self.pd:
            parts = self.pd.split(":")
            if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
                bad.append(f"pd={self.pd!r} is not a prefill:decode ratio like 1:2")
        if bad:
            raise PlanSyntaxError("; ".join(bad))

    @property
    def instance_gpus(self) -> int:
        """GPUs of one model instance (one SGLang server, possibly over several nodes)."""
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        """GPUs of the whole aggregated deployment (all dp replicas)."""
        return self.instance_gpus * self.dp

    @property
    def dense_mlp_tp(self) -> int:
        """GPUs one dense (non-MoE) MLP layer is sharded over: 1 with `--moe-dense-tp-size 1` (every
        rank holds it whole and runs its own tokens), else the whole tp group (SGLang's default, and
        moe_dense_tp = tp). sglang models/deepseek_v2.py: `mlp_parallel_group = "replicated" if
        is_dense_ffn_fully_dp() else "tp"`, is_dense_ffn_fully_dp() = (moe_dense_tp_size == 1)."""
        return 1 if self.moe_dense_tp == 1 else self.tp

    @property
    def kv_bytes(self) -> float:
        """Bytes of one KV-cache element (the models served are bf16; fp8_e4m3 stores one byte)."""
        return 1.0 if self.kv_cache_dtype == "fp8_e4m3" else 2.0

    @property
    def pd_ratio(self) -> tuple[int, int] | None:
        if not self.pd:
            return None
        a, b = self.pd.split(":")
        return int(a), int(b)

    def canonical(self) -> str:
        return ",".join(f"{f.name}={format_value(getattr(self, f.name))}" for f in dataclasses.fields(self))

    __str__ = canonical

    @classmethod
    def parse(cls, text: str) -> "ServePlan":
        return cls(**parse_serve_fields(text))

    def replace(self, **kw) -> "ServePlan":
        return dataclasses.replace(self, **kw)


_FIELDS = {f.name: f for f in dataclasses.fields(ServePlan)}
_ALIASES = {"attn-dp": "attn_dp", "dp_attn": "attn_dp", "moe_a2a_backend": "a2a",
            "two_batch_overlap": "tbo", "cuda_graph": "cuda_graph_max_bs", "mem": "mem_frac",
            "kv_dtype": "kv_cache_dtype", "moe_dense_tp_size": "moe_dense_tp", "dense_tp": "moe_dense_tp"}


def parse_serve_fields(text: str) -> dict:
    """Parse `k=v,k=v` into typed ServePlan fields, rejecting unknown keys and bad values."""
    return parse_key_values(text, _FIELDS, _ALIASES, "serving plan")


@dataclass(frozen=True)
class ServeWorkload:
    """What a serving deployment must handle.

    isl / osl: input / output tokens per request (fixed lengths; `lengths` overrides them with
    per-request (isl, osl) pairs, e.g. read from a CSV).
    concurrency: requests in flight (closed loop); for phase "decode", the decode batch per GPU.
    request_rate: requests/s (open loop, Poisson); 0 = closed loop at `concurrency`.
    ttft_p90_s / tpot_p90_s: SLOs (0 = none).
    phase: "both" (aggregated), or one pool of a prefill/decode-disaggregated deployment.
    """

    isl: int
    osl: int
    concurrency: int = 0
    request_rate: float = 0.0
    ttft_p90_s: float = 0.0
    tpot_p90_s: float = 0.0
    phase: Literal["both", "prefill", "decode"] = "both"
    lengths: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.isl <= 0 or self.osl <= 0:
            raise SpecError(f"--isl and --osl must be positive, got {self.isl}/{self.osl}")
        if self.concurrency < 0 or self.request_rate < 0:
            raise SpecError("--concurrency and --request-rate must be >= 0")
        if self.phase not in PHASES:
            raise SpecError(f"--phase must be one of {'|'.join(PHASES)}, got {self.phase!r}")
        if self.ttft_p90_s < 0 or self.tpot_p90_s < 0:
            raise SpecError("SLOs must be >= 0 (0 = none)")

    @property
    def objective(self) -> str:
        """What the search maximises: input tokens/s/GPU for a prefill pool, output tokens/s/GPU otherwise."""
        return "input_tokens_per_s_per_gpu" if self.phase == "prefill" else "output_tokens_per_s_per_gpu"

