"""A cluster YAML means what it says: a file that keeps a catalog kind but changes a number that
kind's shipped tables were built from is refused (they would be ignored); given its own kind, its
tables are built from its own numbers (cost_model/build_default_tables.py) and change the price."""
import json
import re

from cost_model.build_default_tables import main as build_tables
from tuner.cli import main

P = ["--model", "deepseek-v3", "--gpus", "1024", "--gbs", "8192", "--seq", "4096", "--precision", "fp8",
     "--plan", "tp=2,pp=4,vpp=8,ep=64,dispatcher=flex", "--json"]


def _yaml(tmp_path, kind=None, **sub):
    from clusters import CLUSTER_DIR
    text = (CLUSTER_DIR / "h100-sxm.yaml").read_text()
    for field, value in sub.items():
        text = re.sub(rf"^{field}: {{value: [^,]+,", f"{field}: {{value: {value},", text, flags=re.M)
    if kind:
        text = re.sub(r"^kind: {value: [^,]+,", f"kind: {{value: {kind},", text, flags=re.M)
    f = tmp_path / f"{kind or 'edited'}.yaml"
    f.write_text(text)
    return str(f)


def test_a_changed_network_under_a_catalog_kind_is_refused(tmp_path, capsys):
    f = _yaml(tmp_path, scaleout_gbps=100)
    assert main(["predict", "--cluster", f, *P]) == 2
    err = capsys.readouterr().err
    assert "scaleout_gbps 100 (tables: 400)" in err and "build_default_tables --kinds" in err
    # hbm_gib is read by the memory model itself: such an edit is what it says, and accepted
    assert main(["predict", "--cluster", _yaml(tmp_path, hbm_gib=96), *P]) in (0, 3)


def test_a_kind_of_its_own_is_priced_with_tables_built_from_its_numbers(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MOETUNE_HOME", str(tmp_path / "home"))
    f = _yaml(tmp_path, kind="h100-100g", scaleout_gbps=100)
    assert main(["predict", "--cluster", f, *P]) == 2
    assert "no tables for cluster kind 'h100-100g'" in capsys.readouterr().err
    assert build_tables(["--kinds", f, "--out", str(tmp_path / "home" / "tables")]) == 0
    capsys.readouterr()
    main(["predict", "--cluster", f, *P])
    slow = json.loads(capsys.readouterr().out)
    main(["predict", "--cluster", "h100-sxm", *P])
    fast = json.loads(capsys.readouterr().out)
    assert slow["breakdown_s"]["ep_dispatch_combine"] > 2 * fast["breakdown_s"]["ep_dispatch_combine"]
    assert slow["step_time_s"] > fast["step_time_s"]
