from __future__ import annotations

import os
from pathlib import Path

from fedpeer.store import Counter, StateDir, atomic_write, read_json, write_json


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "d" / "f.json"
    write_json(target, {"a": 1})
    write_json(target, {"a": 2})
    assert read_json(target) == {"a": 2}
    assert sorted(os.listdir(target.parent)) == ["f.json"]
    assert os.stat(target).st_mode & 0o777 == 0o600


def test_atomic_write_failure_keeps_old_content(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "f"
    atomic_write(target, b"old")

    def broken_replace(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", broken_replace)
    try:
        atomic_write(target, b"new")
    except OSError:
        pass
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f"]


def test_counter_survives_reopen(tmp_path: Path) -> None:
    c = Counter(tmp_path / "c")
    assert c.value == 0
    c.set(2**63 + 5)
    c2 = Counter(tmp_path / "c")   # without close/sync: what a kill -9 leaves behind
    assert c2.value == 2**63 + 5


def test_incarnation_increases_every_boot(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    first = state.next_incarnation()
    assert StateDir(tmp_path / "state").next_incarnation() == first + 1
