"""Secure sum of uint64 vectors around the ring of a job's members (DESIGN §6).

Every member of `ch.members` calls `secure_sum(ch, tag, vector)` with the same tag, mode, vector
length and chunk size; every participant still standing at the end returns the same
`SumOutcome`: the sum modulo 2^64 of the vectors of `participants`. Floats and counts go through
`fedpeer.protocols.fixedpoint` first, which refuses inputs whose sum could wrap.

Rules of this module
* Pure protocol code: it talks only through the `Channel` (fedpeer/net/channel.py). Randomness is
  `ch.random_bytes` (the OS CSPRNG in the daemon), pairwise secrets are `ch.pairwise_seed`,
  waiting is `ch.recv` with a timeout. The only clock use is a bound on each `ch.send`
  (`asyncio.timeout`), so that every wait is bounded by hop_timeout_ms.
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
  peer unacknowledged); the initiator likewise, and it sends the total to every member the same
  way, SENDS_IN_FLIGHT_MAX chunks at a time to each. Mask work on chunks of OFF_LOOP_BYTES_MIN
  or more runs in a worker thread (the event loop serves membership meanwhile).
* Delivery of the total: once every chunk is back (and, in pairwise mode, the self masks are
  removed), the initiator sends the total to every participant directly. Not as soon as each
  chunk is complete: a failure later in the lap would leave members holding part of a total
  over participants that a re-run changes (see "Dropouts" below: today only the initiator holds
  that). Not around the ring either (each member keeping a copy and passing it on): on one
  machine the bytes are the same (2n-1 chunk hops per chunk either way) and the chain measured
  no faster (bare relays, 8 MiB: 126 vs 128 MiB/s at 3 sites, 25 vs 47 at 9), while it would let
  any member alter or withhold the total of everyone after it. Members accept the total only
  from the initiator.

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
  (if reachable) and raise JobError. After `attempts_max` attempts, with fewer than 2
  participants left, or with a dispute no ring order can route around, the initiator
  announces that it gives up, saying why, and everybody raises JobError.
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
message is encrypted to its recipient (DESIGN §5). Integrity is not protected: any participant
can shift the total by adding something other than its vector.

ring mode (DESIGN §6)
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
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .. import wire
from ..errors import JobError, LocalProtocolError
from ..net.channel import Channel, MalformedFrom, NodeId, PeerDead, PeerRefused, PeerUnreachable, RecvTimeout
from ..wire import NODE_ID, v_array, v_bool, v_bytes, v_int, v_list, v_str
from . import securesum_masks as sm
from .securesum_masks import PAIR_DOMAIN as _PAIR_DOMAIN  # noqa: F401  (tests reconstruct masks)
from .securesum_masks import SEED_BYTES
from .securesum_masks import SELF_DOMAIN as _SELF_DOMAIN  # noqa: F401
from .securesum_masks import expand_mask, pairwise_label

__all__ = ["MODES", "SumOutcome", "expand_mask", "pairwise_label", "secure_sum"]

MODES = ("ring", "pairwise")
DEFAULT_CHUNK_ENTRIES = 65_536      # 512 KiB of uint64 per message
CHUNK_ENTRIES_MAX = 1 << 20         # 8 MiB per message; receivers refuse larger chunks
VECTOR_ENTRIES_MAX = 1 << 27        # entries per secure sum: 1 GiB of uint64
CHUNKS_IN_FLIGHT_MAX = 8            # chunks on the ring at once; bounds each member's buffer
SENDS_IN_FLIGHT_MAX = 8             # unacknowledged sends of one member to one peer (ring or result)
OFF_LOOP_BYTES_MIN = 2 << 20        # chunks of this many bytes or more are masked in a worker thread
ATTEMPTS_MAX = 16                   # largest attempts_max accepted (and attempt number on the wire)
PARTICIPANTS_MAX = 128              # as many as a job may have members
HOP_TIMEOUT_MS_MAX = 3_600_000
TAG_BYTES_MAX = 128                 # the caller's tag; our suffix adds at most ~40 bytes
WIRE_TAG_BYTES_MAX = 256
REASON_BYTES_MAX = 2048
PHASE = "secure sum"


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class SumChunk:
    """One chunk of the masked running sum, predecessor -> successor (and last -> initiator)."""
    tag: str
    data: np.ndarray          # uint64
    WAITING_FOR: ClassVar[str] = "secure-sum chunk"


FAULTS = ("unreachable", "refused", "malformed")


@dataclass(frozen=True)
class RingBroken:
    """A member -> the initiator: the ring edge between me and my neighbour `peer` failed.
    `fault` is "unreachable" (my successor did not acknowledge my chunk), "refused" (my
    successor's gate refused my chunk) or "malformed" (my predecessor's chunk failed my checks).
    A claim, not a verdict: the initiator weighs it (module docstring, "Blame")."""
    tag: str
    peer: bytes
    fault: str


@dataclass(frozen=True)
class SumRestart:
    """The initiator -> members: attempt `attempt` runs over `participants` (ring order);
    an empty list means the initiator gave up. `reason` says why, for error messages."""
    tag: str
    attempt: int
    participants: tuple[bytes, ...]
    reason: str
    WAITING_FOR: ClassVar[str] = "secure-sum announcement"


@dataclass(frozen=True)
class SeedRequest:
    """The initiator -> members (pairwise mode): every chunk came back, reveal your self-mask seed."""
    tag: str


@dataclass(frozen=True)
class SeedReveal:
    tag: str
    seed: bytes


@dataclass(frozen=True)
class SumWhere:
    """The initiator -> members: chunk `chunk` did not come back; did you get it, pass it on?"""
    tag: str
    chunk: int


@dataclass(frozen=True)
class SumHere:
    """A member -> the initiator: its answer to SumWhere (`passed`: my successor acknowledged it)."""
    tag: str
    chunk: int
    got: bool
    passed: bool


@dataclass(frozen=True, eq=False)
class SumResult:
    """The initiator -> members: one chunk of the total."""
    tag: str
    data: np.ndarray          # uint64
    WAITING_FOR: ClassVar[str] = "secure-sum total"


def _register() -> None:
    tag = v_str(WIRE_TAG_BYTES_MAX)
    chunk = v_array(max_elements=CHUNK_ENTRIES_MAX, dtypes=frozenset({"<u8"}))

    def to_body(msg: Any) -> dict:
        body = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
        if "data" in body:
            body["data"] = wire.encode_array(body["data"])
        if "participants" in body:
            body["participants"] = list(body["participants"])
        return body

    def from_body(cls: type) -> Any:
        def build(body: dict) -> Any:
            if "data" in body and body["data"].ndim != 1:
                raise ValueError("a secure-sum chunk must be one-dimensional")
            if "participants" in body:
                body = {**body, "participants": tuple(body["participants"])}
            return cls(**body)
        return build

    for kind, cls, fields in (
            ("ss_chunk", SumChunk, {"tag": tag, "data": chunk}),
            ("ss_ring_broken", RingBroken, {"tag": tag, "peer": NODE_ID,
                                            "fault": v_str(16, frozenset(FAULTS))}),
            ("ss_restart", SumRestart, {"tag": tag, "attempt": v_int(1, ATTEMPTS_MAX + 1),
                                        "participants": v_list(NODE_ID, PARTICIPANTS_MAX),
                                        "reason": v_str(REASON_BYTES_MAX)}),
            ("ss_seed_request", SeedRequest, {"tag": tag}),
            ("ss_seed", SeedReveal, {"tag": tag, "seed": v_bytes(exact=SEED_BYTES)}),
            ("ss_result", SumResult, {"tag": tag, "data": chunk}),
            ("ss_where", SumWhere, {"tag": tag, "chunk": v_int(0, VECTOR_ENTRIES_MAX)}),
            ("ss_here", SumHere, {"tag": tag, "chunk": v_int(0, VECTOR_ENTRIES_MAX),
                                  "got": v_bool, "passed": v_bool})):
        wire.register(kind, cls, fields, to_body=to_body, from_body=from_body(cls))


_register()


# ---------------------------------------------------------------------------------------------
# Outcome, plan, attempt
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class SumOutcome:
    total: np.ndarray                     # uint64: the sum mod 2^64 over `participants`
    participants: tuple[bytes, ...]       # members whose vectors are in the sum, in key order
    attempts: int

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, SumOutcome) and self.participants == other.participants
                and self.attempts == other.attempts and np.array_equal(self.total, other.total))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class _Plan:
    """What every member agrees on before the first message: from the call's arguments."""
    job_id: str
    tag: str
    mode: str
    vector: np.ndarray
    chunk_entries: int
    hop_timeout_ms: int
    attempts_max: int
    initiator: bytes | None = None    # who runs the sum: None = the first member; set by a takeover

    @property
    def chunks(self) -> int:
        return max(1, -(-len(self.vector) // self.chunk_entries))

    def span(self, k: int) -> slice:
        return slice(k * self.chunk_entries, min((k + 1) * self.chunk_entries, len(self.vector)))

    def chunk_len(self, k: int) -> int:
        s = self.span(k)
        return s.stop - s.start

    def prefix(self, attempt: int | None = None) -> str:
        """Tags of this sum (every initiator's) without `attempt`; with it, of that attempt under
        this plan's initiator. A takeover's messages live under the new initiator's key, so no
        message of a dead initiator's attempts is ever mixed into its successor's."""
        base = f"{self.tag}/ss-{self.mode}/"
        if attempt is None:
            return base
        return f"{self.era_prefix()}a{attempt}/"

    def era_prefix(self) -> str:
        base = f"{self.tag}/ss-{self.mode}/"
        return base if self.initiator is None else f"{base}by-{self.initiator.hex()[:16]}/"

    def first(self, members: Sequence[bytes]) -> bytes:
        """This plan's initiator."""
        return members[0] if self.initiator is None else self.initiator

    def chunk_tag(self, attempt: int, k: int) -> str:
        return f"{self.prefix(attempt)}c{k}"

    def result_tag(self, attempt: int, k: int) -> str:
        return f"{self.prefix(attempt)}r{k}"

    def restart_tag(self) -> str:
        return f"{self.era_prefix()}restart"

    def send_bound_ms(self) -> int:
        return self.hop_timeout_ms


@dataclass(frozen=True)
class _Attempt:
    number: int
    participants: tuple[bytes, ...]

    @property
    def initiator(self) -> bytes:
        return self.participants[0]

    def neighbours(self, me: bytes) -> tuple[bytes, bytes]:
        i = self.participants.index(me)
        n = len(self.participants)
        return self.participants[(i - 1) % n], self.participants[(i + 1) % n]

    def round_trip_ms(self, plan: _Plan) -> int:
        """The initiator's wait for a chunk to come back: one hop per participant + its own send."""
        return (len(self.participants) + 1) * plan.hop_timeout_ms

    def patience_ms(self, plan: _Plan) -> int:
        """A member's wait for its next message: two round trips and five hops, so the initiator
        has always noticed a failure, asked where a chunk is (one hop out, two for the answers)
        and announced a new attempt (two waves) before a member gives up. A member may start
        waiting up to a round trip before the initiator does (its chunk came back later)."""
        return 2 * self.round_trip_ms(plan) + 5 * plan.hop_timeout_ms


def _plan(ch: Channel, tag: str, vector: np.ndarray, mode: str, hop_timeout_ms: int,
          chunk_entries: int, attempts_max: int) -> _Plan:
    def misuse(problem: str) -> LocalProtocolError:
        return LocalProtocolError("securesum", problem)

    if mode not in MODES:
        raise misuse(f"mode must be one of {MODES}, got {mode!r}")
    if not tag or len(tag.encode()) > TAG_BYTES_MAX:
        raise misuse(f"tag must be 1 to {TAG_BYTES_MAX} bytes")
    vector = np.asarray(vector)
    if vector.dtype != np.uint64 or vector.ndim != 1 or len(vector) > VECTOR_ENTRIES_MAX:
        raise misuse(f"vector must be 1-D uint64 with at most {VECTOR_ENTRIES_MAX} entries, "
                     f"got {vector.dtype} {vector.shape}")
    if not 1 <= chunk_entries <= CHUNK_ENTRIES_MAX:
        raise misuse(f"chunk_entries must be in [1, {CHUNK_ENTRIES_MAX}]")
    if not 1 <= attempts_max <= ATTEMPTS_MAX or not 1 <= hop_timeout_ms <= HOP_TIMEOUT_MS_MAX:
        raise misuse(f"attempts_max must be in [1, {ATTEMPTS_MAX}] and hop_timeout_ms in "
                     f"[1, {HOP_TIMEOUT_MS_MAX}]")
    assert list(ch.members) == sorted(set(ch.members)) and ch.me in ch.members, \
        "channel members must be sorted, unique and include me"
    if len(ch.members) < 2:
        raise JobError(f"secure sum '{tag}' needs at least 2 members, got {len(ch.members)}")
    return _Plan(ch.job_id, tag, mode, vector, chunk_entries, hop_timeout_ms, attempts_max)


# ---------------------------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------------------------

def _Masks(ch: Channel, plan: _Plan, att: _Attempt) -> sm.Masks:
    """One member's masks for one attempt (fedpeer/protocols/securesum_masks.py)."""
    return sm.Masks(ch, plan, ch.me, att.initiator, att.participants, att.number)


async def _compute(plan: _Plan, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args): mask work on one chunk, in a worker thread when chunks are large (an 8 MiB
    chunk with 8 pairwise masks is ~25 ms of AES and adds: too long for the event loop); on the
    loop below OFF_LOOP_BYTES_MIN, where a thread hand-off costs more than it saves."""
    if 8 * plan.chunk_entries >= OFF_LOOP_BYTES_MIN:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


# ---------------------------------------------------------------------------------------------
# Channel helpers
# ---------------------------------------------------------------------------------------------

async def _send(ch: Channel, plan: _Plan, dst: NodeId, msg: object) -> None:
    """ch.send bounded by one hop: a peer that does not acknowledge in time is unreachable."""
    try:
        async with asyncio.timeout(plan.send_bound_ms() / 1000):
            await ch.send(dst, msg)
    except TimeoutError:
        raise PeerUnreachable(dst, f"no acknowledgement within {plan.send_bound_ms()} ms") from None


async def _broadcast(ch: Channel, plan: _Plan, targets: Sequence[NodeId], msg: object) -> set[NodeId]:
    """Send to all targets at once; returns those that were unreachable."""
    results = await asyncio.gather(*(_send(ch, plan, p, msg) for p in targets), return_exceptions=True)
    failed = set()
    for peer, result in zip(targets, results):
        if isinstance(result, PeerUnreachable):
            failed.add(peer)
        elif isinstance(result, BaseException):
            raise result
    return failed


Want = tuple[type, str, NodeId | None]


async def _recv_first(ch: Channel, wants: Sequence[Want], timeout_ms: int) -> list[tuple[NodeId, Any]]:
    """Wait for the first message matching any of `wants`. Returns every message taken (more
    than one if several arrived in the same instant: none is lost). RecvTimeout if none."""
    if len(wants) == 1:
        kind, tag, src = wants[0]
        return [await ch.recv(kind, tag, src=src, timeout_ms=timeout_ms)]
    tasks = [asyncio.create_task(ch.recv(kind, tag, src=src, timeout_ms=timeout_ms))
             for kind, tag, src in wants]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        # A recv cancelled in the very step it took its message still returns it: collect all.
        results = await asyncio.gather(*tasks, return_exceptions=True)
    got = [r for r in results if isinstance(r, tuple)]
    if got:
        return got
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, (RecvTimeout, asyncio.CancelledError)):
            raise r
    raise RecvTimeout(f"nothing within {timeout_ms} ms")


class _WrongLength(JobError):
    """A chunk of the wrong length: well-formed on the wire, but not what this sum expects."""


def _check_chunk(plan: _Plan, data: np.ndarray, k: int, src: NodeId) -> np.ndarray:
    if data.shape != (plan.chunk_len(k),):
        raise _WrongLength(f"secure sum '{plan.tag}': {src.hex()[:16]} sent chunk {k} with "
                       f"{data.shape[0]} entries, expected {plan.chunk_len(k)}: members disagree "
                       f"on the vector length or chunk size")
    return data


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------

async def secure_sum(ch: Channel, tag: str, vector: np.ndarray, *, mode: str = "ring",
                     hop_timeout_ms: int = 10_000, chunk_entries: int = DEFAULT_CHUNK_ENTRIES,
                     attempts_max: int = 3) -> SumOutcome:
    """Sum `vector` (1-D uint64) over the job's members; see the module docstring.

    `tag` must be unique per sum within the job (masks derive from it). Raises JobError when the
    sum fails or this member is left out, LocalProtocolError on bad arguments."""
    plan = _plan(ch, tag, vector, mode, hop_timeout_ms, chunk_entries, attempts_max)
    started_ms = ch.now_ms()
    try:
        if ch.me == ch.members[0]:
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


def _observe(ch: Channel, mode: str, started_ms: int, *, ok: bool, attempts: int) -> None:
    """Tell the daemon's metrics (fedpeer/metrics.py, carried by its channels; absent in sims)
    how long a sum took; the protocol itself never imports the shell."""
    observer = getattr(ch, "metrics", None)
    if observer is not None:
        observer.secure_sum_done(mode, (ch.now_ms() - started_ms) / 1000, ok=ok, attempts=max(1, attempts))


class _InitiatorGone(Exception):
    """The failure detector declared this attempt's initiator dead (module docstring, "Takeover")."""


# ---------------------------------------------------------------------------------------------
# Initiator
# ---------------------------------------------------------------------------------------------

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
    while True:
        try:
            total = await _lead_attempt(ch, plan, att)
        except _RingFault as fault:
            ch.discard(plan.prefix(att.number))
            disputes |= fault.disputes
            att = await _next_attempt(ch, plan, att, fault, disputes)
            continue
        except JobError as exc:       # members disagree on the vector: tell them, then fail
            await _broadcast(ch, plan, att.participants[1:],
                             SumRestart(plan.restart_tag(), att.number + 1, (), str(exc)))
            raise
        await _deliver(ch, plan, att, total)
        return SumOutcome(total=total, participants=tuple(sorted(att.participants)), attempts=att.number)


async def _lead_attempt(ch: Channel, plan: _Plan, att: _Attempt) -> np.ndarray:
    """One ring run (and, in pairwise mode, the seed round). Raises _RingFault on failure."""
    masks = _Masks(ch, plan, att)
    pred, succ = att.neighbours(ch.me)
    total = np.empty(len(plan.vector), dtype=np.uint64)
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
        for k in range(plan.chunks):
            data = await _await_return(ch, plan, att, k, pred)
            await _compute(plan, sm.unmask_ring, data, masks, k, total[plan.span(k)])
            window.release()
            ch.progress(PHASE, k + 1, plan.chunks)

    try:
        async with asyncio.TaskGroup() as group:   # pipelined: sending does not wait for returns
            group.create_task(send_chunks(group))
            group.create_task(receive_chunks())
    except BaseExceptionGroup as eg:
        if not all(isinstance(e, (_RingFault, JobError)) for e in eg.exceptions):
            raise                      # a bug or a cancellation: not ours to interpret
        fatal = [e for e in eg.exceptions if isinstance(e, JobError)]
        raise (fatal[0] if fatal else _RingFault.merge(eg.exceptions)) from None
    if plan.mode == "pairwise":
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


async def _next_attempt(ch: Channel, plan: _Plan, att: _Attempt, fault: _RingFault,
                        disputes: set[Dispute]) -> _Attempt:
    """Drop suspects, dead members and culprits of disputes; announce the survivors in a ring
    order that separates disputing members, with a new attempt number (again, while
    announcements find more unreachable members); JobError when out of attempts."""
    reason = fault.reason
    survivors = [p for p in att.participants if p == ch.me or p in fault.responsive
                 or (p not in fault.suspects and ch.alive(p))]
    targets = [p for p in att.participants if p != ch.me]
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
        if number > plan.attempts_max or order is None:
            raise await _give_up(ch, plan, targets, number, survivors, disputes, reason)
        announce = SumRestart(plan.restart_tag(), number, order, reason)
        early = [p for p in targets if p in first and p in survivors]
        unreachable = await _broadcast(ch, plan, early, announce)
        first = frozenset()
        if early and unreachable >= set(early):
            number -= 1                   # nobody has heard this number: it is still fresh
        else:
            unreachable |= await _broadcast(ch, plan, [p for p in targets if p not in early], announce)
        targets = [p for p in targets if p not in unreachable]
        lost = [p for p in survivors if p in unreachable]
        if not lost:
            return _Attempt(number, order)
        survivors = [p for p in survivors if p not in unreachable]
        reason = "unreachable when announcing the next attempt: " + ", ".join(p.hex()[:16] for p in lost)


async def _give_up(ch: Channel, plan: _Plan, targets: Sequence[NodeId], number: int,
                   survivors: Sequence[bytes], disputes: set[Dispute], reason: str) -> JobError:
    """Tell every member the sum failed and why; the error to raise."""
    if len(survivors) < 2:
        detail = " with fewer than 2 participants left"
    elif number > plan.attempts_max:
        detail = ""
    else:
        pair = next(d for d in disputes if d <= set(survivors))
        a, b = sorted(pair)
        detail = (f": {a.hex()[:16]} and {b.hex()[:16]} each blame the other and no other member "
                  f"can stand between them; one of the two is faulty")
    why = f"secure sum '{plan.tag}' failed after {number - 1} attempt(s){detail}; last failure: {reason}"
    await _broadcast(ch, plan, targets, SumRestart(plan.restart_tag(), number, (), why))
    return JobError(why)


async def _deliver(ch: Channel, plan: _Plan, att: _Attempt, total: np.ndarray) -> None:
    """Send the total to every member, chunk by chunk, up to SENDS_IN_FLIGHT_MAX chunks at once
    to each. A member that died after the ring came back is not waited for: its vector is in
    the sum, the others get the same outcome."""
    async def to(member: NodeId) -> None:
        try:
            await _send_all(ch, plan, member, (SumResult(plan.result_tag(att.number, k), total[plan.span(k)])
                                               for k in range(plan.chunks)))
        except PeerUnreachable:
            pass

    await asyncio.gather(*(to(m) for m in att.participants[1:]))


async def _send_all(ch: Channel, plan: _Plan, dst: NodeId, messages: Any) -> None:
    """Send every message of the iterable to `dst`, SENDS_IN_FLIGHT_MAX at a time; the first
    failure (PeerUnreachable) stops the rest and is raised."""
    window = asyncio.Semaphore(SENDS_IN_FLIGHT_MAX)

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


# ---------------------------------------------------------------------------------------------
# Other members
# ---------------------------------------------------------------------------------------------

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
            ring = _Attempt(0, (ch.me, *[p for p in order if p != ch.me and p not in gone]))
            why = "took over from initiator(s) declared dead: " + ", ".join(p.hex()[:16] for p in sorted(gone))
            first = await _next_attempt(ch, era, ring, _RingFault(why), set())
            return await _lead(ch, era, first)
        restart = (SumRestart, era.restart_tag(), candidate)
        try:
            _, msg = await ch.recv(*restart[:2], src=candidate, timeout_ms=att.patience_ms(plan))
        except PeerDead:
            gone.add(candidate)
            continue
        except RecvTimeout:
            raise JobError(f"secure sum '{plan.tag}': initiator {att.initiator.hex()[:16]} was declared dead "
                           f"and {candidate.hex()[:16]}, next in ring order, did not take over within "
                           f"{att.patience_ms(plan)} ms") from None
        return era, _accept_restart(ch, era, msg)
    raise JobError(f"secure sum '{plan.tag}': every other participant was declared dead")


async def _follow_attempt(ch: Channel, plan: _Plan, att: _Attempt) -> SumOutcome | _Attempt:
    """One attempt as a member: forward the chunks, reveal the seed if asked, take the result.
    Returns the next attempt when the initiator announces one."""
    masks, trace = _Masks(ch, plan, att), _Trace()
    try:
        return await _follow_ring(ch, plan, att, masks, trace)
    finally:
        trace.stop()


async def _follow_ring(ch: Channel, plan: _Plan, att: _Attempt, masks: sm.Masks,
                       trace: _Trace) -> SumOutcome | _Attempt:
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
    return await _collect_result(ch, plan, att, got)


@dataclass
class _Trace:
    """Which chunks this member got and passed on in this attempt: its answer to SumWhere.
    `sending`: the sends of chunks still unacknowledged (SumWhere waits for them: at most a hop)."""
    got: set[int] = dataclasses.field(default_factory=set)
    passed: set[int] = dataclasses.field(default_factory=set)
    sending: dict[int, asyncio.Task] = dataclasses.field(default_factory=dict)
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
    window = asyncio.Semaphore(SENDS_IN_FLIGHT_MAX)

    async def forward(k: int, msg: SumChunk) -> None:
        try:
            await _send(ch, plan, succ, msg)
            trace.passed.add(k)
            ch.progress(PHASE, len(trace.passed), plan.chunks)
        except PeerUnreachable as exc:   # PeerRefused included, reported as what it is
            if not trace.broken:
                trace.broken.append(exc)
                if succ != att.initiator:     # else there is nobody to tell: the initiator sees it
                    fault = "refused" if isinstance(exc, PeerRefused) else "unreachable"
                    try:
                        await _send(ch, plan, att.initiator, RingBroken(_broken_tag(plan, att), succ, fault))
                    except PeerUnreachable:
                        pass          # the initiator is gone: our next wait finds out
        finally:
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
        trace.sending[k] = asyncio.create_task(forward(k, SumChunk(tag, data)))
    if trace.broken:
        exc = trace.broken[0]
        if succ == att.initiator and isinstance(exc, PeerRefused):
            return await _initiator_fate(ch, plan, att, trace, exc)
        return False
    return True


def _broken_tag(plan: _Plan, att: _Attempt) -> str:
    return plan.prefix(att.number) + "broken"


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
    restart = (SumRestart, plan.restart_tag(), att.initiator)
    where = (SumWhere, plan.prefix(att.number) + "where", att.initiator)
    deadline = ch.now_ms() + att.patience_ms(plan)
    while True:
        try:
            got = await _recv_first(ch, [*wants, restart, where], max(0, deadline - ch.now_ms()))
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
            pending = trace.sending.get(q.chunk)
            if pending is not None and not pending.done():   # its outcome within a hop: the truth
                await asyncio.wait({pending})
            here = SumHere(q.tag, q.chunk, q.chunk in trace.got, q.chunk in trace.passed)
            try:
                await _send(ch, plan, att.initiator, here)
            except PeerUnreachable:
                pass          # the initiator is gone: the next wait finds out
        newer = [m for _, m in got if isinstance(m, SumRestart) and m.attempt > att.number]
        if newer:
            return _accept_restart(ch, plan, max(newer, key=lambda m: m.attempt))
        others = [m for _, m in got if not isinstance(m, (SumRestart, SumWhere))]
        if others:
            return others[0]
        # only stale announcements (overtaken by a newer one): keep waiting


def _accept_restart(ch: Channel, plan: _Plan, msg: SumRestart) -> _Attempt:
    if not msg.participants:
        raise JobError(msg.reason or f"secure sum '{plan.tag}': the initiator gave up")
    listed = list(msg.participants)     # ring order: the initiator first, then any order
    if len(set(listed)) != len(listed) or not set(listed) <= set(ch.members) \
            or listed[0] != plan.first(ch.members) or len(listed) < 2:
        raise JobError(f"secure sum '{plan.tag}': the initiator announced an invalid participant list")
    if ch.me not in msg.participants:
        raise JobError(f"secure sum '{plan.tag}': this site was left out of attempt {msg.attempt} "
                       f"({msg.reason})")
    return _Attempt(msg.attempt, msg.participants)


async def _collect_result(ch: Channel, plan: _Plan, att: _Attempt, first: SumResult) -> SumOutcome:
    total = np.empty(len(plan.vector), dtype=np.uint64)
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
