"""The secure sum's other members (fedpeer/protocols/securesum/api.py: "Takeover"): forward chunks,
report broken edges, answer the initiator, reveal seeds, take the total; take over when the
initiator is declared dead."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.protocols.securesum import masks as sm
from fedpeer.protocols.securesum.core import (
    PHASE,
    SumOutcome,
    Want,
    _Attempt,
    _broken_tag,
    _check_chunk,
    _compute,
    _InitiatorGone,
    _list_digest,
    _list_tag,
    _Masks,
    _new_total,
    _Plan,
    _recv_first,
    _send,
    _WrongLength,
)
from fedpeer.protocols.securesum.lead import _lead, _next_attempt, _RingFault
from fedpeer.protocols.securesum.wire import (
    RingBroken,
    SeedRequest,
    SeedReveal,
    SumChange,
    SumChunk,
    SumHere,
    SumListAsk,
    SumRestart,
    SumResult,
    SumWhere,
)
from fedpeer.runtime.channel import Channel, MalformedFrom, PeerDead, PeerRefused, PeerUnreachable, RecvTimeout


async def _follow(ch: Channel, plan: _Plan) -> SumOutcome:
    att = _Attempt(1, tuple(ch.members))
    gone: set[bytes] = set()          # initiators declared dead during this sum
    while True:
        try:
            outcome = await _follow_attempt(ch, plan, att)
        except _InitiatorGone:
            ch.discard(plan.prefix(att.number))
            gone.add(att.initiator)
            taken = await _take_over(ch, plan, att, gone)
            if isinstance(taken, SumOutcome):
                return taken          # this member was next in ring order: it led the rest
            plan, att = taken
            continue
        if isinstance(outcome, SumOutcome):
            return outcome
        ch.discard(plan.prefix(att.number))
        att = outcome


async def _take_over(ch: Channel, plan: _Plan, att: _Attempt,
                     gone: set[bytes]) -> SumOutcome | tuple[_Plan, _Attempt]:
    """The initiator of `att` was declared dead: the next participant in its ring order that is
    not known dead runs the sum anew over the survivors, under its own key (fresh tags, fresh
    masks). If that is me, I lead to the end; else I wait for its first announcement, moving on
    to the next one if it is declared dead too (module docstring, "Takeover")."""
    order = list(att.participants)
    start = order.index(att.initiator)
    for candidate in order[start + 1:] + order[:start]:
        if candidate in gone:
            continue
        era = dataclasses.replace(plan, initiator=candidate)
        if candidate == ch.me:
            ring = _Attempt(0, (ch.me, *[p for p in order if p != ch.me and p not in gone]), charged=0)
            why = "took over from initiator(s) declared dead: " + ", ".join(p.hex()[:16] for p in sorted(gone))
            first = await _next_attempt(ch, era, ring, _RingFault(why), set(), held=att.participants)
            return await _lead(ch, era, first)
        wants: list[Want] = [(SumRestart, era.restart_tag(), candidate)]
        if era.compact:
            wants.append((SumChange, era.restart_tag(), candidate))
        deadline = ch.now_ms() + att.patience_ms(plan)
        taken: _Attempt | None = None
        while taken is None:
            try:
                got = await _recv_first(ch, wants, max(0, deadline - ch.now_ms()))
            except PeerDead:
                gone.add(candidate)
                break
            except RecvTimeout:
                raise JobError(f"secure sum '{plan.tag}': initiator {att.initiator.hex()[:16]} was declared dead "
                               f"and {candidate.hex()[:16]}, next in ring order, did not take over within "
                               f"{att.patience_ms(plan)} ms") from None
            taken = await _announced(ch, era, _Attempt(0, att.participants), [m for _, m in got])
        if taken is not None:
            return era, taken
    raise JobError(f"secure sum '{plan.tag}': every other participant was declared dead")


async def _follow_attempt(ch: Channel, plan: _Plan, att: _Attempt) -> SumOutcome | _Attempt:
    """One attempt as a member: forward the chunks, reveal the seed if asked, take the result.
    Returns the next attempt when the initiator announces one."""
    masks, trace = _Masks(ch, plan, att), _Trace()
    total = _new_total(plan)          # allocated while the chunks go round
    try:
        return await _follow_ring(ch, plan, att, masks, trace, total)
    finally:
        trace.stop()
        if not total.done():
            total.cancel()


async def _follow_ring(ch: Channel, plan: _Plan, att: _Attempt, masks: sm.Masks, trace: _Trace,
                       total: asyncio.Future) -> SumOutcome | _Attempt:
    forwarded = await _forward_chunks(ch, plan, att, masks, trace)
    if isinstance(forwarded, _Attempt):
        return forwarded
    first_result = (SumResult, plan.result_tag(att.number, 0), att.initiator)
    wants: list[Want] = [first_result]
    if masks.self_seed is not None:
        wants.append((SeedRequest, plan.prefix(att.number) + "seed", att.initiator))
    got = await _await_initiator(ch, plan, att, wants, trace)
    if isinstance(got, SeedRequest):
        try:
            await _send(ch, plan, att.initiator, SeedReveal(got.tag, masks.self_seed))
        except PeerUnreachable as exc:
            return await _initiator_fate(ch, plan, att, trace, exc)
        got = await _await_initiator(ch, plan, att, [first_result], trace)
    if isinstance(got, _Attempt):
        return got
    return await _collect_result(ch, plan, att, got, await total)


@dataclass
class _Trace:
    """Which chunks this member got and passed on in this attempt: its answer to SumWhere.
    `sending`: the tasks forwarding chunks; `settled[k]` is done once chunk k's send was
    acknowledged or failed (SumWhere waits for it: at most a hop, not the report after it)."""
    got: set[int] = dataclasses.field(default_factory=set)
    passed: set[int] = dataclasses.field(default_factory=set)
    sending: dict[int, asyncio.Task] = dataclasses.field(default_factory=dict)
    settled: dict[int, asyncio.Future] = dataclasses.field(default_factory=dict)
    broken: list[PeerUnreachable] = dataclasses.field(default_factory=list)   # the edge to my successor failed

    def stop(self) -> None:
        """Cancel the sends still in flight (the attempt is over for this member)."""
        for task in self.sending.values():
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()      # retrieved: a crashed member's send ends this way


async def _forward_chunks(ch: Channel, plan: _Plan, att: _Attempt, masks: sm.Masks,
                          trace: _Trace) -> _Attempt | bool:
    """Add my contribution to each chunk and pass it on, up to SENDS_IN_FLIGHT_MAX chunks at
    once (a hop's acknowledgement is not waited for before the next chunk is taken). False if a
    ring edge next to me failed (reported to the initiator), the next attempt if one is
    announced meanwhile."""
    pred, succ = att.neighbours(ch.me)
    window = asyncio.Semaphore(plan.send_window())

    def settle(k: int) -> None:
        if not trace.settled[k].done():
            trace.settled[k].set_result(None)

    async def forward(k: int, msg: SumChunk) -> None:
        try:
            await _send(ch, plan, succ, msg)
            trace.passed.add(k)
            settle(k)
            ch.progress(PHASE, len(trace.passed), plan.chunks)
        except PeerUnreachable as exc:   # PeerRefused included, reported as what it is
            settle(k)
            if not trace.broken:
                trace.broken.append(exc)
                if succ != att.initiator:     # else there is nobody to tell: the initiator sees it
                    fault = "refused" if isinstance(exc, PeerRefused) else "unreachable"
                    try:
                        await _send(ch, plan, att.initiator, RingBroken(_broken_tag(plan, att), succ, fault))
                    except PeerUnreachable:
                        pass          # the initiator is gone: our next wait finds out
        finally:
            settle(k)
            window.release()

    for k in range(plan.chunks):
        await window.acquire()
        if trace.broken:
            break
        tag = plan.chunk_tag(att.number, k)
        try:
            got = await _await_initiator(ch, plan, att, [(SumChunk, tag, pred)], trace)
            if isinstance(got, _Attempt):
                return got
            data = _check_chunk(plan, got.data, k, pred)
            trace.got.add(k)
        except (MalformedFrom, _WrongLength) as exc:
            if pred == att.initiator or (isinstance(exc, MalformedFrom) and exc.peer != pred):
                raise    # the initiator sent it: there is nobody to tell, this member fails
            report = RingBroken(_broken_tag(plan, att), pred, "malformed")
            return await _report_broken(ch, plan, att, report, exc, trace) or False
        if trace.broken:
            break
        data = await _compute(plan, masks.added, data, k)
        trace.settled[k] = asyncio.get_running_loop().create_future()
        trace.sending[k] = asyncio.create_task(forward(k, SumChunk(tag, data)))
    if trace.broken:
        exc = trace.broken[0]
        if succ == att.initiator and isinstance(exc, PeerRefused):
            return await _initiator_fate(ch, plan, att, trace, exc)
        return False
    return True


async def _report_broken(ch: Channel, plan: _Plan, att: _Attempt, report: RingBroken, exc: Exception,
                         trace: _Trace) -> _Attempt | None:
    """Tell the initiator which edge failed. If that edge is the one to the initiator, or the
    report cannot reach it, there is nobody to tell: wait for what becomes of the initiator."""
    if report.peer == att.initiator:
        return await _initiator_fate(ch, plan, att, trace, exc)
    try:
        await _send(ch, plan, att.initiator, report)
    except PeerUnreachable as exc2:
        return await _initiator_fate(ch, plan, att, trace, exc2)
    return None


async def _initiator_fate(ch: Channel, plan: _Plan, att: _Attempt, trace: _Trace, exc: Exception) -> _Attempt:
    """The initiator did not take what I sent it. If it refused it, it is alive and will not
    have it: JobError. Else it may be down: wait for its next announcement, or for the failure
    detector to declare it dead (_InitiatorGone: the next in ring order takes over), or JobError
    after a member's patience."""
    if isinstance(exc, PeerRefused):
        raise JobError(f"secure sum '{plan.tag}': the initiator {att.initiator.hex()[:16]} refused "
                       f"our message: {exc.reason}")
    return await _await_initiator(ch, plan, att, [], trace)


async def _await_initiator(ch: Channel, plan: _Plan, att: _Attempt, wants: list[Want], trace: _Trace) -> Any:
    """The next message matching `wants`, or the next attempt if the initiator announces one
    first; JobError after the member's patience (the initiator is presumably gone). Answers the
    initiator's SumWhere meanwhile."""
    restart: list[Want] = [(SumRestart, plan.restart_tag(), att.initiator)]
    if plan.compact:
        restart.append((SumChange, plan.restart_tag(), att.initiator))
    where = (SumWhere, plan.prefix(att.number) + "where", att.initiator)
    deadline = ch.now_ms() + att.patience_ms(plan)
    while True:
        try:
            got = await _recv_first(ch, [*wants, *restart, where], max(0, deadline - ch.now_ms()))
        except PeerDead as exc:
            if exc.peer == att.initiator:
                raise _InitiatorGone() from None
            wants = [w for w in wants if w[2] != exc.peer]   # its chunk will not come: the initiator will say
            continue
        except RecvTimeout:
            raise JobError(
                f"secure sum '{plan.tag}': nothing from the ring or the initiator "
                f"{att.initiator.hex()[:16]} within {att.patience_ms(plan)} ms in attempt "
                f"{att.number}; the initiator is presumably down") from None
        for q in (m for _, m in got if isinstance(m, SumWhere)):
            settled = trace.settled.get(q.chunk)
            if settled is not None and not settled.done():   # its outcome within a hop: the truth
                await asyncio.wait({settled})
            here = SumHere(q.tag, q.chunk, q.chunk in trace.got, q.chunk in trace.passed)
            try:
                await _send(ch, plan, att.initiator, here)
            except PeerUnreachable:
                pass          # the initiator is gone: the next wait finds out
        nxt = await _announced(ch, plan, att, [m for _, m in got])
        if nxt is not None:
            return nxt
        others = [m for _, m in got if not isinstance(m, (SumRestart, SumChange, SumWhere))]
        if others:
            return others[0]
        # only stale announcements (overtaken by a newer one), or a change to a list this member
        # does not hold (it asked for the whole list): keep waiting


async def _announced(ch: Channel, plan: _Plan, att: _Attempt, got: list[Any]) -> _Attempt | None:
    """The attempt the newest of the announcements in `got` starts, applied in order from `att`
    (stale ones ignored); None if none is newer, or if a change (SumChange) was made to a list
    this member does not hold: it then asks the initiator for the whole list (SumListAsk; the
    answer is a SumRestart, taken by the next wait). JobError if this member was left out or
    the initiator gave up."""
    now = att
    for msg in sorted((m for m in got if isinstance(m, (SumRestart, SumChange))), key=lambda m: m.attempt):
        if msg.attempt <= now.number:
            continue
        if isinstance(msg, SumRestart):
            now = _accept_restart(ch, plan, msg)
            continue
        applied = _apply_change(ch, plan, now.participants, msg)
        if applied is None:
            try:
                await _send(ch, plan, plan.first(ch.members), SumListAsk(_list_tag(plan)))
            except PeerUnreachable:
                pass          # the initiator is gone: the next wait finds out
            break
        now = applied
    return None if now is att else now


def _accept_restart(ch: Channel, plan: _Plan, msg: SumRestart) -> _Attempt:
    if not msg.participants:
        raise JobError(msg.reason or f"secure sum '{plan.tag}': the initiator gave up")
    return _accepted(ch, plan, msg.attempt, tuple(msg.participants), msg.reason)


def _apply_change(ch: Channel, plan: _Plan, held: tuple[bytes, ...], msg: SumChange) -> _Attempt | None:
    """The attempt a compact announcement starts from the list this member holds; None if the
    change was made to another list (`base`)."""
    if msg.base != _list_digest(held):
        return None
    members = ch.members
    if any(i >= len(members) for i in (*msg.dropped, *msg.order)):
        raise JobError(f"secure sum '{plan.tag}': the initiator announced an invalid participant list")
    gone = {members[i] for i in msg.dropped}
    if ch.me in gone:
        raise JobError(f"secure sum '{plan.tag}': this site was left out of attempt {msg.attempt} ({msg.reason})")
    kept = [p for p in held if p not in gone]
    first = plan.first(members)
    if msg.order:
        listed = tuple(members[i] for i in msg.order)
        if sorted(listed) != sorted(kept):
            raise JobError(f"secure sum '{plan.tag}': the initiator announced an invalid participant list")
    else:
        listed = (first, *sorted(p for p in kept if p != first))
    return _accepted(ch, plan, msg.attempt, listed, msg.reason)


def _accepted(ch: Channel, plan: _Plan, attempt: int, listed: tuple[bytes, ...], reason: str) -> _Attempt:
    """An announced attempt, once its list is checked: ring order, the initiator first, then any
    order; members of the job, each once, at least 2, this member among them."""
    if len(set(listed)) != len(listed) or not set(listed) <= set(ch.members) \
            or listed[0] != plan.first(ch.members) or len(listed) < 2:
        raise JobError(f"secure sum '{plan.tag}': the initiator announced an invalid participant list")
    if ch.me not in listed:
        raise JobError(f"secure sum '{plan.tag}': this site was left out of attempt {attempt} ({reason})")
    return _Attempt(attempt, listed)


async def _collect_result(ch: Channel, plan: _Plan, att: _Attempt, first: SumResult,
                          total: np.ndarray) -> SumOutcome:
    total[plan.span(0)] = _check_chunk(plan, first.data, 0, att.initiator)
    for k in range(1, plan.chunks):
        try:
            _, msg = await ch.recv(SumResult, plan.result_tag(att.number, k), src=att.initiator,
                                   timeout_ms=att.patience_ms(plan))
        except (RecvTimeout, PeerDead):
            # no takeover once part of the total is here: a re-run's total would tell this member
            # the difference, the vectors of the members left out of it
            raise JobError(f"secure sum '{plan.tag}': result chunk {k} did not arrive within "
                           f"{att.patience_ms(plan)} ms; the initiator is presumably down") from None
        total[plan.span(k)] = _check_chunk(plan, msg.data, k, att.initiator)
    return SumOutcome(total=total, participants=tuple(sorted(att.participants)), attempts=att.number)

