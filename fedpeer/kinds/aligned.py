"""What every job over vertical sites ([data] partition = "vertical") does first, and the secure sums
it goes on with (docs/algorithms.md, "Vertical partition"): the kinds that run over vertical sites
(`kmeans`: fedpeer/kinds/cluster/vertical.py; `stats`: fedpeer/kinds/vertical_stats.py) share it.

1. columns: every member tells every other the names of its feature columns; the job's joined
   columns are every member's own, member after member in ring order (the job's members sorted
   by key: the order `participants` lists them in). A name held by two members is refused.
2. alignment: a private set intersection of the members' IDs (fedpeer/protocols/psi.py: who
   learns what is said there); this site's rows are then the common entities' rows, in the order
   every member derived. A site refuses an intersection below its [policy] rows_min before any
   common ID is revealed.
3. sums: every later exchange is a secure sum over all the members (a vertical job cannot go on
   without any member's columns, so a member lost fails the job): of floats in fixed point
   (`VerticalSums.add`: the partial distances), or a gather (`VerticalSums.gather`: each member's
   own values, exactly, in its own entries; each member commits to its values first, so every
   member checks every member's values came back, and a false claim that they did not is named).

Failures: no ID in common, or an intersection whose checks fail, end the job everywhere
(`JobFailsEverywhere`, naming no site); a site's own refusal names it (the job lifecycle tells
the others); a member's refusal is named by that member.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedpeer.errors import DataError, JobError
from fedpeer.jobs.kind import ImplausibleTotal, JobContext, JobFailsEverywhere, checked_total
from fedpeer.protocols import psi
from fedpeer.protocols.fixedpoint import FixedPoint
from fedpeer.protocols.securesum.api import VECTOR_ENTRIES_MAX, secure_sum
from fedpeer.runtime.channel import NodeId
from fedpeer.wire import frame as wire

FIXED = FixedPoint(frac_bits=32, limbs=3)     # |x| · members < 2^63 at 2^-32 resolution
COLUMNS_MAX = 100_000                          # feature columns of one member
COLUMN_NAME_BYTES_MAX = 256
GATHER_CHECK_WAIT_HOPS = 2                     # a member waits this many hops for the others' word after a gather
SALT_BYTES = 32                                # of a gather commitment's salt (psi.PsiDigest carries it)
COMMIT_DOMAIN = b"fedpeer/v1/vertical/gather-commit\x00"

Offload = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Columns:
    """A member's feature columns, in its order (step 1)."""
    tag: str
    features: list
    WAITING_FOR: ClassVar[str] = "a member's columns"


@dataclass(frozen=True)
class GatherCheck:
    """After a gather: whether the sender's own values came back bit for bit (VerticalSums.gather)."""
    tag: str
    intact: bool
    WAITING_FOR: ClassVar[str] = "a member's word that its gathered values came back"


# registered by the job catalogue with the kinds that run over vertical sites (their `messages`)
MESSAGES = (*psi.MESSAGES,
            wire.declare("vertical_columns", Columns, {
                "tag": wire.v_str(psi.TAG_BYTES_MAX),
                "features": wire.v_list(wire.v_str(COLUMN_NAME_BYTES_MAX), COLUMNS_MAX)}),
            wire.declare("vertical_gather_check", GatherCheck, {"tag": wire.v_str(psi.TAG_BYTES_MAX),
                                                                "intact": wire.v_bool}))


@dataclass(frozen=True)
class Aligned:
    """This site's aligned rows and what every member knows of the alignment."""

    X: np.ndarray                               # (N, this site's columns), read-only, in the shared order
    position: int                               # this site's place in ring order
    columns: tuple[tuple[str, ...], ...]        # every member's columns, in ring order
    ids_per_member: tuple[int, ...]             # every member's number of IDs, in ring order

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def features(self) -> tuple[str, ...]:
        """The joined columns: every member's own, in ring order."""
        return tuple(name for block in self.columns for name in block)

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(len(block) for block in self.columns)

    def own_slice(self) -> slice:
        return self.slices()[self.position]

    def slices(self) -> tuple[slice, ...]:
        """Every member's rows of the joined columns, in ring order."""
        starts = np.concatenate([[0], np.cumsum(self.widths)]).astype(int)
        return tuple(slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:]))


async def exchange_columns(ch: Any, features: tuple[str, ...], tag: str, wait_ms: int) -> tuple[tuple[str, ...], ...]:
    """Step 1: every member's columns in ring order."""
    others = [p for p in ch.members if p != ch.me]
    await asyncio.gather(*(ch.send(p, Columns(f"{tag}/columns", list(features))) for p in others))
    got = dict(await asyncio.gather(*(ch.recv(Columns, f"{tag}/columns", src=p, timeout_ms=wait_ms)
                                      for p in others)))
    columns = tuple(tuple(features) if p == ch.me else tuple(got[p].features) for p in ch.members)
    seen: set[str] = set()
    for block in columns:
        twice = next((c for c in block if c in seen), None)
        if twice is not None:
            raise JobFailsEverywhere(f"column {twice!r} is held by two members; a vertical job names every column "
                                     "once: rename it at one of them")
        if not block:
            raise JobFailsEverywhere("a member holds no feature column besides its ID column")
        seen.update(block)
    return columns


async def align(ch: Any, ctx: JobContext, prefix: str, offload: Offload = asyncio.to_thread) -> Aligned:
    """Steps 1 and 2 (module docstring)."""
    block = ctx.data
    members = tuple(ch.members)
    wait_ms = ctx.hop_timeout_ms * (len(members) + 1)
    ch.progress("columns", 0, 2)
    columns = await exchange_columns(ch, tuple(block.features), prefix, wait_ms)
    ch.progress("private set intersection", 1, 2)
    try:
        found = await psi.intersect(ch, [str(v) for v in block.ids], hop_timeout_ms=ctx.hop_timeout_ms,
                                    rows_min=block.aligned_rows_min, ids_max=block.aligned_ids_max,
                                    offload=offload, tag=f"{prefix}/psi")
    except (psi.NoCommonIds, psi.Inconsistent) as exc:
        raise JobFailsEverywhere(f"aligning the rows: {exc}") from None
    except psi.TooManyIds as exc:
        who = ctx.names.get(exc.member, exc.member.hex()[:16])
        raise JobError(f"{who} announces more IDs than this site's [policy] ids_max; raise ids_max here if that "
                       "site's ID column is expected to be that long") from None
    except psi.RefusedByMember as exc:
        who = ctx.names.get(exc.member, exc.member.hex()[:16])
        raise JobError(f"{who} refuses the aligned rows: fewer IDs are held by every member than its [policy] "
                       "rows_min") from None
    X = await offload(block.aligned, found.rows)
    return Aligned(X, members.index(ch.me), columns, tuple(found.sizes[p] for p in members))


class VerticalSums:
    """A vertical job's secure sums over every member (one lost fails the job), with a count of
    what this site sent."""

    def __init__(self, ch: Any, ctx: JobContext, mode: str, prefix: str, compact: bool = False) -> None:
        self.ch, self.ctx, self.mode, self.prefix, self.compact = ch, ctx, mode, prefix, compact
        self.sent_entries: list[int] = []
        self.refuted: list[NodeId] = []     # members whose claim "my values were altered" the commitments refuted

    def check_size(self, floats: int, fix: str) -> None:
        entries = floats * FIXED.limbs
        if entries > VECTOR_ENTRIES_MAX:
            raise JobError(f"one secure sum would hold {entries} entries, more than the secure sum's "
                           f"{VECTOR_ENTRIES_MAX}; {fix}")

    async def add(self, name: str, floats: np.ndarray) -> np.ndarray:
        """The members' float vectors summed (fixed point: 2^-32 resolution)."""
        parties = len(self.ch.members)
        try:
            vector = FIXED.encode(floats, parties)
        except DataError as exc:
            raise JobError(f"{exc}; set standardize=true or rescale the features") from None
        out = await secure_sum(self.ch, self.tag(name), vector, mode=self.mode, hop_timeout_ms=self.ctx.hop_timeout_ms,
                               compact=self.compact)
        if out.participants != tuple(self.ch.members):
            raise JobError("a member dropped out of a secure sum; a vertical job needs every member's columns")
        self.sent_entries.append(len(vector))
        return FIXED.decode(out.total)

    async def gather(self, name: str, placed_values: np.ndarray, slices: Sequence[slice]) -> np.ndarray:
        """Every member's values side by side, exactly: each member sends the float64 bits of its
        own values in its own entries (`placed`; every member's rows of placed_values are
        `slices`, in ring order) and zeros elsewhere, so the sum modulo 2^64 is every member's
        bits. For values each member computes alone (its columns' statistics, its projection of
        the centres), with no fixed-point rounding. Before the sum every member commits to its own
        values (a salted SHA-256, `commitment`); after it, every member reveals its salt and says
        whether its values came back (one message each way, each time). Every member then checks
        every member's values against its commitment (`_judge`): a member that shifts another's
        entries is caught by all, and a member that claims "altered" about values that came back
        as committed is named (`refuted`) and its claim ignored."""
        placed_values = np.ascontiguousarray(placed_values, dtype=np.float64)
        bits = placed_values.ravel().view(np.uint64)
        tag, members = self.tag(name), tuple(self.ch.members)
        mine = slices[members.index(self.ch.me)]
        salt = self.ch.random_bytes(SALT_BYTES)
        commits = await self._exchange(psi.PsiDigest, f"{tag}/commit", psi.PsiDigest(
            f"{tag}/commit", commitment(tag, salt, placed_values[mine].view(np.uint64))))
        out = await secure_sum(self.ch, tag, bits, mode=self.mode, hop_timeout_ms=self.ctx.hop_timeout_ms,
                               compact=self.compact)
        if out.participants != members:
            raise JobError("a member dropped out of a secure sum; a vertical job needs every member's columns")
        self.sent_entries.append(len(bits))
        total = out.total.reshape(placed_values.shape)
        intact = bool(np.array_equal(total[mine], placed_values[mine].view(np.uint64)))
        claims, salts = await asyncio.gather(
            self._exchange(GatherCheck, f"{tag}/check", GatherCheck(f"{tag}/check", intact)),
            self._exchange(psi.PsiDigest, f"{tag}/salt", psi.PsiDigest(f"{tag}/salt", salt)))
        self._judge(tag, total, slices, {m: c.digest for m, c in commits.items()},
                    {m: s.digest for m, s in salts.items()}, {m: c.intact for m, c in claims.items()})
        return checked_total(tag, _finite, out.total.view(np.float64))

    async def _exchange(self, kind: type, tag: str, msg: Any) -> dict[NodeId, Any]:
        """Send `msg` to every other member and take theirs (every member's, this one's included)."""
        others = [p for p in self.ch.members if p != self.ch.me]
        wait_ms = self.ctx.hop_timeout_ms * GATHER_CHECK_WAIT_HOPS
        await asyncio.gather(*(self.ch.send(p, msg) for p in others))
        got = await asyncio.gather(*(self.ch.recv(kind, tag, src=p, timeout_ms=wait_ms) for p in others))
        return {self.ch.me: msg, **dict(got)}

    def _judge(self, tag: str, total: np.ndarray, slices: Sequence[slice], commits: dict[NodeId, bytes],
               salts: dict[NodeId, bytes], claims: dict[NodeId, bool]) -> None:
        """Every member's values against its commitment. All came back: a claim of "altered" is
        false, its maker named (`refuted`) and its claim ignored. Some did not: the total is
        refused everywhere (a member shifted another's entries, or sent other values than it
        committed to: the sum hides which), naming only a member that says its values came back
        when they did not come back as it committed (it contradicts itself)."""
        members = tuple(self.ch.members)
        back = {m: commitment(tag, salts[m], total[slices[i]]) == commits[m] for i, m in enumerate(members)}
        if all(back.values()):
            self.refuted.extend(m for m in members if not claims[m] and m not in self.refuted)
            return
        liar = next((m for m in members if not back[m] and claims[m]), None)
        if liar is not None:
            raise JobFailsEverywhere(f"{self.ctx.names.get(liar, liar.hex()[:16])}: its values in secure sum "
                                     f"'{tag}' are not those it committed to, though it says they came back")
        raise ImplausibleTotal.of(tag, "every member's own values come back as it sent them")

    def tag(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def names(self) -> list[str]:
        return [self.ctx.names.get(k, k.hex()[:16]) for k in self.ch.members]

    def false_claims(self) -> dict:
        """{"false_claims": [sites]} when some member claimed its gathered values were altered
        and every member's values came back as it committed to them; else {}."""
        return {"false_claims": [self.ctx.names.get(k, k.hex()[:16]) for k in self.refuted]} if self.refuted else {}


def commitment(tag: str, salt: bytes, values: np.ndarray) -> bytes:
    """A member's commitment to its own gathered values (their uint64 bits), salted so that a
    commitment alone does not let anyone test guesses of low-entropy values."""
    return hashlib.sha256(COMMIT_DOMAIN + tag.encode() + b"\x00" + salt + np.ascontiguousarray(values, dtype=np.uint64)
                          .tobytes()).digest()


def _finite(values: np.ndarray) -> np.ndarray:
    if not np.isfinite(values).all():
        raise ValueError("every gathered value is finite")
    return values


def placed(aligned: Aligned, own: np.ndarray, per_column: int = 1) -> np.ndarray:
    """A vector over the joined columns (`per_column` values each, column-major blocks) holding
    `own` (this site's columns' values, (own columns, per_column)) in this site's place, zeros
    elsewhere: summed over the members, every member's values side by side."""
    out = np.zeros((len(aligned.features), per_column))
    out[aligned.own_slice()] = np.asarray(own, dtype=np.float64).reshape(-1, per_column)
    return out


def alignment_result(aligned: Aligned, ctx: JobContext, members: tuple[NodeId, ...]) -> dict:
    """What a vertical job's result says of the alignment (the same at every member)."""
    return {"partition": "vertical", "aligned_rows": aligned.n,
            "ids_per_site": {ctx.names.get(m, m.hex()[:16]): c for m, c in zip(members, aligned.ids_per_member)},
            "columns_per_site": {ctx.names.get(m, m.hex()[:16]): list(block)
                                 for m, block in zip(members, aligned.columns)}}
