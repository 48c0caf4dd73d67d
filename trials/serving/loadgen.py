"""A small closed-loop serving benchmark: random token-id prompts over OpenAI `/v1/completions`.

`num_prompts` requests of `isl` random token ids each ask for exactly `osl` tokens
(`ignore_eos`, `min_tokens`), streamed, with at most `concurrency` in flight (0 = all at once);
a `request_rate` > 0 spaces arrivals by exponential gaps (open loop, Poisson). Each streamed
chunk that carries a choice is one token arrival; the server's final usage record gives the
exact output token count. Per request: TTFT (first chunk), the inter-token gaps (ITL), TPOT =
(latency - TTFT) / (output tokens - 1). `summarize` turns them into the figures every serving
backend reports (same names as vLLM's / SGLang's bench_serving JSON).
"""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int
    output_len: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list = field(default_factory=list)
    error: str = ""


def random_prompts(n: int, isl: int, vocab: int, seed: int) -> list[list[int]]:
    # ids above the special tokens (0..2 in trials.serving.model_dir) so no prompt holds an EOS
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(isl)] for _ in range(n)]


async def _one(session, url: str, model: str, prompt: list[int], osl: int, timeout_s: float) -> RequestResult:
    import aiohttp
    body = {"model": model, "prompt": prompt, "max_tokens": osl, "min_tokens": osl, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    res = RequestResult(ok=False, prompt_len=len(prompt))
    t0 = time.perf_counter()
    last = t0
    arrivals = 0
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.text())[:300]}"
                return res
            async for raw in r.content:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if msg.get("choices"):
                    now = time.perf_counter()
                    if arrivals == 0:
                        res.ttft_s = now - t0
                    else:
                        res.itl_s.append(now - last)
                    last = now
                    arrivals += 1
                if msg.get("usage"):
                    res.output_len = int(msg["usage"].get("completion_tokens") or 0)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"[:300]
        return res
    res.latency_s = time.perf_counter() - t0
    res.output_len = res.output_len or arrivals
    res.ok = arrivals > 0
    if not res.ok:
        res.error = "no tokens streamed"
    return res


async def _run(base_url: str, model: str, prompts, osl: int, concurrency: int, request_rate: float,
               timeout_s: float, seed: int):
    import aiohttp
    sem = asyncio.Semaphore(concurrency or len(prompts))
    rng = random.Random(seed + 1)
    url = base_url.rstrip("/") + "/v1/completions"

    async def guarded(p, delay):
        await asyncio.sleep(delay)
        async with sem:
            return await _one(session, url, model, p, osl, timeout_s)

    delays, t = [], 0.0
    for _ in prompts:
        delays.append(t)
        if request_rate > 0:
            t += rng.expovariate(request_rate)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(guarded(p, d) for p, d in zip(prompts, delays)))
        return results, time.perf_counter() - t0


def run_benchmark(base_url: str, model: str, *, isl: int, osl: int, num_prompts: int, concurrency: int,
                  vocab: int, request_rate: float = 0.0, seed: int = 0, timeout_s: float = 600.0) -> dict:
    prompts = random_prompts(num_prompts, isl, vocab, seed)
    results, duration = asyncio.run(_run(base_url, model, prompts, osl, concurrency, request_rate, timeout_s, seed))
    return summarize(results, duration, concurrency=concurrency)


def _pct(xs: list, q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(results: list[RequestResult], duration_s: float, *, concurrency: int = 0) -> dict:
    ok = [r for r in results if r.ok]
    out = {"num_prompts": len(results), "completed": len(ok), "failed": len(results) - len(ok),
           "errors": sorted({r.error for r in results if not r.ok})[:5], "duration_s": duration_s,
           "max_concurrency": concurrency,
           "total_input_tokens": sum(r.prompt_len for r in ok), "total_output_tokens": sum(r.output_len for r in ok)}
    out["request_throughput"] = len(ok) / duration_s if duration_s > 0 else 0.0
    out["input_throughput"] = out["total_input_tokens"] / duration_s if duration_s > 0 else 0.0
    out["output_throughput"] = out["total_output_tokens"] / duration_s if duration_s > 0 else 0.0
    out["total_token_throughput"] = out["input_throughput"] + out["output_throughput"]
    series = {"ttft": [r.ttft_s for r in ok],
              "tpot": [(r.latency_s - r.ttft_s) / (r.output_len - 1) for r in ok if r.output_len > 1],
              "itl": [x for r in ok for x in r.itl_s],
              "e2el": [r.latency_s for r in ok]}
    for name, xs in series.items():
        out[f"mean_{name}_s"] = statistics.fmean(xs) if xs else float("nan")
        for q in PERCENTILES:
            out[f"p{q}_{name}_s"] = _pct(xs, q)
    return out
