"""Secure sum of a small vector, all to all (mode "allreduce" below ALL_TO_ALL_BYTES_MAX): two
one-way legs, whatever the number of members.

The ring (api.py) takes n + 3 legs per sum and the all-reduce (allreduce.py) three; for a vector
of a few KiB every leg is latency — ~1 ms on loopback, 25 ms or more between hospitals — and the
bytes do not matter. So:

1. Every member adds its pairwise masks (one per other participant, + by the smaller key, - by
   the other: they cancel in the total) and a self mask from a fresh seed to its vector — the
   masks of pairwise mode (masks.py) — and sends the masked vector to every other member.
2. A member that holds every member's masked vector sends everyone its self-mask seed and the
   SHA-256 of each member's masked vector as it received it; then it adds the n masked vectors
   and removes the n self masks: the total. A member whose digest of member i's vector differs
   from another's fails the sum naming i (it sent them different vectors) and the member that
   reported the other digest. A compact sum sends one digest of the n digests instead, and only
   members whose digests differ exchange the lists (api.py, "Compact messages").

Who learns what: pairwise mode's. Each member sees every other member's vector under the pairwise
masks it shares with the others and its self mask: a coalition short of all other participants
learns nothing of it beyond the total. A self mask is revealed only once its owner holds every
masked vector, so an attempt that fails before the reveal leaves nobody a total to compare with
a re-run; the exception is pairwise mode's (a failure during the reveal can leave the members
that got every seed holding the total over the old participants).

Cost: each member sends its vector n - 1 times (the all-reduce: about twice, in all) and every
member applies n + (n - 1) masks to it: the line is a few hundred KiB of copies per member.

Failures: as in the all-reduce — any member lost or silent, or sending what the gate refuses,
fails the sum at the members that notice (JobError); the caller re-runs over the survivors
(fedpeer/protocols/epochs.py).
"""

from __future__ import annotations

import hashlib

import numpy as np

from fedpeer.protocols.securesum import masks as sm
from fedpeer.errors import JobError
from fedpeer.protocols.securesum.allreduce import _Run, check_digests, masked, sent_digests, unmask_selves
from fedpeer.protocols.securesum.core import Equivocation, SumOutcome, _Plan
from fedpeer.protocols.securesum.wire import ArReveal, SumChunk
from fedpeer.runtime.channel import Channel

# Vectors whose copies to the other members (8 bytes x entries x (n - 1)) stay under this take
# the all-to-all; larger ones the all-reduce, whose members send each vector about twice in all.
ALL_TO_ALL_BYTES_MAX = 256 << 10


def takes_all_to_all(entries: int, members: int) -> bool:
    return 8 * int(entries) * max(1, members - 1) <= ALL_TO_ALL_BYTES_MAX


def _digest(vector: np.ndarray) -> bytes:
    return hashlib.sha256(memoryview(np.ascontiguousarray(vector)).cast("B")).digest()


async def all_to_all(ch: Channel, plan: _Plan) -> SumOutcome:
    """The sum of `plan.vector` over ch.members, all to all (module docstring); JobError on failure."""
    run = _Run(ch, plan, label="all to all")
    label = sm.pairwise_label(plan, 1)
    pair_seeds = {p: ch.pairwise_seed(p, label) for p in run.others}
    self_seed = ch.random_bytes(sm.SEED_BYTES)
    mine = masked(plan.vector, ch.me, pair_seeds, self_seed)
    got = await run.barrier(SumChunk, "v", SumChunk(f"{run.prefix}v", mine), "masked vector")
    vectors = {ch.me: mine}
    for src, msg in zip(run.others, got):
        if msg.data.shape != mine.shape:
            raise run.fail(f"{run.name(src)} sent a vector of {msg.data.shape[0]} entries, expected {len(mine)}: "
                           "members disagree on the vector")
        vectors[src] = msg.data
    digests = [_digest(vectors[m]) for m in run.members]
    reveals = await run.barrier(ArReveal, "reveal",
                                ArReveal(f"{run.prefix}reveal", self_seed, sent_digests(plan, digests)),
                                "self-mask seed and digests")

    def blame(src: bytes, k: int) -> JobError:
        return run.fail(f"{run.name(src)} holds another vector of {run.name(run.members[k])} than this member: "
                        "that member sent them different vectors (or the first misreports it)", Equivocation)
    await check_digests(run, digests, [r.digests for r in reveals], blame)
    total = mine.copy()
    for src in run.others:
        np.add(total, vectors[src], out=total)
    unmask_selves(total, [self_seed, *(r.seed for r in reveals)])
    return SumOutcome(total, run.members, 1)
