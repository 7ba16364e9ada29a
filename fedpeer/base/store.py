"""Persistence under the state directory.

Rules:
- Whole files are replaced atomically (write temp -> fsync -> rename -> fsync directory), so a crash
  leaves either the old or the new content, never a torn one; a failed write leaves no temp file
  and no open descriptor behind. `durable=False` skips the two fsyncs, for a file nothing reads
  after a crash of the machine (a running job's intermediate state: a daemon restarted mid-job
  marks the job failed): every reader still sees the old or the new file whole, and a killed
  process loses nothing; only a power loss or kernel crash may leave the old, an empty or no file.
  Temps a kill left between write and rename (`.NAME.PID.tmp`) are removed when `StateDir` opens.
  Nothing here is pickled: JSON for documents.
- State files fail closed. Every file `StateDir` reads is validated by type and range; a file that
  lies raises `StateError` (one line: the file, what is wrong, the fix), never a traceback.
  (Replay protection needs nothing on disk: it is per session, in memory, see fedpeer/wire/session.py;
  a `replay/` directory left by an earlier version is not read.)
- A failing disk (ENOSPC, EDQUOT, EIO, EROFS, EMFILE...) must not take the daemon down. Every write
  through `StateDir` turns an OSError into `StateWriteError` (one line naming the state_dir and
  the fix), marks the directory degraded (`health()`, for `fedpeer status`), and logs at most once
  per STATE_ERROR_LOG_INTERVAL_MS. The next successful whole-file write clears the state; while
  degraded, `probe()` tries a small write so recovery is seen even when nothing else writes.
  Retrying is the caller's business: the node retries on its next tick, the job registry on the
  job's next state change. This module never sleeps or loops on a failure.
- Writes at start-up that the node cannot run without (this boot's incarnation) raise
  `StateError` instead: the CLI exits 2 with one line, and systemd does not crash-loop on a trace.

Shell code: it reads the wall clock and the monotonic clock (both injectable for tests).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedpeer.base.logs import fields
from fedpeer.errors import FedpeerError, StateError, StateWriteError

log = logging.getLogger("fedpeer.store")

STATE_ERROR_LOG_INTERVAL_MS = 10_000   # a failing disk is logged in full once, then one line per interval
STATE_PROBE_INTERVAL_MS = 1_000        # while degraded, at most one probe write per interval
STATE_PROBE_BYTES = 64 * 1024          # a probe proves room for a job record, not for one byte
STATE_FILE_BYTES_MAX = 64 * 1024       # node.json / election.json are a few dozen bytes
STATE_INT_MAX = 2**62                  # incarnations and terms stay below this (exclusive)
VOTE_KEY_BYTES = 32                    # voted_for is a member's Ed25519 public key
_TEMP_RE = re.compile(r"^\..+\.\d+\.tmp$")   # what atomic_write names its temps
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_FIXES = {   # errno -> what the operator does about it
    errno.ENOSPC: "free space or move [node] state_dir",
    errno.EDQUOT: "raise the quota or move [node] state_dir",
    errno.EROFS: "remount the filesystem read-write or move [node] state_dir",
    errno.EACCES: "give the daemon's user write access or move [node] state_dir",
    errno.EPERM: "give the daemon's user write access or move [node] state_dir",
    errno.EMFILE: "raise the open-files limit (LimitNOFILE) of the daemon",
    errno.ENFILE: "raise the system's open-files limit (fs.file-max)",
    errno.EIO: "check the disk (dmesg) or move [node] state_dir",
}
_NODE_FIX = ("delete the file to start over at incarnation 1 (safe: peers accept this node's own "
             "lower incarnation once they suspect it)")
_ELECTION_FIX = ("set term above every term `fedpeer status` shows at any site and voted_for to null "
                 "(deleting the file restarts at term 0 with no vote, which can let this node vote "
                 "twice in one term and so elect two leaders)")


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


# ---------------------------------------------------------------------------------------------
# Atomic files.
# ---------------------------------------------------------------------------------------------

def atomic_write(path: Path, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Replace `path` with `data` whole, or raise OSError leaving the old content and no temp.
    `durable=False`: without the fsyncs (module docstring: only for what no restart reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        _fsync_dir(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)   # a nearly full disk may take part of it, then raise ENOSPC
        view = view[written:]


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass   # the caller's error is the one to report; the temp goes at the next start


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (a power loss could otherwise bring the old file back)."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json(path: Path, doc: Any, durable: bool = True) -> None:
    atomic_write(path, json.dumps(doc, indent=1, sort_keys=True).encode("utf-8") + b"\n", durable=durable)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as exc:
        raise FedpeerError(f"{path}: unreadable state file: {exc}") from None


def remove_stale_temps(root: Path) -> int:
    """Delete every `.NAME.PID.tmp` under root (a kill between write and rename); returns the count.

    Called before this process writes anything, so no temp can be one of ours in flight."""
    removed = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if _TEMP_RE.match(name):
                try:
                    os.unlink(os.path.join(dirpath, name))
                    removed += 1
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    log.warning("stale_temp_not_removed", extra=fields(
                        file=os.path.join(dirpath, name), error=exc.strerror or str(exc)))
    return removed


# ---------------------------------------------------------------------------------------------
# Health of the state directory.
# ---------------------------------------------------------------------------------------------

class StateHealth:
    """Whether writes under one state_dir succeed; turns OSErrors into one-line StateWriteErrors."""

    def __init__(self, root: Path, now_ms: Callable[[], int] = _monotonic_ms) -> None:
        self.root = root
        self._now_ms = now_ms
        self._lock = threading.Lock()      # writes report from a worker thread and the loop
        self.error: str | None = None      # set while degraded
        self.errno: int | None = None      # of the last failure while degraded
        self.since_ms: int | None = None
        self.failed_writes = 0             # since start, every kind of write
        self._logged_ms: int | None = None
        self._unlogged = 0                 # failures since the last log line

    def failed(self, exc: OSError, path: Path) -> StateWriteError:
        """Record a failed write of `path`; returns the error for the caller to raise."""
        with self._lock:
            return self._failed(exc, path)

    def _failed(self, exc: OSError, path: Path) -> StateWriteError:
        code = exc.errno or 0
        strerror = exc.strerror or str(exc)
        error = (f"disk full at {self.root}" if code in _DISK_FULL
                 else f"cannot write {self.root}: {strerror}")
        now = self._now_ms()
        self.failed_writes += 1
        self.errno = code
        if error != self.error:            # a new episode, or the problem changed: log it in full
            if self.error is None:
                self.since_ms = now
            self.error, self._logged_ms, self._unlogged = error, now, 0
            log.error("state_write_failed", extra=fields(
                state_dir=str(self.root), file=_relative(path, self.root), errno=errno.errorcode.get(code, code),
                error=error, fix=_fix(code)))
        else:
            self._unlogged += 1
            if self._logged_ms is None or now - self._logged_ms >= STATE_ERROR_LOG_INTERVAL_MS:
                log.warning("state_write_failing", extra=fields(
                    state_dir=str(self.root), error=error, failed_since_last_log=self._unlogged,
                    degraded_s=round((now - (self.since_ms or now)) / 1000, 1)))
                self._logged_ms, self._unlogged = now, 0
        message = f"{error} ({strerror}, writing {_relative(path, self.root)}); {_fix(code)}"
        return StateWriteError(message, path=path, errno=code)

    def succeeded(self) -> None:
        """A whole file was written: the directory takes writes again."""
        if self.error is None:
            return
        with self._lock:
            self._succeeded()

    def _succeeded(self) -> None:
        if self.error is None:
            return
        log.info("state_dir_writable_again", extra=fields(
            state_dir=str(self.root), was=self.error,
            degraded_s=round((self._now_ms() - (self.since_ms or 0)) / 1000, 1), failed_writes=self.failed_writes))
        self.error = self.errno = self.since_ms = self._logged_ms = None
        self._unlogged = 0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"writable": self.error is None, "error": self.error, "since_ms": self.since_ms,
                "failed_writes": self.failed_writes}


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _fix(code: int) -> str:
    return _FIXES.get(code, "check the disk or move [node] state_dir")


# ---------------------------------------------------------------------------------------------
# The state directory.
# ---------------------------------------------------------------------------------------------

class StateDir:
    """The node's state directory: node facts, election hard state, job records.

    Every whole-file write fsyncs (the file, then its directory: ~12 ms here), so callers on the
    event loop hand job records to a worker thread (`fsyncs`: jobs/records.py). The health
    bookkeeping is locked: writes may come from that thread and the loop at once."""

    fsyncs = True        # writes block for the disk: keep them off the event loop

    def __init__(self, root: Path, now_ms: Callable[[], int] = _monotonic_ms) -> None:
        self.root = root
        self._health = StateHealth(root, now_ms)
        self._now_ms = now_ms
        self._probed_ms: int | None = None
        try:
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise StateError(root, "", f"cannot create the state directory: {exc.strerror or exc}; "
                                       f"{_fix(exc.errno or 0)}") from None
        removed = remove_stale_temps(root)
        if removed:
            log.info("stale_temp_files_removed", extra=fields(state_dir=str(root), count=removed))

    # -- node.json ---------------------------------------------------------------------------

    def next_incarnation(self) -> int:
        """SWIM incarnation for this boot: strictly above every earlier boot's (persisted first).

        Raises StateError if node.json lies or this boot's number cannot be written: the node must
        not start with an incarnation a peer may already have seen."""
        path = self.root / "node.json"
        doc = self._load(path, _NODE_FIX)
        found = doc.get("incarnation") if doc is not None else None
        if type(found) is int and found >= STATE_INT_MAX - 1:
            # left by the bug that let a member's gossip raise it: peers that hold this node
            # suspect or dead accept its own lower number (fedpeer/core/membership/swim.py), so restart
            log.warning("incarnation_reset", extra=fields(
                file=str(path), found=found, now=1, reason="out of range; peers take this node's own lower number"))
            incarnation = 1
        else:
            incarnation = 1 if doc is None else _state_int(path, doc, "incarnation", _NODE_FIX) + 1
        try:   # not through the health tracker: this failure is the one line the operator sees
            atomic_write(path, _json_bytes({"incarnation": incarnation}))
        except OSError as exc:
            problem = exc.strerror or str(exc)
            what = f"disk full ({problem})" if exc.errno in _DISK_FULL else problem
            raise StateError(self.root, "", f"cannot record this boot's incarnation: {what}; "
                                            f"{_fix(exc.errno or 0)}") from None
        return incarnation

    def save_incarnation(self, incarnation: int) -> None:
        """Raises StateWriteError if not written (the disk, or a value out of range)."""
        self._check_range("node.json", "incarnation", incarnation)
        self._write(self.root / "node.json", _json_bytes({"incarnation": incarnation}))

    # -- election.json -----------------------------------------------------------------------

    def load_vote(self) -> tuple[int, bytes | None]:
        """The election's hard state (term, voted_for): must survive restarts (one vote per term)."""
        path = self.root / "election.json"
        doc = self._load(path, _ELECTION_FIX)
        if doc is None:
            return 0, None
        term = _state_int(path, doc, "term", _ELECTION_FIX)
        if "voted_for" not in doc:
            raise StateError(path, "voted_for", f"missing; {_ELECTION_FIX}")
        voted = doc["voted_for"]
        if voted is None:
            return term, None
        if (not isinstance(voted, str) or len(voted) != 2 * VOTE_KEY_BYTES
                or not re.fullmatch(r"[0-9a-fA-F]+", voted)):
            raise StateError(path, "voted_for", f"must be null or {VOTE_KEY_BYTES} bytes in hex, "
                                                f"found {_shown(voted)}; {_ELECTION_FIX}")
        return term, bytes.fromhex(voted)

    def save_vote(self, term: int, voted_for: bytes | None) -> None:
        """Raises StateWriteError if not written (the disk, or a term out of range)."""
        self._check_range("election.json", "term", term)
        assert voted_for is None or len(voted_for) == VOTE_KEY_BYTES, "voted_for is a public key"
        doc = {"term": term, "voted_for": voted_for.hex() if voted_for else None}
        self._write(self.root / "election.json", _json_bytes(doc))

    # -- job records and other files ----------------------------------------------------------

    def write_record(self, path: Path | str, doc: Any) -> None:
        """Atomically write a JSON document at `path` (relative to the state dir, or inside it).

        Raises StateWriteError (one line, names the state_dir) if the disk refuses it."""
        self._write(self._inside(path), _json_bytes(doc))

    def write_bytes(self, path: Path | str, data: bytes) -> None:
        """Like write_record, for raw bytes (models)."""
        self._write(self._inside(path), data)

    def health(self) -> dict[str, Any]:
        """{"writable", "error", "since_ms", "failed_writes"} for `fedpeer status`; no I/O."""
        return self._health.snapshot()

    @property
    def writable(self) -> bool:
        return self._health.error is None

    def probe(self) -> bool:
        """While degraded, try one small write (at most once per STATE_PROBE_INTERVAL_MS) so that
        freed space is noticed even if nothing else writes; returns whether the dir is writable."""
        if self._health.error is None:
            return True
        now = self._now_ms()
        if self._probed_ms is not None and now - self._probed_ms < STATE_PROBE_INTERVAL_MS:
            return False
        self._probed_ms = now
        path = self.root / ".probe"
        try:
            self._write(path, b"\0" * STATE_PROBE_BYTES)
        except StateWriteError:
            return False
        _unlink_quietly(path)
        return True

    def require_writable(self) -> None:
        """Raise StateWriteError ("disk full at ...") unless the dir takes writes (probes first):
        for refusing new jobs while degraded."""
        if not self.probe():
            health = self._health
            raise StateWriteError(f"{health.error} (new jobs are refused until it takes writes again); "
                                  f"{_fix(health.errno or 0)}", path=self.root, errno=health.errno)

    # -- internals ---------------------------------------------------------------------------

    def _write(self, path: Path, data: bytes) -> None:
        try:
            atomic_write(path, data)
        except OSError as exc:
            raise self._health.failed(exc, path) from None
        self._health.succeeded()

    def _inside(self, path: Path | str) -> Path:
        full = self.root / path
        if ".." in Path(path).parts or not full.is_relative_to(self.root):
            raise ValueError(f"{path}: not inside the state directory {self.root}")
        return full

    def _check_range(self, name: str, key: str, value: int) -> None:
        # A number the next start would refuse must never reach the disk: refuse it now, without
        # marking the disk degraded (the value is wrong, not the disk).
        if type(value) is not int or not 0 <= value < STATE_INT_MAX:
            raise StateWriteError(f"{self.root / name}: refusing to record {key} {_shown(value)}: "
                                  f"outside [0, 2**62)", path=self.root / name, errno=None)

    def _load(self, path: Path, fix: str) -> dict[str, Any] | None:
        """The JSON object in path, None if the file does not exist; StateError if it lies."""
        try:
            with open(path, "rb") as f:
                raw = f.read(STATE_FILE_BYTES_MAX + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(path, "", f"cannot read: {exc.strerror or exc}; {fix}") from None
        if len(raw) > STATE_FILE_BYTES_MAX:
            raise StateError(path, "", f"larger than {STATE_FILE_BYTES_MAX} bytes; {fix}")
        try:
            doc = json.loads(raw)
        except ValueError as exc:   # UnicodeDecodeError included
            raise StateError(path, "", f"not valid JSON ({_one_line(exc)}); {fix}") from None
        if not isinstance(doc, dict):
            raise StateError(path, "", f"must be a JSON object, found {type(doc).__name__}; {fix}")
        return doc


def _state_int(path: Path, doc: dict[str, Any], key: str, fix: str) -> int:
    if key not in doc:
        raise StateError(path, key, f"missing; {fix}")
    value = doc[key]
    if type(value) is not int or not 0 <= value < STATE_INT_MAX:
        raise StateError(path, key, f"must be an integer in [0, 2**62), found {_shown(value)}; {fix}")
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode("utf-8") + b"\n"
