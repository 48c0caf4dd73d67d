"""The test suite's own isolation (tests/conftest.py): what one test writes, no other reads."""
from __future__ import annotations


def test_each_test_has_its_own_moetune_home(_own_moetune_home, _isolated_moetune_home):
    import os
    assert os.environ["MOETUNE_HOME"] == str(_own_moetune_home) != str(_isolated_moetune_home)
    (_own_moetune_home / "written-by-this-test").write_text("x")
    assert not (_isolated_moetune_home / "written-by-this-test").exists()
