"""What the secure sum's initiator and members share (fedpeer/protocols/securesum/api.py): its limits,
the plan every member agrees on before the first message, an attempt (number and ring order),
the outcome, and the helpers every wait and send goes through (each bounded by the hop timeout)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeer.errors import JobError, LocalProtocolError
from fedpeer.protocols.securesum import masks as sm
from fedpeer.protocols.securesum.wire import ATTEMPTS_MAX, CHUNK_ENTRIES_MAX, VECTOR_ENTRIES_MAX
from fedpeer.runtime.channel import Channel, NodeId, PeerUnreachable, RecvTimeout

RING_MODES = ("ring", "pairwise")
SPARSE = sm.SPARSE_MODE              # pairwise with O(log n) mask neighbours (masks.py, mask_neighbours)
PAIRED_MODES = sm.PAIRED_MODES       # pairwise and self masks, the seed round
MODES = (*RING_MODES, SPARSE, "allreduce")   # allreduce: allreduce.py
# 2 MiB of uint64 per message: every frame costs fixed Python work at each end (framing, session,
# gate, mailbox, HTTP), so fewer, larger frames cost less CPU per MiB. 8 MiB ring sums over 5
# daemons, sums' CPU of all daemons (ms per MiB of vector, two runs): 512 KiB chunks 46 / 43,
# 1 MiB 40 / 41, 2 MiB 30 / 29; wall time no worse. Chunks this size are masked off the loop.
DEFAULT_CHUNK_ENTRIES = 262_144
CHUNKS_IN_FLIGHT_MAX = 8            # chunks on the ring at once; bounds each member's buffer
SENDS_IN_FLIGHT_MAX = 8             # unacknowledged sends of one member to one peer (ring or result)
SEND_BYTES_IN_FLIGHT_MAX = 32 << 20 # ... and at most this many bytes of them to all peers at once
OFF_LOOP_BYTES_MIN = 2 << 20        # chunks of this many bytes or more are masked in a worker thread
HOP_TIMEOUT_MS_MAX = 3_600_000
TAG_BYTES_MAX = 128                 # the caller's tag; our suffix adds at most ~40 bytes
PHASE = "secure sum"


class Equivocation(JobError):
    """Members hold different copies of what one member sent them all (the digests differ): that
    member is named. Nobody died, so the caller has no one to wait for or drop
    (fedpeer/protocols/epochs.py fails the job at once)."""


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
    compact: bool = False             # every member speaks COMPACT_CAPABILITY (wire.py): announcements
                                      # as changes, reveals and checks as one digest

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

    def send_window(self, peers: int = 1) -> int:
        """Chunks in flight to each of `peers` peers at once: SENDS_IN_FLIGHT_MAX, fewer for large
        chunks, so that one member never holds more than SEND_BYTES_IN_FLIGHT_MAX unacknowledged."""
        return max(1, min(SENDS_IN_FLIGHT_MAX, SEND_BYTES_IN_FLIGHT_MAX // (8 * self.chunk_entries * peers)))


@dataclass(frozen=True)
class _Attempt:
    number: int
    participants: tuple[bytes, ...]
    charged: int = 1      # attempts so far that count against attempts_max (lead.py, _out_of_attempts)

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
          chunk_entries: int, attempts_max: int, compact: bool = False) -> _Plan:
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
    return _Plan(ch.job_id, tag, mode, vector, chunk_entries, hop_timeout_ms, attempts_max, compact=bool(compact))


# ---------------------------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------------------------

def _Masks(ch: Channel, plan: _Plan, att: _Attempt) -> sm.Masks:
    """One member's masks for one attempt (fedpeer/protocols/securesum/masks.py)."""
    return sm.Masks(ch, plan, ch.me, att.initiator, att.participants, att.number)


async def _compute(plan: _Plan, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args): mask work on one chunk, in a worker thread when chunks are large (an 8 MiB
    chunk with 8 pairwise masks is ~25 ms of AES and adds: too long for the event loop); on the
    loop below OFF_LOOP_BYTES_MIN, where a thread hand-off costs more than it saves. The size
    that counts is the chunks' own: a vector shorter than chunk_entries is one short chunk."""
    if 8 * min(plan.chunk_entries, len(plan.vector)) >= OFF_LOOP_BYTES_MIN:
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



def _new_total(plan: _Plan) -> asyncio.Future:
    """A future of the array the total is assembled in. The first write to fresh memory
    page-faults (~1-3 ms/MiB on this VM: 15 % of a member's event loop in a 64 MiB sum, spent
    copying result chunks in), so for vectors of OFF_LOOP_BYTES_MIN or more the array is
    allocated and touched in a worker thread, started early: ready when the first chunk is."""
    entries = len(plan.vector)
    if 8 * entries < OFF_LOOP_BYTES_MIN:
        done = asyncio.get_running_loop().create_future()
        done.set_result(np.empty(entries, dtype=np.uint64))
        return done
    return asyncio.ensure_future(asyncio.to_thread(_touched, entries))


def _touched(entries: int) -> np.ndarray:
    total = np.empty(entries, dtype=np.uint64)
    total.fill(0)
    return total


def _list_digest(participants: Sequence[bytes]) -> bytes:
    """SHA-256 of a participant list in its ring order: what a compact announcement changes
    (SumChange.base), so a member can tell it holds that list."""
    return hashlib.sha256(b"".join(participants)).digest()


def _list_tag(plan: _Plan) -> str:
    """Where members ask this era's initiator for the whole participant list (SumListAsk)."""
    return plan.era_prefix() + "list"


def _broken_tag(plan: _Plan, att: _Attempt) -> str:
    return plan.prefix(att.number) + "broken"


class _InitiatorGone(Exception):
    """The failure detector declared this attempt's initiator dead (module docstring, "Takeover")."""

