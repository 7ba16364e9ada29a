"""Secure sum of uint64 vectors around the ring of a job's members (docs/security.md, secure sum).

Every member of `ch.members` calls `secure_sum(ch, tag, vector)` with the same tag, mode, vector
length and chunk size; every participant still standing at the end returns the same
`SumOutcome`: the sum modulo 2^64 of the vectors of `participants`. Floats and counts go through
`fedpeer.protocols.fixedpoint` first, which refuses inputs whose sum could wrap.

Layout: this module is the entry point (`secure_sum`) and the protocol's description; the code
is split along its seams: securesum_wire.py (messages and their schemas), securesum_core.py
(limits, plan, attempt, outcome, bounded send/receive helpers), securesum_masks.py (the masks),
securesum_lead.py (the initiator: attempts, blame, next ring, unmasking, delivery) and
securesum_follow.py (the other members: forwarding, reports, takeover).

Rules of this module
* Pure protocol code: it talks only through the `Channel` (fedpeer/runtime/channel.py). Randomness is
  `ch.random_bytes` (the OS CSPRNG in the daemon), pairwise secrets are `ch.pairwise_seed`,
  waiting is `ch.recv` with a timeout. The only clock use is a bound on each `ch.send`
  (`asyncio.timeout`), so that every wait is bounded by hop_timeout_ms. The only work handed to
  a worker thread (`asyncio.to_thread`) is arithmetic on large arrays: masks of chunks, and the
  allocation of the total, of OFF_LOOP_BYTES_MIN or more (never in the simulations, whose
  vectors are smaller).
* The initiator is the first of `ch.members` (until it is declared dead: "Takeover" below); the
  first ring runs in `ch.members` order.
  Participants start as all members; only the initiator removes participants or changes the
  ring order, and it announces every new ring with a new attempt number (`SumRestart`). Each
  attempt draws fresh masks: the ring mask and the self-mask seeds from `ch.random_bytes`, the
  pairwise seeds from a label holding the job id, the tag, the mode and the attempt number. No
  mask is ever used for two chunks or attempts (an attempt number is reused only when nobody
  acknowledged its announcement, so nobody holds masks for it). `SumOutcome.participants` is
  in key order whatever the ring order was.
* Messages carry tags `<tag>/ss-<mode>/a<attempt>/...`, so messages of an old attempt (or of a
  member running the other mode) are never mixed into the current one; old attempts are
  dropped from the mailbox with `ch.discard`.
* Vectors travel in chunks of at most `chunk_entries`; the initiator keeps at most
  CHUNKS_IN_FLIGHT_MAX chunks on the ring, so every member buffers a bounded number of them.
* Pipelined: a member passes chunk k on as soon as it has added its contribution, without
  waiting for its successor to acknowledge chunk k-1 (at most SENDS_IN_FLIGHT_MAX sends to one
  peer unacknowledged, and SEND_BYTES_IN_FLIGHT_MAX bytes to all); the initiator likewise, and
  it sends the total to every member the same way, up to SENDS_IN_FLIGHT_MAX chunks at a time
  to each. Masks are made and applied a MiB at a time in place (securesum_masks.py); on chunks
  of OFF_LOOP_BYTES_MIN or more in a worker thread (the event loop serves membership meanwhile).
* Delivery of the total: once every chunk is back (and, in pairwise mode, the self masks are
  removed), the initiator sends the total to every participant directly. Not as soon as each
  chunk is complete: a failure later in the lap would leave members holding part of a total
  over participants that a re-run changes (see "Dropouts" below: today only the initiator holds
  that). Not around the ring either (each member keeping a copy and passing it on): on one
  machine the bytes are the same (2n-1 chunk hops per chunk either way) and the chain measured
  no faster (bare relays, 8 MiB: 126 vs 128 MiB/s at 3 sites, 25 vs 47 at 9), while it would let
  any member alter or withhold the total of everyone after it. Nor does each chunk's lap start
  and end at another site (k mod n) that then delivers that chunk: the same bytes again, while
  every site would hold totals of chunks when an attempt fails and each chunk would need its own
  judge for blame. Members accept the total only from the initiator.

Timeouts and failures (hop = hop_timeout_ms, n = participants in the attempt)
* Every send must be acknowledged within one hop, or the peer counts as unreachable.
* The initiator waits (n + 1) hops for each chunk to come back (one hop per participant and its
  own send). A member reports to the initiator (`RingBroken`) when an edge next to it fails:
  its successor did not acknowledge its chunk ("unreachable") or refused it ("refused",
  `PeerRefused`: the peer is alive, so this is never treated as "unreachable"), or its
  predecessor's chunk failed its checks ("malformed": `MalformedFrom` from its gate, or the
  wrong length). The initiator weighs each report (Blame, below), drops who it proves faulty
  and any member the failure detector (`ch.alive`) reports dead or its announcement cannot
  reach, and starts a new attempt over the survivors. Members left out get the announcement
  (if reachable) and raise JobError. Attempts are bounded by progress: an attempt that drops
  members (dead, unreachable, proven faulty: the participants shrink) does not count against
  `attempts_max`, one that drops nobody (a dispute kept apart, a chunk back late) does, the
  first included; ATTEMPTS_MAX bounds all of them (the attempt number on the wire; at 1,000
  simulated members with 100 dropping over a clean sum's time, 6 attempts). `attempts_max` 1
  keeps a sum to one attempt whatever happens (the DP kinds: no re-run over fewer members).
  Out of attempts, with fewer than 2 participants left, or with a dispute no ring order can
  route around, the initiator announces that it gives up, saying why, and everybody raises
  JobError.
* When a chunk does not come back and nobody reported why, the initiator asks every member
  whether it got the chunk and passed it on (`SumWhere`, answered within two hops) and walks
  the ring from itself to the first link whose ends disagree (Blame, below).
* A member waits at most 2 (n + 1) + 5 hops for its next message (a chunk, an announcement, a
  seed request, a result): longer than the initiator needs to notice a failure, locate it and
  announce a new attempt. So if the initiator stops and nobody declares it dead, every member
  raises JobError at most that long after the last message it received.
* Waits end as soon as the failure detector declares the member waited for dead (`recv` raises
  PeerDead): the initiator drops a dead predecessor, non-returned seeds and SumWhere answers of
  dead members at once; a member whose predecessor dies waits for the initiator's next word.

Takeover: a dead initiator
* When the failure detector declares the initiator of a member's attempt dead, the next
  participant of that attempt's ring order that is not declared dead takes over: it announces
  attempt 1 of its own era over the survivors it sees alive (itself first, the others in key
  order) and leads the sum anew; the other members wait (a member's patience) for that
  announcement, moving on along the ring order when a candidate is declared dead too.
* A takeover's messages carry tags under the new initiator's key (`<tag>/ss-<mode>/by-<key>/a<n>/`)
  and its pairwise seeds are derived from a label holding that key: masks are fresh (ring masks
  and self-mask seeds are drawn anew anyway), and nothing of the dead initiator's attempts mixes in.
* Members accept announcements and results only from the initiator of their current era, and
  only a death declared by their own failure detector moves them to the next era: a live but
  partitioned initiator is not replaced (its attempts fail and it gives up, as before).
* A member that already holds part of the total (some result chunks) does not take part in a
  takeover: comparing the two totals would give it the dead initiator's vector. It raises
  JobError. A member that got the whole total keeps it; if the initiator died while delivering
  the total, members that did not get it re-run without it, and may find that the next in
  ring order already returned: they then raise JobError after their patience.
* The ring needs only each participant to reach its successor; the result goes from the
  initiator to every participant directly. In ring mode a participant that cannot receive it
  raises JobError, while the others return the outcome (whose `participants`, the vectors
  summed, still include it). In pairwise mode the seed round finds such a participant first,
  and the sum is re-run without it.

Compact messages (`compact`: every member has the capability secsum-compact-1, jobs/params.py
SECURE_SUM_COMPACT; without it the whole lists below, as in earlier releases)
* A re-run's announcement (`SumChange`) says what changed: the members dropped (places in the
  job's members) from the list the members hold, identified by its SHA-256 (`base`), and the ring
  order only when it is not the usual one (the initiator first, the others in key order: only a
  dispute changes it). A survivor's message is a fixed frame plus a few bytes per member dropped,
  where the whole list (`SumRestart`) is 32 bytes per participant to every survivor: n² bytes
  from the initiator per re-run (149 MB at 1,000 simulated members with 100 dropping; 1.6 MB
  compact). The members dropped also get the reason.
* A member whose list does not hash to `base` (it missed an announcement: a full mailbox) asks the
  initiator for the whole list (`SumListAsk`), which answers with a `SumRestart` of the current
  attempt while the sum lasts. Announcements it took in order apply one after the other.
* Sums without an initiator (alltoall.py, allreduce.py, reducemap.py) reveal one digest of their
  per-member (per-segment) digests instead of the list, 32 bytes whatever n; members whose
  digests differ then exchange whole lists (`ArCheck`, one leg more, only then) to name the
  member or owner that sent them different values.

Blame: who is dropped, on what evidence
A member can lie to the initiator in a report and can misbehave on the wire, but it cannot
forge what the initiator observes itself. Between two other members, the initiator cannot
check a claim: "my predecessor's chunk was malformed" and "my successor refused my chunk" are
both said by one side of an edge against the other, and frames are authenticated to their
receiver only (no third party can check a refused chunk, and forwarding it would show the
initiator a masked running sum). So:
* Proof: the initiator drops a member on its own evidence only. Its successor refused or did
  not acknowledge its chunk, or a member its announcement; its predecessor's chunk failed its
  own gate (`MalformedFrom`) or had the wrong length; a member did not reveal its seed (or its
  reveal failed the gate); the failure detector reports a member dead. A report that is false on its face
  also proves the reporter faulty: one about a member that is not the reporter's neighbour on
  that side in this attempt, or one about the initiator (it knows what it sent, and it is
  answering). Reports from members outside the attempt's ring are ignored.
* Claim: any other report marks the edge a *dispute* between the two members, neither dropped.
  An "unreachable" claim about a member the failure detector still calls alive is checked by
  announcing the next attempt to the accused first: if it does not acknowledge, it is dropped
  (and the attempt number, which nobody has heard, is reused); if it does, the dispute stands.
  The next ring keeps both but puts them apart, so the same edge cannot fail again.
* Two disputes name the culprit: an honest member only ever disputes a faulty one, so a member
  in disputes with two different members still in the sum is dropped (the one with the most,
  if several). With one faulty member, no honest member is ever dropped while it is alive,
  reaches the others and keeps to the hop timeout, and a faulty member that keeps breaking
  edges is out by the third attempt (`attempts_max` defaults to 3). A member the network cuts
  off from two others looks the same as a faulty one and is dropped. Two colluding members can
  drop an honest one by both disputing it: the rule assumes at most one faulty member per sum.
* When no ring can separate a dispute (three members: the two non-initiators are always
  neighbours), the initiator gives up and every member's error names both: one of them is
  faulty, and which one cannot be known.
* A stall nobody reported (a member swallowed a chunk, or stopped): the initiator asks where
  the chunk is and walks the ring from itself (a member whose send of that chunk is still in
  flight answers once it is acknowledged or failed: within a hop). A member that does not answer, that denies a
  chunk the initiator itself handed it, that says it got the chunk but neither passed it on nor
  reported why, or (the last one) that says it passed it to the initiator, which never got
  it, is dropped on that evidence; "I passed it on" against "I never got it" is a dispute.
* A faulty initiator decides alone who is in and what total each member is sent: it can drop
  anyone, fail the sum, or hand members wrong or different totals (integrity is not protected,
  below). Members accept announcements and results only from it, check that announced lists
  are members with it first, and raise JobError naming it when it sends them something their
  gate refuses. Members replace it only once their failure detector declares it dead.

Who learns what
Everyone in `participants` learns the total, hence the sum of all the other participants'
vectors. Sites are assumed to follow the protocol; a site that also keeps what it sees to
itself learns nothing more (except the initiator after a ring-mode dropout, below). What sites
learn by pooling what they saw (a coalition) depends on the mode. Outsiders see nothing: every
message is encrypted to its recipient (docs/security.md). Integrity is not protected: any participant
can shift the total by adding something other than its vector.

ring mode (docs/security.md, secure sum)
* The initiator adds a uniform mask (fresh for every entry, chunk and attempt: the AES-256-CTR
  keystream of a seed drawn from `ch.random_bytes` per attempt, securesum_masks.py) to its vector
  and sends it on; each site adds its vector and forwards the result; back at the initiator the
  mask is subtracted.
* What a site receives is its predecessors' running sum plus the mask: uniformly distributed,
  whatever the inputs. The initiator sees only the masked total.
* A coalition learns the sum of every maximal run of consecutive non-coalition sites in ring
  order, because it sees the running sum entering and leaving the run. So a site whose two ring
  neighbours collude is fully exposed (the initiator counts as a neighbour: it knows what it
  sent).
* Re-runs: a dispute makes the next attempt run in another order, and a faulty member can start
  one at will; a coalition then sees the runs of two orders, which can isolate a single site
  between two colluders. Use pairwise mode when members may misbehave.
* Dropouts: what was seen in a failed attempt stays known, and the re-run is over fewer sites.
  Each chunk that came back to the initiator before the failure gives the initiator, alone, the
  sum over the old participants; the re-run gives the sum over the survivors; the difference is
  the (summed) entries of the dropped sites in those chunks. A vector of a single chunk cannot
  leak this way (its return ends the attempt). Runs that shrink between attempts let a coalition
  isolate single sites in the same way.

pairwise mode (collusion-resistant)
* As ring mode, and every participant i adds, for every other participant j, a mask expanded
  (the AES-256-CTR keystream, `expand_mask`) from a seed only i and j can derive
  (`ch.pairwise_seed`, an X25519 agreement in the daemon): +mask if i's key < j's key, -mask
  otherwise, so these cancel in the total. Every site but the initiator also adds a self mask
  expanded from a fresh secret seed, which it reveals to the initiator only when asked, after
  the whole vector has come back.
* A coalition of any size learns nothing beyond the total and its own vectors: every value it
  sees carries pairwise masks shared with participants outside the coalition, which cancel only
  in the complete sum (computationally: the pairwise seeds stay secret and AES-CTR keystream
  looks random). A site's vector is exposed only if all other participants collude, and then
  the total gives it away anyway.
* Dropouts: members reveal their self-mask seeds only after every chunk has come back, and an
  attempt fails after that point only if some seed is missing. So every chunk total held from a
  failed attempt still carries the self mask of a member that did not reveal it: alone, the
  initiator learns nothing from it, and re-runs use fresh seeds. The one exception needs a
  coalition holding the initiator and every member whose seed was missing: it knows that
  attempt's total, and by comparing it with the final total it learns the summed vectors of the
  sites dropped between the two that revealed their seeds (e.g. one that died right after).

sparse mode (pairwise with O(log n) mask neighbours; sumcheck offers it, on public vectors, with
the capability secsum-sparse: fedpeer/jobs/params.py SECURE_SUM_WITH_SPARSE)
* As pairwise mode, except that member i adds pairwise masks only with its mask neighbours:
  the 2⌈log2 n⌉ members it picks and those that pick it (`masks.mask_neighbours`), drawn anew
  for every attempt from public randomness (BLAKE2b of the attempt's label and each key), so
  nobody chooses its neighbours and every member computes the same graph. Same messages, same
  self masks and seed round, same re-runs; mask work per member O(log n) instead of n - 1.
* What a coalition learns: a member j's vector is exposed (beyond the total) only to a coalition
  that holds every one of j's mask neighbours (they know the pairwise seeds) and the initiator
  (the only one j's self-mask seed is revealed to) and sees the value entering and leaving j:
  its two ring neighbours, or the initiator as one of them. So a random fraction g of colluding
  members exposes a given member with probability about g^(d + 2), d its mask neighbours
  (at least 2⌈log2 n⌉: 14 at n = 100, 20 at n = 1,000); pairwise mode needs all n - 1 others.
  A coalition holding the initiator and all of j's neighbours is enough whatever the ring order
  when j's ring neighbours are among its mask neighbours. Unlike pairwise mode, the guarantee is
  probabilistic in the coalition's size; it is the SecAgg+ trade (Bell et al. 2020).
* Dropouts: as pairwise mode (the seeds go out only after the lap; a re-run draws new
  neighbours), with the same exception.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedpeer.errors import JobError
from fedpeer.protocols.securesum.core import (  # noqa: F401  (the protocol's limits, for callers and tests)
    CHUNKS_IN_FLIGHT_MAX,
    DEFAULT_CHUNK_ENTRIES,
    HOP_TIMEOUT_MS_MAX,
    MODES,
    RING_MODES,
    OFF_LOOP_BYTES_MIN,
    PAIRED_MODES,
    PHASE,
    SEND_BYTES_IN_FLIGHT_MAX,
    SENDS_IN_FLIGHT_MAX,
    SPARSE,
    TAG_BYTES_MAX,
    Equivocation,
    SumOutcome,
    _Attempt,
    _Masks,
    _Plan,
    _plan,
)
from fedpeer.protocols.securesum.allreduce import all_reduce
from fedpeer.protocols.securesum.alltoall import ALL_TO_ALL_BYTES_MAX, all_to_all, takes_all_to_all  # noqa: F401
from fedpeer.protocols.securesum.allreduce import MODE as ALLREDUCE
from fedpeer.protocols.securesum.follow import _follow
from fedpeer.protocols.securesum.reducemap import MapOutcome, OwnerFn, SegmentRefused, check_results, reduce_map
from fedpeer.protocols.securesum.lead import _lead
from fedpeer.protocols.securesum.masks import PAIR_DOMAIN as _PAIR_DOMAIN  # noqa: F401  (tests reconstruct masks)
from fedpeer.protocols.securesum.masks import (
    SEED_BYTES,  # noqa: F401
    expand_mask,
    pairwise_label,
)
from fedpeer.protocols.securesum.masks import SELF_DOMAIN as _SELF_DOMAIN  # noqa: F401
from fedpeer.protocols.securesum.wire import (  # noqa: F401  (the messages, for callers and tests)
    ATTEMPTS_MAX,
    CHUNK_ENTRIES_MAX,
    FAULTS,
    PARTICIPANTS_MAX,
    REASON_BYTES_MAX,
    VECTOR_ENTRIES_MAX,
    WIRE_TAG_BYTES_MAX,
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
from fedpeer.runtime.channel import Channel

__all__ = ["MODES", "Equivocation", "MapOutcome", "SegmentRefused", "SumOutcome", "expand_mask", "pairwise_label",
           "secure_reduce_map", "secure_results_check", "secure_sum"]


async def secure_sum(ch: Channel, tag: str, vector: np.ndarray, *, mode: str = "ring",
                     hop_timeout_ms: int = 10_000, chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
                     attempts_max: int = 3, compact: bool = False) -> SumOutcome:
    """Sum `vector` (1-D uint64) over the job's members; see the module docstring.

    `tag` must be unique per sum within the job (masks derive from it). `attempts_max` bounds the
    attempts that drop nobody (those that lose members do not count, up to ATTEMPTS_MAX in all;
    1: one attempt, never re-run). `compact`: every member runs COMPACT_CAPABILITY's messages
    (jobs/capabilities.py; "Compact messages" above). Raises JobError when the sum fails or this
    member is left out, LocalProtocolError on bad arguments."""
    plan = _plan(ch, tag, vector, mode, hop_timeout_ms, chunk_entries, attempts_max, compact)
    started_ms = ch.now_ms()
    try:
        if mode == ALLREDUCE:       # small vectors: two legs, all to all (alltoall.py)
            small = takes_all_to_all(len(plan.vector), len(ch.members))
            outcome = await (all_to_all if small else all_reduce)(ch, plan)
        elif ch.me == ch.members[0]:
            outcome = await _lead(ch, plan, _Attempt(1, tuple(ch.members)))
        else:
            outcome = await _follow(ch, plan)
    except JobError:
        _observe(ch, mode, started_ms, ok=False, attempts=0)
        raise
    finally:
        ch.discard(plan.prefix())
    _observe(ch, mode, started_ms, ok=True, attempts=outcome.attempts)
    return outcome


async def secure_reduce_map(ch: Channel, tag: str, vector: np.ndarray, bounds: Sequence[int], owner_fn: OwnerFn, *,
                            hop_timeout_ms: int = 10_000, chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
                            check: bool = True, compact: bool = False) -> MapOutcome:
    """Sum `vector` (1-D uint64) over the job's members segment by segment: member k gets the total
    of vector[bounds[k]:bounds[k + 1]] only, and every member gets owner_fn(k, that total) of
    every k whose segment is not empty (an empty segment's result is empty: its member owns
    nothing; fedpeer/protocols/securesum/reducemap.py). JobError when it fails, SegmentRefused
    when an owner's owner_fn raised ValueError. `compact`: as secure_sum's (the check step's one
    digest)."""
    plan = _plan(ch, tag, vector, ALLREDUCE, hop_timeout_ms, chunk_entries, 1, compact)
    started_ms = ch.now_ms()
    try:
        outcome = await reduce_map(ch, plan, bounds, owner_fn, check)
    except JobError:
        _observe(ch, ALLREDUCE, started_ms, ok=False, attempts=0)
        raise
    finally:
        ch.discard(plan.prefix())
    _observe(ch, ALLREDUCE, started_ms, ok=True, attempts=1)
    return outcome


async def secure_results_check(ch: Channel, tag: str, digests: Sequence[bytes], *,
                               hop_timeout_ms: int = 10_000, compact: bool = False) -> None:
    """The reduce-map's last step on its own (reducemap.check_results): every member's digest of
    each owner's results compared; JobError naming an owner that sent members different ones."""
    # a plan for its tags and hop timeout; the one-entry vector is never sent
    plan = _plan(ch, tag, np.zeros(1, dtype=np.uint64), ALLREDUCE, hop_timeout_ms, DEFAULT_CHUNK_ENTRIES, 1,
                 compact)
    try:
        await check_results(ch, plan, digests)
    finally:
        ch.discard(plan.prefix())


def _observe(ch: Channel, mode: str, started_ms: int, *, ok: bool, attempts: int) -> None:
    """Tell the daemon's metrics (fedpeer/daemon/metrics.py, carried by its channels; absent in sims)
    how long a sum took; the protocol itself never imports the shell."""
    observer = getattr(ch, "metrics", None)
    if observer is not None:
        observer.secure_sum_done(mode, (ch.now_ms() - started_ms) / 1000, ok=ok, attempts=max(1, attempts))

