"""Job lifecycle (DESIGN §4): propose -> every member checks policy and data -> accept/reject ->
start with equal schema fingerprints, or abort with a reason naming the site -> each member runs
the kind's coroutine over its Channel -> each member persists its own record and result.

Rules:
- A job starts only when every member accepted with the same schema fingerprint; otherwise every
  member's record ends `failed` with the reason and the site it is about.
- Every wait is bounded ([jobs] limits): no answer, no start, a job running too long: failed.
- A member whose job fails tells the other members (JobAbort), so nobody waits for it in vain;
  the first reason a member hears is the one it keeps. A member that refuses a proposal tells only
  the proposer (one JobReject); the proposer, who announced the job, tells the others.
- Records live in state/jobs/<id>/job.json, written atomically at every state change; a record
  found non-terminal at start-up (the daemon died mid-job) is marked failed. A write that fails
  (disk full, EIO, EMFILE) leaves the record in memory and is retried at its next change; while
  the state dir takes no writes, new proposals (ours and peers') are refused with its reason.
- Supervision: every job task runs under `_guard`, and nothing in it — its error handling
  included — propagates to the node's task group: a failure ends that job only.
- A member's key buys it bounded load here: a proposal rate (token bucket) and a number of
  pending proposals per proposer; beyond them, proposals are refused at the gate (no record, no
  task, no send). Only running jobs hold `jobs_concurrent_max` slots. A peer's proposal is written
  to disk only once it runs: refused or never-started ones live in a small in-memory list.
- We never send to a key that is not in peers.toml: a proposal naming one is refused, naming it.
- Rows never leave the site: the registry only ever sends fingerprints and column names.
- Membership is heard, not polled: the node reports every peer state change (`on_peer_state`).
  A member declared dead ends every wait on it at once — its jobs' receives from it (PeerDead),
  their sends to it (PeerUnreachable), an answer it owes our proposal, the start a member waits
  for from it as proposer — instead of each waiting out its own timeout.
- An operator's cancel ends the job `cancelled` on every member (JobCancel), not `failed`.
- A running job's phase is written when it changes, so a site restarted after a crash says
  which phase its interrupted job was in. `show` says what a running job waits for, and since when.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..config import Config
from ..errors import DataError, FedpeerError, JobError, RemoteProtocolError
from ..identity import fingerprint
from ..logs import fields
from ..net.channel import MalformedFrom, PeerDead, PeerRefused, PeerUnreachable, RecvTimeout
from . import messages as m
from .base import Finished, JobContext, JobFailsEverywhere, JobKind
from .messages import JOB_ID_RE
from .records import TERMINAL, JobRecord, RecordFiles

log = logging.getLogger("fedpeer.jobs")
PENDING = ("proposed", "accepted")      # known, not yet running: holds no jobs_concurrent_max slot
ABORT_SEND_TIMEOUT_MS = 5_000
ABORT_GRACE_MS = 1_000          # a local failure waits this long for a peer's abort with the cause
RECORDS_LISTED_MAX = 200
SERVE_DONE_INTERVAL_MS = 5_000  # a member may have a done job's answer this often (it reads and sends a model)
SERVED_REMEMBERED_MAX = 1_024   # (job, member) pairs whose last answer time is kept
DEAD_DETAIL = "declared dead by membership"
# Insider load (issue 11 item 4): a member's key must not fill our disk, memory or job slots.
PROPOSALS_BURST_MAX = 8         # proposals one member may send at once (token bucket size) ...
PROPOSAL_REFILL_MS = 2_000      # ... then one more per this interval: honest sites propose by hand
PENDING_PER_PROPOSER_MAX = 4    # proposed or accepted, not yet running, per proposing member
NOT_LISTED = "not in this site's peers.toml"   # a refusal's words the proposer maps to its own names
UNSTORED_RECORDS_MAX = 64       # refused / never-started peer proposals kept in memory (oldest out)


class Transport(Protocol):
    """What the registry and job channels need from the node."""

    me: bytes

    def now_ms(self) -> int: ...
    def alive(self, peer: bytes) -> bool: ...
    def leadership(self) -> tuple[int, bytes | None]: ...    # (term, leader) of the federation's election
    def pairwise_seed(self, peer: bytes, label: bytes) -> bytes: ...
    async def send(self, dst: bytes, msg: object, job_id: str, timeout_ms: int) -> None: ...
    # delivered within timeout_ms (retries included) or raises PeerUnreachable (PeerRefused when
    # the peer proved it refused the message); the registry never passes a dst not in `names`




class NodeChannel:
    """The Channel (fedpeer/net/channel.py) of one job member, over the daemon's transport."""

    def __init__(self, registry: JobRegistry, record: JobRecord) -> None:
        self._registry, self._record = registry, record
        self.me = registry.transport.me
        self.members = record.members
        self.job_id = record.id
        self.metrics = getattr(registry.transport, "metrics", None)   # fedpeer/metrics.py observe_*

    def now_ms(self) -> int:
        return self._registry.transport.now_ms()

    def random_bytes(self, n: int) -> bytes:
        return os.urandom(n)

    def pairwise_seed(self, peer: bytes, label: bytes) -> bytes:
        return self._registry.transport.pairwise_seed(peer, label)

    def alive(self, peer: bytes) -> bool:
        return peer == self.me or self._registry.transport.alive(peer)

    def leadership(self) -> tuple[int, bytes | None]:
        return self._registry.transport.leadership()

    async def sleep_ms(self, ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    def progress(self, phase: str, step: int, total: int) -> None:
        record = self._record
        changed = phase != record.phase
        record.phase, record.step, record.total = phase, step, total
        if changed and record.state == "running":   # on disk: a crash leaves the phase it was in
            self._registry.records.save(record)

    async def send(self, dst: bytes, msg: object) -> None:
        assert dst in self.members and dst != self.me, "send to a non-member or to self"
        sending = self._registry.transport.send(dst, msg, self.job_id, self._registry.config.jobs.hop_timeout_ms)
        await self._registry.unless_dead(dst, sending)

    async def recv(self, kind: type, tag: str, src: bytes | None = None, timeout_ms: int = 30_000) -> tuple[bytes, Any]:
        return await self._record.mailbox.get(kind, tag, src, timeout_ms)

    def discard(self, tag_prefix: str) -> None:
        self._record.mailbox.discard(tag_prefix)


class JobRegistry:
    def __init__(self, config: Config, transport: Transport, names: Mapping[bytes, str],
                 kinds: Mapping[str, JobKind], spawn: Callable[[Any], asyncio.Task], *,
                 state: Any = None) -> None:
        self.config = config
        self.transport = transport
        self.names = names                     # every member key, me included -> local name
        self.kinds = kinds
        self._spawn = spawn
        self.state = state                     # fedpeer.store.StateDir (write_record, health), or None
        self._root = config.node.state_dir / "jobs"
        self.jobs: dict[str, JobRecord] = {}
        self.unstored: OrderedDict[str, JobRecord] = OrderedDict()   # peers' proposals that never ran
        self._buckets: dict[bytes, tuple[float, int]] = {}             # proposer -> (tokens, at_ms)
        self._replies: dict[tuple[str, bytes], asyncio.Future] = {}
        self.dead: set[bytes] = set()                                  # peers membership declared dead
        self._deaths: dict[bytes, set[asyncio.Future]] = {}            # peer -> sends to it in flight
        self._served: dict[tuple[str, bytes], int] = {}                # (job, member) -> last served_ms
        self.records = RecordFiles(self._root, state, names, transport.now_ms, spawn, config.node.state_dir)
        for record in self.records.load():
            self.jobs[record.id] = record

    # -- membership ----------------------------------------------------------------------------

    def on_peer_state(self, peer: bytes, state: str) -> None:
        """The node's membership changed `peer`'s state ("alive", "suspect", "dead", ...). Only a
        declaration of death ends waits (a suspicion is often refuted); "alive" undoes it."""
        if state == "dead" and peer not in self.dead:
            self.dead.add(peer)
            for death in self._deaths.pop(peer, set()):
                if not death.done():
                    death.set_result(None)
            for record in self._all():
                if peer in record.members and record.state not in TERMINAL:
                    self._member_died(record, peer)
        elif state == "alive" and peer in self.dead:
            self.dead.discard(peer)
            for record in self._all():
                record.mailbox.member_alive(peer)

    def _member_died(self, record: JobRecord, peer: bytes) -> None:
        record.mailbox.member_dead(peer)
        # a proposal it has not answered, or a start we wait for from it as proposer
        self._answer(record.id, peer, m.JobReject(job_id=record.id, reason=f"{DEAD_DETAIL} before answering"))
        signal = record.start_signal
        if peer == record.proposer and signal is not None and not signal.done():
            signal.set_exception(_SiteFailure(peer, f"{DEAD_DETAIL} before starting the job"))

    async def unless_dead(self, peer: bytes, work: Any) -> Any:
        """Await `work` (a send to `peer`), but raise PeerUnreachable at once if membership has
        declared `peer` dead, or as soon as it does: a send to a dead peer would retry for a
        whole hop timeout."""
        if peer in self.dead:
            work.close()
            raise PeerUnreachable(peer, DEAD_DETAIL)
        death = asyncio.get_running_loop().create_future()
        self._deaths.setdefault(peer, set()).add(death)
        task = asyncio.ensure_future(work)
        try:
            await asyncio.wait({task, death}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            raise PeerUnreachable(peer, DEAD_DETAIL)
        finally:
            self._deaths.get(peer, set()).discard(death)
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def retry_unsaved(self) -> int:
        """Write again the records whose last write failed (the node's tick calls it): how many
        are still unsaved."""
        return self.records.retry_unsaved()

    # -- queries -----------------------------------------------------------------------------

    def _all(self) -> list[JobRecord]:
        return [*self.jobs.values(), *self.unstored.values()]

    def _find(self, job_id: str) -> JobRecord | None:
        return self.jobs.get(job_id) or self.unstored.get(job_id)

    def list(self) -> list[dict]:
        records = sorted(self._all(), key=lambda r: r.created_ms, reverse=True)[:RECORDS_LISTED_MAX]
        return [{k: v for k, v in r.to_json(self.names, self.transport.now_ms()).items()
                 if k not in ("result", "params")} for r in records]

    def show(self, job_id: str) -> dict:
        record = self._find(job_id)
        if record is None:
            raise JobError(f"no job {job_id!r} on this site")
        return record.to_json(self.names, self.transport.now_ms())

    def running(self) -> int:
        """Jobs holding a [jobs] jobs_concurrent_max slot: running ones only, not pending proposals."""
        return sum(r.state == "running" for r in self.jobs.values())

    def _pending_of(self, proposer: bytes) -> int:
        return sum(r.state in PENDING and r.proposer == proposer for r in self.jobs.values())

    # -- proposing ---------------------------------------------------------------------------

    def propose(self, kind_name: str, params: Mapping[str, Any], member_names: list[str] | None = None) -> str:
        problem = self.records.disk_problem()
        if problem is not None:
            raise JobError(f"{problem}: no new job until the state dir takes writes again")
        self.retry_unsaved()   # records the full disk kept in memory come first
        kind = self._kind_allowed(kind_name)
        try:
            checked = self._checked_params(kind, params)
        except JobError as exc:   # our own policy binds our own proposals too
            raise JobError(f"{self.config.node.name}: {exc}") from None
        members = self._choose_members(member_names)
        if len(members) < kind.members_min:
            raise JobError(f"{kind_name} needs at least {kind.members_min} members; alive now: "
                           f"{', '.join(self.names[k] for k in members)}")
        if self._pending_of(self.transport.me) >= PENDING_PER_PROPOSER_MAX:
            raise JobError(f"{PENDING_PER_PROPOSER_MAX} proposals of this site still wait for their members; "
                           "retry when they have started (PENDING_PER_PROPOSER_MAX)")
        now = self.transport.now_ms()
        job_id = f"{kind_name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now / 1000))}-{secrets.token_hex(3)}"
        record = JobRecord(id=job_id, kind=kind_name, params=checked, proposer=self.transport.me,
                           members=members, created_ms=now)
        self.jobs[job_id] = record
        self.records.save(record)
        try:
            record.task = self._spawn(self._guard(record, self._run_proposer(record, kind)))
        except JobError as exc:   # the daemon is stopping
            self._finish(record, "failed", f"{self.config.node.name}: {exc}")
            raise
        log.info("job_proposed", extra=fields(job=job_id, kind=kind_name, members=len(members)))
        return job_id

    def _kind_allowed(self, kind_name: str) -> JobKind:
        kind = self.kinds.get(kind_name)
        if kind is None:
            raise JobError(f"unknown job kind {kind_name!r}; known: {', '.join(sorted(self.kinds))}")
        if kind_name not in self.config.policy.allowed_jobs:
            raise JobError(f"job kind {kind_name!r} is not in this site's [policy] allowed_jobs")
        if self.running() >= self.config.jobs.jobs_concurrent_max:
            raise JobError(f"{self.running()} jobs already running ([jobs] jobs_concurrent_max)")
        return kind

    def _checked_params(self, kind: JobKind, params: Mapping[str, Any]) -> dict[str, Any]:
        """The kind's own parameter checks, then this site's [policy.<kind>] limits; JobError
        naming the parameter or the limit."""
        checked = kind.check_params(params)
        limits = self.config.policy.kind_limits(kind.name)
        if limits is not None:
            kind.check_policy(checked, limits)
        return checked

    def _choose_members(self, member_names: list[str] | None) -> tuple[bytes, ...]:
        by_name = {name: key for key, name in self.names.items()}
        if member_names:
            unknown = [n for n in member_names if n not in by_name]
            if unknown:
                raise JobError(f"unknown member(s) {unknown}; known: {sorted(by_name)}")
            chosen = {by_name[n] for n in member_names} | {self.transport.me}
        else:
            chosen = {k for k in self.names if k == self.transport.me or self.transport.alive(k)}
        if len(chosen) > self.config.policy.members_max:
            raise JobError(f"{len(chosen)} members exceed [policy] members_max")
        return tuple(sorted(chosen))

    async def _run_proposer(self, record: JobRecord, kind: JobKind) -> None:
        await self.records.on_disk(record)     # our record of the job before any member hears of it
        try:
            mine = await self._check_data(record, kind)
        except (JobError, DataError) as exc:
            raise _SiteFailure(self.transport.me, str(exc)) from None
        others = [k for k in record.members if k != self.transport.me]
        record.announced = True
        for peer in others:
            self._replies[(record.id, peer)] = asyncio.get_running_loop().create_future()
        proposal = m.JobPropose(job_id=record.id, kind=record.kind, params=record.params,
                                members=list(record.members), created_ms=record.created_ms)
        sends = [asyncio.create_task(self._send_or_reply_unreachable(record, p, proposal)) for p in others]
        try:
            answers = await self._collect_answers(record, others)
        finally:
            for task in sends:
                task.cancel()
        missing = self._missing_pairs(answers)
        if missing:   # every pair at once: the operator fixes them in one pass
            raise _SiteFailure(self.transport.me, "; ".join(missing))
        fp, features = mine
        for peer in others:
            answer = answers[peer]
            if isinstance(answer, m.JobReject):
                raise _SiteFailure(peer, answer.reason)
            if answer.fingerprint != fp:
                raise _SiteFailure(peer, _schema_difference(features, answer.features, self.names[peer],
                                                            self.config.node.name))
        start = m.JobStart(job_id=record.id, members=list(record.members))
        await asyncio.gather(*(self._send_start(record, p, start) for p in others))
        await self._execute(record, kind)

    def _missing_pairs(self, answers: Mapping[bytes, Any]) -> list[str]:
        """Refusals that say two members do not know each other, in this site's names: a member
        names the keys it lacks by fingerprint (`_policy_refusal`), and a member that lacks us
        refuses the proposal's frame itself (unknown_sender) or holds another key for us (header)."""
        by_fingerprint = {fingerprint(k): n for k, n in self.names.items()}
        me = self.config.node.name
        pairs = []
        for peer, answer in answers.items():
            if not isinstance(answer, m.JobReject):
                continue
            name, reason = self.names.get(peer, fingerprint(peer)), answer.reason
            if NOT_LISTED in reason:
                pairs += [f"{name} does not list {other}: run `fedpeer peer add` there"
                          for f, other in by_fingerprint.items() if f in reason]
            elif reason.endswith("unknown_sender"):
                pairs.append(f"{name} does not list {me}: run `fedpeer peer add` there")
            elif reason.endswith(": header"):
                pairs.append(f"{name} holds another key for {me}, or another key answers at {name}'s address: "
                             "compare `fedpeer key show` with both peers.toml")
        return pairs

    async def _send_or_reply_unreachable(self, record: JobRecord, peer: bytes, msg: object) -> None:
        try:
            await self.transport.send(peer, msg, record.id, self.config.jobs.job_accept_timeout_ms)
        except PeerUnreachable as exc:
            reason = f"refused the proposal ({exc.reason})" if isinstance(exc, PeerRefused) else f"unreachable: {exc}"
            self._answer(record.id, peer, m.JobReject(job_id=record.id, reason=reason))

    def _answer(self, job_id: str, peer: bytes, answer: m.JobAccept | m.JobReject) -> bool:
        future = self._replies.get((job_id, peer))
        if future is None or future.done():
            return False
        future.set_result(answer)
        return True

    async def _send_start(self, record: JobRecord, peer: bytes, msg: m.JobStart) -> None:
        try:
            await self.transport.send(peer, msg, record.id, self.config.jobs.hop_timeout_ms)
        except PeerUnreachable as exc:
            raise _SiteFailure(peer, f"unreachable when the job was to start: {exc}") from None

    async def _collect_answers(self, record: JobRecord, others: list[bytes]) -> dict[bytes, Any]:
        timeout_s = self.config.jobs.job_accept_timeout_ms / 1000
        futures = {p: self._replies[(record.id, p)] for p in others}
        done, pending = await asyncio.wait(futures.values(), timeout=timeout_s)
        for p in others:
            self._replies.pop((record.id, p), None)
        if pending:
            late = next(p for p, f in futures.items() if f in pending)
            raise _SiteFailure(late, f"did not answer the proposal within {timeout_s:.0f} s")
        return {p: f.result() for p, f in futures.items()}

    # -- being a member ----------------------------------------------------------------------

    def on_message(self, src: bytes, job_id: str, msg: object) -> None:
        """Entry point for every job-related message that passed the wire gate."""
        if isinstance(msg, m.LIFECYCLE) and msg.job_id != job_id:  # type: ignore[union-attr]
            raise RemoteProtocolError("schema", "job id in body and envelope differ")
        if isinstance(msg, m.JobPropose):
            self._on_propose(src, msg)
        elif isinstance(msg, (m.JobAccept, m.JobReject)):
            if not self._answer(job_id, src, msg):
                raise RemoteProtocolError("unknown_job", f"unexpected answer for job {job_id}")
        elif isinstance(msg, m.JobStart):
            self._on_start(src, msg)
        elif isinstance(msg, m.JobAbort):
            self._on_abort(src, msg)
        elif isinstance(msg, m.JobCancel):
            self._on_cancel(src, msg)
        else:
            record = self.jobs.get(job_id)
            if record is not None and src in record.members and record.state == "done" \
                    and self._serve_done(record, src, msg):
                return
            if record is None or src not in record.members or record.state in TERMINAL:
                raise RemoteProtocolError("unknown_job", f"no running job {job_id!r} with that member")
            record.mailbox.put(src, msg)

    def _serve_done(self, record: JobRecord, src: bytes, msg: object) -> bool:
        """A member still running a job that is done here (it was cut off when it ended) may ask
        its kind for what it missed. At most once per SERVE_DONE_INTERVAL_MS per member and job:
        the answer may read a model file. Whether the message was taken."""
        kind = self.kinds.get(record.kind)
        if kind is None or kind.serve_done is None or not isinstance(msg, kind.serve_done_kinds):
            return False
        now = self.transport.now_ms()
        last = self._served.get((record.id, src))
        if last is not None and now - last < SERVE_DONE_INTERVAL_MS:
            return True      # taken, not answered: it asks again later
        self._served[(record.id, src)] = now
        while len(self._served) > SERVED_REMEMBERED_MAX:
            self._served.pop(next(iter(self._served)))
        finished = Finished(me=self.transport.me, members=record.members, workdir=self._root / record.id,
                            leadership=self.transport.leadership())
        try:
            self._spawn(self._answer_done(kind, finished, src, msg, record.id))
        except JobError:
            pass     # the daemon is stopping
        return True

    async def _answer_done(self, kind: JobKind, finished: Finished, src: bytes, msg: object, job_id: str) -> None:
        try:
            answer = await asyncio.to_thread(kind.serve_done, finished, src, msg)
        except (OSError, FedpeerError, ValueError) as exc:   # files gone or unreadable: nothing to offer
            log.info("job_not_served", extra=fields(job=job_id, peer=self.names.get(src, "?"), error=str(exc)))
            return
        if answer is not None:
            await self._send_quietly(src, answer, job_id)

    def on_refused(self, src: bytes, job_id: str, reason: str) -> None:
        """The gate refused a frame an authenticated member sent for `job_id`: whatever that job
        waits for from `src` will not come. Its receives from `src` fail at once (MalformedFrom),
        and an answer it owed to our proposal counts as a refusal naming it. Unknown job: ignored."""
        record = self.jobs.get(job_id)
        if record is None or src not in record.members or record.state in TERMINAL:
            return
        self._answer(job_id, src, m.JobReject(job_id=job_id, reason=f"sent a malformed answer ({reason})"))
        record.mailbox.refuse(src, reason)

    def _on_propose(self, src: bytes, msg: m.JobPropose) -> None:
        if msg.job_id in self.jobs or msg.job_id in self.unstored or not JOB_ID_RE.fullmatch(msg.job_id):
            raise RemoteProtocolError("unknown_job", f"job id {msg.job_id!r} reused or malformed")
        members = tuple(msg.members)
        if src not in members or self.transport.me not in members or tuple(sorted(set(members))) != members:
            raise RemoteProtocolError("schema", "proposal members must be sorted, distinct, include proposer and me")
        self._take_proposal_budget(src)
        # created_ms is when we heard of it: a member's clock must not order (or crowd) our job list
        record = JobRecord(id=msg.job_id, kind=msg.kind, params=dict(msg.params), proposer=src,
                           members=members, created_ms=self.transport.now_ms(), announced=True, stored=False)
        refusal = self._policy_refusal(record)
        if refusal is not None:
            self._refuse(record, refusal)
            return
        self.jobs[record.id] = record
        try:
            record.task = self._spawn(self._guard(record, self._answer_proposal(record)))
        except JobError as exc:   # the daemon is stopping
            self._finish(record, "failed", f"{self.config.node.name}: {exc}")

    def _take_proposal_budget(self, src: bytes) -> None:
        """Bounded load per member: refused here, a proposal costs no record, no task, no send."""
        who = self.names.get(src, fingerprint(src))
        pending = self._pending_of(src)
        if pending >= PENDING_PER_PROPOSER_MAX:
            raise RemoteProtocolError("job_limit", f"{who} already has {pending} pending proposals here "
                                                   "(PENDING_PER_PROPOSER_MAX)")
        now = self.transport.now_ms()
        tokens, at_ms = self._buckets.get(src, (float(PROPOSALS_BURST_MAX), now))
        tokens = min(float(PROPOSALS_BURST_MAX), tokens + max(0, now - at_ms) / PROPOSAL_REFILL_MS)
        if tokens < 1.0:
            self._buckets[src] = (tokens, now)
            raise RemoteProtocolError("job_limit", f"{who} proposes faster than one job per "
                                                   f"{PROPOSAL_REFILL_MS} ms (PROPOSALS_BURST_MAX)")
        self._buckets[src] = (tokens - 1.0, now)

    def _policy_refusal(self, record: JobRecord) -> str | None:
        """Why this site declines the proposal without looking at its data, or None."""
        unknown = [k for k in record.members if k not in self.names]
        if unknown:
            listed = ", ".join(fingerprint(k) for k in unknown[:4])
            return (f"member(s) {listed} {NOT_LISTED}; add them there (and on every member) "
                    "before proposing a job with them")
        problem = self.records.disk_problem()
        if problem is not None:
            return f"{problem}: this site takes no new job until its state dir takes writes again"
        if len(record.members) > self.config.policy.members_max:
            return f"{len(record.members)} members exceed this site's [policy] members_max"
        proposer = self.names[record.proposer]    # a member: checked above
        if not self.config.policy.may_propose(proposer):
            return f"proposer {proposer!r} is not in this site's [policy] proposers"
        try:
            record.params = self._checked_params(self._kind_allowed(record.kind), record.params)
        except JobError as exc:
            return str(exc)
        return None

    def _refuse(self, record: JobRecord, reason: str) -> None:
        """Decline a peer's proposal at once: see `_decline`; the JobReject goes out in its own task."""
        reject = self._decline(record, reason)
        try:
            self._spawn(self._send_quietly(record.proposer, reject, record.id))
        except JobError:
            pass   # the daemon is stopping: the proposer's wait times out

    def _decline(self, record: JobRecord, reason: str) -> m.JobReject:
        """End a peer's proposal we will not run. Its proposer (who announced it) tells the other
        members; we send one JobReject to it and nothing to anyone else, who may not even be known
        here. The record lives in memory only."""
        self._finish(record, "failed", f"{self.config.node.name}: {reason}")
        log.info("job_refused", extra=fields(job=record.id, proposer=self.names.get(record.proposer, "?"),
                                             reason=reason))
        return m.JobReject(job_id=record.id, reason=reason)

    async def _answer_proposal(self, record: JobRecord) -> None:
        kind = self.kinds[record.kind]    # _policy_refusal checked it
        try:
            fp, features = await self._check_data(record, kind)
        except (JobError, DataError) as exc:
            raise _Refused(str(exc)) from None
        record.state, record.phase = "accepted", "waiting for the start"
        record.start_signal = asyncio.get_running_loop().create_future()   # before the accept: a fast start
        accept = m.JobAccept(job_id=record.id, fingerprint=fp, features=list(features))
        try:
            await self.transport.send(record.proposer, accept, record.id, self.config.jobs.job_accept_timeout_ms)
        except PeerUnreachable as exc:
            raise _SiteFailure(record.proposer, f"unreachable when accepting: {exc}") from None
        timeout_s = self.config.jobs.job_start_timeout_ms / 1000
        try:
            await asyncio.wait_for(asyncio.shield(record.start_signal), timeout_s)
        except TimeoutError:
            raise _SiteFailure(record.proposer,
                               f"accepted, but the job was not started within {timeout_s:.0f} s") from None
        await self._execute(record, kind)

    def _on_start(self, src: bytes, msg: m.JobStart) -> None:
        record = self.jobs.get(msg.job_id)
        if (record is None or src != record.proposer or record.state != "accepted" or record.start_signal is None
                or record.start_signal.done() or tuple(msg.members) != record.members):
            raise RemoteProtocolError("unknown_job", f"start of job {msg.job_id!r} not expected")
        record.start_signal.set_result(None)

    def _on_abort(self, src: bytes, msg: m.JobAbort) -> None:
        record = self._find(msg.job_id)
        if record is None or src not in record.members:
            raise RemoteProtocolError("unknown_job", f"abort of unknown job {msg.job_id!r}")
        if record.state in TERMINAL:
            return
        about = self.names.get(msg.site, fingerprint(msg.site)) if len(msg.site) == 32 else self.names[src]
        self._finish(record, "failed", f"{about}: {msg.reason}")
        if record.task is not None:
            record.task.cancel()

    def _on_cancel(self, src: bytes, msg: m.JobCancel) -> None:
        """Another member's operator cancelled the job: it ends `cancelled` here too."""
        record = self._find(msg.job_id)
        if record is None or src not in record.members:
            raise RemoteProtocolError("unknown_job", f"cancel of unknown job {msg.job_id!r}")
        if record.state in TERMINAL:
            return
        self._finish(record, "cancelled", f"{self.names[src]}: {msg.reason}")
        if record.task is not None:
            record.task.cancel()

    # -- running -----------------------------------------------------------------------------

    async def _check_data(self, record: JobRecord, kind: JobKind) -> tuple[bytes, tuple[str, ...]]:
        if not kind.needs_data:
            return b"", ()
        from ..sitedata import load_site   # the loading `fedpeer data check` does too

        data = self.config.data
        if data is None:
            raise JobError("this site has no [data] section in peers.toml")
        if kind.needs_label and not data.label:
            raise JobError(f"[data] label is not set in peers.toml; a {kind.name} job needs the label column")
        if data.engine == "dask":
            from ..ml.dasksite import dask_refusal

            refusal = dask_refusal(kind.name, record.params)
            if refusal is not None:      # before any cluster is asked: nothing loaded, nothing to release
                raise JobError(refusal)
        # Off the event loop: parsing (and missing = "impute") takes seconds on a large file.
        load = asyncio.ensure_future(asyncio.to_thread(load_site, data, self.config.jobs,
                                                       needs_label=kind.needs_label, binary=kind.binary_label))
        try:
            dataset, test = await asyncio.shield(load)
        except asyncio.CancelledError:   # the thread still ends: a Dask site it opens is released then
            load.add_done_callback(lambda f: f.cancelled() or f.exception() or _release_data(f.result()[0]))
            raise
        rows_min = self.config.policy.rows_min
        if dataset.rows < rows_min:   # without the count: a small cohort's size is what this protects
            _release_data(dataset)
            raise JobError(f"local data has fewer rows than [policy] rows_min {rows_min}")
        record.data, record.test_data, record.rows = dataset, test, int(dataset.rows)
        return dataset.fingerprint, dataset.features

    async def _execute(self, record: JobRecord, kind: JobKind) -> None:
        limit = self.config.jobs.jobs_concurrent_max
        if self.running() >= limit:   # pending proposals hold no slot: the check that counts is here
            raise _SiteFailure(self.transport.me,
                               f"{self.running()} jobs already running ([jobs] jobs_concurrent_max)")
        record.state, record.phase, record.started_ms = "running", "starting", self.transport.now_ms()
        record.stored = True          # a job that runs is worth a record on disk
        self.records.save(record)
        # the disk filled since the proposal: do not start what we cannot record
        if not await self.records.on_disk(record):
            raise _SiteFailure(self.transport.me, f"{self.records.write_problem()}: this site cannot record the job; "
                                                  "free space in its state dir")
        log.info("job_started", extra=fields(job=record.id, kind=record.kind, members=len(record.members)))
        ctx = JobContext(site_name=self.config.node.name, names=self.names,
                         hop_timeout_ms=self.config.jobs.hop_timeout_ms, data=record.data,
                         test_data=record.test_data, workdir=self._root / record.id)
        channel = NodeChannel(self, record)
        for peer in self.dead.intersection(record.members):   # died before the start: no wait for them
            record.mailbox.member_dead(peer)
        try:
            result = await asyncio.wait_for(kind.run(channel, record.params, ctx),
                                            self.config.jobs.job_timeout_ms / 1000)
        except TimeoutError:
            raise _SiteFailure(self.transport.me,
                               f"did not finish within {self.config.jobs.job_timeout_ms} ms") from None
        except MalformedFrom as exc:    # evidence against that member, not against this site
            raise _SiteFailure(exc.peer, f"sent a malformed message ({exc.reason})") from None
        except PeerDead as exc:         # the job could not go on without it
            raise _SiteFailure(exc.peer, DEAD_DETAIL) from None
        except (JobError, DataError, RecvTimeout) as exc:
            raise _SiteFailure(self.transport.me, str(exc), everywhere=isinstance(exc, JobFailsEverywhere)) from None
        _release_data(record.data)
        record.data = record.test_data = None
        model = result.pop("_model", None)
        if model is not None and kind.save_model is not None:   # stored before the record says done
            path = self._root / record.id / kind.model_file
            try:
                await asyncio.to_thread(kind.save_model, path, model)
            except OSError as exc:
                raise _SiteFailure(self.transport.me, f"cannot store the model at {path}: "
                                                      f"{exc.strerror or exc}; free space in the state dir") from None
            result["model_file"] = str(path)
            # what `fedpeer predict` checks the file against, for every kind (xgboost also has its own)
            result["model_file_sha256"] = await asyncio.to_thread(_file_sha256, path)
        self._finish(record, "done", None, result)

    # -- supervision -------------------------------------------------------------------------

    async def _guard(self, record: JobRecord, work: Any) -> None:
        """Runs a job task: every failure ends the record with a reason and tells whom it must.
        Nothing but cancellation leaves this coroutine, not even a failure of the failure handling:
        a job task's exception would take the node's task group, and the daemon, down."""
        try:
            await work
        except asyncio.CancelledError:
            # an operator's cancel or a peer's abort finished the record first; what is left is
            # the daemon stopping (a restarted daemon shows this record, not a running one)
            if record.state not in TERMINAL:
                self._finish(record, "cancelled", f"{self.config.node.name}: the daemon was stopped while the job "
                                                  f"ran (phase: {record.phase})")
            raise
        except Exception as exc:
            try:
                await self._fail(record, exc)
            except asyncio.CancelledError:
                raise
            except Exception as inner:   # noqa: BLE001  (supervision: this job only, never the node)
                log.exception("job_failure_handling_failed", extra=fields(job=record.id))
                self._finish(record, "failed", f"{self.config.node.name}: internal error while ending the job: "
                                               f"{type(inner).__name__}: {inner}")
        finally:
            for key in [k for k in self._replies if k[0] == record.id]:
                self._replies.pop(key, None)
            if record.state in TERMINAL:   # a Dask site loaded for a record already ended elsewhere
                _release_data(record.data)
                record.data = record.test_data = None

    async def _fail(self, record: JobRecord, exc: Exception) -> None:
        if isinstance(exc, _Refused):      # declined after looking at our data: tell the proposer only
            await self._send_quietly(record.proposer, self._decline(record, exc.reason), record.id)
        elif isinstance(exc, _SiteFailure):
            await self._site_failed(record, exc)
        else:                              # a bug: keep the daemon alive, fail the job loudly
            log.error("job_crashed", exc_info=exc, extra=fields(job=record.id))
            self._finish(record, "failed", f"{self.config.node.name}: internal error: {type(exc).__name__}: {exc}")
            if record.announced:
                await self._broadcast_abort(record, self.transport.me, f"internal error: {type(exc).__name__}")

    async def _site_failed(self, record: JobRecord, exc: _SiteFailure) -> None:
        if record.announced and record.state not in TERMINAL:
            # a failure here is often the echo of another member ending the job (it then
            # refuses our frames as unknown_job): give its JobAbort, which carries the real
            # reason, a moment to arrive and win (_on_abort cancels this wait)
            await asyncio.sleep(ABORT_GRACE_MS / 1000)
        about = self.names.get(exc.site, fingerprint(exc.site))
        first = record.state not in TERMINAL
        self._finish(record, "failed", f"{about}: {exc.reason}")
        kind = self.kinds.get(record.kind)
        leaves_alone = record.state == "failed" and kind is not None and not kind.member_failure_aborts \
            and record.started_ms is not None and not exc.everywhere
        if first and record.announced and not leaves_alone:
            await self._broadcast_abort(record, exc.site, exc.reason)

    def _finish(self, record: JobRecord, state: str, error: str | None, result: dict | None = None) -> None:
        """End the record (first end wins); never raises."""
        if record.state in TERMINAL:
            return
        record.state, record.error, record.result = state, error, result
        record.phase = state
        record.finished_ms = self.transport.now_ms()
        _release_data(record.data)
        record.data = record.test_data = None
        self.records.save(record)
        if not record.stored:    # a peer's proposal that never ran: memory only, oldest out
            self.jobs.pop(record.id, None)
            self.unstored[record.id] = record
            while len(self.unstored) > UNSTORED_RECORDS_MAX:
                self.unstored.popitem(last=False)
        log.info("job_" + state, extra=fields(job=record.id, kind=record.kind, error=error or "-"))

    async def _broadcast_abort(self, record: JobRecord, site: bytes, reason: str) -> None:
        await self.records.on_disk(record)     # how it ended, on disk before the others hear it
        abort = m.JobAbort(job_id=record.id, site=site, reason=reason)
        others = [k for k in record.members if k != self.transport.me]
        await asyncio.gather(*(self._send_quietly(p, abort, record.id) for p in others))

    async def _send_quietly(self, peer: bytes, msg: object, job_id: str) -> None:
        """Best effort, never raises: used while a job ends, where nothing may fail any more."""
        if peer not in self.names:   # never address a key this site does not know
            return
        try:
            await self.transport.send(peer, msg, job_id, ABORT_SEND_TIMEOUT_MS)
        except PeerUnreachable:
            pass
        except Exception as exc:   # noqa: BLE001  (a bug in the transport must not end the daemon)
            log.warning("job_send_failed", extra=fields(job=job_id, peer=self.names.get(peer, "?"),
                                                        error=f"{type(exc).__name__}: {exc}"))

    def reconfigure(self, config: Config, names: Mapping[bytes, str]) -> list[str]:
        """A reloaded peers.toml: proposals, policy checks and data loads use `config` from now on
        (a running job keeps the parameters and data it started with). Every job a removed member
        takes part in ends now, `failed`, naming the removal, and its other members are told.
        Returns the ids of the jobs it ended."""
        removed = {k: self.names[k] for k in self.names if k not in names}
        self.config, self.names = config, names
        ended = []
        for record in [r for r in self._all() if r.state not in TERMINAL]:
            gone = [k for k in record.members if k in removed]
            if not gone:
                continue
            reason = f"removed from {config.node.name}'s peers.toml"
            self._finish(record, "failed", f"{removed[gone[0]]}: {reason}")
            if record.task is not None:
                record.task.cancel()
            if record.announced:   # _send_quietly never addresses the removed key
                with contextlib.suppress(JobError):   # the daemon is stopping: their waits time out
                    self._spawn(self._broadcast_abort(record, gone[0], reason))
            ended.append(record.id)
        return ended

    def cancel(self, job_id: str) -> dict:
        record = self._find(job_id)
        if record is None:
            raise JobError(f"no job {job_id!r} on this site")
        if record.state in TERMINAL:
            raise JobError(f"job {job_id} already {record.state}")
        self._finish(record, "cancelled", f"{self.config.node.name}: cancelled by the operator")
        if record.task is not None:
            record.task.cancel()
        if record.announced:
            self._spawn(self._broadcast_cancel(record, "cancelled by the operator"))
        return record.to_json(self.names, self.transport.now_ms())

    async def _broadcast_cancel(self, record: JobRecord, reason: str) -> None:
        await self.records.on_disk(record)     # how it ended, on disk before the others hear it
        cancel = m.JobCancel(job_id=record.id, reason=reason)
        others = [k for k in record.members if k != self.transport.me]
        await asyncio.gather(*(self._send_quietly(p, cancel, record.id) for p in others))


class _Refused(Exception):
    """This site declines a peer's proposal (its data does not fit): only the proposer is told."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _SiteFailure(Exception):
    """A job ended because of `site` (this one or a member), for `reason`."""

    def __init__(self, site: bytes, reason: str, everywhere: bool = False) -> None:
        super().__init__(reason)
        self.site, self.reason, self.everywhere = site, reason, everywhere


def _release_data(data: Any) -> None:
    """A job's site data is done with: a Dask site's partitions and client are released (in a
    background thread, fedpeer/ml/dasksite.py); a Dataset is left to the garbage collector."""
    if getattr(data, "engine", "memory") == "dask":
        data.close()


def _schema_difference(mine: tuple[str, ...], theirs: list[str], their_name: str, my_name: str) -> str:
    missing = [c for c in mine if c not in theirs]
    extra = [c for c in theirs if c not in mine]
    if missing or extra:
        return (f"columns differ from {my_name}'s: {their_name} lacks {missing[:10]} and has extra {extra[:10]}; "
                "align the CSV columns or use [data] ignore")
    if list(mine) != list(theirs):
        return f"same columns as {my_name} but in another order; reorder the CSV columns"
    return f"schema fingerprint differs from {my_name}'s (column types differ)"




def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
