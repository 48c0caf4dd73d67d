"""What a serving trial measured: throughputs and latency percentiles of one benchmark run.

`ServeMeasurement` is the serving counterpart of `trials.base.Measurement` (failures use the same
`trials.base.Failure` and failure kinds). `bench` keeps the benchmark's own summary (seconds, the
names of vLLM's / SGLang's bench_serving JSON with `_ms` turned into `_s`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ServeMeasurement:
    plan: str  # canonical ServePlan string actually served
    gpus: int  # devices the deployment used (cores on cpu-local)
    startup_s: float  # launch -> /health answered 200
    input_tokens_per_s_per_gpu: float
    output_tokens_per_s_per_gpu: float
    ttft_p90_s: float
    tpot_p90_s: float
    bench: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    backend: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = True
        return d


def from_bench(plan: str, gpus: int, startup_s: float, bench: dict, *, backend: str,
               versions: dict | None = None) -> ServeMeasurement:
    """A measurement from a benchmark summary in seconds (`trials.serving.loadgen.summarize` names)."""
    return ServeMeasurement(
        plan=plan, gpus=gpus, startup_s=startup_s,
        input_tokens_per_s_per_gpu=bench["input_throughput"] / gpus,
        output_tokens_per_s_per_gpu=bench["output_throughput"] / gpus,
        ttft_p90_s=bench["p90_ttft_s"], tpot_p90_s=bench["p90_tpot_s"],
        bench=bench, versions=dict(versions or {}), backend=backend)


def bench_serving_to_seconds(raw: dict) -> dict:
    """SGLang's (and vLLM's) bench_serving JSON -> the loadgen summary names, milliseconds as seconds."""
    out = {"num_prompts": raw.get("completed", 0), "completed": raw.get("completed", 0), "failed": 0,
           "duration_s": raw["duration"], "max_concurrency": raw.get("max_concurrency") or 0,
           "total_input_tokens": raw.get("total_input_tokens", 0),
           "total_output_tokens": raw.get("total_output_tokens", 0),
           "request_throughput": raw["request_throughput"], "input_throughput": raw["input_throughput"],
           "output_throughput": raw["output_throughput"],
           "total_token_throughput": raw.get("total_throughput", raw["input_throughput"] + raw["output_throughput"])}
    for name in ("ttft", "tpot", "itl", "e2e_latency"):
        short = "e2el" if name == "e2e_latency" else name
        for stat in ("mean", "median", "p90", "p99"):
            v = raw.get(f"{stat}_{name}_ms")
            if v is not None:
                out[f"{'p50' if stat == 'median' else stat}_{short}_s"] = float(v) / 1000.0
    missing = [k for k in ("p90_ttft_s", "p90_tpot_s") if k not in out]
    if missing:
        raise ValueError(f"bench_serving output lacks {', '.join(k.replace('_s', '_ms') for k in missing)}")
    return out
