"""Which transformer layers sit on which pipeline rank and virtual chunk, as Megatron-core splits them.

Three ways, exactly as Megatron-core 0.16 (transformer_config.py / transformer_layer.py):
- even: L layers in pp*vpp equal chunks; virtual chunk v of rank p holds layers
  [v*L/vpp + p*n, ... + n) with n = L/(pp*vpp).
- uneven first/last (`--decoder-first/last-pipeline-num-layers`): the first and/or last rank take
  the given counts, the middle ranks share the rest evenly; each rank's layers split into vpp chunks.
- explicit layout (`--pipeline-model-parallel-layout`): stages separated by `|`, `E` embedding,
  `t` transformer layer, `m` multi-token-prediction layer, `L` loss, `(..)*n` and `x*n` repeat;
  stage s is chunk s // pp of rank s % pp. MTP layers are taken where the cost model prices them,
  together just before the loss in its stage (NVIDIA's DeepSeek-V3 layouts end `...tmL`); a layout
  without them is the same split (the emitter adds them there, as Megatron requires one `m` per
  MTP layer).
- even with the embedding and/or the loss counted as layers (`--account-for-embedding-in-pipeline-split`,
  `--account-for-loss-in-pipeline-split`): L + [emb] + [loss] slots split into pp*vpp equal chunks,
  the embedding takes the first slot of chunk (0, 0) and the loss the last of chunk (pp-1, vpp-1)
  (transformer_config.py __post_init__ divisibility checks; transformer_block.py
  get_num_layers_to_build; transformer_layer.py get_transformer_layer_offset). Megatron refuses them
  together with first/last stage counts or a layout (transformer_config.py raises ValueError).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from specs.errors import LayoutError


@dataclass(frozen=True)
class Split:
    """chunks[p][v] = tuple of global layer indices; embedding on (0, 0), loss on (pp-1, vpp-1)
    unless an explicit layout places them elsewhere."""
    chunks: tuple[tuple[tuple[int, ...], ...], ...]
    embedding_at: tuple[int, int] = (0, 0)
    loss_at: tuple[int, int] = (-1, -1)
    mtp: int = 0  # MTP layers an explicit layout places (beside the loss); 0 when it names none

    def layers_per_rank(self) -> list[int]:
        return [sum(len(c) for c in rank) for rank in self.chunks]


def parse_layout(layout: str) -> list[str]:
    """Megatron's PipelineParallelLayerLayout.parse_str_to_list, as strings per stage."""
    s = layout.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    bad = set(s) - set("EtLm|")
    if bad:
        raise LayoutError(f"layout has characters {''.join(sorted(bad))!r}; allowed: E t L m | ( ) * digits")
    return s.split("|")


@functools.lru_cache(maxsize=4096)  # pure; the space asks the same few splits per parallel point
def split_layers(num_layers: int, pp: int, vpp: int = 1, first: int = 0, last: int = 0,
                 layout: str = "", embedding: bool = False, loss: bool = False) -> Split:
    """The layer split Megatron builds, or LayoutError naming the rule it breaks; `embedding` /
    `loss`: the embedding / loss counted as a pipeline layer."""
    if (embedding or loss) and (layout or first or last):
        raise LayoutError("the embedding/loss in the pipeline split cannot be combined with "
                          "first/last stage layer counts or an explicit layout")
    if layout:
        return _from_layout(num_layers, pp, vpp, layout)
    if embedding or loss:
        return _accounted(num_layers, pp, vpp, embedding, loss)
    if first or last:
        if pp < 2:
            raise LayoutError("uneven first/last stages need pp > 1")
        counts = _uneven_counts(num_layers, pp, vpp, first, last)
    else:
        if num_layers % (pp * vpp):
            raise LayoutError(f"{num_layers} layers do not split evenly over pp*vpp = {pp * vpp} chunks")
        counts = [num_layers // pp] * pp
    per_chunk = [[c // vpp] * vpp for c in counts]
    # Layer ids run virtual-chunk-major: all ranks' chunk 0, then all ranks' chunk 1, ...
    chunks = [[None] * vpp for _ in range(pp)]
    nxt = 0
    for v in range(vpp):
        for p in range(pp):
            n = per_chunk[p][v]
            chunks[p][v] = tuple(range(nxt, nxt + n))
            nxt += n
    return Split(tuple(tuple(r) for r in chunks), (0, 0), (pp - 1, vpp - 1))


def _accounted(num_layers: int, pp: int, vpp: int, embedding: bool, loss: bool) -> Split:
    """Megatron's even split with the embedding and/or loss counted as one layer each."""
    slots = num_layers + embedding + loss
    what = "+".join(n for n, on in (("embedding", embedding), ("loss", loss)) if on)
    if slots % pp:
        raise LayoutError(f"{num_layers} layers + {what} = {slots} do not divide over pp={pp}")
    if (slots // pp) % vpp:
        raise LayoutError(f"{slots // pp} layers (with the {what}) per pipeline rank do not divide into vpp={vpp} chunks")
    n = slots // (pp * vpp)
    chunks = [[None] * vpp for _ in range(pp)]
    nxt = 0
    for v in range(vpp):
        for p in range(pp):
            k = n - (embedding and (p, v) == (0, 0)) - (loss and (p, v) == (pp - 1, vpp - 1))
            if k < 0:  # transformer_block.py: "Not enough layers in the first/last virtual pipeline stage"
                raise LayoutError(f"not enough layers in the chunks holding the {what}")
            chunks[p][v] = tuple(range(nxt, nxt + k))
            nxt += k
    return Split(tuple(tuple(r) for r in chunks), (0, 0), (pp - 1, vpp - 1))


def _uneven_counts(num_layers: int, pp: int, vpp: int, first: int, last: int) -> list[int]:
    middle_layers, middle_stages = num_layers, pp
    for name, n in (("first", first), ("last", last)):
        if n:
            if n % vpp:
                raise LayoutError(f"{n} layers on the {name} stage do not divide into vpp={vpp} chunks")
            middle_layers -= n
            middle_stages -= 1
    if middle_layers < 0 or bool(middle_layers) != bool(middle_stages):
        raise LayoutError(f"{middle_layers} middle layers left for {middle_stages} middle stages")
    if middle_stages and middle_layers % middle_stages:
        raise LayoutError(f"{middle_layers} middle layers do not divide over {middle_stages} middle stages")
    mid = middle_layers // middle_stages if middle_stages else 0
    if middle_stages and mid % vpp:
        raise LayoutError(f"{mid} layers per middle stage do not divide into vpp={vpp} chunks")
    counts = [mid] * pp
    if first:
        counts[0] = first
    if last:
        counts[-1] = last
    return counts


def _from_layout(num_layers: int, pp: int, vpp: int, layout: str) -> Split:
    stages = parse_layout(layout)
    if len(stages) % pp:
        raise LayoutError(f"layout has {len(stages)} stages, not a multiple of pp={pp}")
    detected = len(stages) // pp
    if detected != vpp:
        raise LayoutError(f"layout has {detected} virtual stages per rank but the plan says vpp={vpp}")
    flat = "".join(stages)
    if not flat or flat[0] != "E" or flat.count("E") != 1:
        raise LayoutError("layout must start with the embedding E, exactly once")
    if flat[-1] != "L" or flat.count("L") != 1:
        raise LayoutError("layout must end with the loss L, exactly once")
    if flat.count("t") != num_layers:
        raise LayoutError(f"layout has {flat.count('t')} transformer layers, the model has {num_layers}")
    n_mtp = flat.count("m")
    if n_mtp and not next(st for st in stages if "L" in st).endswith("m" * n_mtp + "L"):
        # Megatron also runs a standalone MTP stage (m in the last chunk of an earlier rank), which
        # the cost model does not price: it puts MTP on the loss stage
        raise LayoutError("MTP layers (m) must sit together just before the loss L, in its stage "
                          "(a standalone MTP stage is not modelled)")
    chunks = [[None] * vpp for _ in range(pp)]
    nxt, emb, loss = 0, (0, 0), (pp - 1, vpp - 1)
    for s, stage in enumerate(stages):
        p, v = s % pp, s // pp
        n = stage.count("t")
        chunks[p][v] = tuple(range(nxt, nxt + n))
        nxt += n
        if "E" in stage:
            emb = (p, v)
        if "L" in stage:
            loss = (p, v)
    return Split(tuple(tuple(r) for r in chunks), emb, loss, n_mtp)


def balanced_layout(num_layers: int, pp: int, vpp: int = 1, loss_weight: int = 1) -> str:
    """The most balanced explicit layout: the embedding weighs one layer and the loss `loss_weight`
    layers, the pp*vpp stages get counts differing by at most one, heavier stages first
    (Megatron-Bridge's DeepSeek-V3 PP8xVPP4 layout "Et|(tt|)*30L" is this rule's answer for 61 layers;
    its B200 MXFP8 PP8xVPP2 layout "Et*4|(t*4|)*14tmL", the loss stage carrying the MTP layer, is the
    answer with loss_weight 3)."""
    stages = pp * vpp
    total = num_layers + 1 + loss_weight
    if stages > num_layers:
        raise LayoutError(f"{stages} pipeline stages for {num_layers} layers")
    base, extra = divmod(total, stages)
    sizes = [base + (1 if i < extra else 0) for i in range(stages)]
    out, left = [], num_layers
    for i, size in enumerate(sizes):
        t = size - (i == 0) - loss_weight * (i == stages - 1)
        t = max(0, min(t, left))
        left -= t
        out.append(("E" if i == 0 else "") + "t" * t + ("L" if i == stages - 1 else ""))
    if left:
        raise LayoutError(f"cannot place {num_layers} layers in {stages} stages")
    return _compress("|".join(out))


def _compress(layout: str) -> str:
    """Shorten runs of identical middle stages to Megatron's (..|)*n form."""
    stages = layout.split("|")
    out, i = [], 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) and stages[j + 1] == stages[i]:
            j += 1
        run = j - i + 1
        if run >= 3 and "E" not in stages[i] and "L" not in stages[i]:
            out.append(f"({stages[i]}|)*{run}")
        else:
            out.extend(s + "|" for s in stages[i:j + 1])
        i = j + 1
    text = "".join(out)
    return text[:-1] if text.endswith("|") else text
