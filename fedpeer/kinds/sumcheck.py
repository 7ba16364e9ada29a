"""`sumcheck`: check the secure-sum ring end to end, and how fast it is, without any data.

Every member contributes a public vector derived from its key, so every member can verify the
total exactly. Nothing private is involved; the secure sum still runs with its masks and
encryption exactly as for a real job. Operators use it to test a federation's connectivity; the
benchmarks use it to measure secure-sum throughput.

Member m's vector is w(m)·C (mod 2^64), with C a public AES-256-CTR keystream and w(m) an odd
64-bit weight hashed from m's key: distinct per member, and the total over participants P is
(Σ w)·C. Odd weights are invertible mod 2^64, so a member checks the total against its own
vector: total = mine·(Σ w)·w(me)^-1, one multiply per entry and no keystream at all. Generating
a vector is one keystream and one multiply (the earlier B + w(m)·C took two keystreams to make
and two more to check: 12-20 % of a 3-daemon sumcheck's CPU, more than the secure sum's own
layer).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.jobs.kind import JobContext, JobKind, Limit, Param
from fedpeer.jobs.params import SECURE_SUM_COMPACT, SECURE_SUM_WITH_SPARSE
from fedpeer.jobs.report import table
from fedpeer.protocols.securesum.api import CHUNK_ENTRIES_MAX, DEFAULT_CHUNK_ENTRIES, secure_sum
from fedpeer.protocols.securesum.masks import MASK_BLOCK_ENTRIES, apply_mask

PARAMS = {
    "entries": Param(int, 1024, "uint64 entries in the vector (8 bytes each)", low=1, high=16 * 1024 * 1024),
    "secure_sum": SECURE_SUM_WITH_SPARSE,
    "secure_sum_compact": SECURE_SUM_COMPACT,
    "chunk_entries": Param(int, DEFAULT_CHUNK_ENTRIES, "entries per message on the ring", low=1024,
                           high=CHUNK_ENTRIES_MAX),
}


OFF_LOOP_ENTRIES_MIN = 1 << 20     # larger vectors are generated and checked in a worker thread
_STEP = b"fedpeer-sumcheck/step\0"


def weight(member: bytes) -> int:
    """A member's public 64-bit weight (BLAKE2b of its key), odd: invertible mod 2^64."""
    return int.from_bytes(hashlib.blake2b(member, digest_size=8, person=b"sumcheck").digest(), "big") | 1


def _times(factor: int) -> Any:
    """An apply_mask op that sets the target to factor·mask (mod 2^64), whatever it held."""
    scale = np.uint64(factor)

    def op(part: np.ndarray, block: np.ndarray, out: np.ndarray) -> None:
        np.multiply(block, scale, out=out)
    return op


def contribution(member: bytes, entries: int) -> np.ndarray:
    """The public test vector of one member: w(member)·C, from the secure sum's own fast
    generator (AES-256-CTR): one keystream and one multiply."""
    vector = np.empty(entries, dtype=np.uint64)
    apply_mask(_times(weight(member)), vector, _STEP, b"", 0)
    return vector


def _correct(total: np.ndarray, mine: np.ndarray, me: bytes, members: tuple[bytes, ...]) -> bool:
    """Whether `total` is the sum of the members' test vectors, (Σ w)·C, given this member's own
    vector `mine` = w(me)·C: C = mine·w(me)^-1 exactly (w odd), so the expected total is
    mine·(Σ w)·w(me)^-1. Compared a block at a time in one scratch block (no array of the
    vector's size: fresh memory page-faults), off the loop for large vectors."""
    if total.shape != mine.shape:
        return False
    factor = np.uint64(sum(weight(m) for m in members) * pow(weight(me), -1, 2**64) % 2**64)
    expected = np.empty(min(len(mine), MASK_BLOCK_ENTRIES), dtype=np.uint64)
    for start in range(0, len(mine), MASK_BLOCK_ENTRIES):
        part = total[start:start + MASK_BLOCK_ENTRIES]
        block = expected[:len(part)]
        np.multiply(mine[start:start + MASK_BLOCK_ENTRIES], factor, out=block)
        if not np.array_equal(block, part):
            return False
    return True


async def _compute(entries: int, fn: Any, *args: Any) -> Any:
    """fn(*args), in a worker thread for large vectors (tens of ms per 8 MiB: not on the loop)."""
    return await asyncio.to_thread(fn, *args) if entries >= OFF_LOOP_ENTRIES_MIN else fn(*args)


async def run(ch: Any, params: Mapping[str, Any], ctx: JobContext) -> dict:
    entries = params["entries"]
    ch.progress("secure sum of the test vectors", 0, 1)
    mine = await _compute(entries, contribution, ch.me, entries)     # before the clock starts
    started, cpu_started = time.perf_counter(), time.process_time()   # measurements for the report
    outcome = await secure_sum(ch, "sumcheck", mine, mode=params["secure_sum"],
                               hop_timeout_ms=ctx.hop_timeout_ms, chunk_entries=params["chunk_entries"],
                               compact=params["secure_sum_compact"])
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    if not await _compute(entries, _correct, outcome.total, mine, ch.me, tuple(outcome.participants)):
        raise JobError("the secure sum returned a wrong total")
    mib = entries * 8 / 2**20
    return {"ok": True, "entries": entries, "mib": mib, "seconds": seconds, "mib_per_s": mib / seconds,
            "cpu_seconds": cpu_seconds,   # this daemon's process (every thread) while its sum ran
            "participants": [ctx.names.get(k, k.hex()[:16]) for k in outcome.participants],
            "attempts": outcome.attempts, "secure_sum": params["secure_sum"]}


# [policy.sumcheck]: the largest (or smallest) parameters of a job this site agrees to run; each bounds
# one parameter, and the defaults are the kind's own bounds, so an unset limit refuses nothing.
LIMITS = {
    "entries_max": Limit("entries", 16 * 1024 * 1024, "uint64 entries in the summed vector (8 bytes each)"),
}


def describe(result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines: whether the total was right, over whom, and how fast."""
    tries = "" if result["attempts"] == 1 else f" (after {result['attempts']} attempts)"
    return [f"  total {'correct' if result['ok'] else 'WRONG'}: {result['entries']} entries "
            f"({_size(result['mib'])}) secure-summed ({result['secure_sum']}) over "
            f"{', '.join(result['participants'])}{tries}",
            f"  {result['seconds'] * 1000:.1f} ms, {result['mib_per_s']:.1f} MiB/s; this daemon's CPU "
            f"{result['cpu_seconds'] * 1000:.1f} ms"]


def site_table(sites: Sequence[Mapping[str, Any]]) -> str:
    """One row per site: its state, whether its total was right, the time and throughput it saw."""
    rows = [("SITE", "STATE", "TOTAL", "ENTRIES", "MS", "MIB/S", "CPU MS", "ATTEMPTS")]
    for s in sites:
        r = s.get("result") or {}
        rows.append((s["name"], s.get("state", "-"), ("correct" if r["ok"] else "WRONG") if r else "-",
                     r.get("entries", "-"), f"{r['seconds'] * 1000:.1f}" if r else "-",
                     f"{r['mib_per_s']:.1f}" if r else "-", f"{r['cpu_seconds'] * 1000:.1f}" if r else "-",
                     r.get("attempts", "-")))
    return table(rows)


def _size(mib: float) -> str:
    return f"{mib:.1f} MiB" if mib >= 1 else f"{mib * 1024:.1f} KiB"


KIND = JobKind(name="sumcheck", help="check the secure-sum ring end to end (no data involved) and time it",
               params=PARAMS, run=run, needs_data=False, binary_label=False,
               limits=LIMITS, describe=describe, site_table=site_table)
