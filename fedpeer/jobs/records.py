"""Job records: what a job is (`JobRecord`) and how its file is kept (`RecordFiles`).

Records live in state/jobs/<id>/job.json, written atomically at every state change. On a state dir
that fsyncs (the daemon's), the writes go to a writer task that does them one at a time in a
worker thread (two fsyncs, ~12 ms each, stalled the event loop several times per job); whatever
depends on a record being on disk awaits `on_disk`. A write that fails (disk full, EIO, EMFILE)
leaves the record in memory — it is the truth — and is retried at its next change."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpeer.base.logs import fields
from fedpeer.base.store import read_json, write_json
from fedpeer.errors import FedpeerError
from fedpeer.identity import fingerprint
from fedpeer.runtime.channel import Mailbox

log = logging.getLogger("fedpeer.jobs")
# A job record's states and the moves between them, in one table. A record starts "proposed" (at
# its proposer, and at a member that heard the proposal); a member that accepts it waits
# "accepted" for the proposer's start; "running" runs the kind; done, failed and cancelled end it
# (the first end wins: JobRegistry.finish). A running job whose daemon stopped or died is
# "interrupted" (its record says at which phase and step): a member restarted mid-job runs it again
# if the others take it back (fedpeer/jobs/lifecycle/rejoin.py), else it fails, saying why.
# `advance` refuses any other move.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "proposed": ("accepted", "running", "failed", "cancelled"),
    "accepted": ("running", "failed", "cancelled"),
    "running": ("done", "failed", "cancelled", "interrupted"),
    "interrupted": ("running", "failed", "cancelled"),
    "done": (),
    "failed": (),
    "cancelled": (),
}
STATES = tuple(TRANSITIONS)
TERMINAL = tuple(state for state, moves in TRANSITIONS.items() if not moves)
PENDING = ("proposed", "accepted")      # known, not yet running: holds no jobs_concurrent_max slot
PROGRESS_SAVE_INTERVAL_MS = 1_000   # a running job's progress is written at most this often (an fsync each)
WAITS_SHOWN_MAX = 8             # pending receives `job show` lists per job (oldest first)


def advance(record: JobRecord, state: str) -> None:
    """Move `record` to `state`, a move the table allows (anything else is a bug here)."""
    if state not in TRANSITIONS[record.state]:
        raise AssertionError(f"job {record.id}: {record.state} -> {state} is not a move of the record table")
    record.state = state


@dataclass
class JobRecord:
    id: str
    kind: str
    params: dict
    proposer: bytes
    members: tuple[bytes, ...]
    created_ms: int
    state: str = "proposed"
    phase: str = "waiting for members"
    step: int = 0
    total: int = 0
    error: str | None = None
    result: dict | None = None
    rows: int | None = None
    data_fingerprint: str | None = None   # hex schema fingerprint of the data this site ran it on
    history: list[dict] = field(default_factory=list)   # rounds' metrics as the job reported them, live
    started_ms: int | None = None
    finished_ms: int | None = None
    mailbox: Mailbox = field(default_factory=Mailbox, repr=False)
    task: asyncio.Task | None = field(default=None, repr=False)
    data: Any = field(default=None, repr=False)
    test_data: Any = field(default=None, repr=False)
    start_signal: asyncio.Future | None = field(default=None, repr=False)   # member: set by JobStart
    rejoins: int = 0             # times this site asked to come back into the job after a restart
    announced: bool = False      # other members know of the job (so they must hear how it ends)
    stored: bool = True          # written to disk; a peer's proposal only once it runs
    dirty: bool = False          # the last write failed: retried at the next state change

    def to_json(self, names: Mapping[bytes, str], now_ms: int) -> dict:
        end = self.finished_ms or now_ms
        waiting = self.waiting_for(names) if self.state == "running" else []
        return {
            "id": self.id, "kind": self.kind, "params": self.params, "state": self.state,
            "proposer": names.get(self.proposer, fingerprint(self.proposer)),
            "members": [{"name": names.get(k, "?"), "fingerprint": fingerprint(k)} for k in self.members],
            "phase": self.phase, "progress": {"step": self.step, "total": self.total},
            "created_ms": self.created_ms, "started_ms": self.started_ms, "finished_ms": self.finished_ms,
            "elapsed_s": round((end - self.started_ms) / 1000, 3) if self.started_ms else None,
            "rows": self.rows, "data_fingerprint": self.data_fingerprint, "history": self.history,
            "error": self.error, "result": self.result,
            **({"rejoins": self.rejoins} if self.rejoins else {}),
            **({"waiting_for": waiting} if waiting else {}),
        }

    def waiting_for(self, names: Mapping[bytes, str]) -> list[str]:
        """What the job's receives wait for now: ["forest from site-3 since 12.4 s", ...]."""
        try:
            now_s = asyncio.get_running_loop().time()
        except RuntimeError:      # no loop, no job running
            return []
        name = lambda k: names.get(k, fingerprint(k))  # noqa: E731
        return [w.describe(name, now_s) for w in self.mailbox.waiting()[:WAITS_SHOWN_MAX]]


def _record_from_json(doc: dict) -> JobRecord:
    record = JobRecord(id=doc["id"], kind=doc["kind"], params=doc["params"], proposer=bytes.fromhex(doc["_proposer"]),
                       members=tuple(bytes.fromhex(k) for k in doc["_members"]), created_ms=doc["created_ms"])
    record.state, record.phase, record.error, record.result = doc["state"], doc["phase"], doc["error"], doc["result"]
    record.step, record.total = doc["progress"]["step"], doc["progress"]["total"]
    record.rows, record.started_ms, record.finished_ms = doc["rows"], doc["started_ms"], doc["finished_ms"]
    record.data_fingerprint = doc.get("data_fingerprint")     # absent from records written before it existed
    record.history = doc.get("history") if isinstance(doc.get("history"), list) else []
    rejoins = doc.get("rejoins", 0)
    record.rejoins = rejoins if isinstance(rejoins, int) and not isinstance(rejoins, bool) else 0
    return record


def stopped_at(record: JobRecord) -> str:
    """Where a job stopped, for the one line an interrupted record keeps."""
    return f"phase {record.phase!r}, step {record.step} of {record.total}"


class RecordFiles:
    """The job records' files under `root` (state/jobs), for the registry."""

    def __init__(self, root: Path, state: Any, names: Mapping[bytes, str], now_ms: Callable[[], int],
                 spawn: Callable[[Any], asyncio.Task], state_dir: Path) -> None:
        self.root, self.state, self.names, self.now_ms, self.spawn = root, state, names, now_ms, spawn
        self.state_dir = state_dir
        self.unsaved: dict[str, JobRecord] = {}                        # records whose last write failed
        # writes off the loop (save): only where they fsync (fedpeer.base.store.StateDir)
        self._writes_off_loop = bool(getattr(state, "fsyncs", False))
        self.queued: dict[str, tuple[JobRecord, dict, int, asyncio.Future]] = {}   # job -> latest doc to write
        self.inflight: tuple[str, JobRecord, dict, int, asyncio.Future] | None = None
        self._snapshots: dict[str, int] = {}     # job -> number of its latest state snapshot
        self._stored_seq: dict[str, int] = {}    # job -> number of the snapshot on disk (under _disk_lock)
        self._writer: asyncio.Task | None = None
        self._disk_lock = threading.Lock()      # one record file write at a time, thread or loop
        self._progress_saved: dict[str, int] = {}                  # job -> when its progress was last written
        self._progress_due: dict[str, asyncio.TimerHandle] = {}    # job -> the write its latest progress waits for


    def load(self) -> list[JobRecord]:
        """The records on disk; one found running (the daemon died mid-job) is marked interrupted,
        with the phase and step it reached (one stopped mid-job was marked so as it stopped); any
        other found non-terminal is marked failed."""
        found: list[JobRecord] = []
        if not self.root.is_dir():
            return found
        for path in sorted(self.root.glob("*/job.json")):
            try:
                doc = read_json(path)
                record = _record_from_json(doc)
            except (FedpeerError, KeyError, TypeError, ValueError) as exc:
                log.warning("job_record_unreadable", extra=fields(path=str(path), error=str(exc)))
                continue
            if record.state == "running":
                advance(record, "interrupted")
                record.error = f"the daemon restarted at {stopped_at(record)}"
                self.save(record)
            elif record.state == "interrupted":
                record.error = record.error or f"the daemon restarted at {stopped_at(record)}"
            elif record.state not in TERMINAL:
                advance(record, "failed")
                record.error = f"this daemon stopped while the job was starting (state: {record.state})"
                record.finished_ms = record.finished_ms or self.now_ms()
                self.save(record)
            found.append(record)
        return found

    def save(self, record: JobRecord) -> bool:
        """Write the record; never raises. A failed write keeps the record in memory (it is the
        truth) and is retried at the next state change of any record.

        On a state dir that fsyncs (the daemon's), the write is queued for a worker thread (two
        fsyncs, ~12 ms each, stalled the event loop several times per job): returns True at
        once, and `_on_disk` awaits it wherever a message depends on the record being on disk
        (the job starting, the proposal, an abort or cancel). Writes of one record land in the
        order of their `_save`s, the latest state last. Otherwise (tests' fakes, no event loop,
        the daemon stopping) it writes now and returns whether the record is on disk."""
        if not record.stored:
            return True
        if self._queue_write(record):
            for other in [r for r in self.unsaved.values() if r is not record]:
                self._queue_write(other)
            return True
        if not self._write(record):
            return False
        for other in [r for r in self.unsaved.values() if r is not record]:
            if not self._write(other):
                break
        return True

    def save_progress(self, record: JobRecord) -> None:
        """A running job's phase or step changed: written now if the last progress write is
        PROGRESS_SAVE_INTERVAL_MS old, else once that much time has passed (the latest progress
        then): a daemon killed mid-job finds, at its restart, where the job was to within that."""
        now = self.now_ms()
        wait = self._progress_saved.get(record.id, now - PROGRESS_SAVE_INTERVAL_MS) + PROGRESS_SAVE_INTERVAL_MS - now
        if wait <= 0:
            self._progress_saved[record.id] = now
            self.save(record)
            return
        if record.id in self._progress_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._progress_due[record.id] = loop.call_later(wait / 1000, self._progress_write, record)

    def _progress_write(self, record: JobRecord) -> None:
        self._progress_due.pop(record.id, None)
        if record.state == "running":
            self._progress_saved[record.id] = self.now_ms()
            self.save(record)

    def forget_progress(self, job_id: str) -> None:
        """The job ended: no progress of it is written any more."""
        self._progress_saved.pop(job_id, None)
        due = self._progress_due.pop(job_id, None)
        if due is not None:
            due.cancel()

    async def on_disk(self, record: JobRecord) -> bool:
        """Wait for the record's queued writes; whether its latest state is on disk."""
        if not record.stored:
            return True
        while True:
            queued = self.queued.get(record.id)
            done = queued[3] if queued is not None else (
                self.inflight[4] if self.inflight is not None and self.inflight[0] == record.id else None)
            if done is None:
                return not record.dirty
            await asyncio.shield(done)

    def _queue_write(self, record: JobRecord) -> bool:
        """Queue the record's current state for the writer task; False if it must be written now."""
        if not self._writes_off_loop:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        try:
            doc, seq = self._snapshot(record)     # the state as of now, whatever changes before the write
        except Exception:   # noqa: BLE001  (a bug: the synchronous path records and logs it)
            return False
        if self._writer is None or self._writer.done():    # done: its callback has not run yet
            writer = self._write_queued()
            try:
                self._writer = self.spawn(writer)
            except Exception:   # noqa: BLE001  (the daemon is stopping: no new task; write now)
                writer.close()
                self._writer = None
                return False
            self._writer.add_done_callback(self._writer_ended)
        queued = self.queued.pop(record.id, None)
        self.queued[record.id] = (record, doc, seq, queued[3] if queued is not None else loop.create_future())
        return True

    async def _write_queued(self) -> None:
        """The writer task: queued records, oldest first, one at a time, in a worker thread."""
        while self.queued:
            job_id = next(iter(self.queued))
            record, doc, seq, done = self.queued.pop(job_id)
            self.inflight = (job_id, record, doc, seq, done)
            error = await asyncio.to_thread(self._write_doc, record, doc, seq)
            self.inflight = None
            self._written(record, error)
            if not done.done():
                done.set_result(None)

    def _writer_ended(self, task: asyncio.Task) -> None:
        """The writer was cancelled (the daemon stops) or failed: whatever is still queued, the
        write that was in flight first, is written here and now (the disk lock waits for a
        worker thread still writing). A writer that emptied the queue just ends: records queued
        since then belong to the writer started for them."""
        if self._writer is task:
            self._writer = None
        if not task.cancelled() and task.exception() is None:
            return
        pending = list(self.queued.values())
        self.queued.clear()
        if self.inflight is not None:       # again: the thread may have been cut short
            pending.insert(0, self.inflight[1:])
            self.inflight = None
        for record, doc, seq, done in pending:      # an older state than the file's is skipped
            self._written(record, self._write_doc(record, doc, seq))
            if not done.done():
                done.set_result(None)

    def _snapshot(self, record: JobRecord) -> tuple[dict, int]:
        """The record's state now, and its number: writes of older numbers are skipped."""
        doc = self._doc(record)
        seq = self._snapshots[record.id] = self._snapshots.get(record.id, 0) + 1
        return doc, seq

    def _doc(self, record: JobRecord) -> dict:
        doc = record.to_json(self.names, self.now_ms())
        doc.pop("waiting_for", None)      # a moment's view, stale once written
        doc["_members"] = [k.hex() for k in record.members]
        doc["_proposer"] = record.proposer.hex()
        return doc

    def _write_doc(self, record: JobRecord, doc: dict, seq: int) -> Exception | None:
        """Atomically write `doc`, snapshot number `seq`, as the record's file (any thread),
        unless a later snapshot is already there; the error, or None."""
        path = self.root / record.id / "job.json"
        try:
            with self._disk_lock:
                if seq <= self._stored_seq.get(record.id, 0):
                    return None
                if self.state is not None:
                    self.state.write_record(path, doc)
                else:
                    write_json(path, doc)
                self._stored_seq[record.id] = seq
        except Exception as exc:   # ENOSPC, EIO, EMFILE, or a bug: this record waits, the node goes on
            return exc
        return None

    def _write(self, record: JobRecord) -> bool:
        try:
            doc, seq = self._snapshot(record)
        except Exception as exc:   # noqa: BLE001  (a bug: recorded like a failed write)
            return self._written(record, exc)
        return self._written(record, self._write_doc(record, doc, seq))

    def _written(self, record: JobRecord, error: Exception | None) -> bool:
        """Bookkeeping after a write (on the loop): dirty and retried later if it failed."""
        if error is not None:
            first = not record.dirty
            record.dirty = True
            self.unsaved[record.id] = record
            if first:   # the state dir's health logs the episode; here once per record
                log.warning("job_record_not_saved", extra=fields(job=record.id, state=record.state,
                                                                  error=f"{type(error).__name__}: {error}"))
            return False
        record.dirty = False
        self.unsaved.pop(record.id, None)
        return True

    def retry_unsaved(self) -> int:
        """Write again the records whose last write failed (the disk has room again); returns how
        many are still unsaved (queued ones included). Cheap when there are none: the node may
        call it from its tick."""
        for record in list(self.unsaved.values()):
            if self._queue_write(record):
                continue
            if not self._write(record):
                break
        return len(self.unsaved)

    def write_problem(self) -> str:
        error = self.state.health().get("error") if self.state is not None else None
        return error or f"cannot write job records under {self.root}"

    def disk_problem(self) -> str | None:
        """Why new jobs must be refused now (the state dir takes no writes), or None."""
        if self.state is None or self.state.health().get("writable", True):
            return None
        probe = getattr(self.state, "probe", None)   # one small write, rate-limited by the store
        if probe is not None and probe():
            return None
        return self.state.health().get("error") or f"disk full at {self.state_dir}"
