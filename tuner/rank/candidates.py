"""The plans a study pre-registers from its screened pool (training and serving alike): the top
predicted, then the best of distinct parallel layouts, so that the measurements say which layout is
right, not which of a dozen near-identical knob settings of one layout is."""
from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter


def select_candidates(pool: list, n: int, *, layout: Callable = attrgetter("layout"),
                      diverse_frac: float = 0.5) -> list:
    """`n` rows of `pool` (distinct plans, best first): about (1 - diverse_frac) of them the top
    predicted, the rest the best of layouts not yet represented (then the next-best of layouts,
    round robin), ranked order kept. `layout(row)` is a row's parallel layout (default: its
    `.layout`, as `tuner.rank.train.Scored` rows have)."""
    n_top = max(1, n - int(n * diverse_frac)) if n > 0 else 0
    keys = [layout(r) for r in pool]
    chosen = list(range(min(n_top, len(pool))))
    seen_layouts = {keys[i] for i in chosen}
    rounds = 0
    while len(chosen) < n and rounds < 64:
        added, used = False, set()
        for i, key in enumerate(keys):
            if len(chosen) >= n:
                break
            if i in chosen or key in used or (rounds == 0 and key in seen_layouts):
                continue
            chosen.append(i)
            used.add(key)
            added = True
        rounds += 1
        if not added and rounds > 1:
            break
    return [pool[i] for i in chosen]
