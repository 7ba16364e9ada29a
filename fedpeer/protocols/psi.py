"""Private set intersection of the members' ID sets, without a server (docs/algorithms.md,
"Vertical partition"; docs/security.md, "What vertical alignment reveals").

Every member of `ch.members` calls `intersect(ch, ids, ...)` with its own distinct IDs; every
member returns the same `Intersection`: the IDs every member holds, as positions into its own
`ids`, in an order every member derives alike. Commutative (Diffie–Hellman) blinding in the
prime-order group of Ed25519 (libsodium through PyNaCl): H(x) is SHA-512(DOMAIN ‖ job id ‖ x)
mapped to two points (Elligator 2, cofactor cleared) and added — the construction ristretto255's
hash-to-group uses, which this PyNaCl does not expose — and a member blinds a point P with its
secret scalar k as k·P. Scalar multiplication commutes, so an ID blinded by every member's
scalar, in any order, is one point whoever held it; under the decisional Diffie–Hellman
assumption a point blinded by a scalar one does not know looks random.

The protocol (members M_0 .. M_{n-1} in ring order; the collector is M_0):
1. sizes: every member tells every other how many IDs it holds (sizes are not hidden); a member
   refuses at once, before it hashes or blinds anything, a member that announces more than its
   [policy] ids_max (`ids_max`: TooManyIds, naming that member).
2. blinding lap: every member blinds its hashed IDs with its scalar, shuffles them and sends the
   list on along the list's `blinding_path` (its owner, the collector, then the others in ring
   order); each member blinds every list it receives, shuffles it and passes it on, so each list
   is blinded and shuffled by every member; the member that blinds a list last keeps it and
   sends it to the collector. With three members or more that is never the collector. Every
   list is checked where it arrives — its owner's size, no repeated point, valid points — and a
   wrong one names the member that sent it (blinding is one-to-one: a repeat is the sender's).
3. count: the collector finds the points in every list (the IDs held by all), and tells every
   member how many; each member checks that count against its [policy] rows_min (`rows_min`)
   and every member tells every other its verdict: one refusal (or none in common) ends the
   intersection at every member before any common ID is revealed.
4. check: the collector sends every member the common points (fully blinded); every member
   checks they are all in every list it blinded last (every list is some member's to check) and
   tells every other its verdict. No member removes its scalar from anything before every
   verdict says yes: a collector that announces points outside the intersection is refused
   before any of them is unblinded.
5. unblinding lap: the collector removes its scalar (k⁻¹) from the common points and passes them
   on in ring order, with a proof (batched Chaum–Pedersen, `prove_strip`) that it removed its own
   scalar from exactly the checked common points and did nothing else; the next member checks the
   proof before it removes its own. Each member removes its own; the last holds H(x) of the
   common IDs, checks every one is its own, and sends them to every member.
6. order: every member checks the common points are all its own, sorts them (by their bytes: H
   depends on the job id, so the order is a pseudo-random one every member derives), maps them
   to its rows, and every member compares a digest of the ordered list with every other's.

Who learns what (docs/security.md, "What vertical alignment reveals", says more, each claim with
its test):
- every member: the common IDs (its own IDs among them, in the shared order), every member's
  number of IDs, the number in common; nothing about another member's IDs outside the
  intersection — what it sees of them is blinded by scalars it does not know, shuffled;
- the collector also: for every group of members, how many IDs they have in common (not which:
  it compares fully blinded lists, each from a known owner, shuffled so no position says which
  ID); no member can test a guessed ID except by holding it itself.
- A member that deviates can break the intersection (a wrong list ends in a failed check, naming
  it where the check has the evidence). It cannot learn a point outside the intersection: the
  collector's common points are checked against every list by a member that made it, before any
  scalar is removed, and its own removal is proven; a member other than the collector holds no
  point without the collector's scalar on it, so it has nothing else to put in the lap. Two
  members that collude (the collector and a list's last blinder) are beyond these checks.

Rules of this module: pure protocol code over the Channel (fedpeer/runtime/channel.py); randomness
(scalars, shuffles, the proof's nonce) from `ch.random_bytes`; the elliptic-curve work runs through `offload` (a
worker thread in the daemon: ~100 µs per point per member); every wait is bounded, every list
travels in chunks of at most CHUNK_POINTS_MAX points.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedpeer.errors import JobError
from fedpeer.runtime.channel import Channel, MalformedFrom, NodeId
from fedpeer.wire import frame as wire

POINT_BYTES = 32                    # an encoded Ed25519 point
IDS_MAX = 1_000_000                 # IDs per member in one intersection (32 MB of points per list)
CHUNK_POINTS_MAX = 1 << 15          # points per message: 1 MiB
TAG_BYTES_MAX = 128                 # the caller's tag and our suffix
ID_BYTES_MAX = 1024                 # an ID's UTF-8 bytes (the data layer allows 256 characters)
POINT_WORK_US_MAX = 2_000           # patience per point and member: ~100 µs measured, 20x for a loaded host
DIGEST_BYTES = 32
DOMAIN = b"fedpeer/v1/psi/ed25519\x00"

Offload = Callable[..., Awaitable[Any]]


class NoCommonIds(JobError):
    """No ID is held by every member: nothing to align."""


class TooFewCommon(JobError):
    """This member refuses an intersection smaller than its `rows_min`."""


class TooManyIds(JobError):
    """Another member (`member`) announces more IDs than this member's `ids_max` ([policy] ids_max)."""

    def __init__(self, member: NodeId) -> None:
        self.member = member
        super().__init__(f"member {member.hex()[:16]} announces more IDs than this site's [policy] ids_max")


class RefusedByMember(JobError):
    """Another member refused the intersection's size (`member`)."""

    def __init__(self, member: NodeId) -> None:
        self.member = member
        super().__init__(f"member {member.hex()[:16]} refuses an intersection of this size (below its [policy] "
                         "rows_min)")


class Inconsistent(JobError):
    """The intersection's checks failed: what a member announced cannot be the true intersection."""


@dataclass(frozen=True)
class PsiSize:
    """A member's number of IDs (step 1), the number in common (step 3, from the collector), or a
    verdict on it (step 3: 1 accepts, 0 refuses)."""
    tag: str
    count: int
    WAITING_FOR: ClassVar[str] = "intersection size"


@dataclass(frozen=True, eq=False)
class PsiPoints:
    """One chunk of a list of points: `total` points in the list, this is chunk `index`."""
    tag: str
    total: int
    index: int
    points: bytes
    WAITING_FOR: ClassVar[str] = "blinded IDs"


@dataclass(frozen=True)
class PsiDigest:
    """SHA-256 of the ordered common points (step 5)."""
    tag: str
    digest: bytes
    WAITING_FOR: ClassVar[str] = "intersection digest"


_TAG = wire.v_str(TAG_BYTES_MAX)
# registered by the job catalogue with the kinds that run over vertical sites (their `messages`)
MESSAGES = (wire.declare("psi_size", PsiSize, {"tag": _TAG, "count": wire.v_int(0, IDS_MAX)}),
            wire.declare("psi_points", PsiPoints, {"tag": _TAG, "total": wire.v_int(0, IDS_MAX),
                                                   "index": wire.v_int(0, IDS_MAX // CHUNK_POINTS_MAX + 1),
                                                   "points": wire.v_bytes(max_bytes=CHUNK_POINTS_MAX * POINT_BYTES)}),
            wire.declare("psi_digest", PsiDigest, {"tag": _TAG, "digest": wire.v_bytes(exact=DIGEST_BYTES)}))


@dataclass(frozen=True)
class Intersection:
    rows: np.ndarray                    # int64: positions into this member's `ids`, in the shared order
    sizes: dict[NodeId, int]            # every member's number of IDs
    digest: bytes                       # SHA-256 of the ordered common points (the same at every member)

    @property
    def count(self) -> int:
        return int(len(self.rows))


# ---------------------------------------------------------------------------------------------
# The group: hashing, scalars, blinding (pure; the bulk runs off the event loop)
# ---------------------------------------------------------------------------------------------

def _nacl() -> Any:
    import nacl.bindings as b
    return b


def hash_ids(job_id: str, ids: Sequence[str]) -> list[bytes]:
    """H(x) of every ID: a point of the prime-order group, the same at every member of the job."""
    b = _nacl()
    job = job_id.encode()
    prefix = DOMAIN + len(job).to_bytes(2, "big") + job
    points = []
    for x in ids:
        raw = x.encode("utf-8")
        if len(raw) > ID_BYTES_MAX:
            raise JobError(f"an ID of {len(raw)} bytes is longer than {ID_BYTES_MAX}")
        h = hashlib.sha512(prefix + raw).digest()
        points.append(b.crypto_core_ed25519_add(b.crypto_core_ed25519_from_uniform(h[:32]),
                                                b.crypto_core_ed25519_from_uniform(h[32:])))
    return points


def new_scalar(random64: bytes) -> bytes:
    """A secret scalar from 64 random bytes (reduced mod the group order; never 0)."""
    scalar = _nacl().crypto_core_ed25519_scalar_reduce(random64)
    assert any(scalar), "a zero scalar from 64 random bytes"
    return scalar


def inverse(scalar: bytes) -> bytes:
    return _nacl().crypto_core_ed25519_scalar_invert(scalar)


def blind(points: Sequence[bytes], scalar: bytes, check: bool) -> list[bytes] | None:
    """scalar·P for every point; with `check`, None if some P is not a valid point of the
    prime-order group (canonical, on the curve, not of small order): a peer's points."""
    b = _nacl()
    if check and not all(b.crypto_core_ed25519_is_valid_point(p) for p in points):
        return None
    return [b.crypto_scalarmult_ed25519_noclamp(scalar, p) for p in points]


def shuffled(points: list[bytes], random32: bytes) -> list[bytes]:
    """The points in a random order (a permutation drawn from 32 random bytes)."""
    order = np.random.default_rng(int.from_bytes(random32, "big")).permutation(len(points))
    return [points[i] for i in order]


def digest_of(points: Sequence[bytes]) -> bytes:
    return hashlib.sha256(DOMAIN + b"order" + b"".join(points)).digest()


# ---------------------------------------------------------------------------------------------
# Sending and receiving lists
# ---------------------------------------------------------------------------------------------

async def _send_list(ch: Channel, dst: NodeId, tag: str, points: Sequence[bytes]) -> None:
    total = len(points)
    for index, start in enumerate(range(0, max(total, 1), CHUNK_POINTS_MAX)):
        await ch.send(dst, PsiPoints(f"{tag}/{index}", total, index, b"".join(points[start:start + CHUNK_POINTS_MAX])))


async def _recv_list(ch: Channel, src: NodeId, tag: str, expected: int | None, wait_ms: int) -> list[bytes]:
    """A list of points from `src`; MalformedFrom when it is not what the protocol makes it."""
    points: list[bytes] = []
    index, total = 0, None
    while total is None or index * CHUNK_POINTS_MAX < max(total, 1):
        _, msg = await ch.recv(PsiPoints, f"{tag}/{index}", src=src, timeout_ms=wait_ms)
        total = msg.total if total is None else total
        want = min(CHUNK_POINTS_MAX, total - index * CHUNK_POINTS_MAX) * POINT_BYTES
        if msg.total != total or msg.index != index or len(msg.points) != want \
                or (expected is not None and total != expected):
            raise MalformedFrom(src, f"intersection list {tag}: chunk {index} is not the announced list")
        raw = bytes(msg.points)
        points += [raw[i:i + POINT_BYTES] for i in range(0, len(raw), POINT_BYTES)]
        index += 1
    return points


async def _broadcast_size(ch: Channel, tag: str, count: int) -> None:
    await asyncio.gather(*(ch.send(p, PsiSize(tag, count)) for p in ch.members if p != ch.me))


async def _gather_sizes(ch: Channel, tag: str, wait_ms: int) -> dict[NodeId, int]:
    got = await asyncio.gather(*(ch.recv(PsiSize, tag, src=p, timeout_ms=wait_ms)
                                 for p in ch.members if p != ch.me))
    return {src: msg.count for src, msg in got}


# ---------------------------------------------------------------------------------------------
# The protocol
# ---------------------------------------------------------------------------------------------

async def intersect(ch: Channel, ids: Sequence[str], *, hop_timeout_ms: int, rows_min: int = 0,
                    ids_max: int = IDS_MAX, offload: Offload = asyncio.to_thread, tag: str = "psi") -> Intersection:
    """The IDs every member holds (module docstring). `ids` must be distinct. Raises NoCommonIds,
    TooFewCommon (this member's `rows_min`), TooManyIds (a member announces more than this
    member's `ids_max`), RefusedByMember, Inconsistent, MalformedFrom, or the channel's errors;
    every member raises for the same intersection."""
    members, me, n = tuple(ch.members), ch.me, len(ch.members)
    if len(ids) > IDS_MAX:
        raise JobError(f"{len(ids)} IDs at this site, more than {IDS_MAX} (IDS_MAX) in one intersection")
    assert len(set(ids)) == len(ids), "the data layer refuses repeated IDs"
    await _broadcast_size(ch, f"{tag}/size", len(ids))
    sizes = {me: len(ids), **await _gather_sizes(ch, f"{tag}/size", hop_timeout_ms * (n + 1))}
    over = next((m for m in members if m != me and sizes[m] > ids_max), None)
    if over is not None:             # step 1: before this member hashes or blinds anything
        raise TooManyIds(over)
    mine = await offload(hash_ids, ch.job_id, list(ids))
    position = {p: i for i, p in enumerate(mine)}
    scalar = new_scalar(ch.random_bytes(64))
    wait_ms = hop_timeout_ms * (n + 2) + sum(sizes.values()) * n * POINT_WORK_US_MAX // 1000
    full, finalized = await _blinding_lap(ch, mine, scalar, sizes, wait_ms, offload, tag)
    common, count = await _count(ch, full, rows_min, sizes, wait_ms, tag)
    common = await _check_common(ch, common, count, finalized, wait_ms, tag)
    plain = await _unblinding_lap(ch, common, scalar, count, position, wait_ms, offload, tag)
    order = sorted(plain)
    digest = digest_of(order)
    await asyncio.gather(*(ch.send(p, PsiDigest(f"{tag}/digest", digest)) for p in members if p != me))
    theirs = await asyncio.gather(*(ch.recv(PsiDigest, f"{tag}/digest", src=p, timeout_ms=wait_ms)
                                    for p in members if p != me))
    if any(msg.digest != digest for _, msg in theirs):
        raise Inconsistent("the members derived different ordered intersections")
    return Intersection(np.array([position[p] for p in order], dtype=np.int64), sizes, digest)


def blinding_path(members: Sequence[NodeId], owner: int) -> tuple[NodeId, ...]:
    """Who blinds list `owner`, in order: its owner, the collector (members[0]), then the others
    in ring order after the owner. So the collector blinds no list last (three members or more):
    every fully blinded list is made, and the announced common points checked against it, by a
    member other than the collector; and every list a member other than the collector sees
    carries the collector's scalar, which only the collector can remove first."""
    n = len(members)
    if owner == 0:
        return tuple(members)
    return (members[owner], members[0], *(members[(owner + i) % n] for i in range(1, n) if (owner + i) % n != 0))


async def _blinding_lap(ch: Channel, mine: list[bytes], scalar: bytes, sizes: dict[NodeId, int], wait_ms: int,
                        offload: Offload, tag: str) -> tuple[dict[NodeId, list[bytes]], dict[NodeId, list[bytes]]]:
    """Step 2: every list blinded and shuffled by every member along its `blinding_path`, the
    lists at once. Returns (at the collector, every fully blinded list by owner; elsewhere {}),
    and the lists this member blinded last, by owner. Every received list is checked where it
    arrives (its owner's size, no repeated point, valid points): a wrong one names its sender."""
    members, me, n = tuple(ch.members), ch.me, len(ch.members)
    collector = members[0]
    finalized: dict[NodeId, list[bytes]] = {}

    async def one(owner: int) -> None:
        path = blinding_path(members, owner)
        j = path.index(me)
        if j == 0:
            points = await offload(blind, mine, scalar, False)
        else:
            got = await _recv_distinct(ch, path[j - 1], f"{tag}/b/{owner}/{j}", sizes[members[owner]], wait_ms)
            points = await offload(blind, got, scalar, True)
            if points is None:
                raise MalformedFrom(path[j - 1], "sent a blinded ID that is not a valid group element")
        points = shuffled(points, ch.random_bytes(32))
        if j < n - 1:
            await _send_list(ch, path[j + 1], f"{tag}/b/{owner}/{j + 1}", points)
            return
        finalized[members[owner]] = points
        if me != collector:
            await _send_list(ch, collector, f"{tag}/full/{owner}", points)

    await _all(*(one(owner) for owner in range(n)))
    full: dict[NodeId, list[bytes]] = {}
    if me == collector:
        for owner in range(n):
            last = blinding_path(members, owner)[-1]
            full[members[owner]] = finalized[members[owner]] if last == me else await _recv_distinct(
                ch, last, f"{tag}/full/{owner}", sizes[members[owner]], wait_ms)
    return full, finalized


async def _recv_distinct(ch: Channel, src: NodeId, tag: str, expected: int, wait_ms: int) -> list[bytes]:
    """A list of `expected` points with no point twice: blinding is one-to-one, so a repeated
    point is the sender's doing (it checked what it received the same way)."""
    points = await _recv_list(ch, src, tag, expected, wait_ms)
    if len(set(points)) != len(points):
        raise MalformedFrom(src, "sent an intersection list that holds a point twice")
    return points


async def _all(*coros: Awaitable[Any]) -> None:
    """Run concurrently; the first failure cancels the rest and is raised as it is."""
    try:
        async with asyncio.TaskGroup() as group:
            for coro in coros:
                group.create_task(coro)
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None


async def _count(ch: Channel, full: dict[NodeId, list[bytes]], rows_min: int, sizes: dict[NodeId, int],
                 wait_ms: int, tag: str) -> tuple[list[bytes], int]:
    """Step 3: the collector's common points (sorted; others: []) and their number; every
    member's verdict on that number. Raises before any common ID is revealed."""
    members, me = tuple(ch.members), ch.me
    collector = members[0]
    common: list[bytes] = []
    if me == collector:
        common = sorted(set.intersection(*(set(points) for points in full.values())))
        await _broadcast_size(ch, f"{tag}/common", len(common))
        count = len(common)
    else:
        _, msg = await ch.recv(PsiSize, f"{tag}/common", src=collector, timeout_ms=wait_ms)
        count = msg.count
        if count > min(sizes.values()):
            raise MalformedFrom(collector, "announced more IDs in common than a member holds")
    if count == 0:
        raise NoCommonIds("no ID is held by every member ([data] id_column): check that every site's ID "
                          "column holds the same identifiers, written alike")
    ok = count >= rows_min
    await _broadcast_size(ch, f"{tag}/verdict", int(ok))
    verdicts = await _gather_sizes(ch, f"{tag}/verdict", wait_ms)
    if not ok:
        raise TooFewCommon("fewer IDs are held by every member than this site's [policy] rows_min: lower "
                           "rows_min here, or align more entities")
    refusing = [m for m in members if verdicts.get(m, 1) != 1]
    if refusing:
        raise RefusedByMember(refusing[0])
    return common, count


async def _check_common(ch: Channel, common: list[bytes], count: int, finalized: dict[NodeId, list[bytes]],
                        wait_ms: int, tag: str) -> list[bytes]:
    """Step 4: the collector sends every member the common points (fully blinded, sorted); every
    member checks them against every list it blinded last (each list is some member's) and every
    member tells every other its verdict. Nobody removes its scalar from any point before every
    verdict is in: a point outside the intersection never reaches the unblinding lap."""
    members, me = tuple(ch.members), ch.me
    collector = members[0]
    if me == collector:
        await asyncio.gather(*(_send_list(ch, m, f"{tag}/c", common) for m in members if m != me))
    else:
        common = await _recv_list(ch, collector, f"{tag}/c", count, wait_ms)
    ok = all(a < b for a, b in zip(common, common[1:])) and all(
        set(common) <= set(points) for points in finalized.values())
    await _broadcast_size(ch, f"{tag}/check", int(ok))
    verdicts = await _gather_sizes(ch, f"{tag}/check", wait_ms)
    if not ok:
        raise MalformedFrom(collector, "announced common IDs that are not all in a list this site blinded last")
    if any(v != 1 for v in verdicts.values()):
        raise Inconsistent("a member found the announced common IDs outside a list it blinded last")
    return common


async def _unblinding_lap(ch: Channel, common: list[bytes], scalar: bytes, count: int, position: dict[bytes, int],
                          wait_ms: int, offload: Offload, tag: str) -> list[bytes]:
    """Step 5: every member removes its scalar in ring order; the collector (first) proves it
    removed its own scalar and nothing else (`prove_strip`), checked by the next member against
    the common points every member checked; the last announces H(x) of the common IDs to every
    member. Every member checks they are all its own."""
    members, me, n = tuple(ch.members), ch.me, len(ch.members)
    p = members.index(me)
    if p == 0:
        points = common
    else:
        points = await _recv_list(ch, members[p - 1], f"{tag}/u/{p}", count, wait_ms)
    if p == 1:
        proof = await _recv_list(ch, members[0], f"{tag}/proof", PROOF_POINTS, wait_ms)
        if not await offload(verify_strip, common, points, proof):
            raise MalformedFrom(members[0], "removed more than its own blinding from the common IDs")
    stripped = await offload(blind, points, inverse(scalar), p != 0)
    if stripped is None:
        raise MalformedFrom(members[p - 1], "sent a common point that is not a valid group element")
    if p == 0:
        proof = await offload(prove_strip, scalar, common, stripped, ch.random_bytes(64))
        await _send_list(ch, members[1], f"{tag}/proof", proof)
    if p < n - 1:
        await _send_list(ch, members[p + 1], f"{tag}/u/{p + 1}", stripped)
        stripped = await _recv_list(ch, members[-1], f"{tag}/ids", count, wait_ms)
    if len(set(stripped)) != count or any(q not in position for q in stripped):
        raise Inconsistent("an ID announced as held by every member is not held here")
    if p == n - 1:
        await asyncio.gather(*(_send_list(ch, m, f"{tag}/ids", stripped) for m in members[:-1]))
    return stripped


# ---------------------------------------------------------------------------------------------
# The collector's proof that it removed its own scalar and nothing else (step 5)
# ---------------------------------------------------------------------------------------------

PROOF_POINTS = 4                    # K = k·B, T1, T2, s: 128 bytes, one PsiPoints message


def _weights(common: Sequence[bytes], stripped: Sequence[bytes], key: bytes) -> list[bytes]:
    """Fiat–Shamir weights binding every point of both lists (a batched proof: one for all)."""
    b = _nacl()
    seed = hashlib.sha512(DOMAIN + b"strip-weights" + key + b"".join(common) + b"".join(stripped)).digest()
    return [b.crypto_core_ed25519_scalar_reduce(hashlib.sha512(seed + i.to_bytes(8, "big")).digest())
            for i in range(len(common))]


def _combined(points: Sequence[bytes], weights: Sequence[bytes]) -> bytes:
    b = _nacl()
    acc = b.crypto_scalarmult_ed25519_noclamp(weights[0], points[0])
    for w, q in zip(weights[1:], points[1:]):
        acc = b.crypto_core_ed25519_add(acc, b.crypto_scalarmult_ed25519_noclamp(w, q))
    return acc


def _challenge(*parts: bytes) -> bytes:
    return _nacl().crypto_core_ed25519_scalar_reduce(hashlib.sha512(DOMAIN + b"strip-challenge" + b"".join(parts))
                                                     .digest())


def prove_strip(scalar: bytes, common: Sequence[bytes], stripped: Sequence[bytes], random64: bytes) -> list[bytes]:
    """A Chaum–Pedersen proof (batched by random weights) that common[i] = k·stripped[i] for
    every i, with K = k·B: the collector's `stripped` is the common points with its own scalar
    removed, not points of its choosing. [K, T1, T2, s]."""
    b = _nacl()
    key = b.crypto_scalarmult_ed25519_base_noclamp(scalar)
    u = _combined(stripped, _weights(common, stripped, key))
    c = b.crypto_scalarmult_ed25519_noclamp(scalar, u)
    r = new_scalar(random64)
    t1, t2 = b.crypto_scalarmult_ed25519_base_noclamp(r), b.crypto_scalarmult_ed25519_noclamp(r, u)
    e = _challenge(key, u, c, t1, t2)
    return [key, t1, t2, b.crypto_core_ed25519_scalar_add(r, b.crypto_core_ed25519_scalar_mul(e, scalar))]


def verify_strip(common: Sequence[bytes], stripped: Sequence[bytes], proof: Sequence[bytes]) -> bool:
    """Whether `proof` shows common[i] = k·stripped[i] for every i, for one k (`prove_strip`)."""
    b = _nacl()
    key, t1, t2, s = proof
    if len(common) != len(stripped) or not common or \
            not all(b.crypto_core_ed25519_is_valid_point(q) for q in (key, t1, t2, *stripped)):
        return False
    if s != b.crypto_core_ed25519_scalar_reduce(s + bytes(32)) or not any(s):
        return False
    weights = _weights(common, stripped, key)
    u, c = _combined(stripped, weights), _combined(common, weights)
    e = _challenge(key, u, c, t1, t2)
    try:
        return (b.crypto_scalarmult_ed25519_base_noclamp(s) == b.crypto_core_ed25519_add(
                    t1, b.crypto_scalarmult_ed25519_noclamp(e, key))
                and b.crypto_scalarmult_ed25519_noclamp(s, u) == b.crypto_core_ed25519_add(
                    t2, b.crypto_scalarmult_ed25519_noclamp(e, c)))
    except RuntimeError:                # an identity point on the way: not an honest proof
        return False
