"""The secure sum's messages and their wire schemas (fedpeer/protocols/securesum/api.py).

Every message carries a `tag` under the sum's prefix (`<tag>/ss-<mode>/[by-<key>/]a<attempt>/...`);
arrays are 1-D uint64 of at most CHUNK_ENTRIES_MAX entries, refused by the receiver's gate
otherwise (the evidence a malformed chunk leaves: `MalformedFrom`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedpeer.protocols.securesum.masks import SEED_BYTES
from fedpeer.wire import frame as wire
from fedpeer.wire.frame import NODE_ID, v_array, v_bool, v_bytes, v_int, v_list, v_str

CHUNK_ENTRIES_MAX = 1 << 20         # 8 MiB per message; receivers refuse larger chunks
VECTOR_ENTRIES_MAX = 1 << 27        # entries per secure sum: 1 GiB of uint64
ATTEMPTS_MAX = 16                   # largest attempts_max accepted, and attempts in all (the number on the wire)
PARTICIPANTS_MAX = 128              # as many as a job may have members
WIRE_TAG_BYTES_MAX = 256
REASON_BYTES_MAX = 2048

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
    WAITING_FOR: ClassVar[str] = "word of a broken ring edge"


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
class SumChange:
    """The initiator -> members, in a compact sum (every member speaks it: _Plan.compact): attempt
    `attempt` runs over the list whose SHA-256 is `base` (the attempt the members hold) less
    `dropped`, indices into the job's members. `order`: the new ring order as indices when it is
    not the initiator first and the others in key order (a dispute keeps two members apart), else
    empty. A member whose list does not hash to `base` (it missed an announcement) asks for the
    whole list (SumListAsk) and gets a SumRestart. `reason` only to the members dropped."""
    tag: str
    attempt: int
    base: bytes
    dropped: tuple[int, ...]
    order: tuple[int, ...]
    reason: str
    WAITING_FOR: ClassVar[str] = "secure-sum announcement"


@dataclass(frozen=True)
class SumListAsk:
    """A member -> the initiator, in a compact sum: a SumChange did not apply to my list; send me
    the whole list of the current attempt (a SumRestart)."""
    tag: str
    WAITING_FOR: ClassVar[str] = "request for the participant list"


@dataclass(frozen=True)
class SeedRequest:
    """The initiator -> members (pairwise mode): every chunk came back, reveal your self-mask seed."""
    tag: str
    WAITING_FOR: ClassVar[str] = "request to reveal the self-mask seeds"


@dataclass(frozen=True)
class SeedReveal:
    tag: str
    seed: bytes
    WAITING_FOR: ClassVar[str] = "self-mask seed"


@dataclass(frozen=True)
class SumWhere:
    """The initiator -> members: chunk `chunk` did not come back; did you get it, pass it on?"""
    tag: str
    chunk: int
    WAITING_FOR: ClassVar[str] = "question about a lost secure-sum chunk"


@dataclass(frozen=True)
class SumHere:
    """A member -> the initiator: its answer to SumWhere (`passed`: my successor acknowledged it)."""
    tag: str
    chunk: int
    got: bool
    passed: bool
    WAITING_FOR: ClassVar[str] = "answer about a lost secure-sum chunk"


@dataclass(frozen=True, eq=False)
class SumResult:
    """The initiator -> members: one chunk of the total."""
    tag: str
    data: np.ndarray          # uint64
    WAITING_FOR: ClassVar[str] = "secure-sum total"


@dataclass(frozen=True)
class ArReveal:
    """All-reduce: the sender's self-mask seed and the SHA-256 of each segment's sum as it received
    them (sent once it holds every owner's sum)."""

    tag: str
    seed: bytes
    digests: list
    WAITING_FOR: ClassVar[str] = "all-reduce seeds and digests"


@dataclass(frozen=True, eq=False)
class ArResult:
    """Reduce-map: what an owner made of its segment's total (`data`), or why it refused the
    total (`refused`, non-empty; `data` then empty)."""

    tag: str
    data: np.ndarray          # uint64
    refused: str
    WAITING_FOR: ClassVar[str] = "an owner's result"


@dataclass(frozen=True)
class ArCheck:
    """Reduce-map: the SHA-256 of each owner's result as the sender received it."""

    tag: str
    digests: list
    WAITING_FOR: ClassVar[str] = "digests of the owners' results"


def _register() -> None:
    tag = v_str(WIRE_TAG_BYTES_MAX)
    chunk = v_array(max_elements=CHUNK_ENTRIES_MAX, dtypes=frozenset({"<u8"}))
    index_list = v_list(v_int(0, PARTICIPANTS_MAX - 1), PARTICIPANTS_MAX)     # places in the job's members

    def to_body(msg: Any) -> dict:
        body = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
        if "data" in body:
            body["data"] = wire.encode_array(body["data"])
        for name in ("participants", "dropped", "order"):
            if name in body:
                body[name] = list(body[name])
        return body

    def from_body(cls: type) -> Any:
        def build(body: dict) -> Any:
            if "data" in body and body["data"].ndim != 1:
                raise ValueError("a secure-sum chunk must be one-dimensional")
            body = {**body, **{name: tuple(body[name]) for name in ("participants", "dropped", "order")
                               if name in body}}
            return cls(**body)
        return build

    for kind, cls, fields in (
            ("ss_chunk", SumChunk, {"tag": tag, "data": chunk}),
            ("ss_ring_broken", RingBroken, {"tag": tag, "peer": NODE_ID,
                                            "fault": v_str(16, frozenset(FAULTS))}),
            ("ss_restart", SumRestart, {"tag": tag, "attempt": v_int(1, ATTEMPTS_MAX + 1),
                                        "participants": v_list(NODE_ID, PARTICIPANTS_MAX),
                                        "reason": v_str(REASON_BYTES_MAX)}),
            ("ss_change", SumChange, {"tag": tag, "attempt": v_int(1, ATTEMPTS_MAX + 1),
                                      "base": v_bytes(exact=32), "dropped": index_list, "order": index_list,
                                      "reason": v_str(REASON_BYTES_MAX)}),
            ("ss_list_ask", SumListAsk, {"tag": tag}),
            ("ss_seed_request", SeedRequest, {"tag": tag}),
            ("ss_seed", SeedReveal, {"tag": tag, "seed": v_bytes(exact=SEED_BYTES)}),
            ("ss_result", SumResult, {"tag": tag, "data": chunk}),
            ("ss_where", SumWhere, {"tag": tag, "chunk": v_int(0, VECTOR_ENTRIES_MAX)}),
            ("ss_here", SumHere, {"tag": tag, "chunk": v_int(0, VECTOR_ENTRIES_MAX),
                                  "got": v_bool, "passed": v_bool}),
            ("ss_ar_reveal", ArReveal, {"tag": tag, "seed": v_bytes(exact=SEED_BYTES),
                                        "digests": v_list(v_bytes(exact=32), PARTICIPANTS_MAX)}),
            ("ss_rm_result", ArResult, {"tag": tag, "data": chunk, "refused": v_str(REASON_BYTES_MAX)}),
            ("ss_rm_check", ArCheck, {"tag": tag, "digests": v_list(v_bytes(exact=32), PARTICIPANTS_MAX)})):
        wire.register(kind, cls, fields, to_body=to_body, from_body=from_body(cls))


_register()

