"""This site as a member of a peer's job (docs/design.md, a job's walk): a proposal passes the gate and policy
(fedpeer/jobs/lifecycle/admission.py), then the site's data is checked and it accepts or declines; it waits
for the proposer's start, and hears the other members' aborts and cancels.

Rules:
- A member that refuses a proposal tells only the proposer (one JobReject); the proposer, who
  announced the job, tells the others, who may not even be known here.
- A peer's proposal is written to disk only once it runs: refused or never-started ones live in
  a small in-memory list (the registry's `unstored`).
- An accepted proposal waits at most job_start_timeout_ms for its start, and no longer than
  membership takes to declare its proposer dead.
- The first end a job hears wins: a member's abort ends it `failed` with the site and reason it
  names (none for a secure sum's implausible total), another operator's cancel ends it `cancelled`.
- A member still running a job that is done here may ask for what it missed, at a bounded rate.
"""

from __future__ import annotations

import asyncio
import logging

from fedpeer.base.logs import fields
from fedpeer.errors import DataError, FedpeerError, JobError, RemoteProtocolError, public_reason
from fedpeer.identity import fingerprint
from fedpeer.jobs import messages as m
from fedpeer.jobs.kind import Finished, JobKind
from fedpeer.jobs.lifecycle.runner import NO_SITE, Refused, SiteFailure
from fedpeer.jobs.messages import JOB_ID_RE
from fedpeer.jobs.records import TERMINAL, JobRecord, advance
from fedpeer.runtime.channel import PeerUnreachable
from fedpeer.jobs.lifecycle.host import Host


log = logging.getLogger("fedpeer.jobs")
SERVE_DONE_INTERVAL_MS = 5_000  # a member may have a done job's answer this often (it reads and sends a model)
SERVED_REMEMBERED_MAX = 1_024   # (job, member) pairs whose last answer time is kept


class MemberSide:
    """Peers' proposals to this site, and the lifecycle messages of jobs under way or done."""

    def __init__(self, registry: Host) -> None:
        self._registry = registry
        self._served: dict[tuple[str, bytes], int] = {}                # (job, member) -> last served_ms

    def on_propose(self, src: bytes, msg: m.JobPropose) -> None:
        registry = self._registry
        if msg.job_id in registry.jobs or msg.job_id in registry.unstored or not JOB_ID_RE.fullmatch(msg.job_id):
            raise RemoteProtocolError("unknown_job", f"job id {msg.job_id!r} reused or malformed")
        members = tuple(msg.members)
        if src not in members or registry.transport.me not in members or tuple(sorted(set(members))) != members:
            raise RemoteProtocolError("schema", "proposal members must be sorted, distinct, include proposer and me")
        registry.admission.take_proposal_budget(src)
        # created_ms is when we heard of it: a member's clock must not order (or crowd) our job list
        record = JobRecord(id=msg.job_id, kind=msg.kind, params=dict(msg.params), proposer=src,
                           members=members, created_ms=registry.transport.now_ms(), announced=True, stored=False)
        refusal = registry.admission.policy_refusal(record)
        if refusal is not None:
            self._refuse(record, refusal)
            return
        registry.jobs[record.id] = record
        try:
            record.task = registry.spawn(registry.runner.guard(record, self._answer_proposal(record)))
        except JobError as exc:   # the daemon is stopping
            registry.finish(record, "failed", f"{registry.config.node.name}: {exc}")

    def _refuse(self, record: JobRecord, reason: str) -> None:
        """Decline a peer's proposal at once: see `decline`; the JobReject goes out in its own task."""
        reject = self.decline(record, reason)
        try:
            self._registry.spawn(self._registry.runner.send_quietly(record.proposer, reject, record.id))
        except JobError:
            pass   # the daemon is stopping: the proposer's wait times out

    def decline(self, record: JobRecord, reason: str, shared: str | None = None) -> m.JobReject:
        """End a peer's proposal we will not run. Its proposer (who announced it) tells the other
        members; we send one JobReject to it and nothing to anyone else, who may not even be known
        here. The record lives in memory only and keeps `reason`; the proposer hears `shared`
        (default: the reason), which holds nothing private of this site's data."""
        registry = self._registry
        registry.finish(record, "failed", f"{registry.config.node.name}: {reason}")
        log.info("job_refused", extra=fields(job=record.id, proposer=registry.names.get(record.proposer, "?"),
                                             reason=reason))
        return m.JobReject(job_id=record.id, reason=reason if shared is None else shared)

    async def _answer_proposal(self, record: JobRecord) -> None:
        registry = self._registry
        kind = registry.kinds[record.kind]    # policy_refusal checked it
        try:
            fp, features = await registry.admission.check_data(record, kind)
        except (JobError, DataError) as exc:
            raise Refused(str(exc), public_reason(exc)) from None
        advance(record, "accepted")
        record.phase = "waiting for the start"
        record.start_signal = asyncio.get_running_loop().create_future()   # before the accept: a fast start
        accept = m.JobAccept(job_id=record.id, fingerprint=fp, features=list(features))
        try:
            await registry.transport.send(record.proposer, accept, record.id,
                                          registry.config.jobs.job_accept_timeout_ms)
        except PeerUnreachable as exc:
            raise SiteFailure(record.proposer, f"unreachable when accepting: {exc}") from None
        timeout_s = registry.config.jobs.job_start_timeout_ms / 1000
        try:
            await asyncio.wait_for(asyncio.shield(record.start_signal), timeout_s)
        except TimeoutError:
            raise SiteFailure(record.proposer,
                              f"accepted, but the job was not started within {timeout_s:.0f} s") from None
        await registry.runner.execute(record, kind)

    def on_start(self, src: bytes, msg: m.JobStart) -> None:
        record = self._registry.jobs.get(msg.job_id)
        if (record is None or src != record.proposer or record.state != "accepted" or record.start_signal is None
                or record.start_signal.done() or tuple(msg.members) != record.members):
            raise RemoteProtocolError("unknown_job", f"start of job {msg.job_id!r} not expected")
        record.start_signal.set_result(None)

    def on_abort(self, src: bytes, msg: m.JobAbort) -> None:
        """A member ended a job we share: the error names the site its abort blames, none for an
        abort about no site (a secure sum's implausible total: every member saw it), else the
        member that sent it."""
        registry = self._registry
        if msg.site == NO_SITE:
            self._end(src, msg.job_id, "abort", "failed", msg.reason, about_none=True)
            return
        about = registry.names.get(msg.site, fingerprint(msg.site)) if len(msg.site) == 32 else None
        self._end(src, msg.job_id, "abort", "failed", msg.reason, about)

    def on_cancel(self, src: bytes, msg: m.JobCancel) -> None:
        """Another member's operator cancelled the job: it ends `cancelled` here too."""
        self._end(src, msg.job_id, "cancel", "cancelled", msg.reason)

    def _end(self, src: bytes, job_id: str, what: str, state: str, reason: str, about: str | None = None,
             about_none: bool = False) -> None:
        """A member ends a job we share (`what`: abort or cancel): it ends in `state` here, the
        error naming `about` (the site the member blames), no site (`about_none`) or the member; a
        job already ended stays."""
        registry = self._registry
        record = registry.find(job_id)
        if record is None or src not in record.members:
            raise RemoteProtocolError("unknown_job", f"{what} of unknown job {job_id!r}")
        if record.state in TERMINAL:
            return
        registry.finish(record, state, reason if about_none else f"{about or registry.names[src]}: {reason}")
        if record.task is not None:
            record.task.cancel()

    def serve_done(self, record: JobRecord, src: bytes, msg: object) -> bool:
        """A member still running a job that is done here (it was cut off when it ended) may ask
        its kind for what it missed. At most once per SERVE_DONE_INTERVAL_MS per member and job:
        the answer may read a model file. Whether the message was taken."""
        registry = self._registry
        kind = registry.kinds.get(record.kind)
        if kind is None or kind.serve_done is None or not isinstance(msg, kind.serve_done_kinds):
            return False
        now = registry.transport.now_ms()
        last = self._served.get((record.id, src))
        if last is not None and now - last < SERVE_DONE_INTERVAL_MS:
            return True      # taken, not answered: it asks again later
        self._served[(record.id, src)] = now
        while len(self._served) > SERVED_REMEMBERED_MAX:
            self._served.pop(next(iter(self._served)))
        finished = Finished(me=registry.transport.me, members=record.members, workdir=registry.root / record.id,
                            leadership=registry.transport.leadership())
        try:
            registry.spawn(self._answer_done(kind, finished, src, msg, record.id))
        except JobError:
            pass     # the daemon is stopping
        return True

    async def _answer_done(self, kind: JobKind, finished: Finished, src: bytes, msg: object, job_id: str) -> None:
        registry = self._registry
        try:
            answer = await asyncio.to_thread(kind.serve_done, finished, src, msg)
        except (OSError, FedpeerError, ValueError) as exc:   # files gone or unreadable: nothing to offer
            log.info("job_not_served", extra=fields(job=job_id, peer=registry.names.get(src, "?"), error=str(exc)))
            return
        if answer is not None:
            await registry.runner.send_quietly(src, answer, job_id)
