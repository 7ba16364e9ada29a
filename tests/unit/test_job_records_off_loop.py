"""Job records are written off the event loop (issue 13 item 2), in order, and on disk before
the messages that depend on them: the job's start, an abort. Over a state dir whose writes take
WRITE_S (as the daemon's two fsyncs do), the loop keeps running meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpeer.errors import JobError
from fedpeer.jobs import messages as m
from fedpeer.jobs.kind import JobKind
from fedpeer.jobs.lifecycle.registry import JobRegistry

from .test_job_registry import ALICE, BOB, ME, NAMES, FakeTransport, make_config, proposal, settle, start

WRITE_S = 0.2                   # one record write, in its worker thread
LOOP_STALL_S_MAX = WRITE_S / 2  # a write on the loop would stall it WRITE_S (other load: some ms)


@dataclass
class SlowState:
    """A state dir that fsyncs (so the registry writes off the loop) and takes WRITE_S per write."""

    root: Path
    fsyncs = True
    written: dict[str, list[dict]] = field(default_factory=dict)    # job -> every state written, in order
    threads: set[str] = field(default_factory=set)

    def write_record(self, path: Path, doc: Any) -> None:
        time.sleep(WRITE_S)
        self.threads.add(threading.current_thread().name)
        self.written.setdefault(Path(path).parent.name, []).append(dict(doc))

    def health(self) -> dict:
        return {"writable": True, "error": None}


def kinds(state: SlowState, seen: dict[str, Any]) -> dict[str, JobKind]:
    async def run(ch: Any, params: Any, ctx: Any) -> dict:
        seen["on disk when the job ran"] = [d["state"] for d in state.written.get(ch.job_id, [])]
        for step in range(5):
            ch.progress(f"phase {step}", step, 5)
            await asyncio.sleep(0)
        return {"ok": 1}

    async def fails(ch: Any, params: Any, ctx: Any) -> dict:
        raise JobError("this kind always fails")

    return {k.name: k for k in (JobKind(name="noop", help="", params={}, run=run, needs_data=False),
                                JobKind(name="fails", help="", params={}, run=fails, needs_data=False))}


async def longest_stall(until: asyncio.Event) -> float:
    worst, last = 0.0, time.perf_counter()
    while not until.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    return worst


async def test_records_are_written_off_the_loop_in_order_and_before_the_job_runs(tmp_path: Path) -> None:
    state, seen = SlowState(tmp_path / "state"), {}
    transport = FakeTransport()
    config = make_config(tmp_path)
    config = type(config)(path=config.path, node=config.node, peers=(), policy=type(config.policy)(
        allowed_jobs=("noop", "fails")), jobs=config.jobs)
    done = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        watch = tg.create_task(longest_stall(done))
        registry = JobRegistry(config, transport, NAMES, kinds(state, seen), tg.create_task, state=state)
        registry.on_message(ALICE, "j-1", proposal(ALICE, "j-1", "noop", members=(BOB,)))
        await settle()
        registry.on_message(ALICE, "j-1", start("j-1", ALICE, BOB, ME))
        while registry.jobs["j-1"].state != "done" or registry.records.queued or registry.records.inflight:
            await asyncio.sleep(0.01)
        done.set()
    assert seen["on disk when the job ran"] == ["running"], "the job started before its record was on disk"
    states = [(d["state"], d["phase"]) for d in state.written["j-1"]]
    assert states[0] == ("running", "starting") and states[-1] == ("done", "done"), states
    assert len(states) < 7, f"{len(states)} writes: queued states of one record are coalesced"
    assert threading.main_thread().name not in state.threads, "a record was written on the loop's thread"
    assert watch.result() < LOOP_STALL_S_MAX, f"the loop stalled {watch.result() * 1000:.0f} ms"


async def test_a_failed_job_is_on_disk_before_its_abort_is_sent(tmp_path: Path) -> None:
    state, seen = SlowState(tmp_path / "state"), {}
    transport = FakeTransport()
    config = make_config(tmp_path)
    config = type(config)(path=config.path, node=config.node, peers=(), policy=type(config.policy)(
        allowed_jobs=("noop", "fails")), jobs=config.jobs)
    on_disk_at_abort: list[list[str]] = []
    sent = transport.send

    async def send(dst: bytes, msg: object, job_id: str, timeout_ms: int) -> None:
        if isinstance(msg, m.JobAbort):
            on_disk_at_abort.append([d["state"] for d in state.written.get(job_id, [])])
        await sent(dst, msg, job_id, timeout_ms)

    transport.send = send  # type: ignore[method-assign]
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(config, transport, NAMES, kinds(state, seen), tg.create_task, state=state)
        registry.on_message(ALICE, "f-1", proposal(ALICE, "f-1", "fails", members=(BOB,)))
        await settle()
        registry.on_message(ALICE, "f-1", start("f-1", ALICE, BOB, ME))
        while not on_disk_at_abort:
            await asyncio.sleep(0.01)
    assert all(states[-1] == "failed" for states in on_disk_at_abort), on_disk_at_abort


async def test_the_last_state_is_written_when_the_daemon_stops(tmp_path: Path) -> None:
    """The task group is cancelled (the daemon stops) while a record's write is in flight and a
    newer state waits: the job ends `cancelled`, and that is the state on disk, written last."""
    state, seen = SlowState(tmp_path / "state"), {}
    transport = FakeTransport(hang_s=600.0)
    config = make_config(tmp_path)
    config = type(config)(path=config.path, node=config.node, peers=(), policy=type(config.policy)(
        allowed_jobs=("noop", "fails")), jobs=config.jobs)

    class Stop(Exception):
        pass

    try:
        async with asyncio.TaskGroup() as tg:
            registry = JobRegistry(config, transport, NAMES, kinds(state, seen), tg.create_task, state=state)
            record = registry.jobs[registry.propose("noop", {}, ["alice"])]
            await asyncio.sleep(WRITE_S / 5)        # its first write is in flight
            record.phase = "later"
            registry.records.save(record)
            raise Stop()
    except* Stop:
        pass
    states = [d["state"] for d in state.written[record.id]]
    assert states[0] == "proposed" and states[-1] == "cancelled", states
    assert "stopped" in state.written[record.id][-1]["error"]
