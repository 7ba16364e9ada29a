"""Members lost mid-job, for the job kinds without a leader (histogram XGBoost, logreg, FedAvg /
mlp): every member runs the same deterministic sequence of secure sums, and this module keeps,
identically at every survivor, who the job's members still are.

* `Epochs.sum` runs one secure sum over a scope (default: every current member) under the tag
  `<prefix>/e<E>/<name>` and says which members of the scope it went without (`Summed.lost`).
  Every survivor of a completed sum gets the same `participants` (the secure sum's guarantee,
  fedpeer/protocols/securesum/api.py), hence the same `lost`.
* A sum that fails outright (the secure sum gives up: with three members, a crash reported by one
  member against its ring successor is a dispute no ring order can route around) waits up to
  DEAD_WAIT_MS for this member's failure detector (`ch.alive`, polled every POLL_MS): the scope's
  members it declares dead are `lost` and the sum has no total (`Summed.total` None: the caller
  redoes it over the survivors under a fresh tag); if it declares nobody dead, the sum's JobError
  stands. A failure that names a member and involves no death (Equivocation: members hold
  different copies of what it sent them; SegmentRefused: an owner refused its total) stands at
  once.
* `Epochs.new_epoch(lost)`, called by every survivor on the same `lost` of a sum over every
  member: the members without them, epoch E + 1 (so every later tag, hence every mask, is
  fresh), and `lost` extended. What a job keeps of its work across a loss is its own business
  (xgbhist.py, logreg.py, fedavg.py say what).

A member left out of a sum (slow, cut off) gets JobError from the secure sum and fails alone
(those kinds declare `member_failure_aborts=False`); the others see it lost in that sum or the next.

Views (`views=True`; capability EPOCH_VIEWS, fedpeer/jobs/capabilities.py: every member must
have it): survivors never split. Without them each survivor moves on its own failure detector's
word, and detectors disagree (one declares a killed member dead, another never does because it
restarted first), and a sum can complete at one member and fail at another (a member lost while
the last messages travel): one survivor then waits in epoch E for members already in E + 1
(7 of 14 real runs of a restart in a 50-round histogram job).
* A member that moves to a new epoch sends its view, the whole list of members lost so far
  (`EpochView`, authenticated to each recipient like every message), to every member of the new
  epoch. A member whose sum failed takes, besides what its own detector declares, the lost of
  every view from a current member that names neither itself nor the sender: the union. So every
  survivor ends in the epoch of the union of what any survivor saw; the epoch's tags carry a
  digest of its lost list, so members that briefly disagree never mix their sums. A view that
  arrives while a sum runs ends it VIEW_GRACE_HOPS hops later unless it completed meanwhile (its
  sender may hold that sum's total, completed without a member, and this member's is then on its
  way). The members just lost get the view too: one that is alive (left out of a sum while it
  lagged) fails alone at once, instead of waiting in the old epoch for members that moved on.
* A member whose sum failed also asks the scope's members, every PROBE_MS while it waits (its
  view, which changes nothing at a member that holds it already), and takes as lost any that
  refuses it as a job it does not run ("unknown_job": it restarted and its job is gone; the refusal is authenticated).
* `finish()`, after the job's last sum: every member tells the others it ended epoch E
  (`EpochDone`) and waits for each one's word, or its view (the last sum failed there: everyone
  goes back to the survivors' resume point), or its death, or its refusal; at most END_WAIT
  (a member's patience in a sum plus DEAD_WAIT_MS) for a member silent and alive, then it is done.

Rejoins (`rejoin=True`, with views; capability JOB_REJOIN, fedpeer/jobs/capabilities.py: every
member must have it): a member restarted mid-job comes back at a boundary where the kind can take
it (a tree, a round). Who is in is kept as a count per member of its moves out and back in
(`changes`: odd, out; even, in; at most REJOINS_MAX returns), so the state only grows and two
states merge by taking each member's larger count: a view carries it (each member named as many
times as it moved, so a job without rejoins sends exactly the views of before), and every
survivor ends in the merge of every survivor's state, as for losses alone. A tag names the
counts, so no tag comes twice even when a member comes back.
* The restarted member (`ask`) asks every other member (`RejoinAsk`, every ASK_EVERY_MS) until a
  current member's view names it back in, or every member refused (`RejoinRefused`, or the job
  is not running there), or REJOIN_WAIT_MS passed: JobError with the reason, this member only.
* A member that hears a member of its current epoch ask has the proof that it restarted and lost
  its part of the job: after a failed sum it is lost at once (it does not refuse the job's
  messages while it asks, so no refusal would tell). At a boundary (`admit`), the members that
  asked and are out come back in: a new epoch, told to every member as a view (the others leave
  their running sum for it, as for a loss); or, where the kind says why not (too near the end),
  each is told why in one line.
* After the resume point that follows, every member that never left sends each member back in
  the digest of the state so far (`send_state`); the first of them in key order also sends the
  state; the member back in takes it only if every digest is the same and the state matches
  (`receive_state`), else it fails alone and is lost again. A member that asks never becomes a
  member by its own word: only a current member's view brings it in, and a view names members
  of the job only (a rejoin never adds a stranger).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from fedpeer.base.logs import fields
from fedpeer.errors import JobError
from fedpeer.protocols.securesum.api import (
    Equivocation,
    OwnerFn,
    SegmentRefused,
    secure_reduce_map,
    secure_results_check,
    secure_sum,
)
from fedpeer.protocols.securesum.wire import PARTICIPANTS_MAX, WIRE_TAG_BYTES_MAX
from fedpeer.runtime.channel import PeerRefused, RecvTimeout, SubChannel
from fedpeer.wire import frame as wire

T = TypeVar("T")
log = logging.getLogger("fedpeer.jobs.epochs")
DEAD_WAIT_MS = 30_000            # after a failed sum, how long to wait for the failure detector to name the dead
POLL_MS = 200                    # how often the failure detector's view is read meanwhile
VIEW_GRACE_HOPS = 1              # with views, how long a running sum may still complete after a view
PROBE_MS = 1_000                 # with views, how often the scope is asked meanwhile (a multiple of POLL_MS)
UNKNOWN_JOB = "unknown_job"      # a member's refusal of a job it does not run (jobs/lifecycle/registry.py)
REJOINS_MAX = 1                  # times one member may come back into one job (then it stays out)
ASK_EVERY_MS = 1_000             # a restarted member asks to rejoin this often (a multiple of POLL_MS) ...
REJOIN_WAIT_MS = 120_000         # ... for at most this long (a boundary may be a tree away, after a loss)
STATE_WAIT_HOPS = 3              # a member back in waits this many hop timeouts for the state so far
STATE_BYTES_MAX = 32 * 1024 * 1024   # the state so far in one message (the frame cap is 64 MiB)
REFUSAL_BYTES_MAX = 512          # a refusal's one line


class LeftBehind(JobError):
    """A current member's view names this member lost: the others went on without it. It fails
    alone, at once (module docstring, "Views")."""


@dataclass(frozen=True)
class EpochView:
    """Every member the sender has lost so far in this job (module docstring, "Views")."""

    tag: str
    lost: tuple[bytes, ...]
    WAITING_FOR = "a survivor's view of the lost members"


@dataclass(frozen=True)
class EpochDone:
    """The sender ended the job in the epoch of `tag` (module docstring, "Views")."""

    tag: str
    WAITING_FOR = "word that a member ended the job"


@dataclass(frozen=True)
class RejoinAsk:
    """A restarted member asks to come back into the job (module docstring, "Rejoins")."""

    tag: str
    WAITING_FOR = "a restarted member's request to rejoin"


@dataclass(frozen=True)
class RejoinRefused:
    """Why a member will not take a restarted member back, in one line."""

    tag: str
    reason: str
    WAITING_FOR = "a member's answer to this site's request to rejoin"


@dataclass(frozen=True)
class RejoinState:
    """The state so far for a member back in: its SHA-256, and from one member the state itself."""

    tag: str
    digest: bytes
    state: bytes
    WAITING_FOR = "the job's state so far, from the members that never left"


def _register() -> None:
    tag = wire.v_str(WIRE_TAG_BYTES_MAX)
    # a member moved out and back in is named once per move: up to 2 * REJOINS_MAX + 1 times
    wire.register("epoch_view", EpochView,
                  {"tag": tag, "lost": wire.v_list(wire.NODE_ID, PARTICIPANTS_MAX * (2 * REJOINS_MAX + 1))},
                  to_body=lambda m: {"tag": m.tag, "lost": list(m.lost)},
                  from_body=lambda body: EpochView(body["tag"], tuple(body["lost"])))
    wire.register("epoch_done", EpochDone, {"tag": tag})
    wire.register("rejoin_ask", RejoinAsk, {"tag": tag})
    wire.register("rejoin_refused", RejoinRefused, {"tag": tag, "reason": wire.v_str(REFUSAL_BYTES_MAX)})
    wire.register("rejoin_state", RejoinState, {"tag": tag, "digest": wire.v_bytes(exact=32),
                                                "state": wire.v_bytes(max_bytes=STATE_BYTES_MAX)})


_register()


class Lost(Exception):
    """A sum completed (or was given up) without some current members: the job goes on over the
    survivors, in a new epoch."""

    def __init__(self, lost: tuple[bytes, ...]) -> None:
        self.lost = lost
        super().__init__(f"{len(lost)} member(s) lost")


@dataclass(frozen=True)
class Summed:
    tag: str
    total: np.ndarray | None        # None: the sum failed and `lost` were declared dead; redo it without them
    lost: tuple[bytes, ...]         # the members of the scope it went without, in key order


@dataclass(frozen=True)
class Mapped:
    tag: str
    results: tuple[np.ndarray, ...] | None   # None: the reduce-map failed and `lost` were declared dead
    lost: tuple[bytes, ...]
    digests: tuple[bytes, ...]               # SHA-256 of each result (for a later check_results)


class Epochs:
    """A member's view of the job's current members, epoch and lost members (module docstring)."""

    def __init__(self, ch: Any, prefix: str, mode: str, hop_timeout_ms: int, *, views: bool = False,
                 rejoin: bool = False, compact: bool = False) -> None:
        self.ch, self.prefix, self.mode, self.hop_timeout_ms = ch, prefix, mode, hop_timeout_ms
        self.compact = compact          # the sums' compact messages (securesum/api.py)
        self.original: tuple[bytes, ...] = tuple(ch.members)
        self.members: tuple[bytes, ...] = self.original
        self.epoch, self.sums = 0, 0
        self.changes: dict[bytes, int] = {}          # member -> its moves out and back in (odd: out), first first
        self.views = views
        self.rejoin = rejoin and views
        self.joined: list[bytes] = []                # members back in that have not been sent the state yet
        self._telling: set[asyncio.Task] = set()     # views on their way (new_epoch is not async)
        self._heard: dict[bytes, int] = {}           # every member's count in the views taken so far
        self._asked: set[bytes] = set()              # members that asked to rejoin (rejoin)
        self._restarted: set[bytes] = set()          # ... while in the current epoch: they lost the job

    @property
    def lost(self) -> list[bytes]:     # the members out now, in the order they were first lost
        return [m for m, c in self.changes.items() if c % 2]

    @property
    def rejoined(self) -> list[bytes]:     # (some may have been lost again since)
        return [m for m, c in self.changes.items() if c >= 2]

    def _count_max(self) -> int:
        return 2 * REJOINS_MAX + 1 if self.rejoin else 1

    def _counted(self) -> list[bytes]:    # each member once per move, in key order: the views' and tags' form
        return sorted(m for m, c in self.changes.items() for _ in range(c))

    def tag(self, name: str) -> str:
        if not self.views or not self.changes:
            return f"{self.prefix}/e{self.epoch}/{name}"
        # named by who moved, not by how many moves this member made to get there: members that
        # took the same losses in one move or in two meet under the same tags (the counts only
        # grow, so no tag comes twice)
        counted = self._counted()
        digest = hashlib.sha256(b"".join(counted)).hexdigest()[:12]
        return f"{self.prefix}/e{len(counted)}-{digest}/{name}"

    async def sum(self, name: str, vector: np.ndarray, *, scope: tuple[bytes, ...] | None = None,
                  hop_timeout_ms: int | None = None) -> Summed:
        """One secure sum over `scope` (default: every current member); JobError when it fails
        and the failure detector declares none of the scope dead within DEAD_WAIT_MS."""
        scope = scope or self.members
        tag = self.tag(name)
        out, dead = await self._or_dead(scope, secure_sum(SubChannel(self.ch, scope), tag, vector, mode=self.mode,
                                                          hop_timeout_ms=hop_timeout_ms or self.hop_timeout_ms,
                                                          compact=self.compact))
        if dead:
            return Summed(tag, None, dead)     # the sum gave up on a member that has since died
        assert out is not None
        self.sums += 1
        return Summed(tag, out.total, tuple(m for m in scope if m not in out.participants))

    async def reduce_map(self, name: str, vector: np.ndarray, bounds: Sequence[int], owner_fn: OwnerFn, *,
                         hop_timeout_ms: int | None = None, check: bool = True) -> Mapped:
        """`sum`'s twin for a secure reduce-map over every current member (securesum/reducemap.py):
        each owner's result, or the members it went without. An owner's refusal (SegmentRefused)
        ends it at once: nobody died."""
        tag = self.tag(name)
        out, dead = await self._or_dead(self.members, secure_reduce_map(
            SubChannel(self.ch, self.members), tag, vector, bounds, owner_fn,
            hop_timeout_ms=hop_timeout_ms or self.hop_timeout_ms, check=check, compact=self.compact))
        if dead:
            return Mapped(tag, None, dead, ())
        assert out is not None
        self.sums += 1
        return Mapped(tag, out.results, (), out.digests)

    async def check_results(self, name: str, digests: Sequence[bytes]) -> tuple[bytes, ...]:
        """securesum's results check over every current member: the members it went without
        (declared dead after it failed), or (); JobError when it failed otherwise."""
        _, dead = await self._or_dead(self.members, secure_results_check(
            SubChannel(self.ch, self.members), self.tag(name), digests, hop_timeout_ms=self.hop_timeout_ms,
            compact=self.compact))
        return dead

    async def _or_dead(self, scope: tuple[bytes, ...], run: Awaitable[T]) -> tuple[T | None, tuple[bytes, ...]]:
        """(run's outcome, ()), or, when it fails with a JobError, (None, the members of `scope`
        the failure detector then declares dead); the JobError stands if it declares none, and at
        once when it names a member and involves no death (module docstring). With views, a view
        that loses more members, arriving while the sum runs, ends it VIEW_GRACE_HOPS hops later
        if it has not completed by then: (None, those)."""
        try:
            if not self.views:
                return await run, ()
            return await self._unless_viewed(run)
        except (SegmentRefused, Equivocation, LeftBehind):
            raise
        except JobError:
            dead = await self.declared_dead(scope)
            if not dead:
                raise
            return None, dead

    async def _unless_viewed(self, run: Awaitable[T]) -> tuple[T | None, tuple[bytes, ...]]:
        """run's outcome, or (None, the lost) if a view losing more members arrives and the sum
        has not completed VIEW_GRACE_HOPS hops later. Its sender has moved on: if the sum went on
        without a member, its total is on its way to this member too (the grace); else the sum
        cannot complete, and waiting out its timeouts would make this member late for the next
        epoch, late enough for the others to leave it out."""
        task = asyncio.ensure_future(run)
        viewer = asyncio.ensure_future(self._next_view())
        try:
            await asyncio.wait({task, viewer}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await asyncio.wait({task}, timeout=VIEW_GRACE_HOPS * self.hop_timeout_ms / 1000)
        finally:
            if not viewer.done():
                viewer.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if not task.cancelled():
            return task.result(), ()         # completed (or failed) first: that stands
        return None, viewer.result()

    async def _next_view(self) -> tuple[bytes, ...]:
        """Wait for views until one loses members beyond ours; those members."""
        while True:
            lost = await self._viewed(wait_ms=self._end_wait_ms())
            if lost:
                return lost

    def new_epoch(self, changed: tuple[bytes, ...]) -> None:
        """Every survivor, on the same `changed` (members lost, or, with rejoins, back in): go on
        over the members then in, under fresh tags. With views, tell the others the state now (in
        the background: this is not async), and the members just lost too: one alive but left
        behind learns it at once (`_viewed`)."""
        for m in changed:
            self.changes[m] = max(self._heard.get(m, 0), self.changes.get(m, 0) + 1)
            if self.changes[m] % 2 == 0 and m not in self.joined:
                self.joined.append(m)
        self.members = tuple(m for m in self.original if self.changes.get(m, 0) % 2 == 0)
        self.joined = [m for m in self.joined if m in self.members]
        self._restarted -= set(changed)
        self.epoch += 1
        log.info("job_epoch", extra=fields(job=getattr(self.ch, "job_id", "-"), tag=self.tag(""),
                                           members=len(self.members),
                                           out=",".join(m.hex()[:8] for m in self.lost) or "-",
                                           back=",".join(m.hex()[:8] for m in self.joined) or "-"))
        if self.views:
            told = self._others() + [m for m in changed if m not in self.members and m != self.ch.me]
            task = asyncio.ensure_future(self._tell(told, self._view()))
            self._telling.add(task)
            task.add_done_callback(self._telling.discard)

    async def finish(self) -> tuple[bytes, ...]:
        """After the job's last sum (views only; else ()): () when every other member ended the
        job too, or is dead, refused, or silent for END_WAIT; else the members lost in some
        member's view: the caller calls new_epoch with them and goes back to its resume point
        (module docstring, "Views")."""
        if not self.views:
            return ()
        tag, others = self.tag("end"), self._others()
        pending = set(others) - await self._tell(others, EpochDone(tag))
        deadline = self.ch.now_ms() + self._end_wait_ms()
        while pending:
            lost = await self._viewed()
            if lost:
                return lost
            pending = {m for m in pending if self.ch.alive(m)}
            left = deadline - self.ch.now_ms()
            if not pending or left <= 0:
                break
            try:
                src, _ = await self.ch.recv(EpochDone, tag, timeout_ms=min(POLL_MS, left))
                pending.discard(src)
            except RecvTimeout:
                pass
        return ()

    def _end_wait_ms(self) -> int:
        """How long a member that ended waits for a silent live one: longer than that member
        needs to fail its last sum (a member's patience in the ring, the longest) and to wait for
        its failure detector, so its view arrives first."""
        return self.hop_timeout_ms * (2 * (len(self.members) + 1) + 5) + DEAD_WAIT_MS + 2 * POLL_MS

    def _others(self) -> list[bytes]:
        return [m for m in self.members if m != self.ch.me]

    def _view(self) -> EpochView:
        return EpochView(f"{self.prefix}/view", tuple(self._counted()))

    async def _tell(self, targets: Sequence[bytes], msg: object) -> set[bytes]:
        """Send msg to each target (each send bounded by a hop); the targets that refused it as
        a job they do not run."""
        async def one(dst: bytes) -> bool:
            try:
                async with asyncio.timeout(self.hop_timeout_ms / 1000):
                    await self.ch.send(dst, msg)
            except PeerRefused as exc:
                return exc.reason == UNKNOWN_JOB
            except (JobError, TimeoutError):     # unreachable, or the job is ending here: best effort
                pass
            return False
        refused = await asyncio.gather(*(one(m) for m in targets))
        return {m for m, r in zip(targets, refused) if r}

    async def _viewed(self, wait_ms: int = 0) -> tuple[bytes, ...]:
        """The members whose state in views received from current members is beyond ours (lost,
        or back in; in key order), taken from the mailbox, waiting up to wait_ms for the first.
        A view that has its sender out, names a member never in the job, or moves a member more
        often than a job allows is ignored; one that has this member out beyond our own count
        means the others went on without it: JobError (it fails alone, as a member left out of a
        sum does)."""
        while True:
            try:
                src, view = await self.ch.recv(EpochView, f"{self.prefix}/view",
                                               timeout_ms=0 if self._heard_changes() else wait_ms)
            except RecvTimeout:
                break
            counts = Counter(view.lost)
            if (src not in self.members or counts.get(src, 0) % 2 or not set(counts) <= set(self.original)
                    or max(counts.values(), default=0) > self._count_max()):
                continue
            mine = counts.get(self.ch.me, 0)
            if mine % 2 and mine > self.changes.get(self.ch.me, 0):
                raise LeftBehind("the other members went on without this site (a member's view of the "
                                 "lost names it): it was left behind")
            for m, c in counts.items():     # kept: a view taken while a sum ran counts after it failed
                self._heard[m] = max(self._heard.get(m, 0), c)
        return self._heard_changes()

    def _heard_changes(self) -> tuple[bytes, ...]:
        return tuple(m for m in self.original if self._heard.get(m, 0) > self.changes.get(m, 0))

    async def declared_dead(self, scope: tuple[bytes, ...] | None = None) -> tuple[bytes, ...]:
        """After a failed sum: the members of `scope` (default: every current member) the failure
        detector declares dead within DEAD_WAIT_MS (polled every POLL_MS). If a crashed member
        made the sum give up, every survivor sees it declared dead soon after and goes on without
        it, as if the sum had completed without it; if nobody is declared dead, the failure stands.
        With views, also the scope's members that refuse our view as a job they do not run (or,
        with rejoins, asked to rejoin: they restarted), and the members moved in other members'
        views (module docstring, "Views"), in key order."""
        scope = scope or self.members
        refused: set[bytes] = set()
        waited = 0
        while True:
            if self.views and waited % PROBE_MS == 0:     # a member may restart while we wait
                refused |= await self._tell([m for m in scope if m != self.ch.me and m not in refused], self._view())
            lost = {m for m in scope if m != self.ch.me and not self.ch.alive(m)} | refused
            if self.rejoin:
                await self._drain_asks()
                lost |= self._restarted & set(scope)
            if self.views:
                lost |= set(await self._viewed())
            if lost or waited >= DEAD_WAIT_MS:
                return tuple(m for m in self.original if m in lost)
            await self.ch.sleep_ms(POLL_MS)
            waited += POLL_MS

    # -- rejoins (module docstring, "Rejoins") ----------------------------------------------------

    async def _drain_asks(self) -> None:
        """Take every request to rejoin from the mailbox: a member out asks to come back; one of
        the current epoch that never moved restarted (it lost its part of the job)."""
        while True:
            try:
                src, _ = await self.ch.recv(RejoinAsk, f"{self.prefix}/rejoin", timeout_ms=0)
            except RecvTimeout:
                return
            count = self.changes.get(src, 0)
            if count == 0 and src in self.members and src != self.ch.me:
                self._restarted.add(src)
                self._asked.add(src)
            elif count % 2:
                self._asked.add(src)      # (a count past the rejoins allowed is refused at the boundary)

    async def admit(self, refusal: str | None = None) -> tuple[bytes, ...]:
        """At a boundary where the kind can take members back: the members out that asked to
        rejoin come back in (a new epoch: the caller goes to its resume point); those the kind
        cannot take now (`refusal`, one line) or that came back REJOINS_MAX times already are
        told why. The members taken back, or ()."""
        if not self.rejoin:
            return ()
        await self._drain_asks()
        asking = [m for m in self.original if m in self._asked and self.changes.get(m, 0) % 2]
        self._asked -= set(asking)
        if not asking:
            return ()
        taken = [] if refusal is not None else [m for m in asking if self.changes[m] < self._count_max()]
        refused = [m for m in asking if m not in taken]
        if refused:
            why = refusal or f"a member may rejoin a job {REJOINS_MAX} time(s)"
            await self._tell(refused, RejoinRefused(f"{self.prefix}/rejoin", why[:REFUSAL_BYTES_MAX // 2]))
        if taken:
            self.new_epoch(tuple(taken))
        return tuple(taken)

    async def ask(self, wait_ms: int = REJOIN_WAIT_MS) -> None:
        """A restarted member: ask every other member to take it back, every ASK_EVERY_MS, until a
        member's view has it back in (this member then takes that state and epoch: it is a
        member again), or every other member refused (JobError with their reasons), or every
        other member refused or is declared dead after DEAD_WAIT_MS, or wait_ms passed (JobError)."""
        others = [m for m in self.original if m != self.ch.me]
        refusals: dict[bytes, str] = {}
        waited = 0
        while waited < wait_ms:
            if waited % ASK_EVERY_MS == 0:
                gone = await self._tell([m for m in others if m not in refusals], RejoinAsk(f"{self.prefix}/rejoin"))
                refusals.update((m, "the job no longer runs there") for m in gone if m not in refusals)
            while True:
                try:
                    src, no = await self.ch.recv(RejoinRefused, f"{self.prefix}/rejoin", timeout_ms=0)
                except RecvTimeout:
                    break
                if src in others:
                    refusals.setdefault(src, no.reason)
            await self._refuse_asks("it is asking to rejoin too")
            if len(refusals) == len(others):
                reasons = list(dict.fromkeys(refusals.values()))
                raise JobError(f"every other member refused: {'; '.join(reasons)}")
            dead = [m for m in others if m not in refusals and not self.ch.alive(m)]
            if waited >= DEAD_WAIT_MS and len(refusals) + len(dead) == len(others):
                reasons = list(dict.fromkeys(refusals.values())) + [f"{len(dead)} declared dead"] * bool(dead)
                raise JobError(f"no other member can take this site back: {'; '.join(reasons)}")
            try:
                src, view = await self.ch.recv(EpochView, f"{self.prefix}/view", timeout_ms=POLL_MS)
            except RecvTimeout:
                waited += POLL_MS
                continue
            counts = Counter(view.lost)
            mine = counts.get(self.ch.me, 0)
            if (src in others and counts.get(src, 0) % 2 == 0 and set(counts) <= set(self.original)
                    and max(counts.values(), default=0) <= self._count_max() and mine and mine % 2 == 0):
                self._adopt(counts)
                return
        raise JobError(f"no member took this site back within {wait_ms // 1000} s")

    async def _refuse_asks(self, reason: str) -> None:     # every request to rejoin waiting here: no
        asking: set[bytes] = set()
        while True:
            try:
                src, _ = await self.ch.recv(RejoinAsk, f"{self.prefix}/rejoin", timeout_ms=0)
            except RecvTimeout:
                break
            asking.add(src)
        if asking:
            await self._tell(sorted(asking), RejoinRefused(f"{self.prefix}/rejoin", reason))

    def _adopt(self, counts: Counter) -> None:
        """A view that has this member back in: its state is ours; every member back in is
        taken to be waiting for the state (the members that never left send it)."""
        self.changes = {m: counts[m] for m in self.original if counts.get(m, 0)}
        self._heard = dict(self.changes)
        self.members = tuple(m for m in self.original if self.changes.get(m, 0) % 2 == 0)
        self.joined = [m for m in self.members if self.changes.get(m, 0)]
        self.epoch = 1
        log.info("job_epoch_adopted", extra=fields(job=getattr(self.ch, "job_id", "-"), tag=self.tag(""),
                                                   members=len(self.members)))

    def _holders(self) -> list[bytes]:     # who sends the state to members back in: those that never left
        return [m for m in self.members if not self.changes.get(m, 0)]

    async def send_state(self, state: bytes) -> None:
        """After the resume point that follows a return: to every member back in (and not sent
        it yet), this member's digest of the state, and the state itself from the first member
        that never left. Best effort: a member back in that misses it fails alone."""
        joined, self.joined = [m for m in self.joined if m in self.members and m != self.ch.me], []
        holders = self._holders()
        if not joined or self.ch.me not in holders:
            return
        digest = hashlib.sha256(state).digest()
        msg = RejoinState(self.tag("state"), digest, state if self.ch.me == holders[0] else b"")
        await self._tell(joined, msg)

    def state_pending(self) -> None:
        """The job starts over at the resume point: members back in need no state."""
        self.joined = []

    async def receive_state(self) -> bytes:
        """A member back in: the state so far, once every member that never left sent the same
        digest and the state matches it; JobError otherwise (this member fails alone)."""
        self.joined = []
        holders = self._holders()
        if not holders:
            raise JobError("no member that never left the job is left to send the model so far")
        got: dict[bytes, RejoinState] = {}
        tag, deadline = self.tag("state"), self.ch.now_ms() + STATE_WAIT_HOPS * self.hop_timeout_ms
        while len(got) < len(holders):
            left = deadline - self.ch.now_ms()
            try:
                src, msg = await self.ch.recv(RejoinState, tag, timeout_ms=max(left, 0))
            except RecvTimeout:
                raise JobError(f"the model so far did not arrive from every member that never left within "
                               f"{STATE_WAIT_HOPS} hop timeouts") from None
            if src in holders:
                got[src] = msg
        if len({m.digest for m in got.values()}) != 1:
            raise JobError("the members that never left sent different digests of the model so far")
        state = got[holders[0]].state
        if hashlib.sha256(state).digest() != got[holders[0]].digest:
            raise JobError("the model so far does not match the digest every member sent")
        return state
