"""The secure sum's initiator (fedpeer/protocols/securesum/api.py: "Timeouts and failures", "Blame"):
runs attempts, weighs the members' reports, chooses the next ring, removes the masks and
delivers the total."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.protocols.securesum import masks as sm
from fedpeer.protocols.securesum.core import (
    CHUNKS_IN_FLIGHT_MAX,
    PAIRED_MODES,
    PHASE,
    SumOutcome,
    _Attempt,
    _broadcast,
    _broken_tag,
    _check_chunk,
    _compute,
    _Masks,
    _new_total,
    _Plan,
    _recv_first,
    _send,
    _list_digest,
    _list_tag,
    _WrongLength,
)
from fedpeer.protocols.securesum.wire import (
    ATTEMPTS_MAX,
    REASON_BYTES_MAX,
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
from fedpeer.runtime.channel import Channel, MalformedFrom, NodeId, PeerDead, PeerRefused, PeerUnreachable, RecvTimeout

Dispute = frozenset[bytes]     # two members on a failed ring edge, neither proven at fault


class _RingFault(Exception):
    """An attempt failed. `suspects` are dropped from the next attempt (on the initiator's own
    evidence); `responsive` are kept whatever the failure detector says, since they just answered
    us (a lagging detector would otherwise shrink the ring for nothing); `disputes` are failed
    edges between two live members whose claims the initiator cannot check (module docstring)."""

    def __init__(self, reason: str, suspects: frozenset[bytes] = frozenset(),
                 responsive: frozenset[bytes] = frozenset(), disputes: frozenset[Dispute] = frozenset(),
                 unconfirmed: frozenset[bytes] = frozenset()) -> None:
        super().__init__(reason)
        self.reason, self.suspects, self.responsive = reason, suspects, responsive
        self.disputes, self.unconfirmed = disputes, unconfirmed   # unconfirmed: claimed unreachable

    @staticmethod
    def merge(faults: Sequence[BaseException]) -> _RingFault:
        rings = [f for f in faults if isinstance(f, _RingFault)]
        return _RingFault("; ".join(f.reason for f in rings),
                          *(frozenset().union(*(getattr(f, name) for f in rings))
                            for name in ("suspects", "responsive", "disputes", "unconfirmed")))


async def _lead(ch: Channel, plan: _Plan, att: _Attempt) -> SumOutcome:
    disputes: set[Dispute] = set()      # kept across attempts: a second one names the culprit
    current = [att]                     # the attempt running now: what a SumListAsk is answered with
    lists = asyncio.create_task(_serve_lists(ch, plan, current)) if plan.compact else None
    try:
        while True:
            try:
                total = await _lead_attempt(ch, plan, att)
            except _RingFault as fault:
                ch.discard(plan.prefix(att.number))
                disputes |= fault.disputes
                att = current[0] = await _next_attempt(ch, plan, att, fault, disputes)
                continue
            except JobError as exc:       # members disagree on the vector: tell them, then fail
                await _broadcast(ch, plan, att.participants[1:],
                                 SumRestart(plan.restart_tag(), att.number + 1, (), _said(str(exc))))
                raise
            await _deliver(ch, plan, att, total)
            return SumOutcome(total=total, participants=tuple(sorted(att.participants)), attempts=att.number)
    finally:
        if lists is not None:
            lists.cancel()
            await asyncio.gather(lists, return_exceptions=True)     # retrieved, whatever ended it


async def _serve_lists(ch: Channel, plan: _Plan, current: list[_Attempt]) -> None:
    """Compact sums: answer a participant that could not apply an announcement (SumListAsk: its
    list is not the one the change was made to) with the current attempt's whole list, until the
    sum ends (cancelled). Rare: a member misses an announcement only when its mailbox dropped it."""
    while True:
        att = current[0]
        try:
            src, _ = await ch.recv(SumListAsk, _list_tag(plan), timeout_ms=att.patience_ms(plan))
        except (RecvTimeout, MalformedFrom, PeerDead):
            continue
        att = current[0]
        if src in att.participants and src != ch.me:
            try:
                await _send(ch, plan, src, SumRestart(plan.restart_tag(), att.number, att.participants, ""))
            except PeerUnreachable:
                pass                  # the next attempt finds it, as any member that does not answer


async def _lead_attempt(ch: Channel, plan: _Plan, att: _Attempt) -> np.ndarray:
    """One ring run (and, in pairwise mode, the seed round). Raises _RingFault on failure."""
    masks = _Masks(ch, plan, att)
    pred, succ = att.neighbours(ch.me)
    total_ready = _new_total(plan)       # allocated while the first chunks go round
    window = asyncio.Semaphore(CHUNKS_IN_FLIGHT_MAX)

    async def send_chunk(k: int) -> None:
        data = await _compute(plan, masks.contribution, k)     # my vector, my masks, the ring mask
        try:
            await _send(ch, plan, succ, SumChunk(plan.chunk_tag(att.number, k), data))
        except PeerUnreachable as exc:   # refused or unreachable: my own evidence either way
            raise _RingFault(f"successor {succ.hex()[:16]} "
                             f"{'refused' if isinstance(exc, PeerRefused) else 'did not take'} "
                             f"our chunk: {exc}", frozenset({succ})) from None

    async def send_chunks(group: asyncio.TaskGroup) -> None:
        for k in range(plan.chunks):     # several sends at once: a hop's latency is not paid per chunk
            await window.acquire()
            group.create_task(send_chunk(k))

    async def receive_chunks() -> None:
        nonlocal total
        total = await total_ready
        for k in range(plan.chunks):
            data = await _await_return(ch, plan, att, k, pred)
            await _compute(plan, sm.unmask_ring, data, masks, k, total[plan.span(k)])
            window.release()
            ch.progress(PHASE, k + 1, plan.chunks)

    total = np.empty(0, dtype=np.uint64)
    try:
        async with asyncio.TaskGroup() as group:   # pipelined: sending does not wait for returns
            group.create_task(send_chunks(group))
            group.create_task(receive_chunks())
    except BaseExceptionGroup as eg:
        if not all(isinstance(e, (_RingFault, JobError)) for e in eg.exceptions):
            raise                      # a bug or a cancellation: not ours to interpret
        fatal = [e for e in eg.exceptions if isinstance(e, JobError)]
        raise (fatal[0] if fatal else _RingFault.merge(eg.exceptions)) from None
    if plan.mode in PAIRED_MODES:
        await _unmask_self(ch, plan, att, total)
    return total


async def _await_return(ch: Channel, plan: _Plan, att: _Attempt, k: int, pred: NodeId) -> np.ndarray:
    """Chunk k back from my predecessor, or a _RingFault: a ring report weighed by `_judge`, a
    malformed chunk (my own gate's evidence against my predecessor), or a timeout."""
    wants = [(SumChunk, plan.chunk_tag(att.number, k), pred), (RingBroken, _broken_tag(plan, att), None)]
    deadline = ch.now_ms() + att.round_trip_ms(plan)
    while True:
        try:
            got = await _recv_first(ch, wants, max(0, deadline - ch.now_ms()))
        except RecvTimeout:
            raise await _locate_stall(ch, plan, att, k, pred) from None
        except PeerDead as exc:       # my predecessor is down: its chunk will not come
            raise _RingFault(f"{exc.peer.hex()[:16]} was declared dead holding chunk {k}",
                             frozenset({exc.peer})) from None
        except MalformedFrom as exc:
            raise _RingFault(f"{exc.peer.hex()[:16]} sent a malformed chunk {k}: {exc.reason}",
                             frozenset({exc.peer})) from None
        faults = [_judge(ch, att, src, msg) for src, msg in got if isinstance(msg, RingBroken)]
        if any(faults):
            raise _RingFault.merge([f for f in faults if f is not None])
        chunks = [m for _, m in got if isinstance(m, SumChunk)]
        if chunks:
            try:
                return _check_chunk(plan, chunks[0].data, k, pred)
            except _WrongLength as exc:
                raise _RingFault(str(exc), frozenset({pred})) from None
        # only reports from outside this attempt's ring: they prove nothing, keep waiting


async def _locate_stall(ch: Channel, plan: _Plan, att: _Attempt, k: int, pred: NodeId) -> _RingFault:
    """Chunk k did not come back and nobody reported why: ask every member whether it got the
    chunk and passed it on, and walk the ring from me to the first link whose two ends disagree
    (module docstring, "Blame")."""
    members, tag = att.participants[1:], plan.prefix(att.number) + "where"
    unreachable = await _broadcast(ch, plan, members, SumWhere(tag, k))
    deadline = ch.now_ms() + 2 * plan.hop_timeout_ms
    answers: dict[bytes, SumHere] = {}
    for member in (m for m in members if m not in unreachable):
        try:
            _, msg = await ch.recv(SumHere, tag, src=member, timeout_ms=max(0, deadline - ch.now_ms()))
            if msg.chunk == k:
                answers[member] = msg
        except (RecvTimeout, MalformedFrom, PeerDead):
            pass
    why, heard = f"chunk {k} did not come back within {att.round_trip_ms(plan)} ms", frozenset(answers)
    prev = ch.me
    for member in members:
        name, here = member.hex()[:16], answers.get(member)
        if here is None:
            return _RingFault(f"{why}; {name} did not say where it is", frozenset({member}), heard)
        if not here.got and prev == ch.me:
            return _RingFault(f"{why}; {name} denies the chunk it acknowledged", frozenset({member}), heard)
        if not here.got:
            return _RingFault(f"{why}; {prev.hex()[:16]} says it passed it on, {name} never got it",
                              responsive=heard, disputes=frozenset({frozenset({prev, member})}))
        if not here.passed:
            return _RingFault(f"{why}; {name} got it, did not pass it on and did not say why",
                              frozenset({member}), heard)
        prev = member
    try:    # everyone says it passed the chunk on: unless it came in just now, the last one lies
        await ch.recv(SumChunk, plan.chunk_tag(att.number, k), src=pred, timeout_ms=0)
        return _RingFault(f"{why}; it came back late", responsive=heard)
    except (RecvTimeout, MalformedFrom, PeerDead):
        return _RingFault(f"{why}; {prev.hex()[:16]} says it passed it to me", frozenset({prev}), heard)


def _judge(ch: Channel, att: _Attempt, src: NodeId, report: RingBroken) -> _RingFault | None:
    """What a member's ring report proves to the initiator (module docstring, "Blame"): None
    for a report from outside the ring; the reporter for a claim that is false on its face;
    the accused for an unreachable one the failure detector confirms; else a dispute."""
    if src == ch.me or src not in att.participants:
        return None
    pred, succ = att.neighbours(src)
    who, other = src.hex()[:16], report.peer.hex()[:16]
    if report.peer != (pred if report.fault == "malformed" else succ) or report.peer == ch.me:
        # not its neighbour on that side, or me (I know what I sent and I am answering): a lie
        return _RingFault(f"{who} made a false ring report about {other}", frozenset({src}))
    if report.fault == "unreachable" and not ch.alive(report.peer):
        return _RingFault(f"{who} could not reach {other}, which is down", frozenset({report.peer}))
    unconfirmed = frozenset({report.peer}) if report.fault == "unreachable" else frozenset()
    return _RingFault(f"{who} reports a {report.fault} chunk between itself and {other}",
                      disputes=frozenset({frozenset({src, report.peer})}), unconfirmed=unconfirmed)


async def _unmask_self(ch: Channel, plan: _Plan, att: _Attempt, total: np.ndarray) -> None:
    """Pairwise mode: every chunk is back; collect the members' self-mask seeds and remove the
    self masks. Members whose seed is missing are suspects, those who answered are kept."""
    members = att.participants[1:]
    tag = plan.prefix(att.number) + "seed"
    unreachable = await _broadcast(ch, plan, members, SeedRequest(tag))
    deadline = ch.now_ms() + 2 * plan.hop_timeout_ms
    seeds: dict[bytes, bytes] = {}
    for member in members:
        if member in unreachable:
            continue
        try:
            _, msg = await ch.recv(SeedReveal, tag, src=member, timeout_ms=max(0, deadline - ch.now_ms()))
            seeds[member] = msg.seed
        except (RecvTimeout, MalformedFrom, PeerDead):    # a malformed reveal is no reveal
            pass
    missing = frozenset(members) - set(seeds)
    if missing:
        names = ", ".join(m.hex()[:16] for m in sorted(missing))
        raise _RingFault(f"no self-mask seed from {names}", missing, frozenset(seeds))
    for k in range(plan.chunks):     # a chunk at a time: 64 MiB of masks in one go held the loop ~150 ms
        await _compute(plan, sm.unmask_self, total[plan.span(k)], list(seeds.values()), k)
        await ch.sleep_ms(0)


def _culprits(disputes: set[Dispute], members: Sequence[bytes]) -> set[bytes]:
    """Members in disputes with two or more others still in the sum. An honest member only ever
    disputes a faulty one, so with one faulty member that member is the only one found; with
    several, those with the most partners go first (the fewest faults that explain them)."""
    left, out = set(members), set()
    while True:
        partners = {p: {q for d in disputes if p in d and d <= left for q in d - {p}} for p in left}
        most = max((len(v) for v in partners.values()), default=0)
        if most < 2:
            return out
        worst = {p for p, v in partners.items() if len(v) == most}
        out |= worst
        left -= worst


def _ring_order(me: bytes, members: Sequence[bytes], disputes: set[Dispute]) -> tuple[bytes, ...] | None:
    """The next ring: me first, the others in key order, except that no two members in a dispute
    are neighbours (so the same edge cannot fail twice). Called after `_culprits`, so every member
    is in at most one dispute: the first of each pair, then the undisputed, then the seconds.
    None if impossible (two disputing members and nobody else to put between them)."""
    others = sorted(p for p in members if p != me)
    pairs = sorted(tuple(sorted(d)) for d in disputes if d <= set(others))
    if not pairs:
        return (me, *others)
    paired = {p for pair in pairs for p in pair}
    order = [a for a, _ in pairs] + [p for p in others if p not in paired] + [b for _, b in pairs]
    if any(frozenset(edge) in disputes for edge in zip(order, order[1:])):
        return None
    return (me, *order)


def _out_of_attempts(plan: _Plan, number: int, charged: int) -> bool:
    """Whether attempt `number` may not run. Attempts that lose members (dead, unreachable, proven
    faulty: the participants shrink) make progress and do not count against attempts_max; those
    that drop nobody (a dispute kept apart, a chunk that came back late) do (`charged`, the first
    attempt included). ATTEMPTS_MAX bounds them all (the attempt number on the wire). attempts_max
    1 keeps a sum to one attempt whatever happens: the DP kinds' sums, which must not be re-run
    over fewer members."""
    if number > ATTEMPTS_MAX:
        return True
    if plan.attempts_max == 1:
        return number > 1
    return charged > plan.attempts_max


async def _next_attempt(ch: Channel, plan: _Plan, att: _Attempt, fault: _RingFault,
                        disputes: set[Dispute], held: Sequence[bytes] | None = None) -> _Attempt:
    """Drop suspects, dead members and culprits of disputes; announce the survivors in a ring
    order that separates disputing members, with a new attempt number (again, while
    announcements find more unreachable members); JobError when out of attempts
    (`_out_of_attempts`). `held`: the list the members hold, if not att's (a takeover's)."""
    reason = fault.reason
    survivors = [p for p in att.participants if p == ch.me or p in fault.responsive
                 or (p not in fault.suspects and ch.alive(p))]
    targets = [p for p in att.participants if p != ch.me]
    held = tuple(att.participants if held is None else held)
    # Members claimed unreachable hear first: one that has just crashed (before the failure
    # detector says so) is found before anyone hears this attempt number, which is then reused.
    first = fault.unconfirmed
    number = att.number
    while True:
        number += 1
        culprits = _culprits(disputes, survivors)
        if culprits:
            survivors = [p for p in survivors if p not in culprits]
            reason += "; dropped " + ", ".join(p.hex()[:16] for p in sorted(culprits)) + \
                " for disputes with two or more members"
        order = _ring_order(ch.me, survivors, disputes) if len(survivors) >= 2 else None
        charged = att.charged + (len(survivors) >= len(att.participants))
        exhausted = _out_of_attempts(plan, number, charged)
        if order is None or exhausted:
            raise await _give_up(ch, plan, targets, number, survivors, disputes, reason, exhausted)
        early = [p for p in targets if p in first and p in survivors]
        unreachable = await _announce(ch, plan, early, number, held, order, reason)
        first = frozenset()
        if early and unreachable >= set(early):
            number -= 1                   # nobody has heard this number: it is still fresh
        else:
            unreachable |= await _announce(ch, plan, [p for p in targets if p not in early], number, held,
                                           order, reason)
            held = order                  # what every member still reachable holds now
        targets = [p for p in targets if p not in unreachable]
        lost = [p for p in survivors if p in unreachable]
        if not lost:
            return _Attempt(number, order, charged)
        survivors = [p for p in survivors if p not in unreachable]
        reason = "unreachable when announcing the next attempt: " + ", ".join(p.hex()[:16] for p in lost)


async def _announce(ch: Channel, plan: _Plan, targets: Sequence[NodeId], number: int, held: Sequence[bytes],
                    order: tuple[bytes, ...], reason: str) -> set[NodeId]:
    """Tell `targets` that attempt `number` runs over `order`; returns those unreachable. A
    compact sum sends the change from `held` (the list the members hold): who is dropped, as
    places in the job's members, and the order only when it is not the usual one, in bytes
    growing with the members dropped, not with the participants; the members dropped also get
    the reason. Otherwise the whole list, to everyone (SumRestart)."""
    if not plan.compact:
        return await _broadcast(ch, plan, targets, SumRestart(plan.restart_tag(), number, order, _said(reason)))
    place = {m: i for i, m in enumerate(ch.members)}
    kept = set(order)
    assert kept <= set(held), "an announcement only ever drops participants"
    usual = (order[0], *sorted(order[1:]))
    stay = SumChange(plan.restart_tag(), number, _list_digest(held), tuple(place[p] for p in held if p not in kept),
                     () if order == usual else tuple(place[p] for p in order), "")
    leave = dataclasses.replace(stay, reason=_said(reason))
    unreachable = await asyncio.gather(_broadcast(ch, plan, [p for p in targets if p in kept], stay),
                                       _broadcast(ch, plan, [p for p in targets if p not in kept], leave))
    return unreachable[0] | unreachable[1]


def _said(reason: str) -> str:
    """A reason as announcements carry it: at most REASON_BYTES_MAX bytes, which every receiver's
    gate allows (a reason naming many members dropped at once is longer; a member whose gate
    refused its announcement would be dropped for it)."""
    raw = reason.encode()
    return reason if len(raw) <= REASON_BYTES_MAX else raw[:REASON_BYTES_MAX - 3].decode(errors="ignore") + "..."


async def _give_up(ch: Channel, plan: _Plan, targets: Sequence[NodeId], number: int,
                   survivors: Sequence[bytes], disputes: set[Dispute], reason: str, exhausted: bool) -> JobError:
    """Tell every member the sum failed and why; the error to raise."""
    if len(survivors) < 2:
        detail = " with fewer than 2 participants left"
    elif exhausted:
        detail = ""
    else:
        pair = next(d for d in disputes if d <= set(survivors))
        a, b = sorted(pair)
        detail = (f": {a.hex()[:16]} and {b.hex()[:16]} each blame the other and no other member "
                  f"can stand between them; one of the two is faulty")
    why = f"secure sum '{plan.tag}' failed after {number - 1} attempt(s){detail}; last failure: {reason}"
    await _broadcast(ch, plan, targets, SumRestart(plan.restart_tag(), number, (), _said(why)))
    return JobError(why)


async def _deliver(ch: Channel, plan: _Plan, att: _Attempt, total: np.ndarray) -> None:
    """Send the total to every member, chunk by chunk, up to SENDS_IN_FLIGHT_MAX chunks at once
    to each (fewer for large chunks: `send_window`). A member that died after the ring came back
    is not waited for: its vector is in the sum, the others get the same outcome."""
    members = att.participants[1:]

    async def to(member: NodeId) -> None:
        try:
            await _send_all(ch, plan, member, (SumResult(plan.result_tag(att.number, k), total[plan.span(k)])
                                               for k in range(plan.chunks)), plan.send_window(len(members)))
        except PeerUnreachable:
            pass

    await asyncio.gather(*(to(m) for m in members))


async def _send_all(ch: Channel, plan: _Plan, dst: NodeId, messages: Any, window_size: int) -> None:
    """Send every message of the iterable to `dst`, `window_size` at a time; the first failure
    (PeerUnreachable) stops the rest and is raised."""
    window = asyncio.Semaphore(window_size)

    async def one(msg: object) -> None:
        try:
            await _send(ch, plan, dst, msg)
        finally:
            window.release()

    try:
        async with asyncio.TaskGroup() as group:
            for msg in messages:
                await window.acquire()
                group.create_task(one(msg))
    except BaseExceptionGroup as eg:
        unreachable = [e for e in eg.exceptions if isinstance(e, PeerUnreachable)]
        if len(unreachable) < len(eg.exceptions):
            raise                      # a bug or a cancellation: not ours to interpret
        raise unreachable[0] from None

