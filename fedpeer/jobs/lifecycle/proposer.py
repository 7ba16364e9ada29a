"""This site as a job's proposer (docs/design.md, a job's walk): propose -> every member checks policy and data ->
accept/reject -> start with equal schema fingerprints, or abort with a reason naming the site.

Rules:
- A job starts only when every member accepted with the same schema fingerprint; otherwise every
  member's record ends `failed` with the reason and the site it is about.
- Our record of the job is on disk before any member hears of it, and our own data is checked
  first: a proposal this site could not run is not sent.
- A member that refuses tells only the proposer, who announced the job and tells the others.
  Refusals that say two members do not know each other are all reported at once, in this
  site's names, so the operator fixes them in one pass.
- Members must answer within job_accept_timeout_ms; one declared dead meanwhile counts as a
  refusal at once.
- A job goes only to members whose build runs it (fedpeer/jobs/capabilities.py): one named by the
  operator that lacks a capability the job needs refuses the proposal at once, before any member
  hears of it, in one line naming the site, both versions and the capability; unnamed ones are
  left out (logged). A member that has not said what it runs is waited for up to
  PEER_INFO_WAIT_MS, then taken as the previous release (fedpeer/jobs/versions.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

from fedpeer.base.logs import fields
from fedpeer.errors import DataError, JobError
from fedpeer.identity import fingerprint
from fedpeer.jobs import capabilities
from fedpeer.jobs import messages as m
from fedpeer.jobs.kind import JobKind
from fedpeer.data.spec import data_difference
from fedpeer.jobs.lifecycle.admission import NOT_LISTED, PENDING_PER_PROPOSER_MAX
from fedpeer.jobs.lifecycle.runner import SiteFailure
from fedpeer.jobs.records import JobRecord
from fedpeer.runtime.channel import PeerRefused, PeerUnreachable
from fedpeer.jobs.lifecycle.host import Host
from fedpeer.jobs.privacy import with_bounds
from fedpeer.jobs.versions import refusal_line


log = logging.getLogger("fedpeer.jobs")
PEER_INFO_WAIT_MS = 500     # a proposal waits this long for a member that has not said what it runs


class ProposerSide:
    """Our proposals: each member's answer is awaited here, until the job starts or fails."""

    def __init__(self, registry: Host) -> None:
        self._registry = registry
        self._replies: dict[tuple[str, bytes], asyncio.Future] = {}

    async def propose_when_known(self, kind_name: str, params: Mapping[str, Any],
                                 member_names: list[str] | None = None) -> str:
        """`propose`, once every chosen member has said what it runs (or PEER_INFO_WAIT_MS passed)."""
        registry = self._registry
        versions = registry.versions
        if versions is not None:
            me = registry.transport.me
            await versions.wait_known([k for k in self._choose_members(member_names) if k != me],
                                      PEER_INFO_WAIT_MS)
        return self.propose(kind_name, params, member_names)

    def propose(self, kind_name: str, params: Mapping[str, Any], member_names: list[str] | None = None) -> str:
        registry = self._registry
        problem = registry.records.disk_problem()
        if problem is not None:
            raise JobError(f"{problem}: no new job until the state dir takes writes again")
        registry.retry_unsaved()   # records the full disk kept in memory come first
        kind = registry.admission.kind_allowed(kind_name)
        data = registry.config.data        # a DP job's public bounds: the proposer's [data] bounds
        params = with_bounds(kind.params, params, data.bounds if data is not None else {})
        try:
            checked = registry.admission.checked_params(kind, params)
        except JobError as exc:   # our own policy binds our own proposals too
            raise JobError(f"{registry.config.node.name}: {exc}") from None
        members, checked, sent_params = self._fit_versions(kind, checked, self._choose_members(member_names),
                                                           named=bool(member_names))
        if len(members) < kind.members_min:
            raise JobError(f"{kind_name} needs at least {kind.members_min} members; alive now: "
                           f"{', '.join(registry.names[k] for k in members)}")
        if registry.pending_of(registry.transport.me) >= PENDING_PER_PROPOSER_MAX:
            raise JobError(f"{PENDING_PER_PROPOSER_MAX} proposals of this site still wait for their members; "
                           "retry when they have started (PENDING_PER_PROPOSER_MAX)")
        now = registry.transport.now_ms()
        job_id = f"{kind_name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now / 1000))}-{secrets.token_hex(3)}"
        record = JobRecord(id=job_id, kind=kind_name, params=checked, proposer=registry.transport.me,
                           members=members, created_ms=now)
        registry.jobs[job_id] = record
        registry.records.save(record)
        try:
            record.task = registry.spawn(registry.runner.guard(record, self._run(record, kind, sent_params)))
        except JobError as exc:   # the daemon is stopping
            registry.finish(record, "failed", f"{registry.config.node.name}: {exc}")
            raise
        log.info("job_proposed", extra=fields(job=job_id, kind=kind_name, members=len(members)))
        return job_id

    def _fit_versions(self, kind: JobKind, params: dict[str, Any], members: tuple[bytes, ...],
                      named: bool) -> tuple[tuple[bytes, ...], dict[str, Any], dict[str, Any]]:
        """The members whose builds run this job, its parameters (optional ones settled for those
        members, capabilities.settled) and the parameters its proposal carries; JobError (one
        line per site) when a named member lacks what the job needs, or too few are left."""
        registry = self._registry
        versions = registry.versions
        if versions is None:
            return members, params, params
        me, lines, fit = registry.transport.me, [], []
        params = capabilities.settled(kind, params, [versions.own.caps if p == me else versions.info(p).caps
                                                     for p in members])
        data = registry.config.data
        vertical = data is not None and data.partition == "vertical"
        for peer in members:
            info = versions.own if peer == me else versions.info(peer)
            lack = capabilities.lacking(kind, params, info.caps, vertical)
            if lack:
                lines.append(refusal_line(registry.names[peer], info, lack[0], registry.config.node.name, versions.own))
            else:
                fit.append(peer)
        if lines and (named or len(fit) < kind.members_min):
            raise JobError("; ".join(lines))
        for line in lines:
            log.warning("job_member_left_out", extra=fields(kind=kind.name, why=line))
        return tuple(fit), params, capabilities.for_members(kind, params,
                                                            [versions.info(p).caps for p in fit if p != me])

    def _choose_members(self, member_names: list[str] | None) -> tuple[bytes, ...]:
        registry = self._registry
        by_name = {name: key for key, name in registry.names.items()}
        if member_names:
            unknown = [n for n in member_names if n not in by_name]
            if unknown:
                raise JobError(f"unknown member(s) {unknown}; known: {sorted(by_name)}")
            chosen = {by_name[n] for n in member_names} | {registry.transport.me}
        else:
            chosen = {k for k in registry.names if k == registry.transport.me or registry.transport.alive(k)}
        if len(chosen) > registry.config.policy.members_max:
            raise JobError(f"{len(chosen)} members exceed [policy] members_max")
        return tuple(sorted(chosen))

    async def _run(self, record: JobRecord, kind: JobKind, params: dict[str, Any]) -> None:
        registry = self._registry
        me = registry.transport.me
        await registry.records.on_disk(record)     # our record of the job before any member hears of it
        try:
            mine = await registry.admission.check_data(record, kind)
        except (JobError, DataError) as exc:
            raise SiteFailure.here(me, exc) from None
        others = [k for k in record.members if k != me]
        record.announced = True
        for peer in others:
            self._replies[(record.id, peer)] = asyncio.get_running_loop().create_future()
        proposal = m.JobPropose(job_id=record.id, kind=record.kind, params=params,
                                members=list(record.members), created_ms=record.created_ms)
        sends = [asyncio.create_task(self._send_or_reply_unreachable(record, p, proposal)) for p in others]
        try:
            answers = await self._collect_answers(record, others)
        finally:
            for task in sends:
                task.cancel()
        missing = self._missing_pairs(answers)
        if missing:   # every pair at once: the operator fixes them in one pass
            raise SiteFailure(me, "; ".join(missing))
        fp, features = mine
        for peer in others:
            answer = answers[peer]
            if isinstance(answer, m.JobReject):
                raise SiteFailure(peer, answer.reason)
            if answer.fingerprint != fp:
                raise SiteFailure(peer, data_difference(fp, features, answer.fingerprint, answer.features,
                                                        registry.names[peer], registry.config.node.name))
        start = m.JobStart(job_id=record.id, members=list(record.members))
        # This site starts while the starts travel (its first message to a member that has not had
        # its start yet waits in that member's mailbox); a start that cannot be delivered fails the
        # job here at once, as it did before this site began.
        try:
            async with asyncio.TaskGroup() as group:
                for peer in others:
                    group.create_task(self._send_start(record, peer, start))
                group.create_task(registry.runner.execute(record, kind))
        except BaseExceptionGroup as failed:        # the first failure, as the job's guard expects
            raise _first(failed) from None

    def _missing_pairs(self, answers: Mapping[bytes, Any]) -> list[str]:
        """Refusals that say two members do not know each other, in this site's names: a member
        names the keys it lacks by fingerprint (`Admission.policy_refusal`), and a member that lacks
        us refuses the proposal's frame itself (unknown_sender) or holds another key for us (header)."""
        registry = self._registry
        by_fingerprint = {fingerprint(k): n for k, n in registry.names.items()}
        me = registry.config.node.name
        pairs = []
        for peer, answer in answers.items():
            if not isinstance(answer, m.JobReject):
                continue
            name, reason = registry.names.get(peer, fingerprint(peer)), answer.reason
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
        registry = self._registry
        try:
            await registry.transport.send(peer, msg, record.id, registry.config.jobs.job_accept_timeout_ms)
        except PeerUnreachable as exc:
            reason = f"refused the proposal ({exc.reason})" if isinstance(exc, PeerRefused) else f"unreachable: {exc}"
            self.answer(record.id, peer, m.JobReject(job_id=record.id, reason=reason))

    def answer(self, job_id: str, peer: bytes, answer: m.JobAccept | m.JobReject) -> bool:
        """`peer`'s answer to our proposal `job_id`: whether one was awaited (and not yet had)."""
        future = self._replies.get((job_id, peer))
        if future is None or future.done():
            return False
        future.set_result(answer)
        return True

    def forget(self, job_id: str) -> None:
        """The job's task ended: no answer to it is awaited any more."""
        for key in [k for k in self._replies if k[0] == job_id]:
            self._replies.pop(key, None)

    async def _send_start(self, record: JobRecord, peer: bytes, msg: m.JobStart) -> None:
        registry = self._registry
        try:
            await registry.transport.send(peer, msg, record.id, registry.config.jobs.hop_timeout_ms)
        except PeerUnreachable as exc:
            raise SiteFailure(peer, f"unreachable when the job was to start: {exc}") from None

    async def _collect_answers(self, record: JobRecord, others: list[bytes]) -> dict[bytes, Any]:
        timeout_s = self._registry.config.jobs.job_accept_timeout_ms / 1000
        futures = {p: self._replies[(record.id, p)] for p in others}
        done, pending = await asyncio.wait(futures.values(), timeout=timeout_s)
        for p in others:
            self._replies.pop((record.id, p), None)
        if pending:
            late = next(p for p, f in futures.items() if f in pending)
            raise SiteFailure(late, f"did not answer the proposal within {timeout_s:.0f} s")
        return {p: f.result() for p, f in futures.items()}


def _first(group: BaseExceptionGroup) -> BaseException:
    """A task group's failure to report: a SiteFailure (a member's start not delivered, or this
    site's part of the job) before anything else, the first of each kind."""
    leaves = list(_leaves(group))
    return next((e for e in leaves if isinstance(e, SiteFailure)), leaves[0])


def _leaves(group: BaseExceptionGroup) -> Any:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc
