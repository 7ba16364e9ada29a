"""`sumcheck`: check the secure-sum ring end to end, and how fast it is, without any data.

Every member contributes a vector derived from a public seed and its own key, so every member can
recompute every contribution and verify the total exactly. Nothing private is involved; the
secure sum still runs with its masks and encryption exactly as for a real job. Operators use it to
test a federation's connectivity; the benchmarks use it to measure secure-sum throughput.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import JobError
from ..protocols.securesum import CHUNK_ENTRIES_MAX, secure_sum
from .base import JobContext, JobKind, Param

PARAMS = {
    "entries": Param(int, 1024, "uint64 entries in the vector (8 bytes each)", low=1, high=16 * 1024 * 1024),
    "secure_sum": Param(str, "pairwise", "secure-sum mode", choices=("ring", "pairwise")),
    "chunk_entries": Param(int, 65_536, "entries per message on the ring", low=1024, high=CHUNK_ENTRIES_MAX),
}


def contribution(member: bytes, entries: int) -> np.ndarray:
    """The public test vector of one member: SHAKE-256 of its key, as uint64s."""
    raw = hashlib.shake_256(b"fedpeer-sumcheck\0" + member).digest(8 * entries)
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


async def run(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> dict:
    entries = params["entries"]
    ch.progress("secure sum", 0, 1)
    started = time.perf_counter()   # a measurement for the report, not protocol logic
    outcome = await secure_sum(ch, "sumcheck", contribution(ch.me, entries), mode=params["secure_sum"],
                               hop_timeout_ms=ctx.hop_timeout_ms, chunk_entries=params["chunk_entries"])
    seconds = time.perf_counter() - started
    expected = np.zeros(entries, dtype=np.uint64)
    for member in outcome.participants:
        expected += contribution(member, entries)      # wraps mod 2^64 like the secure sum
    if not np.array_equal(expected, outcome.total):
        raise JobError("the secure sum returned a wrong total")
    mib = entries * 8 / 2**20
    return {"ok": True, "entries": entries, "mib": mib, "seconds": seconds, "mib_per_s": mib / seconds,
            "participants": [ctx.names.get(k, k.hex()[:16]) for k in outcome.participants],
            "attempts": outcome.attempts, "secure_sum": params["secure_sum"]}


KIND = JobKind(name="sumcheck", help="check the secure-sum ring end to end (no data involved) and time it",
               params=PARAMS, run=run, needs_data=False, binary_label=False,
               limited={"entries_max": "entries"})
