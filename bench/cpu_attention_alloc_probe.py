"""Page faults and CPU time of Megatron's local CPU attention (fwd + bwd, one thread) per call, at
the cells around the held-out seq-1024 plan (issue 27): run it once with glibc's malloc defaults
(how the profile's workers measured before) and once with the CPU trial ranks' allocator
(trials/megatron/backend.py CPU_ALLOCATOR_TUNABLES):

  PYTHONPATH=. env -u GLIBC_TUNABLES python bench/cpu_attention_alloc_probe.py
  PYTHONPATH=. GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184 \
      python bench/cpu_attention_alloc_probe.py

Fault counts do not depend on the host's load; CPU times do (run it on a quiet host)."""
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from trials.profile.attention import _cpu_attention  # noqa: E402

CELLS = ((256, 32), (1024, 2), (1024, 4), (1024, 8))  # (seq, bh); head_dim 16 (tiny-moe)
CALLS = 12


def step(q, k, v, mask, d: int) -> None:
    """One training call: forward with autograd recording, then the backward."""
    o = _cpu_attention(q, k, v, mask, d ** -0.5)
    torch.autograd.grad(o, (q, k, v), torch.ones_like(o))


def main() -> None:
    torch.set_num_threads(1)  # as the trial ranks and the profile's workers run
    for s, bh in CELLS:
        d = 16
        q, k, v = (torch.randn(bh, s, d, requires_grad=True) for _ in range(3))
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
        for _ in range(3):
            step(q, k, v, mask, d)
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
        for _ in range(CALLS):
            step(q, k, v, mask, d)
        f1, t1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
        print(f"seq {s:5d} bh {bh:2d}: {(f1 - f0) / CALLS:8.0f} minor faults per fwd+bwd "
              f"({(f1 - f0) / CALLS * 4 / 1024:6.1f} MiB), cpu {(t1 - t0) / CALLS * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
