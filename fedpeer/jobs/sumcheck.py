"""`sumcheck`: check the secure-sum ring end to end, and how fast it is, without any data.

Every member contributes a vector derived from a public seed and its own key, so every member can
recompute every contribution and verify the total exactly. Nothing private is involved; the
secure sum still runs with its masks and encryption exactly as for a real job. Operators use it to
test a federation's connectivity; the benchmarks use it to measure secure-sum throughput.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import JobError
from ..protocols.securesum import CHUNK_ENTRIES_MAX, expand_mask, secure_sum
from ..protocols.securesum_masks import apply_mask
from .base import JobContext, JobKind, Param

PARAMS = {
    "entries": Param(int, 1024, "uint64 entries in the vector (8 bytes each)", low=1, high=16 * 1024 * 1024),
    "secure_sum": Param(str, "pairwise", "secure-sum mode", choices=("ring", "pairwise")),
    "chunk_entries": Param(int, 65_536, "entries per message on the ring", low=1024, high=CHUNK_ENTRIES_MAX),
}


OFF_LOOP_ENTRIES_MIN = 1 << 20     # larger vectors are generated and checked in a worker thread
_DOMAIN = b"fedpeer-sumcheck\0"


def contribution(member: bytes, entries: int) -> np.ndarray:
    """The public test vector of one member: the AES-256-CTR keystream of its key (the secure
    sum's own fast generator), as uint64s — cheap, so it does not weigh on what is measured."""
    return expand_mask(_DOMAIN, member, 0, entries)


def _correct(total: np.ndarray, members: tuple[bytes, ...], entries: int) -> bool:
    """Whether `total` is the sum of the members' test vectors (built and compared in one go:
    64 MiB of comparison alone held the event loop ~30 ms)."""
    expected = np.zeros(entries, dtype=np.uint64)
    for member in members:    # each member's vector added in place (no 8 MiB array per member)
        apply_mask(np.add, expected, _DOMAIN, member, 0)      # wraps mod 2^64 like the secure sum
    return bool(np.array_equal(expected, total))


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
