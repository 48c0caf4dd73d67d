"""specs.fileio.write_atomic: replace or create exclusively, never a half-written file, no
temporary files left behind, distinct temporary names for concurrent writers."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from specs.fileio import write_atomic


def test_replace_text_and_bytes(tmp_path):
    p = tmp_path / "sub" / "f.txt"
    write_atomic(p, "one\n")
    write_atomic(p, b"two\n", fsync=True)
    assert p.read_bytes() == b"two\n"
    assert sorted(x.name for x in p.parent.iterdir()) == ["f.txt"]


def test_exclusive_refuses_existing_and_keeps_it(tmp_path):
    p = tmp_path / "prereg.json"
    write_atomic(p, "first", exclusive=True, fsync=True)
    with pytest.raises(FileExistsError):
        write_atomic(p, "second", exclusive=True)
    assert p.read_text() == "first"
    assert [x.name for x in tmp_path.iterdir()] == ["prereg.json"]


def test_concurrent_exclusive_writers_exactly_one_wins(tmp_path):
    p = tmp_path / "race.json"
    wins, losses = [], []
    barrier = threading.Barrier(8)

    def writer(i):
        barrier.wait()
        try:
            write_atomic(p, f"writer {i}", exclusive=True)
            wins.append(i)
        except FileExistsError:
            losses.append(i)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 7
    assert p.read_text() == f"writer {wins[0]}"
    assert [x.name for x in tmp_path.iterdir()] == ["race.json"]


def test_unwritable_folder_names_the_target_not_the_temporary_file():
    # /proc refuses new files even to root (a chmod'ed folder would not stop root, who runs CI)
    target = Path("/proc") / "moetune-fileio-test.txt"
    with pytest.raises(OSError) as e:
        write_atomic(target, "x")
    assert e.value.filename == str(target)
    assert not target.exists()
