"""Secure sum by all-reduce (mode "allreduce"): no member carries more than its share.

The ring (api.py) sends every chunk through every member and the initiator delivers the whole
total to each member: it carries n times the bytes of the others and the chunks go round in n
sequential hops. Here, as in NCCL's and Horovod's all-reduce, the vector is cut into one segment
per participant and every member both sends and receives about 2(n-1)/n of the vector:

1. Mask: every member adds to its whole vector its pairwise masks (one per other participant,
   +mask by the smaller key, -mask by the other: they cancel in every entry of the total) and a
   self mask from a fresh secret seed (masks.py; the same AES-256-CTR streams as pairwise mode,
   addressed by entry, so any slice is masked with its own part of the stream).
2. Reduce-scatter: member k owns segment k; every member sends its masked segment k to member k,
   in pieces of at most `chunk_entries`. Member k adds the n masked segments: the segment's total
   plus the n self masks.
3. All-gather: each owner, once it holds all n contributions, sends that sum (still under the n
   self masks) to everyone; receiving it also tells a member that owner k is complete.
4. Reveal: a member that holds every owner's sum (so every owner had every contribution) sends
   everyone, in one message, its self-mask seed and the SHA-256 of each segment as it received it;
   then it removes the n self masks from the whole vector: the total. A member whose digest of
   segment k differs from another's fails the sum naming segment k's owner, who sent them
   different sums (a compact sum: one digest of the digests, the lists only where they differ;
   `check_digests`).
Three one-way legs (scatter, gather, reveal), against the ring's n + 3 (n hops, seed request and
reveal, delivery): a member waits for what it receives, not for its own sends' acknowledgements
(`_Run.post`). Small vectors take two legs all to all instead (alltoall.py,
ALL_TO_ALL_BYTES_MAX). The price: every member removes all n self
masks from the whole vector (n AES passes) where an owner removed them from its segment only.

Who learns what: an owner sees, of each member, its segment plus pairwise masks shared with the
others and its self mask: uniformly distributed whatever the inputs, so a coalition of any size
short of all other participants learns nothing of a member's segment beyond the total (as in
pairwise mode). Every participant learns the total. A self mask is revealed only once every
owner's sum has arrived, so the segment sums a member holds when an attempt fails before the
reveal still carry self masks it cannot remove: a re-run over the survivors (fresh masks: a
new tag) cannot be compared with them. The exception is pairwise mode's: a failure after the
reveal (a member lost while the seeds go round) leaves the members that got every seed holding
the total over the old participants, which the re-run's total over fewer
sites, once compared, turns into the lost sites' summed entries of those segments.

Integrity: an owner could alter its segment's total; if it sends everyone the same altered total,
nobody can tell it from a member that contributed other values (every kind checks totals
against what honest members could give); if it sends different totals to different members, the
digests disagree and the sum fails naming it.

Failures: any member lost, silent beyond a hop, or sending what its gate or this module refuses
fails the sum at the members that notice (JobError; PeerDead when the failure detector declared
the member dead). There is no initiator to re-run it: the caller does, over the survivors its
failure detector names, under a fresh tag (fedpeer/protocols/epochs.py). Members that got every
segment before another failed may have returned already; the others fail the sum.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.protocols.securesum import masks as sm
from fedpeer.protocols.securesum.core import OFF_LOOP_BYTES_MIN, Equivocation, SumOutcome, _Plan, _send
from fedpeer.protocols.securesum.wire import ArCheck, ArReveal, SumChunk
from fedpeer.runtime.channel import Channel, MalformedFrom, PeerUnreachable, RecvTimeout

MODE = "allreduce"
WAIT_HOPS = 2                            # a member waits this many hops for each message it expects
_POSTED: set[asyncio.Task] = set()       # sends still going out after their run returned: held here


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def segments(length: int, n: int) -> list[slice]:
    """n contiguous segments of [0, length), as equal as whole AES blocks (2 entries) allow."""
    blocks = -(-length // 2)
    bounds = [min(length, 2 * (blocks * k // n)) for k in range(n)] + [length]
    return [slice(bounds[k], bounds[k + 1]) for k in range(n)]


def pieces(seg: slice, chunk_entries: int) -> list[slice]:
    """`seg` in pieces of at most chunk_entries entries (even, so each starts on an AES block)."""
    step = max(2, chunk_entries - chunk_entries % 2)
    return [slice(s, min(s + step, seg.stop)) for s in range(seg.start, seg.stop, step)] or [seg]


def masked(vector: np.ndarray, me: bytes, pair_seeds: dict[bytes, bytes], self_seed: bytes) -> np.ndarray:
    """vector + my pairwise masks + my self mask (mod 2^64), in a fresh array."""
    out = vector.astype(np.uint64)          # a copy
    for peer, seed in pair_seeds.items():
        sm.apply_mask(np.add if me < peer else np.subtract, out, sm.PAIR_DOMAIN, seed, 0)
    sm.apply_mask(np.add, out, sm.SELF_DOMAIN, self_seed, 0)
    return out


def unmask_selves(total: np.ndarray, seeds: Sequence[bytes]) -> None:
    """Remove every member's self mask from the whole vector, in place."""
    for seed in seeds:
        sm.apply_mask(np.subtract, total, sm.SELF_DOMAIN, seed, 0)


def digests(total: np.ndarray, segs: Sequence[slice]) -> list[bytes]:
    return [hashlib.sha256(memoryview(total[s]).cast("B")).digest() for s in segs]   # no copy: a view


def sent_digests(plan: _Plan, mine: Sequence[bytes]) -> list[bytes]:
    """What a member sends the others of its digests (one per member or segment): all of them, or
    in a compact sum (_Plan.compact) their SHA-256 alone, 32 bytes whatever the members."""
    return [hashlib.sha256(b"".join(mine)).digest()] if plan.compact else list(mine)


async def check_digests(run: _Run, mine: Sequence[bytes], theirs: Sequence[Sequence[bytes]],
                        blame: Callable[[bytes, int], JobError]) -> None:
    """Compare my digests (`mine`, one per member or segment) with what each other member sent
    (`theirs`, in run.others order: `sent_digests`); raise blame(member, k) for the first member
    whose digest k differs from mine. In a compact sum only the members whose digest of digests
    differs from mine exchange their whole lists with me (ArCheck, one leg), to find k; a member
    whose whole list matches mine after all sent a digest of digests that is not of its list, and
    is named. No message more when nothing differs."""
    if not run.plan.compact:
        for src, other in zip(run.others, theirs):
            differ = [k for k in range(len(mine)) if k >= len(other) or other[k] != mine[k]]
            if differ:
                raise blame(src, differ[0])
        return
    summary = sent_digests(run.plan, mine)
    odd = [src for src, other in zip(run.others, theirs) if list(other) != summary]
    if not odd:
        return
    tag = f"{run.prefix}full"
    for src in odd:
        run.post(src, [ArCheck(tag, list(mine))])
    lists = await run.until(asyncio.gather(*(run.recv(ArCheck, tag, src, "list of digests") for src in odd)))
    for src, other in zip(odd, lists):
        full = other.digests
        differ = [k for k in range(len(mine)) if k >= len(full) or full[k] != mine[k]]
        if differ:
            raise blame(src, differ[0])
    raise run.fail(f"{run.name(odd[0])} sent a digest of digests that is not of the digests it holds", Equivocation)


class _Run:
    """One member's run of a sum without an initiator (this all-reduce, the all-to-all, the
    reduce-map): the plan, the participants, the segments (`segs`: equal ones unless given) and
    what it holds; `label` names the protocol in its errors."""

    def __init__(self, ch: Channel, plan: _Plan, segs: Sequence[slice] | None = None,
                 label: str = "all-reduce") -> None:
        self.ch, self.plan, self.label = ch, plan, label
        self.members = tuple(ch.members)
        self.others = [m for m in self.members if m != ch.me]
        self.mine = self.members.index(ch.me)
        self.segs = list(segs) if segs is not None else segments(len(plan.vector), len(self.members))
        self.prefix = plan.prefix(1)
        self.sending: set[asyncio.Task] = set()      # posted sends not yet acknowledged
        self.send_failure: BaseException | None = None
        self._failed = asyncio.Event()               # set with send_failure
        self._owner: asyncio.Task | None = None      # the task that posted them (the job's), while they go

    def name(self, member: bytes) -> str:
        return member.hex()[:16]

    def fail(self, what: str, kind: type[JobError] = JobError) -> JobError:
        return kind(f"secure sum '{self.plan.tag}' ({self.label}): {what}")

    async def compute(self, fn: Any, *args: Any) -> Any:
        if 8 * len(self.plan.vector) >= OFF_LOOP_BYTES_MIN:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    async def recv(self, kind: type, tag: str, src: bytes, what: str) -> Any:
        wait_ms = WAIT_HOPS * self.plan.hop_timeout_ms
        try:
            _, msg = await self.ch.recv(kind, tag, src=src, timeout_ms=wait_ms)
        except RecvTimeout:
            raise self.fail(f"no {what} from {self.name(src)} within {wait_ms} ms") from None
        except MalformedFrom as exc:
            raise self.fail(f"{self.name(src)} sent a {what} its gate refused: {exc}") from None
        return msg

    async def send_all(self, dst: bytes, msgs: Sequence[object]) -> None:
        """Send `msgs` to dst in order, at most the plan's window unacknowledged at once."""
        window = asyncio.Semaphore(self.plan.send_window(max(1, len(self.others))))

        async def one(msg: object) -> None:
            async with window:
                await _send(self.ch, self.plan, dst, msg)
        try:
            await asyncio.gather(*(one(m) for m in msgs))
        except PeerUnreachable as exc:
            raise self.fail(f"{self.name(dst)} did not take what it was sent: {exc}") from None

    async def recv_pieces(self, owner: int, src: bytes, kind: str) -> list[tuple[slice, np.ndarray]]:
        """src's pieces of segment `owner` ("p": masked contributions, "t": totals), checked: each
        with its entries' place in the vector (the data: a view of the frame that carried it)."""
        seg = self.segs[owner]
        out = []
        for j, piece in enumerate(pieces(seg, self.plan.chunk_entries)):
            msg = await self.recv(SumChunk, f"{self.prefix}{kind}{owner}/{j}", src, f"piece {j} of segment {owner}")
            if msg.data.shape != (piece.stop - piece.start,):
                raise self.fail(f"{self.name(src)} sent piece {j} of segment {owner} with {msg.data.shape[0]} "
                                f"entries, expected {piece.stop - piece.start}: members disagree on the vector")
            out.append((piece, msg.data))
        return out

    async def reduce_own(self, masked: np.ndarray) -> np.ndarray:
        """My segment's sum: my entries of `masked` plus every other member's masked contribution
        (pieces "p"), each added where it lies (no concatenation), in a fresh array."""
        own = self.segs[self.mine]
        acc = masked[own].copy()
        for parts in await asyncio.gather(*(self.recv_pieces(self.mine, p, "p") for p in self.others)):
            for piece, data in parts:
                part = acc[piece.start - own.start:piece.stop - own.start]
                np.add(part, data, out=part)
        return acc

    def messages(self, data: np.ndarray, owner: int, kind: str) -> list[SumChunk]:
        """`data` (segment `owner`'s entries) in pieces, tagged <prefix><kind><owner>/<piece>."""
        seg = self.segs[owner]
        return [SumChunk(f"{self.prefix}{kind}{owner}/{j}", data[p.start - seg.start:p.stop - seg.start])
                for j, p in enumerate(pieces(seg, self.plan.chunk_entries))]

    def post(self, dst: bytes, msgs: Sequence[object]) -> None:
        """Send `msgs` to dst (send_all) without waiting for their acknowledgements: a step waits
        for what it receives (`until`), and what it receives already says the others had what
        they needed (every step's messages depend on the step before), so each leg costs one way,
        not a round trip (over a 25 ms link: 25 ms a leg, not 50). A send that fails fails the
        next `until` at once; one that fails after the run ended fails nothing here (the member
        that did not get it fails its own run). The messages must not change until sent: post
        arrays nobody writes to afterwards. Cancelling the task that posted them (the job, cancelled
        or stopped with the daemon) cancels the sends still going out."""
        task = asyncio.ensure_future(self.send_all(dst, msgs))
        self.sending.add(task)
        _POSTED.add(task)
        task.add_done_callback(self._posted)
        if self._owner is None:
            self._owner = asyncio.current_task()
            if self._owner is not None:
                self._owner.add_done_callback(self._owner_ended)

    def _owner_ended(self, owner: asyncio.Task) -> None:
        if owner.cancelled():
            for task in list(self.sending):
                task.cancel()

    def _posted(self, task: asyncio.Task) -> None:
        self.sending.discard(task)
        _POSTED.discard(task)
        if not self.sending and self._owner is not None:       # all sent: the owner no longer holds this run
            self._owner.remove_done_callback(self._owner_ended)
            self._owner = None
        if task.cancelled() or task.exception() is None or self.send_failure is not None:
            return
        self.send_failure = task.exception()
        self._failed.set()

    async def until(self, aw: Any) -> Any:
        """`await aw` (receipts), raising instead as soon as a posted send fails."""
        if self.send_failure is not None:
            raise self.send_failure
        main, failed = asyncio.ensure_future(aw), asyncio.ensure_future(self._failed.wait())
        main.add_done_callback(_retrieved)       # cancelled below when a send fails: nobody awaits it then
        try:
            await asyncio.wait((main, failed), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            main.cancel()
            raise
        finally:
            failed.cancel()
        if not main.done():
            main.cancel()
            assert self.send_failure is not None
            raise self.send_failure
        return main.result()

    async def barrier(self, kind: type, suffix: str, msg: object, what: str) -> list[Any]:
        """Send msg to every other member and take theirs (tag <prefix><suffix>)."""
        for p in self.others:
            self.post(p, [msg])
        return await self.until(asyncio.gather(*(self.recv(kind, f"{self.prefix}{suffix}", p, what)
                                                 for p in self.others)))


async def all_reduce(ch: Channel, plan: _Plan) -> SumOutcome:
    """The all-reduce of `plan.vector` over ch.members (module docstring); JobError on failure."""
    run = _Run(ch, plan)
    label = sm.pairwise_label(plan, 1)
    pair_seeds = {p: ch.pairwise_seed(p, label) for p in run.others}
    self_seed = ch.random_bytes(sm.SEED_BYTES)
    y = await run.compute(masked, plan.vector, ch.me, pair_seeds, self_seed)
    own = run.segs[run.mine]

    for k, p in enumerate(run.members):      # scatter: my masked segment k to owner k
        if p != ch.me:
            run.post(p, run.messages(y[run.segs[k]], k, "p"))
    total = np.empty(len(plan.vector), dtype=np.uint64)

    async def gather_from(k: int, src: bytes) -> None:
        for piece, data in await run.recv_pieces(k, src, "t"):
            total[piece] = data

    async def reduce_and_share() -> None:     # my segment's sum, as soon as it is complete, to everyone
        total[own] = summed = await run.reduce_own(y)     # (`total` is unmasked in place later: not sent)
        for p in run.others:
            run.post(p, run.messages(summed, run.mine, "t"))
    await run.until(asyncio.gather(reduce_and_share(),
                                   *(gather_from(k, p) for k, p in enumerate(run.members) if p != ch.me)))
    mine = await run.compute(digests, total, run.segs)
    reveal = ArReveal(f"{run.prefix}reveal", self_seed, sent_digests(plan, mine))
    reveals = await run.barrier(ArReveal, "reveal", reveal, "self-mask seed and digest")

    def blame(src: bytes, k: int) -> JobError:
        return run.fail(f"{run.name(src)} holds another sum of segment {k} than this member: its "
                        f"owner {run.name(run.members[k])} sent them different sums", Equivocation)
    await check_digests(run, mine, [r.digests for r in reveals], blame)
    await run.compute(unmask_selves, total, [self_seed, *(r.seed for r in reveals)])
    return SumOutcome(total, run.members, 1)
