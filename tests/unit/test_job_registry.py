"""The job registry under a hostile member and a failing disk, over a fake transport.

Every registry task is spawned into a TaskGroup the test owns, as the daemon spawns them into its
own: an exception escaping a job task ends the group and fails the test, which is exactly how one
frame used to take a whole daemon down (issues 10 and 11). Time is the fake transport's clock.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fedpeer.config.load import Address, Config, JobLimits, NodeSection, Policy
from fedpeer.errors import JobError, RemoteProtocolError
from fedpeer.identity import fingerprint
from fedpeer.jobs import messages as m
from fedpeer.jobs.kind import ImplausibleTotal, JobFailsEverywhere, JobKind
from fedpeer.jobs.lifecycle import admission, runner
from fedpeer.jobs.lifecycle import registry as reg
from fedpeer.jobs.lifecycle.registry import JobRegistry
from fedpeer.wire import frame as wire


def key(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


ME, ALICE, BOB, STRANGER = key("me"), key("alice"), key("bob"), key("stranger")
NAMES = {ME: "site-me", ALICE: "alice", BOB: "bob"}        # STRANGER is in nobody's peers.toml


@dataclass
class FakeTransport:
    me: bytes = ME
    clock_ms: int = 1_700_000_000_000
    sent: list[tuple[bytes, object]] = field(default_factory=list)
    fail_with: Exception | None = None        # every send raises this (a transport bug, a refusal)
    hang_s: float = 0.0                       # a job's own sends take this long (a peer that does not answer)

    def now_ms(self) -> int:
        return self.clock_ms

    def alive(self, peer: bytes) -> bool:
        return True

    def leadership(self) -> tuple[int, bytes | None]:
        return 1, None

    def pairwise_seed(self, peer: bytes, label: bytes) -> bytes:
        return bytes(32)

    async def send(self, dst: bytes, msg: object, job_id: str, timeout_ms: int) -> None:
        self.sent.append((dst, msg))
        if dst not in NAMES:   # as Node.send did: membership.address_of raised KeyError
            raise KeyError(dst)
        if self.fail_with is not None:
            raise self.fail_with
        await asyncio.sleep(self.hang_s if isinstance(msg, wire.DiagProbe) else 0)


@dataclass
class FakeState:
    """fedpeer.base.store.StateDir's job-record surface: write_record and health."""

    root: Path
    full: bool = False
    written: dict[str, dict] = field(default_factory=dict)

    def write_record(self, path: Path, doc: Any) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.written[Path(path).parent.name] = doc

    def health(self) -> dict:
        return {"writable": not self.full, "error": f"disk full at {self.root}" if self.full else None}


async def _noop_run(ch: Any, params: Any, ctx: Any) -> dict:
    return {"ok": 1}


async def _failing_run(ch: Any, params: Any, ctx: Any) -> dict:
    await ch.sleep_ms(50)
    raise JobError("this kind always fails")


async def _implausible_run(ch: Any, params: Any, ctx: Any) -> dict:
    await ch.sleep_ms(50)
    raise ImplausibleTotal.of("k/round1", "the cluster sizes add up to the rows")


async def _job_wide_run(ch: Any, params: Any, ctx: Any) -> dict:
    await ch.sleep_ms(50)
    raise JobFailsEverywhere("aligning the rows: no ID is held by every member")


async def _own_data_run(ch: Any, params: Any, ctx: Any) -> dict:
    await ch.sleep_ms(50)
    raise JobFailsEverywhere("this site's weights diverge; lower learning_rate", here=True)


async def _short_run(ch: Any, params: Any, ctx: Any) -> dict:
    await ch.sleep_ms(50)
    return {"ok": 2}


async def _recv_from_alice(ch: Any, params: Any, ctx: Any) -> dict:
    await ch.recv(wire.DiagProbe, "never", src=ALICE, timeout_ms=60_000)
    return {}


async def _send_to_alice(ch: Any, params: Any, ctx: Any) -> dict:
    ch.progress("sending to alice", 1, 2)
    await ch.send(ALICE, wire.DiagProbe(b"x"))
    return {}


KINDS = {k.name: k for k in (
    JobKind(name="noop", help="", params={}, run=_noop_run, needs_data=False),
    JobKind(name="fails", help="", params={}, run=_failing_run, needs_data=False),
    JobKind(name="implausible", help="", params={}, run=_implausible_run, needs_data=False,
            member_failure_aborts=False),
    JobKind(name="waits", help="", params={}, run=_recv_from_alice, needs_data=False),
    JobKind(name="job-wide", help="", params={}, run=_job_wide_run, needs_data=False),
    JobKind(name="own-data", help="", params={}, run=_own_data_run, needs_data=False),
    JobKind(name="short", help="", params={}, run=_short_run, needs_data=False),
    JobKind(name="sends", help="", params={}, run=_send_to_alice, needs_data=False),
)}


def make_config(tmp_path: Path, **jobs: int) -> Config:
    node = NodeSection(name="site-me", listen=Address("127.0.0.1", 1), advertise=Address("127.0.0.1", 1),
                       key_file=tmp_path / "key", state_dir=tmp_path / "state", admin="unix:/nonexistent")
    return Config(path=tmp_path / "peers.toml", node=node, peers=(),
                  policy=Policy(allowed_jobs=tuple(KINDS)), jobs=JobLimits(**jobs))


def proposal(src: bytes, job_id: str, kind: str = "noop", members: tuple[bytes, ...] = ()) -> m.JobPropose:
    members = tuple(sorted(set(members) | {src, ME}))
    return m.JobPropose(job_id=job_id, kind=kind, params={}, members=list(members), created_ms=2**62)


def start(job_id: str, *members: bytes) -> m.JobStart:
    return m.JobStart(job_id=job_id, members=sorted(members))


def sent_of(transport: FakeTransport, kind: type) -> list[tuple[bytes, Any]]:
    return [(dst, msg) for dst, msg in transport.sent if isinstance(msg, kind)]


async def settle(rounds: int = 20) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def job_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state" / "jobs").glob("*/job.json"))


# ---------------------------------------------------------------------------------------------
# 1. One frame must not kill the daemon
# ---------------------------------------------------------------------------------------------

async def test_proposal_naming_an_unknown_member_is_refused_to_the_proposer_only(tmp_path: Path) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        registry.on_message(ALICE, "evil-1", proposal(ALICE, "evil-1", members=(BOB, STRANGER)))
        await settle()
    # one JobReject, to the proposer, naming the stranger; nothing to bob, nothing to the stranger
    assert [dst for dst, _ in transport.sent] == [ALICE], transport.sent
    (_, reject), = sent_of(transport, m.JobReject)
    assert fingerprint(STRANGER) in reject.reason and "peers.toml" in reject.reason
    shown = registry.show("evil-1")
    assert shown["state"] == "failed" and fingerprint(STRANGER) in shown["error"]
    assert shown["created_ms"] == transport.clock_ms, "ordered by our clock, not the proposer's"
    assert job_files(tmp_path) == [], "a refused proposal must not be written to disk"


async def test_a_failure_inside_the_failure_handling_ends_only_that_job(tmp_path: Path) -> None:
    """The job fails, its abort fan-out meets a transport bug and its record a full disk: the
    job ends `failed`, the task group (the daemon) lives on."""
    transport = FakeTransport()
    state = FakeState(tmp_path / "state")
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task, state=state)
        registry.on_message(ALICE, "fails-1", proposal(ALICE, "fails-1", "fails", members=(BOB,)))
        await settle()
        registry.on_message(ALICE, "fails-1", start("fails-1", ALICE, BOB, ME))
        await settle()
        state.full = True                            # the disk fills while the job runs
        transport.fail_with = RuntimeError("transport bug")
        await asyncio.sleep(runner.ABORT_GRACE_MS / 1000 + 0.2)
        record = registry.jobs["fails-1"]
        assert record.state == "failed" and "always fails" in record.error
        assert record.dirty, "the final state could not be written: it stays in memory, marked for a retry"
        assert {dst for dst, _ in sent_of(transport, m.JobAbort)} == {ALICE, BOB}
        # the disk comes back: the next state change (a new job) writes the lost final state too
        state.full, transport.fail_with = False, None
        other = registry.propose("noop", {}, ["alice"])
        await settle()
        registry.jobs[other].task.cancel()
    assert state.written["fails-1"]["state"] == "failed" and not record.dirty


async def test_an_implausible_total_ends_the_job_everywhere_blaming_no_site(tmp_path: Path) -> None:
    """A secure sum's total fails its check here: the record and every member's abort carry the
    check's one line, about no site (not this one, which merely noticed); even a kind whose members
    may fail alone ends everywhere. A peer's abort about no site is recorded naming nobody."""
    transport = FakeTransport()
    state = FakeState(tmp_path / "state")
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task, state=state)
        registry.on_message(ALICE, "bad-1", proposal(ALICE, "bad-1", "implausible", members=(BOB,)))
        await settle()
        registry.on_message(ALICE, "bad-1", start("bad-1", ALICE, BOB, ME))
        await asyncio.sleep(runner.ABORT_GRACE_MS / 1000 + 0.2)
        record = registry.jobs["bad-1"]
        want = ("secure sum 'k/round1': check 'the cluster sizes add up to the rows' failed — a member's "
                "contribution is implausible; no model is kept")
        assert record.state == "failed" and record.error == want
        aborts = sent_of(transport, m.JobAbort)
        assert {dst for dst, _ in aborts} == {ALICE, BOB}
        assert all(a.site == b"" and a.reason == want for _, a in aborts)
        # the same abort from a peer: the job ends here naming no site either (not the sender)
        registry.on_message(ALICE, "bad-2", proposal(ALICE, "bad-2", "waits", members=(BOB,)))
        await settle()
        registry.on_message(ALICE, "bad-2", start("bad-2", ALICE, BOB, ME))
        await settle()
        registry.on_message(BOB, "bad-2", m.JobAbort(job_id="bad-2", site=b"", reason=want))
        await settle()
        assert registry.jobs["bad-2"].state == "failed" and registry.jobs["bad-2"].error == want


async def test_a_job_wide_failure_names_no_site_unless_on_this_sites_own_evidence(tmp_path: Path) -> None:
    """Issue 38, finding 6: a failure of the whole job (no ID in common) used to start with the
    name of whichever site aborted first, here this one. It now names no site, in the record and
    in every member's abort; a failure whose cause is this site's own data still names it."""
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        for job, kind in (("wide-1", "job-wide"), ("own-1", "own-data")):
            registry.on_message(ALICE, job, proposal(ALICE, job, kind, members=(BOB,)))
            await settle()
            registry.on_message(ALICE, job, start(job, ALICE, BOB, ME))
        await asyncio.sleep(runner.ABORT_GRACE_MS / 1000 + 0.2)
    wide, own = registry.jobs["wide-1"], registry.jobs["own-1"]
    assert wide.state == "failed" and wide.error == "aligning the rows: no ID is held by every member", wide.error
    assert own.state == "failed" and own.error.startswith("site-me: this site's weights diverge"), own.error
    aborts = {a.job_id: a for _, a in sent_of(transport, m.JobAbort)}
    assert aborts["wide-1"].site == b"" and aborts["own-1"].site == ME


# ---------------------------------------------------------------------------------------------
# 2. A full disk
# ---------------------------------------------------------------------------------------------

async def test_full_disk_refuses_new_jobs_and_never_raises(tmp_path: Path) -> None:
    transport = FakeTransport()
    state = FakeState(tmp_path / "state", full=True)
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task, state=state)
        with pytest.raises(JobError, match="disk full at .*state"):
            registry.propose("noop", {}, ["alice"])
        registry.on_message(ALICE, "job-1", proposal(ALICE, "job-1"))
        await settle()
    (_, reject), = sent_of(transport, m.JobReject)
    assert reject.reason.startswith(f"disk full at {tmp_path / 'state'}")
    assert registry.show("job-1")["state"] == "failed"


async def test_record_save_failing_mid_job_keeps_the_job_and_retries(tmp_path: Path) -> None:
    transport = FakeTransport()
    state = FakeState(tmp_path / "state")
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task, state=state)
        registry.on_message(ALICE, "job-2", proposal(ALICE, "job-2", "short"))
        await settle()
        registry.on_message(ALICE, "job-2", start("job-2", ALICE, ME))
        await settle()
        assert state.written["job-2"]["state"] == "running"
        state.full = True     # ENOSPC at the "done" write
        del state.written["job-2"]
        await asyncio.sleep(0.2)
        record = registry.jobs["job-2"]
        assert record.state == "done" and record.result == {"ok": 2} and record.dirty
        assert "job-2" not in state.written
        state.full = False
        other = registry.propose("noop", {}, ["alice"])       # the next state change retries
        await settle()
        registry.jobs[other].task.cancel()
    assert state.written["job-2"]["state"] == "done" and not record.dirty


async def test_disk_full_since_the_proposal_fails_the_start_naming_the_disk(tmp_path: Path) -> None:
    """The disk filled after we accepted (health still said writable): the job does not start
    here, its members hear why, and the record waits in memory for the disk."""
    transport = FakeTransport()
    state = FakeState(tmp_path / "state")
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task, state=state)
        registry.on_message(ALICE, "job-4", proposal(ALICE, "job-4", members=(BOB,)))
        await settle()
        state.full = True
        registry.on_message(ALICE, "job-4", start("job-4", ALICE, BOB, ME))
        await asyncio.sleep(runner.ABORT_GRACE_MS / 1000 + 0.2)
    record = registry.jobs["job-4"]
    assert record.state == "failed" and record.error.startswith(f"site-me: disk full at {tmp_path / 'state'}")
    assert record.result is None and record.dirty
    aborts = sent_of(transport, m.JobAbort)
    assert {dst for dst, _ in aborts} == {ALICE, BOB} and all("disk full" in a.reason for _, a in aborts)
    # space comes back; the node's tick (no job changing state) writes the kept record
    assert registry.retry_unsaved() == 1 and "job-4" not in state.written
    state.full = False
    assert registry.retry_unsaved() == 0 and state.written["job-4"]["state"] == "failed" and not record.dirty


# ---------------------------------------------------------------------------------------------
# 3. A proposal flood from one member
# ---------------------------------------------------------------------------------------------

async def test_proposal_flood_is_bounded_and_an_honest_job_still_runs(tmp_path: Path) -> None:
    transport = FakeTransport()
    refused = 0
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path, jobs_concurrent_max=1, job_start_timeout_ms=600_000),
                               transport, NAMES, KINDS, tg.create_task)
        for i in range(3_000):                     # 3,000 in 12 s, as in the audit
            transport.clock_ms += 4
            try:
                registry.on_message(ALICE, f"flood-{i}", proposal(ALICE, f"flood-{i}", members=(BOB,)))
            except RemoteProtocolError as exc:
                assert exc.reason == "job_limit", exc
                refused += 1
            if i % 100 == 0:
                await settle(3)
        await settle()
        alice_pending = [r for r in registry.jobs.values() if r.proposer == ALICE]
        assert len(alice_pending) <= admission.PENDING_PER_PROPOSER_MAX
        assert len(registry.jobs) + len(registry.unstored) <= \
            admission.PENDING_PER_PROPOSER_MAX + reg.UNSTORED_RECORDS_MAX
        assert refused >= 3_000 - admission.PROPOSALS_BURST_MAX - 12_000 // admission.PROPOSAL_REFILL_MS - 1
        # one answer per proposal that got through, to alice only: no fan-out to bob
        assert {dst for dst, _ in transport.sent} == {ALICE}
        assert len(transport.sent) <= 3_000 - refused
        # bob's honest job: accepted and run, although alice's proposals wait (pending holds no slot)
        registry.on_message(BOB, "honest-1", proposal(BOB, "honest-1"))
        await settle()
        registry.on_message(BOB, "honest-1", start("honest-1", BOB, ME))
        await settle()
        assert registry.show("honest-1")["state"] == "done"
        for record in alice_pending:
            record.task.cancel()
    assert [p.parent.name for p in job_files(tmp_path)] == ["honest-1"], "only the job that ran is on disk"


async def test_pending_proposals_hold_no_running_slot(tmp_path: Path) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path, jobs_concurrent_max=1), transport, NAMES, KINDS, tg.create_task)
        registry.on_message(ALICE, "p-1", proposal(ALICE, "p-1"))
        registry.on_message(ALICE, "p-2", proposal(ALICE, "p-2"))
        await settle()
        assert registry.running() == 0
        job_id = registry.propose("noop", {}, ["bob"])        # still allowed: nothing runs
        await settle()
        for job in ("p-1", "p-2"):
            registry.jobs[job].task.cancel()
        registry.on_message(BOB, job_id, m.JobAccept(job_id=job_id, fingerprint=b"", features=[]))
        await settle()
    assert registry.show(job_id)["state"] == "done"


# ---------------------------------------------------------------------------------------------
# 4. Refusals are evidence: the job learns at once whom they are about
# ---------------------------------------------------------------------------------------------

async def test_refused_frame_from_a_member_ends_its_wait_at_once_naming_it(tmp_path: Path) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        registry.on_message(ALICE, "w-1", proposal(ALICE, "w-1", "waits", members=(BOB,)))
        await settle()
        registry.on_message(ALICE, "w-1", start("w-1", ALICE, BOB, ME))
        await settle()
        registry.on_refused(ALICE, "w-1", "schema")
        registry.on_refused(ALICE, "no-such-job", "schema")      # ignored
        async with asyncio.timeout(runner.ABORT_GRACE_MS / 1000 + 1):
            await registry.jobs["w-1"].task
    record = registry.jobs["w-1"]
    assert record.state == "failed" and record.error.startswith("alice: ") and "schema" in record.error


async def test_a_refused_proposal_is_a_reject_naming_the_refuser(tmp_path: Path) -> None:
    from fedpeer.runtime.channel import PeerRefused
    transport = FakeTransport(fail_with=PeerRefused(ALICE, "job_limit"))
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        job_id = registry.propose("noop", {}, ["alice"])
        async with asyncio.timeout(runner.ABORT_GRACE_MS / 1000 + 1):
            await registry.jobs[job_id].task
    error = registry.show(job_id)["error"]
    assert error.startswith("alice: refused the proposal") and "job_limit" in error


async def test_a_start_that_cannot_be_delivered_fails_the_job_at_once_naming_the_member(tmp_path: Path) -> None:
    """The proposer begins its own part while the starts travel; a start that cannot be delivered
    still ends the job at once, naming that member, and stops the proposer's own part (here it
    waits 60 s for a message from that member)."""
    from fedpeer.runtime.channel import PeerUnreachable
    transport = FakeTransport()
    sent = transport.send

    async def send(dst: bytes, msg: object, job_id: str, timeout_ms: int) -> None:
        if isinstance(msg, m.JobStart) and dst == ALICE:
            await asyncio.sleep(0.05)                 # the proposer's own part is running by then
            raise PeerUnreachable(ALICE, "connection refused")
        await sent(dst, msg, job_id, timeout_ms)

    transport.send = send        # type: ignore[method-assign]
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        job_id = registry.propose("waits", {}, ["alice", "bob"])
        await settle()
        for peer in (ALICE, BOB):
            registry.on_message(peer, job_id, m.JobAccept(job_id=job_id, fingerprint=b"", features=[]))
        await settle()
        assert registry.show(job_id)["state"] == "running", "the proposer runs before every start is delivered"
        async with asyncio.timeout(runner.ABORT_GRACE_MS / 1000 + 2):
            await registry.jobs[job_id].task
    shown = registry.show(job_id)
    assert shown["state"] == "failed" and shown["error"].startswith("alice: unreachable when the job was to start")
    assert {dst for dst, msg in transport.sent if isinstance(msg, m.JobStart)} == {BOB}, "alice's start failed"


# ---------------------------------------------------------------------------------------------
# 5. Job ids
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("job_id", ["abc\n", "abc\n\n", "-abc", "ABC", "a/b", ""])
async def test_malformed_job_ids_are_refused(tmp_path: Path, job_id: str) -> None:
    with pytest.raises(RemoteProtocolError):
        m.JOB_ID(job_id, "job_id")
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        with pytest.raises(RemoteProtocolError):
            registry.on_message(ALICE, job_id, proposal(ALICE, job_id))
    assert registry.jobs == {} and transport.sent == []



# ---------------------------------------------------------------------------------------------
# 6. Membership: a member declared dead ends every wait on it at once (issue 12 item 3)
# ---------------------------------------------------------------------------------------------

async def running_job(registry: JobRegistry, job_id: str, kind: str) -> reg.JobRecord:
    registry.on_message(ALICE, job_id, proposal(ALICE, job_id, kind, members=(BOB,)))
    await settle()
    registry.on_message(ALICE, job_id, start(job_id, ALICE, BOB, ME))
    await settle()
    return registry.jobs[job_id]


@pytest.mark.looptime
async def test_a_receive_from_a_member_declared_dead_ends_at_once_and_show_said_what_it_waited_for(
        tmp_path: Path) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        record = await running_job(registry, "d-1", "waits")
        await asyncio.sleep(12.4)
        assert registry.show("d-1")["waiting_for"] == ["DiagProbe from alice since 12.4 s"]
        started = asyncio.get_running_loop().time()
        registry.on_peer_state(ALICE, "suspect")            # a suspicion is no verdict
        await settle()
        assert record.state == "running"
        registry.on_peer_state(ALICE, "dead")
        await record.task
        ended = asyncio.get_running_loop().time() - started
    assert record.state == "failed" and record.error == "alice: declared dead by membership", record.error
    assert ended <= runner.ABORT_GRACE_MS / 1000 + 0.1, "the 60 s receive must end when alice is declared dead"
    assert "waiting_for" not in registry.show("d-1")


@pytest.mark.looptime
async def test_a_send_to_a_member_declared_dead_ends_at_once(tmp_path: Path) -> None:
    transport = FakeTransport(hang_s=600.0)               # alice never acknowledges
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path, hop_timeout_ms=600_000), transport, NAMES, KINDS,
                               tg.create_task)
        record = await running_job(registry, "d-2", "sends")
        await asyncio.sleep(3)
        started = asyncio.get_running_loop().time()
        registry.on_peer_state(ALICE, "dead")
        await record.task
        ended = asyncio.get_running_loop().time() - started
    assert record.state == "failed" and "declared dead by membership" in record.error, record.error
    assert ended <= runner.ABORT_GRACE_MS / 1000 + 0.1
    assert not registry.deaths._watches.get(ALICE), "no death watch is left behind"


@pytest.mark.looptime
async def test_a_proposer_declared_dead_before_the_start_ends_the_members_wait(tmp_path: Path) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path, job_start_timeout_ms=600_000), transport, NAMES, KINDS,
                               tg.create_task)
        registry.on_message(ALICE, "d-3", proposal(ALICE, "d-3", members=(BOB,)))
        await settle()
        registry.on_peer_state(ALICE, "dead")
        async with asyncio.timeout(runner.ABORT_GRACE_MS / 1000 + 1):
            await registry.jobs["d-3"].task
    assert registry.show("d-3")["error"] == "alice: declared dead by membership before starting the job"


# ---------------------------------------------------------------------------------------------
# 7. Cancel and interrupted jobs (issue 12: cancelled here, failed elsewhere; phase `starting`)
# ---------------------------------------------------------------------------------------------

async def test_a_cancel_is_cancelled_on_every_member(tmp_path: Path) -> None:
    transport = FakeTransport()
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        record = await running_job(registry, "c-1", "waits")
        # alice's operator cancels: we hear it, and end `cancelled`, naming alice
        registry.on_message(ALICE, "c-1", m.JobCancel(job_id="c-1", reason="cancelled by the operator"))
        await settle()
        assert record.state == "cancelled" and record.error == "alice: cancelled by the operator"
        # our own operator cancels another job: every other member hears a cancel, not an abort
        other = await running_job(registry, "c-2", "waits")
        registry.cancel("c-2")
        await settle()
    assert other.state == "cancelled"
    cancels = [(dst, msg.job_id) for dst, msg in sent_of(transport, m.JobCancel)]
    assert sorted(cancels) == sorted([(ALICE, "c-2"), (BOB, "c-2")])
    assert not [a for _, a in sent_of(transport, m.JobAbort) if a.job_id in ("c-1", "c-2")]


async def test_a_restarted_site_says_which_phase_its_interrupted_job_was_in(tmp_path: Path) -> None:
    transport = FakeTransport(hang_s=600.0)
    async with asyncio.TaskGroup() as tg:
        registry = JobRegistry(make_config(tmp_path), transport, NAMES, KINDS, tg.create_task)
        record = await running_job(registry, "k-1", "sends")
        assert record.phase == "sending to alice"
        # kill -9: nothing of the registry runs any more; only what is on disk remains
        on_disk = (tmp_path / "state" / "jobs" / "k-1" / "job.json").read_text()
        record.task.cancel()
    assert '"phase": "sending to alice"' in on_disk
    import shutil
    shutil.rmtree(tmp_path / "state2", ignore_errors=True)
    shutil.copytree(tmp_path / "state", tmp_path / "state2")
    (tmp_path / "state2" / "jobs" / "k-1" / "job.json").write_text(on_disk)
    config = make_config(tmp_path)
    config = Config(path=config.path, node=NodeSectionAt(config.node, tmp_path / "state2"), peers=(),
                    policy=config.policy, jobs=config.jobs)
    restarted = JobRegistry(config, FakeTransport(), NAMES, KINDS, lambda coro: coro.close())
    shown = restarted.show("k-1")
    assert shown["state"] == "failed" and shown["phase"] == "sending to alice"
    # one line: where it stopped, and why it does not come back (this kind takes nobody back)
    assert shown["error"] == (f"{config.node.name}: the daemon restarted at phase 'sending to alice', step 1 of 2; "
                              "it does not rejoin: a sends job does not take a restarted member back"), shown["error"]


def NodeSectionAt(node: NodeSection, state_dir: Path) -> NodeSection:
    from dataclasses import replace
    return replace(node, state_dir=state_dir)


def test_job_show_prints_what_a_running_job_waits_for() -> None:
    from fedpeer.app.cli import format_job
    record = {"id": "j-1", "kind": "bofrf", "state": "running", "proposer": "alice",
              "members": [{"name": "alice"}, {"name": "site-me"}], "phase": "exchanging forests",
              "progress": {"step": 2, "total": 5}, "params": {}, "elapsed_s": 20.0, "rows": 10,
              "error": None, "result": None, "waiting_for": ["forest from site-3 since 12.4 s"]}
    assert "  waiting for forest from site-3 since 12.4 s" in format_job(record).splitlines()
