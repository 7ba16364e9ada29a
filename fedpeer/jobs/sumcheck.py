"""`sumcheck`: check the secure-sum ring end to end, and how fast it is, without any data.

Every member contributes a public vector derived from its key, so every member can verify the
total exactly. Nothing private is involved; the secure sum still runs with its masks and
encryption exactly as for a real job. Operators use it to test a federation's connectivity; the
benchmarks use it to measure secure-sum throughput.

Member m's vector is B + w(m)·C (mod 2^64), with B and C two public AES-256-CTR keystreams and
w(m) a 64-bit weight hashed from m's key: distinct per member, and the total over participants P
is |P|·B + (Σ w)·C, so checking it costs two keystreams whatever the number of members (one
keystream per member, the earlier check, cost more CPU than the sum itself at 9 daemons).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import JobError
from ..protocols.securesum import CHUNK_ENTRIES_MAX, secure_sum
from ..protocols.securesum_masks import MASK_BLOCK_ENTRIES, apply_mask
from .base import JobContext, JobKind, Param

PARAMS = {
    "entries": Param(int, 1024, "uint64 entries in the vector (8 bytes each)", low=1, high=16 * 1024 * 1024),
    "secure_sum": Param(str, "pairwise", "secure-sum mode", choices=("ring", "pairwise")),
    "chunk_entries": Param(int, 65_536, "entries per message on the ring", low=1024, high=CHUNK_ENTRIES_MAX),
}


OFF_LOOP_ENTRIES_MIN = 1 << 20     # larger vectors are generated and checked in a worker thread
_BASE = b"fedpeer-sumcheck/base\0"
_STEP = b"fedpeer-sumcheck/step\0"


def weight(member: bytes) -> np.uint64:
    """A member's public 64-bit weight (BLAKE2b of its key)."""
    return np.uint64(int.from_bytes(hashlib.blake2b(member, digest_size=8, person=b"sumcheck").digest(), "big"))


def _plus_times(factor: np.uint64) -> Any:
    """An apply_mask op: part + factor·mask (mod 2^64); scales the scratch block in place."""
    def op(part: np.ndarray, block: np.ndarray, out: np.ndarray) -> None:
        np.multiply(block, factor, out=block)
        np.add(part, block, out=out)
    return op


def contribution(member: bytes, entries: int) -> np.ndarray:
    """The public test vector of one member: B + w(member)·C, from the secure sum's own fast
    generator (AES-256-CTR) — cheap, so it does not weigh on what is measured."""
    vector = np.zeros(entries, dtype=np.uint64)
    apply_mask(_plus_times(weight(member)), vector, _STEP, b"", 0)
    apply_mask(np.add, vector, _BASE, b"", 0)
    return vector


def _correct(total: np.ndarray, members: tuple[bytes, ...], entries: int) -> bool:
    """Whether `total` is the sum of the members' test vectors: |members|·B + (Σ w)·C, two
    keystreams however many members, built and compared a block at a time (no array of the
    vector's size: fresh memory page-faults), off the loop."""
    weights = np.uint64(sum(int(weight(m)) for m in members) % 2**64)
    count = np.uint64(len(members))
    for start in range(0, entries, MASK_BLOCK_ENTRIES):
        part = total[start:start + MASK_BLOCK_ENTRIES]
        expected = np.zeros(len(part), dtype=np.uint64)
        apply_mask(_plus_times(weights), expected, _STEP, b"", 0, offset=start)
        apply_mask(_plus_times(count), expected, _BASE, b"", 0, offset=start)
        if not np.array_equal(expected, part):
            return False
    return True


async def _compute(entries: int, fn: Any, *args: Any) -> Any:
    """fn(*args), in a worker thread for large vectors (tens of ms per 8 MiB: not on the loop)."""
    return await asyncio.to_thread(fn, *args) if entries >= OFF_LOOP_ENTRIES_MIN else fn(*args)


async def run(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> dict:
    entries = params["entries"]
    ch.progress("secure sum", 0, 1)
    mine = await _compute(entries, contribution, ch.me, entries)     # before the clock starts
    started = time.perf_counter()   # a measurement for the report, not protocol logic
    outcome = await secure_sum(ch, "sumcheck", mine, mode=params["secure_sum"],
                               hop_timeout_ms=ctx.hop_timeout_ms, chunk_entries=params["chunk_entries"])
    seconds = time.perf_counter() - started
    if not await _compute(entries, _correct, outcome.total, tuple(outcome.participants), entries):
        raise JobError("the secure sum returned a wrong total")
    mib = entries * 8 / 2**20
    return {"ok": True, "entries": entries, "mib": mib, "seconds": seconds, "mib_per_s": mib / seconds,
            "participants": [ctx.names.get(k, k.hex()[:16]) for k in outcome.participants],
            "attempts": outcome.attempts, "secure_sum": params["secure_sum"]}


KIND = JobKind(name="sumcheck", help="check the secure-sum ring end to end (no data involved) and time it",
               params=PARAMS, run=run, needs_data=False, binary_label=False,
               limited={"entries_max": "entries"})
