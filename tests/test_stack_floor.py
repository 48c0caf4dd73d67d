"""The CPU stack floor's arithmetic (trials/profile/stack_floor.py), without running trials."""
from __future__ import annotations

import pytest

from trials.profile import stack_floor as sf
from trials.profile.common import Ctx


def _b_ms(rows) -> float:
    """The per-layer-per-microbatch floor b (ms) the "stack" row encodes: gap x kernels."""
    from cost_model.model import structural_kernels
    from specs.models import load_model
    spec = load_model(sf.REF_MODEL)
    k_attn, _, k_moe = structural_kernels(spec, 1, 1, False, spec.num_experts)
    stack = next(r for _, r in rows if r["mode"] == "stack")
    return stack["gap_us"] * 3.0 * float(k_attn + k_moe) / 1e3


def test_consistent_grid_gives_the_double_difference():
    # T = c + L*s + m*a + L*m*b with c=5, s=1, a=2, b=4 ms
    T = {(n, m): (5 + n * 1 + m * 2 + n * m * 4) / 1e3 for n, m in sf.GRID}
    rows = sf.rows_from(T)
    assert _b_ms(rows) == pytest.approx(4.0)
    step = next(r for _, r in rows if r["mode"] == "stack_step")
    assert step["gap_us"] == pytest.approx(1000.0)
    assert "clamped" not in rows[0][1]["source"]


def test_interfered_point_is_bounded_by_the_grid():
    # the samples a busy moment produced on the 2-core host (T(3,4) taken under more load)
    T = {(1, 1): 0.015581, (3, 1): 0.036761, (1, 4): 0.051303, (3, 4): 0.295435}
    rows = sf.rows_from(T)
    bound_ms = min((T[3, 1] - T[1, 1]) / 2, (T[1, 4] - T[1, 1]) / 3) * 1e3
    assert _b_ms(rows) == pytest.approx(bound_ms)
    assert "clamped" in rows[0][1]["source"]


def test_points_interleave_rounds_with_unique_ids():
    pts = sf.points(Ctx())
    assert len(pts) == sf.ROUNDS * len(sf.GRID)
    assert len({p["id"] for p in pts}) == len(pts)
    assert [(p["layers"], p["microbatches"]) for p in pts[:len(sf.GRID)]] == list(sf.GRID)


def test_the_floor_split_is_where_a_trials_split_sees_the_grids_difference():
    T = {(n, m): (5 + n * 1 + m * 2 + n * m * 4) / 1e3 for n, m in sf.GRID}
    splits = {(1, 1): {"host_launch": 0.002, "attention": 0.002, "gemm": 0.004, "ep_comm": 0.0005},
              (3, 4): {"host_launch": 0.032, "attention": 0.012, "gemm": 0.004, "ep_comm": 0.0001},
              (3, 1): {"host_launch": 1.0}, (1, 4): {"attention": 1.0}}  # only (3,4) - (1,1) is read
    assert sf.floor_split(splits) == pytest.approx({"host_launch": 0.75, "attention": 0.25})  # gemm 0, ep_comm < 0
    rows = sf.rows_from(T, splits)
    gaps = {r["mode"]: r["gap_us"] for _, r in rows}
    assert gaps["stack@host_launch"] == pytest.approx(0.75 * gaps["stack"])
    assert gaps["stack@attention"] == pytest.approx(0.25 * gaps["stack"])
    assert "stack@gemm" not in gaps and "stack@ep_comm" not in gaps
    # no split recorded (an older profile, or a trial that recorded none): the rows as before
    assert [r["mode"] for _, r in sf.rows_from(T)] == [r["mode"] for _, r in sf.rows_from(T, {(1, 1): {}})] \
        == ["stack", "stack_step"]
