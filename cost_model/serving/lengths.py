"""Request lengths of the benchmark workloads the serving model is checked against.

ShareGPT (bench_serving's `sharegpt` dataset, ShareGPT_V3_unfiltered_cleaned_split.json):
- what is sourced: 1000 sampled prompts total ~215k input and ~198k output tokens (the totals
  vLLM / SGLang benchmark_serving runs print for 1000 ShareGPT prompts with a Llama tokenizer),
  so means 215 / 198; and the sampler's filters (`sample_sharegpt_requests`: drop prompt < 4 or
  output < 4 tokens, prompt > 1024, prompt + output > 2048).
- what is assumed: the shape. No public quantiles were found, so each length is taken as the
  maximum-entropy law for a positive quantity of known mean, the exponential, truncated by those
  filters (means re-matched after truncation), input and output independent. The tail matters:
  with "all prompts sent at once" the makespan ends with the few longest outputs decoding at a
  small batch, which fixed 215 / 198 lengths miss entirely.

The sample is deterministic (quantiles, not random draws) so a prediction is reproducible.
"""
from __future__ import annotations

import numpy as np

SHAREGPT_MEAN_IN = 215.0
SHAREGPT_MEAN_OUT = 198.0
SHAREGPT_MIN = 4
SHAREGPT_MAX_IN = 1024
SHAREGPT_MAX_TOTAL = 2048


def _trunc_exp_quantiles(n: int, mean: float, lo: float, hi: float) -> np.ndarray:
    """n quantiles ((i + 0.5) / n) of an exponential truncated to [lo, hi] whose mean is `mean`
    (the scale solved by bisection)."""
    u = (np.arange(n) + 0.5) / n

    def q(scale):
        a, b = np.exp(-lo / scale), np.exp(-hi / scale)
        return -scale * np.log(a - u * (a - b))

    s_lo, s_hi = 1.0, 50.0 * mean
    for _ in range(60):
        mid = 0.5 * (s_lo + s_hi)
        if q(mid).mean() < mean:
            s_lo = mid
        else:
            s_hi = mid
    return q(0.5 * (s_lo + s_hi))


def sharegpt_lengths(n: int, mean_in: float = SHAREGPT_MEAN_IN, mean_out: float = SHAREGPT_MEAN_OUT) -> list[tuple[int, int]]:
    """`n` (input, output) token lengths shaped like bench_serving's ShareGPT sample (see above), at
    the means a run printed where it did (its totals over its prompt count: the tokenizer sets them)."""
    n = max(int(n), 1)
    ins = _trunc_exp_quantiles(n, mean_in, SHAREGPT_MIN, SHAREGPT_MAX_IN)
    outs = _trunc_exp_quantiles(n, mean_out, SHAREGPT_MIN, SHAREGPT_MAX_TOTAL - SHAREGPT_MIN)
    outs = outs[np.random.RandomState(0).permutation(n)]  # independent of the input length
    outs = np.minimum(outs, SHAREGPT_MAX_TOTAL - ins)
    # in the order the sampler sends them: random, not by length (the quantiles come sorted; a burst
    # sent shortest prompt first prefilled half its requests in a fifth of the prefill time)
    order = np.random.RandomState(1).permutation(n)
    return [(int(round(a)), int(max(round(b), SHAREGPT_MIN))) for a, b in zip(ins[order], outs[order])]


def fixed_lengths(n: int, isl: int, osl: int) -> list[tuple[int, int]]:
    """`n` requests of exactly isl / osl tokens (bench_serving `random` with range ratio 1, or
    vLLM's `bench serve` random dataset at its default range ratio 0)."""
    return [(int(isl), int(osl))] * max(int(n), 1)
