"""The noise-aware verdict (issue 27): the pre-registered protocol, the bootstrap interval on the
interleaved re-measurement, and `moetune adjudicate` refusing a tampered protocol."""
from __future__ import annotations

import json

import pytest

from clusters import load_cluster
from specs.models import load_model
from specs.plan import Plan
from specs.workload import Workload
from tuner.study import prereg as prereg
from tuner.study import storage as study_mod
from tuner.study import verdict as V
from tuner.study.loop import REMEASURED


def P(text):
    return Plan.parse(text).canonical()


BASE, WIN = P("ep=2"), P("mbs=4")


@pytest.fixture(scope="module")
def workload():
    return Workload(model=load_model("tiny-moe"), cluster=load_cluster("cpu-local", 2), gbs=8, seq=128)


def _doc(tmp_path, workload, **proto):
    from cost_model.calibration import IDENTITY
    doc = prereg.build(study="adj", workload=workload, precision="bf16",
                       plans=[{"plan": WIN, "predicted_step_time_s": 1.0}],
                       baseline={"plan": BASE, "predicted_step_time_s": 1.0, "predicted_tokens_per_s_per_gpu": 100.0},
                       baseline_source="test", tables_digest="x", calibration=IDENTITY, trials_budget=1,
                       sampler="guided-ei", space={}, adjudication=V.protocol(**proto))
    prereg.write(tmp_path, doc)
    return doc


def _m(r, role, steps):
    plan = BASE if role == "baseline" else WIN
    s = sorted(steps)[len(steps) // 2]
    return {"round": r, "role": role, "plan": plan, "ok": True, "step_time_s": s, "step_times_s": list(steps),
            "tokens_per_s_per_gpu": 100.0 / s}


def _study(tmp_path, remeasured, base_tps=100.0, win_tps=150.0):
    st = study_mod.open_study("adj", study_mod.open_storage(None, tmp_path))
    st.set_user_attr("preregistration_sha256", prereg.load(tmp_path)["sha256"])
    for plan, roles, tps in ((BASE, "baseline", base_tps), (WIN, "searched", win_tps)):
        t = study_mod.claim(st, plan, {"roles": roles})
        study_mod.record(st, t, {"ok": True, "step_time_s": 100.0 / tps, "tokens_per_s_per_gpu": tps})
    st.set_user_attr(REMEASURED, remeasured)
    return st


def _rounds(base_steps, win_steps):
    out = []
    for r, (b, w) in enumerate(zip(base_steps, win_steps)):
        out += [_m(r, "baseline", b), _m(r, "winner", w)]
    return out


@pytest.mark.parametrize("win,verdict", [
    ([[0.80, 0.81, 0.80]] * 3, "PASS"),  # clearly faster
    ([[1.20, 1.21, 1.19]] * 3, "FAIL"),  # clearly slower
    ([[0.70, 1.30, 1.00], [1.35, 0.75, 1.0], [1.0, 0.72, 1.28]], "INCONCLUSIVE"),  # noise straddles 0.98
])
def test_bootstrap_verdicts(win, verdict):
    base = [[1.0, 1.01, 0.99]] * 3
    p = V.protocol()
    d = V.decide(V.complete_pairs(_rounds(base, win)), p)
    assert d["verdict"] == verdict, d
    assert d["low"] <= d["ratio"] <= d["high"]
    # the protocol fixes the seed: the same data give the same interval
    assert V.decide(V.complete_pairs(_rounds(base, win)), p) == d


def test_adjudicate_reads_the_remeasurement_and_prints_every_one(tmp_path, workload, capsys):
    from tuner.cli import main
    _doc(tmp_path, workload)
    # the study's single measurements say 1.5x, the interleaved re-measurement says slower: FAIL
    _study(tmp_path, _rounds([[1.0, 1.0]] * 3, [[1.2, 1.21]] * 3))
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("FAIL") and "interval" in out[-1]
    assert sum(1 for x in out if x.startswith("round ")) == 6  # every measurement shown


def test_adjudicate_incomplete_with_one_round(tmp_path, workload, capsys):
    from tuner.cli import main
    _doc(tmp_path, workload)
    _study(tmp_path, _rounds([[1.0]], [[0.5]]))
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("INCOMPLETE")


def test_adjudicate_refuses_an_edited_protocol(tmp_path, workload, capsys):
    from tuner.cli import main
    _doc(tmp_path, workload)
    _study(tmp_path, _rounds([[1.0, 1.0]] * 3, [[1.2, 1.2]] * 3))
    path = tmp_path / prereg.NAME
    text = path.read_text()
    assert '"rounds": 3' in text
    path.write_text(text.replace('"rounds": 3', '"rounds": 2'))
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused" in err[0] and "modified" in err[0]
    # edited with every hash made consistent again (sidecar and embedded): the study recorded the
    # hash it ran under, so it is still refused
    doc = json.loads(text)
    doc["adjudication"]["bar"] = 0.5
    doc["sha256"] = prereg.canonical_hash(doc)
    data = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    path.write_text(data)
    import hashlib
    (tmp_path / prereg.SIDECAR).write_text(f"{hashlib.sha256(data.encode()).hexdigest()}  {prereg.NAME}\n")
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "study ran under" in err[0]


def test_adjudicate_refuses_measurements_off_protocol(tmp_path, workload, capsys):
    from tuner.cli import main
    _doc(tmp_path, workload)
    ms = _rounds([[1.0]] * 3, [[0.8]] * 3)
    ms[0], ms[1] = ms[1], ms[0]  # winner first: not the pre-registered A B order
    _study(tmp_path, ms)
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not the protocol's round 0 baseline" in err[0]


@pytest.mark.parametrize("bad,word", [({"rounds": 1}, "rounds"), ({"bootstrap": 10}, "bootstrap"),
                                      ({"bar": 0}, "bar"), ({"interval": 1.0}, "interval")])
def test_protocol_checks(bad, word):
    with pytest.raises(V.ProtocolError, match=word):
        V.protocol(**bad)
