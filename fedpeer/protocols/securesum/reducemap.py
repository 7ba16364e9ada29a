"""Secure reduce-map: a reduce-scatter whose owners each turn their segment's total into a small
result that every member gets — the totals themselves never travel (`secure_reduce_map`, api.py).

Histogram XGBoost (fedpeer/kinds/xgboost/hist.py) needs of a level's summed histograms only the
best split of each node; LightGBM's data-parallel learner and XGBoost's column-wise split search
cut the work the same way: the vector is cut into one segment per member at bounds the caller
chooses (a block of features each), member k owns segment k, finds its block's best splits and
sends everyone those few entries. Against the all-reduce (allreduce.py) this halves the bytes
(no all-gather of the totals), makes each member search one n-th of the candidates, and removes
the self masks from one segment instead of the whole vector.

1. Mask: member i adds to every segment k it sends (k != i), for every other member j with
   j != k, a pairwise mask (+ by the smaller key, - by the other: they cancel in the segment's
   sum), and its self mask from a fresh seed. Pairwise masks shared with k would hide nothing
   from k, who knows their seeds, so they are left out; its own segment is not sent, so not
   masked. Masks are addressed by entry (masks.apply_mask_at): any bound works.
2. Reduce-scatter: every member sends its masked segment k to owner k, in pieces of at most
   `chunk_entries`; owner k adds them to its own entries: the total plus the n - 1 self masks.
3. Complete: an owner holding every contribution tells everyone (ArComplete).
4. Reveal: a member that has heard every owner complete sends everyone its self-mask seed.
5. Map: owner k removes the n - 1 self masks from its segment: the total of segment k; then
   `owner_fn(k, total)` gives its result (uint64, at most CHUNK_ENTRIES_MAX entries), sent to
   everyone (ArResult). An owner_fn that raises ValueError refuses the total: the owner sends
   its reason instead and every member, the owner too, raises SegmentRefused naming it.
6. Check: every member sends everyone the SHA-256 of each result as it received it; a member
   whose digest of owner k's result differs from another's fails the sum naming k, who sent
   them different results.
Five one-way legs (the all-reduce's three: scatter, gather, reveal), all but the first tiny.

Who learns what: owner k, of member i's segment k, sees it under the pairwise masks i shares
with every member but k and under i's self mask until i reveals it: a coalition short of all
other members learns nothing of it (as in pairwise mode). Owner k learns its segment's total
over all members (a part of what the all-reduce gives everyone); every member learns the n
results. A self mask is revealed only once every owner holds every contribution, so an attempt
that fails earlier leaves no owner a total it could compare with a re-run's; the exception is
the all-reduce's: a failure during the reveal can leave an owner every seed of its segment.

Failures: as in the all-reduce (JobError naming who did not answer or sent what the gate
refused; PeerDead when the failure detector declared a member dead): the caller re-runs over the
survivors under a fresh tag (fedpeer/protocols/epochs.py).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedpeer.errors import JobError
from fedpeer.protocols.securesum import masks as sm
from fedpeer.protocols.securesum.allreduce import _Run
from fedpeer.protocols.securesum.core import _Plan
from fedpeer.protocols.securesum.wire import (
    CHUNK_ENTRIES_MAX,
    REASON_BYTES_MAX,
    ArCheck,
    ArComplete,
    ArResult,
    SeedReveal,
)
from fedpeer.runtime.channel import Channel

OwnerFn = Callable[[int, np.ndarray], np.ndarray]


class SegmentRefused(JobError):
    """An owner's owner_fn refused its segment's total (a check it failed, in `reason`): raised at
    every member that hears of it, the owner included."""

    def __init__(self, tag: str, owner: str, reason: str) -> None:
        self.owner, self.reason = owner, reason
        super().__init__(f"secure sum '{tag}' (reduce-map): {owner}, owner of a segment, refused its total: {reason}")


@dataclass(frozen=True, eq=False)
class MapOutcome:
    results: tuple[np.ndarray, ...]      # each owner's result, in member order
    participants: tuple[bytes, ...]


def segment_slices(bounds: Sequence[int], length: int, n: int) -> list[slice]:
    """The caller's bounds (n + 1 offsets from 0 to length, ascending) as n slices."""
    b = [int(x) for x in bounds]
    if len(b) != n + 1 or b[0] != 0 or b[-1] != length or any(x > y for x, y in zip(b, b[1:])):
        raise ValueError(f"reduce-map bounds must be {n + 1} ascending offsets from 0 to {length}, got {b[:8]}")
    return [slice(b[k], b[k + 1]) for k in range(n)]


def masked_segments(vector: np.ndarray, segs: Sequence[slice], mine: int, members: Sequence[bytes],
                    pair_seeds: dict[bytes, bytes], self_seed: bytes) -> np.ndarray:
    """vector with every segment but mine masked (module docstring, step 1), in a fresh array."""
    out = vector.astype(np.uint64)          # a copy
    me = members[mine]
    for k, seg in enumerate(segs):
        if k == mine:
            continue
        for peer, seed in pair_seeds.items():
            if peer != members[k]:
                sm.apply_mask_at(np.add if me < peer else np.subtract, out[seg], sm.PAIR_DOMAIN, seed, seg.start)
        sm.apply_mask_at(np.add, out[seg], sm.SELF_DOMAIN, self_seed, seg.start)
    return out


def unmask_segment(total: np.ndarray, seg: slice, seeds: Sequence[bytes]) -> np.ndarray:
    """Segment `seg`'s masked sum (`total`, its entries) less the others' self masks, in place."""
    for seed in seeds:
        sm.apply_mask_at(np.subtract, total, sm.SELF_DOMAIN, seed, seg.start)
    return total


async def reduce_map(ch: Channel, plan: _Plan, bounds: Sequence[int], owner_fn: OwnerFn) -> MapOutcome:
    """The reduce-map of `plan.vector` over ch.members (module docstring); JobError on failure,
    SegmentRefused when an owner refused its total."""
    run = _Run(ch, plan, segment_slices(bounds, len(plan.vector), len(ch.members)))
    label = sm.pairwise_label(plan, 1)
    pair_seeds = {p: ch.pairwise_seed(p, label) for p in run.others}
    self_seed = ch.random_bytes(sm.SEED_BYTES)
    y = await run.compute(masked_segments, plan.vector, run.segs, run.mine, run.members, pair_seeds, self_seed)
    own = run.segs[run.mine]
    pre = run.prefix

    async def scatter() -> None:       # my masked segment k to owner k
        await asyncio.gather(*(run.send_all(p, run.messages(y[run.segs[k]], k, "p"))
                               for k, p in enumerate(run.members) if p != ch.me))

    async def reduce_and_tell() -> np.ndarray:
        acc = y[own].copy()
        for parts in await asyncio.gather(*(run.recv_pieces(run.mine, p, "p") for p in run.others)):
            for piece, data in parts:
                part = acc[piece.start - own.start:piece.stop - own.start]
                np.add(part, data, out=part)
        await asyncio.gather(*(run.send_all(p, [ArComplete(f"{pre}complete")]) for p in run.others))
        return acc

    async def heard_complete() -> None:
        await asyncio.gather(*(run.recv(ArComplete, f"{pre}complete", p, "word that its segment is complete")
                               for p in run.others))

    acc, _, _ = await asyncio.gather(reduce_and_tell(), scatter(), heard_complete())
    seeds = await run.barrier(SeedReveal, "seed", SeedReveal(f"{pre}seed", self_seed), "self-mask seed")
    total = await run.compute(unmask_segment, acc, own, [r.seed for r in seeds])
    refused = ""
    try:
        mine = await run.compute(owner_fn, run.mine, total)
        mine = np.ascontiguousarray(mine, dtype=np.uint64).ravel()
        if len(mine) > CHUNK_ENTRIES_MAX:
            raise run.fail(f"this member's result has {len(mine)} entries, more than {CHUNK_ENTRIES_MAX}")
    except ValueError as exc:
        refused, mine = (str(exc) or type(exc).__name__)[:REASON_BYTES_MAX], np.zeros(0, dtype=np.uint64)
    results: list[np.ndarray] = [np.zeros(0, dtype=np.uint64)] * len(run.members)
    results[run.mine] = mine

    async def share() -> None:
        await asyncio.gather(*(run.send_all(p, [ArResult(f"{pre}r{run.mine}", mine, refused)]) for p in run.others))

    async def result_of(k: int, src: bytes) -> None:
        msg = await run.recv(ArResult, f"{pre}r{k}", src, "result")
        if msg.refused:
            raise SegmentRefused(plan.tag, run.name(src), msg.refused)
        results[k] = msg.data

    await asyncio.gather(share(), *(result_of(k, p) for k, p in enumerate(run.members) if p != ch.me))
    if refused:
        raise SegmentRefused(plan.tag, "this member", refused)
    digests = [hashlib.sha256(memoryview(r).cast("B")).digest() for r in results]
    checks = await run.barrier(ArCheck, "check", ArCheck(f"{pre}check", digests), "digests of the results")
    for src, other in zip(run.others, checks):
        differ = [k for k in range(len(run.members)) if k >= len(other.digests) or other.digests[k] != digests[k]]
        if differ:
            raise run.fail(f"{run.name(src)} holds another result of segment {differ[0]} than this member: its "
                           f"owner {run.name(run.members[differ[0]])} sent them different results")
    return MapOutcome(tuple(results), run.members)
