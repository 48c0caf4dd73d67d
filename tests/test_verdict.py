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
from tuner.study.storage import REMEASURED


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
    assert len(err) == 1 and "not the protocol's verdict round 0 baseline" in err[0]


@pytest.mark.parametrize("bad,word", [({"rounds": 1}, "rounds"), ({"bootstrap": 10}, "bootstrap"),
                                      ({"bar": 0}, "bar"), ({"interval": 1.0}, "interval")])
def test_protocol_checks(bad, word):
    with pytest.raises(V.ProtocolError, match=word):
        V.protocol(**bad)


# -- the winner's curse: the top measured plans are re-measured before the winner is chosen --------

LUCKY, TRUE, THIRD = P("mbs=2"), P("mbs=4"), P("mbs=8")
TRUE_STEP = {BASE: 1.0, LUCKY: 0.85, TRUE: 0.62, THIRD: 0.70}  # the plans' real step times, s


def _rows(single_tps: dict) -> list[dict]:
    """Study rows: the baseline and three searched plans with their single study measurements."""
    return [{"number": i, "state": "COMPLETE", "plan": plan, "roles": "baseline" if plan == BASE else "searched",
             "measured_tokens_per_s_per_gpu": tps, "measured_step_time_s": 100.0 / tps}
            for i, (plan, tps) in enumerate(single_tps.items())]


def _true_measure(plan):
    """A trial backend double: each run measures the plan's real step time (a little step noise)."""
    s = TRUE_STEP[plan]
    return {"ok": True, "step_time_s": s, "step_times_s": [s * 0.99, s, s * 1.01], "tokens_per_s_per_gpu": 100.0 / s}


def test_protocol_records_top_k_and_refuses_a_bad_one():
    p = V.protocol()
    assert p["top_k"] == V.TOP_K >= 2 and p["select_rounds"] == V.SELECT_ROUNDS >= 1 and p["select_rule"] == V.SELECT_RULE
    for bad in ({"top_k": 0}, {"select_rounds": 0}):
        with pytest.raises(V.ProtocolError, match=next(iter(bad))):
            V.protocol(**bad)
    with pytest.raises(V.ProtocolError, match="select_rule"):
        V.check_protocol(dict(p, select_rule="the fastest single measurement"))
    # a protocol pre-registered before the selection (no top_k) re-measures the single best alone
    old = {k: v for k, v in p.items() if k not in ("top_k", "select_rounds", "select_rule")}
    rows = _rows({BASE: 100.0, LUCKY: 200.0, TRUE: 180.0})
    assert V.candidates(V.check_protocol(old), rows) == [LUCKY]
    assert [e["phase"] for e in V.schedule(old, BASE, [LUCKY])] == ["verdict"] * 2 * old["rounds"]


def test_remeasurement_picks_the_truly_faster_plan_over_a_lucky_single_measurement():
    from tuner.study.report import adjudicate
    # the study's single measurements: LUCKY ran at 2x its real speed and looks best
    rows = _rows({BASE: 100.0, LUCKY: 200.0, TRUE: 155.0, THIRD: 140.0})
    p = V.protocol()
    cands = V.candidates(p, rows)
    assert cands == [LUCKY, TRUE, THIRD]
    saved = []
    done = V.run(p, BASE, cands, [], _true_measure, lambda ms: saved.append(list(ms)))
    assert saved[-1] == done and len(saved) == len(done)  # stored after each measurement
    # the selection round (baseline, then each candidate), then the verdict's rounds on the chosen plan
    assert [(m["phase"], m["role"], m["plan"]) for m in done[:4]] == [
        ("select", "baseline", BASE), ("select", "candidate", LUCKY), ("select", "candidate", TRUE),
        ("select", "candidate", THIRD)]
    assert V.winner(p, BASE, cands, done) == TRUE
    ver = [m for m in done if m["phase"] == "verdict"]
    assert [m["plan"] for m in ver] == [BASE, TRUE] * p["rounds"]
    prereg = {"baseline": {"plan": BASE}, "acceptance": {"ratio": p["bar"]}, "adjudication": p}
    v = adjudicate(rows, prereg, done)
    assert v["best"]["plan"] == TRUE and v["verdict"] == "PASS"
    assert v["ratio"] == pytest.approx(TRUE_STEP[BASE] / TRUE_STEP[TRUE], rel=1e-6)
    # judged on the single best (the old protocol), the lucky plan would have been the winner
    old = {k: v for k, v in p.items() if k not in ("top_k", "select_rounds", "select_rule")}
    assert V.winner(old, BASE, V.candidates(old, rows), []) == LUCKY


def test_selection_then_resume_and_a_verdict_on_the_wrong_plan_refused():
    rows = _rows({BASE: 100.0, LUCKY: 200.0, TRUE: 155.0, THIRD: 140.0})
    p = V.protocol()
    cands = V.candidates(p, rows)
    part = V.run(p, BASE, cands, [], _true_measure, lambda ms: None)[:5]  # stopped after one verdict run
    assert V.run(p, BASE, cands, part, _true_measure, lambda ms: None)[:5] == part  # goes on, keeps what ran
    # the verdict's rounds measuring the lucky plan instead of the selection's choice break the protocol
    forged = part[:4] + [dict(part[4]), dict(_m(0, "winner", [0.5]), plan=LUCKY, phase="verdict")]
    with pytest.raises(V.ProtocolError, match="verdict round 0 winner"):
        V.verify_measurements(p, forged, BASE, cands)
    # until the selection round is complete there is no winner, and the verdict says so
    from tuner.study.report import adjudicate
    prereg = {"baseline": {"plan": BASE}, "acceptance": {"ratio": p["bar"]}, "adjudication": p}
    assert V.winner(p, BASE, cands, part[:3]) is None
    assert adjudicate(rows, prereg, part[:3])["verdict"] == "INCOMPLETE"


def test_adjudicate_refuses_an_edited_top_k(tmp_path, workload, capsys):
    from tuner.cli import main
    _doc(tmp_path, workload)
    _study(tmp_path, _rounds([[1.0, 1.0]] * 3, [[0.8, 0.8]] * 3))
    path = tmp_path / prereg.NAME
    text = path.read_text()
    assert f'"top_k": {V.TOP_K}' in text
    path.write_text(text.replace(f'"top_k": {V.TOP_K}', '"top_k": 1'))
    assert main(["adjudicate", "adj", "--study-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused" in err[0] and "modified" in err[0]


def test_trial_loop_remeasure_runs_the_protocol_and_resumes(tmp_path, workload):
    """TrialLoop.remeasure (the loop's hook) on a study whose lucky plan has the best single
    measurement: it re-measures through `measure_once`, stores every measurement in the study as
    it goes, judges the truly faster plan, and a second call (a resumed study) measures nothing."""
    from tuner.study.loop import TrialLoop
    doc = _doc(tmp_path, workload)
    st = study_mod.open_study("adj", study_mod.open_storage(None, tmp_path))
    for plan, tps in ((BASE, 100.0), (LUCKY, 200.0), (TRUE, 155.0), (THIRD, 140.0)):
        t = study_mod.claim(st, plan, {"roles": "baseline" if plan == BASE else "searched"})
        study_mod.record(st, t, {"ok": True, "step_time_s": 100.0 / tps, "tokens_per_s_per_gpu": tps})
    loop = TrialLoop.__new__(TrialLoop)  # no Ray: the trial runs are the test double's
    loop.study, loop.prereg = st, doc
    runs = []
    loop.measure_once = lambda plan: runs.append(plan) or _true_measure(plan)
    done = loop.remeasure()
    assert runs == [BASE, LUCKY, TRUE, THIRD] + [BASE, TRUE] * V.ROUNDS
    assert st.user_attrs[REMEASURED] == done
    assert loop.remeasure() == done and len(runs) == 4 + 2 * V.ROUNDS
    from tuner.study.report import adjudicate
    v = adjudicate(study_mod.trial_rows(st), doc, done)
    assert v["best"]["plan"] == TRUE and v["verdict"] == "PASS"


def test_the_calibration_reads_a_plan_at_the_fastest_of_all_its_runs(tmp_path, workload):
    """A study's calibration rows (`tuner.study.calibrate.load_study`) take each plan at the fastest
    of its trial and its adjudication re-measurements, the split scaled to it; a plan never
    re-measured, and a failed re-measurement, change nothing."""
    from tuner.study.calibrate import load_study
    _doc(tmp_path, workload)
    st = study_mod.open_study("adj", study_mod.open_storage(None, tmp_path))
    for plan, tps, parts in ((BASE, 50.0, {"attention": 1.5, "host_launch": 0.5}), (WIN, 150.0, None)):
        t = study_mod.claim(st, plan, {"roles": "baseline" if plan == BASE else "searched"})
        if parts:
            t.set_user_attr("measured_parts_s", parts)
        # the baseline's trial: 2.0 s (a slow moment)
        study_mod.record(st, t, {"ok": True, "step_time_s": 100.0 / tps, "tokens_per_s_per_gpu": tps})
    again = [_m(0, "baseline", [1.0, 1.1, 1.2]), _m(1, "baseline", [1.3, 1.2, 1.25]),
             {"round": 2, "role": "baseline", "plan": BASE, "ok": False, "kind": "crash"}]
    st.set_user_attr(REMEASURED, again)
    rows = {r["plan"]: r for r in load_study("adj", None, tmp_path)}
    base, win = rows[BASE], rows[WIN]
    assert base["measured_step_time_s"] == pytest.approx(1.1)  # the fastest of 2.0, 1.1, 1.25
    assert base["measured_runs"] == 3 and base["measured_first_s"] == pytest.approx(2.0)
    assert base["measured_parts_s"] == pytest.approx({"attention": 0.825, "host_launch": 0.275})
    assert win["measured_step_time_s"] == pytest.approx(100.0 / 150.0) and "measured_runs" not in win
