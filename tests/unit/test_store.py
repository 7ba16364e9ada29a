from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path

import pytest

from fedpeer.base.store import (
    STATE_ERROR_LOG_INTERVAL_MS,
    STATE_PROBE_INTERVAL_MS,
    StateDir,
    atomic_write,
    read_json,
    write_json,
)
from fedpeer.errors import ConfigError, StateError, StateWriteError


class FakeClock:
    def __init__(self) -> None:
        self.ms = 1_000

    def __call__(self) -> int:
        return self.ms


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def temps(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.tmp"))


def failing(code: int):
    """A stand-in for an os function: raises OSError(code) as the kernel would."""
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


# -- atomic files ----------------------------------------------------------------------------

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
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f"]


@pytest.mark.parametrize("where", ["write", "fsync", "open", "dir_fsync"])
def test_atomic_write_failure_leaks_no_descriptor_and_no_temp(tmp_path: Path, monkeypatch, where: str) -> None:
    target = tmp_path / "f"
    atomic_write(target, b"old")
    real_fsync, real_open = os.fsync, os.open
    if where == "write":
        monkeypatch.setattr(os, "write", failing(errno.ENOSPC))
    elif where == "fsync":
        monkeypatch.setattr(os, "fsync", failing(errno.EIO))
    elif where == "open":
        monkeypatch.setattr(os, "open", lambda p, *a, **k: failing(errno.EMFILE)() if str(p).endswith(".tmp")
                            else real_open(p, *a, **k))
    else:
        def fsync_files_only(fd: int) -> None:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real_fsync(fd)
        monkeypatch.setattr(os, "fsync", fsync_files_only)
    before = open_fds()
    for _ in range(20):
        with pytest.raises(OSError):
            atomic_write(target, b"new")
    assert open_fds() == before
    assert temps(tmp_path) == []
    monkeypatch.undo()
    assert target.read_bytes() == (b"new" if where == "dir_fsync" else b"old")   # renamed, then not durable


def test_partial_writes_are_completed(tmp_path: Path, monkeypatch) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))   # 3 bytes per call
    atomic_write(tmp_path / "f", b"0123456789")
    monkeypatch.undo()
    assert (tmp_path / "f").read_bytes() == b"0123456789"


# -- node.json and election.json -------------------------------------------------------------

def test_incarnation_increases_every_boot(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    first = state.next_incarnation()
    assert first == 1
    assert StateDir(tmp_path / "state").next_incarnation() == first + 1


BAD_NODE = {
    "not json": b"{incarnation: 3",
    "empty": b"",
    "not utf-8": b'{"incarnation": "\xff"}',
    "a list": b"[3]",
    "a number": b"3",
    "missing key": b'{"inc": 3}',
    "a string": b'{"incarnation": "3"}',
    "a float": b'{"incarnation": 3.0}',
    "a bool": b'{"incarnation": true}',
    "null": b'{"incarnation": null}',
    "negative": b'{"incarnation": -1}',
    "huge file": b'{"incarnation": 3, "pad": "' + b"x" * 100_000 + b'"}',
}


@pytest.mark.parametrize("case", sorted(BAD_NODE))
def test_bad_node_json_is_one_line_naming_the_file_and_the_fix(tmp_path: Path, case: str) -> None:
    root = tmp_path / "state"
    root.mkdir()
    (root / "node.json").write_bytes(BAD_NODE[case])
    with pytest.raises(StateError) as info:
        StateDir(root).next_incarnation()
    message = str(info.value)
    assert message.startswith(f"{root / 'node.json'}: ") and "\n" not in message
    assert "delete the file to start over at incarnation 1" in message
    assert isinstance(info.value, ConfigError)   # the CLI exits 2 with one line
    assert (root / "node.json").read_bytes() == BAD_NODE[case]   # evidence left for the operator


@pytest.mark.parametrize("huge", [2**62 - 1, 2**62, 2**63])
def test_an_incarnation_raised_by_the_old_gossip_bug_restarts_at_one(tmp_path: Path, huge: int, caplog) -> None:
    """Issue 11: a member's gossip once pushed a site to 2**63 and only hand-editing node.json
    recovered; peers now accept the site's own lower number, so start-up resets it (and says so)."""
    root = tmp_path / "state"
    root.mkdir()
    (root / "node.json").write_text(json.dumps({"incarnation": huge}))
    assert StateDir(root).next_incarnation() == 1
    assert json.loads((root / "node.json").read_text()) == {"incarnation": 1}
    assert "incarnation_reset" in caplog.text


KEY = bytes(range(32))
BAD_ELECTION = {
    "not json": b"term=3",
    "an object in a list": b'[{"term": 3, "voted_for": null}]',
    "negative term": b'{"term": -5, "voted_for": null}',
    "string term": b'{"term": "5", "voted_for": null}',
    "float term": b'{"term": 5.5, "voted_for": null}',
    "term too large": json.dumps({"term": 2**63, "voted_for": None}).encode(),
    "missing term": b'{"voted_for": null}',
    "missing voted_for": b'{"term": 5}',
    "voted_for not hex": json.dumps({"term": 5, "voted_for": "zz" * 32}).encode(),
    "voted_for short": json.dumps({"term": 5, "voted_for": KEY.hex()[:62]}).encode(),
    "voted_for a number": b'{"term": 5, "voted_for": 7}',
    "voted_for empty": b'{"term": 5, "voted_for": ""}',
}


@pytest.mark.parametrize("case", sorted(BAD_ELECTION))
def test_bad_election_json_is_one_line_naming_the_file_and_the_risk_of_deleting_it(tmp_path: Path,
                                                                                   case: str) -> None:
    root = tmp_path / "state"
    root.mkdir()
    (root / "election.json").write_bytes(BAD_ELECTION[case])
    with pytest.raises(StateError) as info:
        StateDir(root).load_vote()
    message = str(info.value)
    assert message.startswith(f"{root / 'election.json'}: ") and "\n" not in message
    assert "vote twice" in message


def test_vote_round_trip_and_absent_file(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    assert state.load_vote() == (0, None)
    state.save_vote(7, KEY)
    assert StateDir(tmp_path / "state").load_vote() == (7, KEY)
    state.save_vote(8, None)
    assert state.load_vote() == (8, None)


def test_a_number_the_next_start_would_refuse_is_never_written(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    state.save_vote(3, None)
    for bad in (2**62, -1, True):
        with pytest.raises(StateWriteError, match="refusing to record term"):
            state.save_vote(bad, None)
    with pytest.raises(StateWriteError, match="refusing to record incarnation"):
        state.save_incarnation(2**63)
    assert state.load_vote() == (3, None)
    assert state.health()["writable"] is True   # the value was wrong, not the disk


# -- stale temps -----------------------------------------------------------------------------

def test_stale_temps_are_removed_at_start_everywhere_and_counted(tmp_path: Path, caplog) -> None:
    root = tmp_path / "state"
    (root / "jobs" / "stats-1").mkdir(parents=True)
    stale = [root / ".node.json.4242.tmp", root / "jobs" / "stats-1" / ".job.json.17.tmp"]
    kept = [root / "node.json", root / ".hidden", root / "notes.tmp", root / "jobs" / "stats-1" / "job.json"]
    for path in stale + kept:
        path.write_text("{}")
    with caplog.at_level(logging.INFO, logger="fedpeer.store"):
        StateDir(root)
    assert [p for p in stale if p.exists()] == []
    assert all(p.exists() for p in kept)
    removed = [r for r in caplog.records if r.getMessage() == "stale_temp_files_removed"]
    assert len(removed) == 1 and removed[0].fedpeer_fields["count"] == 2


# -- failing writes --------------------------------------------------------------------------

def test_disk_full_raises_state_write_error_reports_health_and_recovers(tmp_path: Path, monkeypatch,
                                                                        caplog) -> None:
    clock = FakeClock()
    root = tmp_path / "state"
    state = StateDir(root, now_ms=clock)
    state.save_incarnation(4)
    assert state.health() == {"writable": True, "error": None, "since_ms": None, "failed_writes": 0}
    monkeypatch.setattr(os, "write", failing(errno.ENOSPC))
    with pytest.raises(StateWriteError) as info:
        state.save_incarnation(5)
    assert str(info.value) == (f"disk full at {root} (No space left on device, writing node.json); "
                               "free space or move [node] state_dir")
    clock.ms += 500
    with pytest.raises(StateWriteError, match="disk full"):
        state.write_record("jobs/j1/job.json", {"state": "done"})
    with pytest.raises(StateWriteError, match="disk full"):
        state.save_vote(2, None)
    assert state.health() == {"writable": False, "error": f"disk full at {root}", "since_ms": 1_000,
                              "failed_writes": 3}
    assert temps(root) == [] and json.loads((root / "node.json").read_text()) == {"incarnation": 4}
    monkeypatch.undo()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedpeer.store"):
        state.write_record(Path("jobs/j1/job.json"), {"state": "done"})
    assert state.health() == {"writable": True, "error": None, "since_ms": None, "failed_writes": 3}
    assert json.loads((root / "jobs" / "j1" / "job.json").read_text()) == {"state": "done"}
    assert [r.getMessage() for r in caplog.records] == ["state_dir_writable_again"]


@pytest.mark.parametrize("code, error, fix", [
    (errno.EIO, "cannot write {root}: Input/output error", "dmesg"),
    (errno.EROFS, "cannot write {root}: Read-only file system", "read-write"),
    (errno.EDQUOT, "disk full at {root}", "quota"),
    (errno.EMFILE, "cannot write {root}: Too many open files", "LimitNOFILE"),
])
def test_other_write_errors_name_the_problem_and_the_fix(tmp_path: Path, monkeypatch, code: int, error: str,
                                                         fix: str) -> None:
    root = tmp_path / "state"
    state = StateDir(root)
    monkeypatch.setattr(os, "fsync", failing(code))
    with pytest.raises(StateWriteError) as info:
        state.save_incarnation(1)
    assert str(info.value).startswith(error.format(root=root)) and fix in str(info.value)
    assert info.value.errno == code and "\n" not in str(info.value)
    assert state.health()["error"] == error.format(root=root)


def test_a_failing_disk_is_logged_once_per_interval_with_a_count(tmp_path: Path, monkeypatch, caplog) -> None:
    clock = FakeClock()
    state = StateDir(tmp_path / "state", now_ms=clock)
    monkeypatch.setattr(os, "write", failing(errno.ENOSPC))
    with caplog.at_level(logging.INFO, logger="fedpeer.store"):
        for _ in range(100):
            clock.ms += 10   # 100 failures within one second
            with pytest.raises(StateWriteError):
                state.save_incarnation(1)
        assert [r.getMessage() for r in caplog.records] == ["state_write_failed"]
        clock.ms += STATE_ERROR_LOG_INTERVAL_MS
        with pytest.raises(StateWriteError):
            state.save_incarnation(1)
    assert [r.getMessage() for r in caplog.records] == ["state_write_failed", "state_write_failing"]
    assert caplog.records[1].fedpeer_fields["failed_since_last_log"] == 100
    assert state.health()["failed_writes"] == 101


def test_probe_and_require_writable_notice_freed_space(tmp_path: Path, monkeypatch) -> None:
    clock = FakeClock()
    root = tmp_path / "state"
    state = StateDir(root, now_ms=clock)
    assert state.probe() is True and not (root / ".probe").exists()   # healthy: no I/O
    monkeypatch.setattr(os, "write", failing(errno.ENOSPC))
    with pytest.raises(StateWriteError):
        state.save_incarnation(1)
    with pytest.raises(StateWriteError, match=r"disk full at .* \(new jobs are refused"):
        state.require_writable()
    failures = state.health()["failed_writes"]
    assert state.probe() is False and state.health()["failed_writes"] == failures   # within the interval
    monkeypatch.undo()
    assert state.probe() is False                       # still within the interval: no write tried
    clock.ms += STATE_PROBE_INTERVAL_MS
    state.require_writable()
    assert state.health()["writable"] is True and not (root / ".probe").exists() and temps(root) == []


def test_start_on_a_full_disk_is_one_line_state_error(tmp_path: Path, monkeypatch, caplog) -> None:
    root = tmp_path / "state"
    monkeypatch.setattr(os, "write", failing(errno.ENOSPC))
    with pytest.raises(StateError) as info:
        StateDir(root).next_incarnation()
    assert caplog.records == []   # the error is the one line the CLI prints; no log line before it
    assert str(info.value) == (f"{root}: cannot record this boot's incarnation: disk full "
                               "(No space left on device); free space or move [node] state_dir")


def test_unusable_state_dir_is_one_line_state_error(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StateError, match=r"file/state: cannot create the state directory: Not a directory"):
        StateDir(tmp_path / "file" / "state")
    monkeypatch.setattr(os, "open", failing(errno.EACCES))
    with pytest.raises(StateError, match=r"cannot record this boot's incarnation: Permission denied; "
                                         r"give the daemon's user write access"):
        StateDir(tmp_path / "state").next_incarnation()


def test_records_stay_inside_the_state_dir(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    for bad in ("../x.json", tmp_path / "x.json", "jobs/../../x.json"):
        with pytest.raises(ValueError, match="not inside the state directory"):
            state.write_record(bad, {})
    state.write_record(tmp_path / "state" / "jobs" / "a" / "job.json", {"a": 1})
    state.write_bytes("jobs/a/model.json", b"{}")
    assert read_json(tmp_path / "state" / "jobs" / "a" / "job.json") == {"a": 1}
