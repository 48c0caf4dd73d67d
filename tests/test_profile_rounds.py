"""The profile measures in rounds (issue 27): interleaved order, the rounds' spread in the table,
noisy points reported."""
from __future__ import annotations

import csv

import pytest


def _gemm(tflops):
    return [("gemm", dict(dtype="bf16", m=16, n=64, k=64, tflops=tflops, source="measured:gemm"))]


def test_rounds_are_interleaved_within_a_level():
    from trials.profile.driver import ROUND_SEP, _ordered
    todo = []
    for k in range(2):
        for name, lvl in (("a", 0), ("b", 0), ("c", 1)):
            pid = name if k == 0 else f"{name}{ROUND_SEP}{k}"
            todo.append(("gemm", {"id": pid, "level": lvl, "_round": k}))
    order = [p["id"] for _, p in _ordered(todo)]
    # level 0 twice (a b, then a b again), then level 1
    assert order == ["a", "b", f"a{ROUND_SEP}1", f"b{ROUND_SEP}1", "c", f"c{ROUND_SEP}1"]


def test_rounds_come_in_blocks_so_a_short_budget_still_measures_twice():
    from trials.profile.driver import ROUND_BLOCK, ROUND_SEP, _ordered
    n = 3 * ROUND_BLOCK
    todo = [("gemm", {"id": f"p{i}" + (f"{ROUND_SEP}1" if k else ""), "level": 0, "_round": k})
            for k in range(2) for i in range(n)]
    order = [p["id"] for _, p in _ordered(todo)]
    first_block = [f"p{i}" for i in range(ROUND_BLOCK)]
    assert order[:2 * ROUND_BLOCK] == first_block + [f"{x}{ROUND_SEP}1" for x in first_block]
    assert sorted(order) == sorted(p["id"] for _, p in todo)


def test_table_rows_carry_samples_and_spread_and_noisy_points_are_listed(tmp_path):
    from cost_model.tables import load_tables
    from trials.profile.driver import ROUND_SEP, SPREAD_WARN, PartialStore, assemble
    out = tmp_path / "p"
    store = PartialStore(out)
    store.add("gemm", "g", _gemm(1.0))
    store.add("gemm", f"g{ROUND_SEP}1", _gemm(1.5))  # 50% apart: noisy
    (spread,) = [s for r, p, s, n in store.point_spreads() if p == "g"]
    assert spread == pytest.approx(0.5 / 1.25) and spread > SPREAD_WARN
    assemble("cpu-local", out, PartialStore(out), {"host": "test"})
    rows = [r for r in csv.DictReader(open(out / "gemm.csv")) if r["source"] == "measured:gemm"]
    assert len(rows) == 1 and rows[0]["samples"] == "2" and float(rows[0]["spread"]) == pytest.approx(0.4)
    assert float(rows[0]["tflops"]) == pytest.approx(1.25)  # the median of the rounds
    t = load_tables(out)  # the extra columns do not disturb the loader
    assert t["gemm"].lookup("bf16", m=16, n=64, k=64) == pytest.approx(1.25)


@pytest.mark.parametrize("on_gpu", [False, True])
def test_cpu_profile_workers_get_the_trial_ranks_allocator(monkeypatch, on_gpu):
    """The CPU tables are measured with the allocator the CPU trial ranks run with (glibc keeps
    freed memory); GPU profiling workers keep the defaults, as GPU trial ranks do."""
    import trials.ray_runtime as rr
    from trials.megatron.backend import CPU_ALLOCATOR_TUNABLES
    from trials.profile import driver
    seen = {}
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(rr, "ray_session", lambda address, **kw: seen.update(kw) or "session")
    assert driver._ray_session(None, 2, on_gpu) == "session"
    env = seen["runtime_env"]["env_vars"]
    assert env["OMP_NUM_THREADS"] == "1"
    assert (env.get("GLIBC_TUNABLES") == CPU_ALLOCATOR_TUNABLES) == (not on_gpu)
