"""MOSAIC co-design (`tuner.design`, `moetune design`): the geometry ladder against the paper's
published counts, App. D's closed form, the envelope parser, and a real search whose optimum must
be a realizable layout that fits in memory, written as a model YAML and a launch script."""
from __future__ import annotations

import json

import pytest

from clusters import load_cluster
from specs.errors import UsageError
from specs.models import load_model
from specs.stack import profile_for
from specs.workload import Workload
from tuner.cli import main
from tuner.design import Envelope, design, enumerate_geometries, geometry_of, ladder_model, parse_envelope, token_budget, write_outputs
from tuner.space.megatron_rules import check

SMALL = "q=4,6;e=8,16,32;k=1,2;g=1,2,4;s=0.3..0.99"


@pytest.mark.parametrize("q,e,k,g,n_act,n_tot,s", [
    (12, 96, 2, 4, 14.5e9, None, 0.956),  # paper §7.3.1 / Table 4 optimum
    (4, 128, 3, 4, 0.7e9, 16e9, None),  # paper §7.2: q=4 model
    (8, 128, 3, 4, 5.4e9, 127e9, None),  # q=8
    (12, 128, 3, 4, 18e9, 434e9, None),  # q=12
])
def test_ladder_reproduces_the_papers_parameter_counts(q, e, k, g, n_act, n_tot, s):
    spec = ladder_model(q, e, k, g)
    geo = geometry_of(spec, q, e, k, g)
    assert (spec.num_layers, spec.num_attention_heads, spec.hidden_size) == (4 * q, 4 * q, 512 * q)
    assert spec.ffn_hidden_size == 1280 * q and spec.moe_ffn_hidden_size == 1280 * q // g
    assert geo.n_act == pytest.approx(n_act, rel=0.04)
    if n_tot:
        assert geo.n_tot == pytest.approx(n_tot, rel=0.04)
    if s:
        assert geo.s == pytest.approx(s, abs=0.001)


def test_ladder_skips_fractional_expert_widths():
    assert ladder_model(4, 16, 2, 6) is None  # 5120 / 6
    assert ladder_model(6, 16, 2, 6).moe_ffn_hidden_size == 1280


def test_token_budget_is_the_closed_form():
    # C_model = MFU * F_peak * N * T and D* = C_model / (6 N_act)
    d = token_budget(0.2, 2.25e15, 256, 20 * 86400, 14.5e9)
    assert d == pytest.approx(0.2 * 2.25e15 * 256 * 20 * 86400 / (6 * 14.5e9))


def test_envelope_parsing_and_errors(tmp_path):
    env = parse_envelope("q=4..6;e=8,16;k=1;g=2;s=0.5..0.9;tpp=20..100;tp=1,2")
    assert env.q == (4, 5, 6) and env.e == (8, 16) and env.tp == (1, 2)
    assert (env.s_min, env.s_max, env.tpp_min, env.tpp_max) == (0.5, 0.9, 20.0, 100.0)
    assert env.gbs == Envelope.default().gbs == 1024
    f = tmp_path / "env.yaml"
    f.write_text("q: [4, 8]\ne: 8,16\ns: [0.4, 0.95]\n")
    assert parse_envelope(str(f)).q == (4, 8)
    for bad in ("q=a..b", "z=1", "s=0.9..0.5", "q=0", "k"):
        with pytest.raises(UsageError):
            parse_envelope(bad)


def test_default_envelope_is_paper_sized():
    env = Envelope.default()
    assert env.q == tuple(range(4, 13)) and max(env.e) == 512 and max(env.k) == 8 and max(env.g) == 8
    assert env.tp == (1,) and env.cp == (1,)
    geos = enumerate_geometries(env)
    assert len(geos) > 1000
    assert all(env.s_min <= g.s <= env.s_max for g, _ in geos)


@pytest.fixture(scope="module")
def small_result():
    return design("h100-sxm", 64, 10, envelope=parse_envelope(SMALL), runner_ups=5, exhaustive=True)


def test_optimum_is_realizable_and_fits(small_result):
    res = small_result
    o = res.optimum
    assert o is not None and o.feasible
    assert res.workload.model.name == o.geometry.name
    cl = load_cluster("h100-sxm", 64)
    assert check(res.workload, res.plan, profile_for(cl, "auto")) == []
    assert o.peak_memory_gib <= cl.hbm_gib * 0.9
    assert (res.plan.tp, res.plan.cp) == (1, 1)
    # tokens: the closed form, capped on the TPP grid
    assert o.d == pytest.approx(min(o.d_star, 150 * o.geometry.n_act))
    assert o.c_model == pytest.approx(6 * o.geometry.n_act * o.d)
    assert o.c_model <= res.c_peak
    # ranked: optimum first, runner-ups by loss
    losses = [o.loss] + [c.loss for c in res.runner_ups]
    assert losses == sorted(losses)


def test_branch_and_bound_returns_the_exhaustive_ranking(small_result):
    pruned = design("h100-sxm", 64, 10, envelope=parse_envelope(SMALL), runner_ups=5)
    assert pruned.stats["pruned_by_bound"] > 0
    assert pruned.optimum.geometry == small_result.optimum.geometry
    assert [c.geometry for c in pruned.runner_ups] == [c.geometry for c in small_result.runner_ups]


def test_outputs_round_trip(small_result, tmp_path):
    paths = write_outputs(small_result, tmp_path)
    o = small_result.optimum
    spec = load_model(paths[f"{o.geometry.name}.yaml"])
    assert spec == small_result.workload.model
    script = (tmp_path / f"{o.geometry.name}.launch.sh").read_text()
    assert f"# moetune plan: {o.plan}" in script
    assert "--num-experts" in script
    assert (tmp_path / "frontier.png").stat().st_size > 1000
    d = json.loads((tmp_path / "design.json").read_text())
    assert d["optimum"]["geometry"]["name"] == o.geometry.name
    # the YAML is a workload `predict`/`plans` accept
    w = Workload(spec, load_cluster("h100-sxm", 64), 1024, 2048)
    assert check(w, small_result.plan, profile_for(w.cluster, "auto")) == []


def test_cli_design_json_and_bad_input(tmp_path, capsys):
    rc = main(["design", "--cluster", "h100-sxm", "--gpus", "64", "--days", "10", "--envelope", SMALL,
               "--json", "--top", "3", "--out", str(tmp_path / "o")])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["optimum"]["feasible"] and len(d["runner_ups"]) == 3
    assert (tmp_path / "o" / "frontier.png").exists()
    for argv, needle in ((["--days", "0"], "--days"), (["--days", "1", "--envelope", "q=x"], "--envelope"),
                         (["--days", "1", "--law", str(tmp_path / "none.json")], "cannot read law file")):
        rc = main(["design", "--cluster", "h100-sxm", "--gpus", "64", *argv, "--out", str(tmp_path / "bad")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and needle in err[0]
        assert not (tmp_path / "bad").exists()
