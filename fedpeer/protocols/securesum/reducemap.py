"""Secure reduce-map: a reduce-scatter whose owners each turn their segment's total into a small
result that every member gets — the totals themselves never travel (`secure_reduce_map`, api.py).

Histogram XGBoost (fedpeer/kinds/xgboost/hist.py) needs of a level's summed histograms only the
best split of each node; LightGBM's data-parallel learner and XGBoost's column-wise split search
cut the work the same way: the vector is cut into one segment per member at bounds the caller
chooses (a block of features each; empty for the members the caller makes no owner), member k
owns segment k, finds its block's best splits and sends everyone those few entries. Against the
all-reduce (allreduce.py) this halves the bytes (no all-gather of the totals) and shares the
search among the owners.

1. Mask: member i adds to every segment k it sends (k != i), for every other member j with
   j != k, a pairwise mask (+ by the smaller key, - by the other: they cancel in the segment's
   sum). Pairwise masks shared with k would hide nothing from k, who knows their seeds, so they
   are left out; its own segment is not sent, so not masked. Masks are addressed by entry
   (masks.apply_mask_at): any bound works.
2. Reduce-scatter: every member sends its masked segment k to owner k, in pieces of at most
   `chunk_entries`; owner k adds them to its own entries: the segment's total. A member whose
   segment is empty (the caller's bounds give it none) owns nothing: nobody sends it pieces and
   it sends no result (its result is empty).
3. Map: `owner_fn(k, total)` gives owner k's result (uint64, at most CHUNK_ENTRIES_MAX entries),
   sent to everyone (ArResult). An owner_fn that raises ValueError refuses the total: the owner
   sends its reason instead and every member, the owner too, raises SegmentRefused naming it.
4. Check: every member sends everyone the SHA-256 of each result as it received it; a member
   whose digest of owner k's result differs from another's fails the sum naming k, who sent
   them different results (a compact sum: one digest of the digests, the lists only where they
   differ; allreduce.check_digests). A caller may leave this step out and run it once over several
   reduce-maps (`check_results` with a hash of each owner's results: histogram XGBoost, once
   per tree): a member then learns of a two-faced owner only then, or when what the others
   do next stops matching what it does.
Three one-way legs (the all-reduce's three: scatter, gather, reveal), the last two a few bytes.

Who learns what: owner k, of member i's segment k, sees it under the pairwise masks i shares
with every member but k: a coalition short of all other members learns nothing of it (pairwise
mode's guarantee). Owner k learns its segment's total over all members (a part of what the
all-reduce gives everyone); every member learns the owners' results. There are no self masks (the
all-reduce's protection of a failed attempt): an attempt that fails after owner k got every
contribution leaves k that segment's total over the old members, and a re-run over fewer can
show k the lost members' part of it. Histogram XGBoost, the one caller, re-grows an unfinished
tree over the survivors after a loss, and its finished levels of that tree show the same
(docs/algorithms.md): self masks would hide one level of it, at two more legs per level.

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
from fedpeer.protocols.securesum.allreduce import _Run, check_digests, sent_digests
from fedpeer.protocols.securesum.core import Equivocation, _Plan
from fedpeer.protocols.securesum.wire import (
    CHUNK_ENTRIES_MAX,
    REASON_BYTES_MAX,
    ArCheck,
    ArResult,
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
    digests: tuple[bytes, ...]           # SHA-256 of each result as this member received it


def segment_slices(bounds: Sequence[int], length: int, n: int) -> list[slice]:
    """The caller's bounds (n + 1 offsets from 0 to length, ascending) as n slices."""
    b = [int(x) for x in bounds]
    if len(b) != n + 1 or b[0] != 0 or b[-1] != length or any(x > y for x, y in zip(b, b[1:])):
        raise ValueError(f"reduce-map bounds must be {n + 1} ascending offsets from 0 to {length}, got {b[:8]}")
    return [slice(b[k], b[k + 1]) for k in range(n)]


def masked_segments(vector: np.ndarray, segs: Sequence[slice], mine: int, members: Sequence[bytes],
                    pair_seeds: dict[bytes, bytes]) -> np.ndarray:
    """vector with every segment but mine masked (module docstring, step 1), in a fresh array."""
    out = vector.astype(np.uint64)          # a copy
    me = members[mine]
    for k, seg in enumerate(segs):
        if k == mine:
            continue
        for peer, seed in pair_seeds.items():
            if peer != members[k]:
                sm.apply_mask_at(np.add if me < peer else np.subtract, out[seg], sm.PAIR_DOMAIN, seed, seg.start)
    return out


async def reduce_map(ch: Channel, plan: _Plan, bounds: Sequence[int], owner_fn: OwnerFn,
                     check: bool = True) -> MapOutcome:
    """The reduce-map of `plan.vector` over ch.members (module docstring); JobError on failure,
    SegmentRefused when an owner refused its total. `check` False leaves step 4 to the caller
    (check_results, once over several reduce-maps: the digests are in the outcome)."""
    run = _Run(ch, plan, segment_slices(bounds, len(plan.vector), len(ch.members)), "reduce-map")
    label = sm.pairwise_label(plan, 1)
    pair_seeds = {p: ch.pairwise_seed(p, label) for p in run.others}
    y = await run.compute(masked_segments, plan.vector, run.segs, run.mine, run.members, pair_seeds)
    pre = run.prefix

    owners = [k for k, seg in enumerate(run.segs) if seg.stop > seg.start]    # the others have nothing to sum

    for k in owners:                   # scatter: my masked segment k to owner k
        if k != run.mine:
            run.post(run.members[k], run.messages(y[run.segs[k]], k, "p"))
    owner = run.mine in owners
    refused, mine = "", np.zeros(0, dtype=np.uint64)
    if owner:
        total = await run.until(run.reduce_own(y))      # my segment's total
        try:
            mine = await run.compute(owner_fn, run.mine, total)
            mine = np.ascontiguousarray(mine, dtype=np.uint64).ravel()
            if len(mine) > CHUNK_ENTRIES_MAX:
                raise run.fail(f"this member's result has {len(mine)} entries, more than {CHUNK_ENTRIES_MAX}")
        except ValueError as exc:
            refused, mine = (str(exc) or type(exc).__name__)[:REASON_BYTES_MAX], np.zeros(0, dtype=np.uint64)
    results: list[np.ndarray] = [np.zeros(0, dtype=np.uint64)] * len(run.members)
    results[run.mine] = mine

    if owner:
        sent = mine.copy()                  # `mine` is the caller's (results[run.mine]): it may change it
        for p in run.others:
            run.post(p, [ArResult(f"{pre}r{run.mine}", sent, refused)])

    async def result_of(k: int, src: bytes) -> None:
        msg = await run.recv(ArResult, f"{pre}r{k}", src, "result")
        if msg.refused:
            raise SegmentRefused(plan.tag, run.name(src), msg.refused)
        results[k] = msg.data

    await run.until(asyncio.gather(*(result_of(k, run.members[k]) for k in owners if k != run.mine)))
    if refused:
        raise SegmentRefused(plan.tag, "this member", refused)
    digests = tuple(hashlib.sha256(memoryview(r).cast("B")).digest() for r in results)
    if check:
        await compare_digests(run, digests, "result")
    return MapOutcome(tuple(results), run.members, digests)


async def compare_digests(run: _Run, digests: Sequence[bytes], what: str) -> None:
    """Send every other member my digest of each owner's `what` and compare theirs (step 4):
    JobError naming the first owner whose digests differ."""
    mine = ArCheck(f"{run.prefix}check", sent_digests(run.plan, digests))
    checks = await run.barrier(ArCheck, "check", mine, f"digests of the {what}s")

    def blame(src: bytes, k: int) -> JobError:
        return run.fail(f"{run.name(src)} holds another {what} of segment {k} than this member: its "
                        f"owner {run.name(run.members[k])} sent them different {what}s", Equivocation)
    await check_digests(run, digests, [c.digests for c in checks], blame)


async def check_results(ch: Channel, plan: _Plan, digests: Sequence[bytes]) -> None:
    """Step 4 on its own, for a caller that ran reduce_map(check=False) several times: `digests`,
    one per member (e.g. a hash of every result it sent over a whole tree), compared with every
    other member's; JobError naming an owner whose results differed between members."""
    if len(digests) != len(ch.members):
        raise ValueError(f"one digest per member, got {len(digests)} for {len(ch.members)}")
    await compare_digests(_Run(ch, plan, label="reduce-map"), digests, "result")
