"""Job lifecycle (docs/design.md, a job's walk): propose -> every member checks policy and data -> accept/reject ->
start with equal schema fingerprints, or abort with a reason naming the site -> each member runs
the kind's coroutine over its Channel -> each member persists its own record and result.

`JobRegistry` is this site's jobs: their records, and the entry points the node calls. It
composes the parts of the lifecycle, each in its module:
- admission.py: whether this site takes part (proposal budgets, policy, parameters, its data);
- proposer.py: our proposals, from the proposal to the start;
- member.py: peers' proposals, their start, and the other members' aborts and cancels;
- runner.py: running a started job, supervising every job task, telling others how it ended;
- nodechannel.py: the node's transport, a job's Channel over it, and the death watch on sends;
- rejoin.py: a job interrupted by this daemon's restart, and its requests to come back into it;
- records.py: the job records and their files.

Rules:
- Every wait is bounded ([jobs] limits): no answer, no start, a job running too long: failed.
- Records live in state/jobs/<id>/job.json, written atomically at every state change, and a
  running job's progress at most once a second; a running job found at start-up (the daemon
  died mid-job), or stopped with the daemon, is "interrupted" at the phase and step it reached,
  and comes back into the job if the others take it back (rejoin.py), else fails saying why. A write that fails
  (disk full, EIO, EMFILE) leaves the record in memory and is retried at its next change; while
  the state dir takes no writes, new proposals (ours and peers') are refused with its reason.
- Rows never leave the site: the registry only ever sends fingerprints and column names.
- Membership is heard, not polled: the node reports every peer state change (`on_peer_state`).
  A member declared dead ends every wait on it at once — its jobs' receives from it (PeerDead),
  their sends to it (PeerUnreachable), an answer it owes our proposal, the start a member waits
  for from it as proposer — instead of each waiting out its own timeout.
- An operator's cancel ends the job `cancelled` on every member (JobCancel), not `failed`.
- `show` says what a running job waits for, and since when.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from fedpeer.base.logs import fields
from fedpeer.config.load import Config
from fedpeer.errors import JobError, RemoteProtocolError
from fedpeer.jobs import messages as m
from fedpeer.jobs.kind import JobKind
from fedpeer.jobs.lifecycle.admission import Admission, release_data
from fedpeer.jobs.lifecycle.member import MemberSide
from fedpeer.jobs.lifecycle.host import Transport
from fedpeer.jobs.lifecycle.nodechannel import DEAD_DETAIL, DeathWatch
from fedpeer.jobs.lifecycle.proposer import ProposerSide
from fedpeer.jobs.lifecycle.rejoin import RejoinSide
from fedpeer.jobs.lifecycle.runner import JobRunner, SiteFailure
from fedpeer.jobs.privacy import PrivacyLedger
from fedpeer.jobs.records import PENDING, TERMINAL, JobRecord, RecordFiles, advance, stopped_at

log = logging.getLogger("fedpeer.jobs")
RECORDS_LISTED_MAX = 200
UNSTORED_RECORDS_MAX = 64       # refused / never-started peer proposals kept in memory (oldest out)


class JobRegistry:
    """This site's jobs, their records, and the entry points the node and the admin API call."""

    def __init__(self, config: Config, transport: Transport, names: Mapping[bytes, str],
                 kinds: Mapping[str, JobKind], spawn: Callable[[Any], asyncio.Task], *,
                 state: Any = None) -> None:
        self.config = config
        self.transport = transport
        self.names = names                     # every member key, me included -> local name
        self.kinds = kinds
        self.spawn = spawn
        self.state = state                     # fedpeer.base.store.StateDir (write_record, health), or None
        self.root = config.node.state_dir / "jobs"
        self.jobs: dict[str, JobRecord] = {}
        self.unstored: OrderedDict[str, JobRecord] = OrderedDict()   # peers' proposals that never ran
        self.deaths = DeathWatch()
        # what DP jobs released of each dataset here (fedpeer/jobs/privacy.py); a ledger that lies stops the start
        self.privacy = PrivacyLedger(config.node.state_dir, config.privacy.epsilon_budget,
                                     config.privacy.delta_budget)
        self.admission = Admission(self)
        self.as_proposer = ProposerSide(self)
        self.as_member = MemberSide(self)
        self.runner = JobRunner(self)
        self.rejoins = RejoinSide(self)
        # what each member runs (fedpeer/jobs/versions.py), set by the node; None: every member
        # is taken to run all this site's kinds
        self.versions: Any = None
        self.records = RecordFiles(self.root, state, names, transport.now_ms, spawn, config.node.state_dir)
        # told of every job that ran here once it ends (the node's tracker: fedpeer/daemon/tracking.py)
        self.on_end: Callable[[JobRecord], None] | None = None
        for record in self.records.load():
            self.jobs[record.id] = record
        self.rejoins.settle_loaded()

    # -- membership ----------------------------------------------------------------------------

    def on_peer_state(self, peer: bytes, state: str) -> None:
        """The node's membership changed `peer`'s state ("alive", "suspect", "dead", ...). Only a
        declaration of death ends waits (a suspicion is often refuted); "alive" undoes it."""
        if state == "dead" and self.deaths.declare_dead(peer):
            for record in self.all_records():
                if peer in record.members and record.state not in TERMINAL:
                    self._member_died(record, peer)
        elif state == "alive":
            if self.deaths.declare_alive(peer):
                for record in self.all_records():
                    record.mailbox.member_alive(peer)
            self.rejoins.on_peer_alive(peer)      # heard after our restart: ask to come back into its jobs

    def _member_died(self, record: JobRecord, peer: bytes) -> None:
        record.mailbox.member_dead(peer)
        # a proposal it has not answered, or a start we wait for from it as proposer
        self.as_proposer.answer(record.id, peer,
                                m.JobReject(job_id=record.id, reason=f"{DEAD_DETAIL} before answering"))
        signal = record.start_signal
        if peer == record.proposer and signal is not None and not signal.done():
            signal.set_exception(SiteFailure(peer, f"{DEAD_DETAIL} before starting the job"))

    def retry_unsaved(self) -> int:
        """Write again the records whose last write failed (the node's tick calls it): how many
        are still unsaved."""
        return self.records.retry_unsaved()

    # -- queries -----------------------------------------------------------------------------

    def all_records(self) -> list[JobRecord]:
        return [*self.jobs.values(), *self.unstored.values()]

    def find(self, job_id: str) -> JobRecord | None:
        return self.jobs.get(job_id) or self.unstored.get(job_id)

    def list(self) -> list[dict]:
        records = sorted(self.all_records(), key=lambda r: r.created_ms, reverse=True)[:RECORDS_LISTED_MAX]
        return [{k: v for k, v in self._doc(r).items() if k not in ("result", "params")} for r in records]

    def show(self, job_id: str) -> dict:
        record = self.find(job_id)
        if record is None:
            raise JobError(f"no job {job_id!r} on this site")
        return self._doc(record)

    def _doc(self, record: JobRecord) -> dict:
        """A record as the admin API shows it, with what this site's privacy ledger charges the job
        (`privacy_spent`: {epsilon, delta}, or None for a job without DP or refused before its start)."""
        return {**record.to_json(self.names, self.transport.now_ms()),
                "privacy_spent": self.privacy.charged(record.data_fingerprint or "", record.id)}

    def running(self) -> int:
        """Jobs holding a [jobs] jobs_concurrent_max slot: running ones only, not pending proposals."""
        return sum(r.state == "running" for r in self.jobs.values())

    def pending_of(self, proposer: bytes) -> int:
        return sum(r.state in PENDING and r.proposer == proposer for r in self.jobs.values())

    # -- the node's and the operator's entry points ------------------------------------------

    def propose(self, kind_name: str, params: Mapping[str, Any], member_names: list[str] | None = None) -> str:
        return self.as_proposer.propose(kind_name, params, member_names)

    async def propose_when_known(self, kind_name: str, params: Mapping[str, Any],
                                 member_names: list[str] | None = None) -> str:
        """`propose`, once each member has said what it runs (bounded: proposer.PEER_INFO_WAIT_MS)."""
        return await self.as_proposer.propose_when_known(kind_name, params, member_names)

    def on_message(self, src: bytes, job_id: str, msg: object) -> None:
        """Entry point for every job-related message that passed the wire gate."""
        if isinstance(msg, m.LIFECYCLE) and msg.job_id != job_id:  # type: ignore[union-attr]
            raise RemoteProtocolError("schema", "job id in body and envelope differ")
        if isinstance(msg, m.JobPropose):
            self.as_member.on_propose(src, msg)
        elif isinstance(msg, (m.JobAccept, m.JobReject)):
            if not self.as_proposer.answer(job_id, src, msg):
                raise RemoteProtocolError("unknown_job", f"unexpected answer for job {job_id}")
        elif isinstance(msg, m.JobStart):
            self.as_member.on_start(src, msg)
        elif isinstance(msg, m.JobAbort):
            self.as_member.on_abort(src, msg)
        elif isinstance(msg, m.JobCancel):
            self.as_member.on_cancel(src, msg)
        else:
            record = self.jobs.get(job_id)
            if record is not None and src in record.members and record.state == "done" \
                    and self.as_member.serve_done(record, src, msg):
                return
            if record is None or src not in record.members or record.state in TERMINAL \
                    or record.state == "interrupted":     # (not yet asking to come back: the others lose it)
                raise RemoteProtocolError("unknown_job", f"no running job {job_id!r} with that member")
            record.mailbox.put(src, msg)

    def on_refused(self, src: bytes, job_id: str, reason: str) -> None:
        """The gate refused a frame an authenticated member sent for `job_id`: whatever that job
        waits for from `src` will not come. Its receives from `src` fail at once (MalformedFrom),
        and an answer it owed to our proposal counts as a refusal naming it. Unknown job: ignored."""
        record = self.jobs.get(job_id)
        if record is None or src not in record.members or record.state in TERMINAL:
            return
        self.as_proposer.answer(job_id, src, m.JobReject(job_id=job_id, reason=f"sent a malformed answer ({reason})"))
        record.mailbox.refuse(src, reason)

    def reconfigure(self, config: Config, names: Mapping[bytes, str]) -> list[str]:
        """A reloaded peers.toml: proposals, policy checks and data loads use `config` from now on
        (a running job keeps the parameters and data it started with). Every job a removed member
        takes part in ends now, `failed`, naming the removal, and its other members are told.
        Returns the ids of the jobs it ended."""
        removed = {k: self.names[k] for k in self.names if k not in names}
        self.config, self.names = config, names
        ended = []
        for record in [r for r in self.all_records() if r.state not in TERMINAL]:
            gone = [k for k in record.members if k in removed]
            if not gone:
                continue
            reason = f"removed from {config.node.name}'s peers.toml"
            self.finish(record, "failed", f"{removed[gone[0]]}: {reason}")
            if record.task is not None:
                record.task.cancel()
            if record.announced:   # send_quietly never addresses the removed key
                with contextlib.suppress(JobError):   # the daemon is stopping: their waits time out
                    self.spawn(self.runner.broadcast_abort(record, gone[0], reason))
            ended.append(record.id)
        return ended

    def cancel(self, job_id: str) -> dict:
        record = self.find(job_id)
        if record is None:
            raise JobError(f"no job {job_id!r} on this site")
        if record.state in TERMINAL:
            raise JobError(f"job {job_id} already {record.state}")
        self.finish(record, "cancelled", f"{self.config.node.name}: cancelled by the operator")
        if record.task is not None:
            record.task.cancel()
        if record.announced:
            self.spawn(self.runner.broadcast_cancel(record, "cancelled by the operator"))
        return record.to_json(self.names, self.transport.now_ms())

    # -- ending a record ---------------------------------------------------------------------

    def interrupt(self, record: JobRecord) -> None:
        """The daemon stops while the job runs here: the record says where it stopped (rejoin.py)."""
        advance(record, "interrupted")
        record.error = f"the daemon stopped at {stopped_at(record)}"
        self.records.forget_progress(record.id)
        release_data(record.data)
        record.data = record.test_data = None
        self.records.save(record)
        log.info("job_interrupted", extra=fields(job=record.id, kind=record.kind, error=record.error))

    def finish(self, record: JobRecord, state: str, error: str | None, result: dict | None = None) -> None:
        """End the record (first end wins); never raises."""
        if record.state in TERMINAL:
            return
        self.records.forget_progress(record.id)
        interrupted = record.state == "interrupted"
        advance(record, state)
        record.error, record.result = error, result
        if not interrupted:          # an interrupted job's phase is where it stopped: kept
            record.phase = state
        record.finished_ms = self.transport.now_ms()
        release_data(record.data)
        record.data = record.test_data = None
        self.records.save(record)
        if not record.stored:    # a peer's proposal that never ran: memory only, oldest out
            self.jobs.pop(record.id, None)
            self.unstored[record.id] = record
            while len(self.unstored) > UNSTORED_RECORDS_MAX:
                self.unstored.popitem(last=False)
        log.info("job_" + state, extra=fields(job=record.id, kind=record.kind, error=error or "-"))
        if self.on_end is not None and record.started_ms is not None:
            try:
                self.on_end(record)
            except Exception as exc:   # noqa: BLE001  (what hears of an end never fails the job)
                log.warning("job_end_hook_failed", extra=fields(job=record.id, error=f"{type(exc).__name__}: {exc}"))
