"""The secure sum's masks (fedpeer/protocols/securesum/api.py, "ring mode" and "pairwise mode").

Every mask is an AES-256-CTR keystream (`expand_mask`) read as uint64: under a key derived from a
domain and a 32-byte seed, with the chunk index as the initial counter block, so no two chunks,
seeds or domains share a stream. Three kinds, all fresh per attempt:
* ring mask (the initiator only): seed drawn from `ch.random_bytes` per attempt; added to the
  initiator's chunk on the way out and subtracted when the chunk comes back.
* pairwise masks (pairwise mode): one per other participant, seed `ch.pairwise_seed(peer, label)`
  (an X25519 agreement in the daemon) with a label naming the job, tag, mode, attempt and era;
  +mask by the member with the smaller key, -mask by the other, so they cancel in the total.
* self mask (pairwise mode, every member but the initiator): seed drawn from `ch.random_bytes`,
  revealed to the initiator only once every chunk has come back.

Cost: one AES pass over the chunk per mask (~0.17 ms/MiB with AES instructions, a MiB at a time
into a per-thread buffer) and one in-place add; `Masks.contribution` allocates one array per chunk.
Chunks of OFF_LOOP_BYTES_MIN or more are masked in a worker thread by the caller
(`securesum._compute`), so the event loop never holds more than a few ms of mask work at a time.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

SEED_BYTES = 32
MASK_BLOCK_ENTRIES = 1 << 17            # masks are made and applied 1 MiB at a time (per-thread buffer)

PAIR_DOMAIN = b"fedpeer/securesum/pair-mask/v2\x00"    # v2: AES-256-CTR (v1: SHAKE-256)
SELF_DOMAIN = b"fedpeer/securesum/self-mask/v2\x00"
RING_DOMAIN = b"fedpeer/securesum/ring-mask/v1\x00"    # was os.urandom per entry: ~6x slower
LABEL_DOMAIN = b"fedpeer/securesum/pairwise-seed/v1"
SPARSE_DOMAIN = b"fedpeer/securesum/sparse-neighbours/v1\x00"
SPARSE_MODE = "sparse"                  # pairwise masks with O(log n) neighbours only (mask_neighbours)
PAIRED_MODES = ("pairwise", SPARSE_MODE)   # the modes with pairwise and self masks


def expand_mask(domain: bytes, seed: bytes, chunk: int, entries: int) -> np.ndarray:
    """`entries` uniform uint64 (read-only): the AES-256-CTR keystream under the key
    BLAKE2b-256(domain ‖ seed), initial counter block = chunk index (8 bytes) ‖ 0 (8 bytes), so
    every seed and chunk has its own stream (2^64 blocks each) and no mask is reused across
    chunks. About 10x faster than SHAKE-256 where the CPU has AES instructions (8 MiB
    in ~2 ms vs ~24 ms)."""
    mask = np.zeros(entries, dtype=np.uint64)
    apply_mask(np.add, mask, domain, seed, chunk)
    mask.flags.writeable = False
    return mask


def apply_mask(op: Any, target: np.ndarray, domain: bytes, seed: bytes, chunk: int, offset: int = 0) -> None:
    """target = op(target, mask) in place (np.add or np.subtract, mod 2^64), for the mask
    `expand_mask(domain, seed, chunk, offset + len(target))[offset:]` (`offset` even: a whole AES
    block, two entries, per counter step), made and applied MASK_BLOCK_ENTRIES at a time
    in this thread's scratch buffer: no allocation per mask (fresh buffers page-fault, ~1-3 ms/MiB
    on this VM), and `update_into` instead of `update` (which allocates its output: 0.09 vs
    0.32 ms per 512 KiB here)."""
    key = hashlib.blake2b(domain + seed, digest_size=32).digest()
    assert offset % 2 == 0, "the keystream is addressed in AES blocks of two entries"
    counter = (chunk << 64) + offset // 2           # the block chunk ‖ 0, then offset/2 blocks on
    stream = Cipher(algorithms.AES(key), modes.CTR(counter.to_bytes(16, "big"))).encryptor()
    buf = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = bytearray(8 * MASK_BLOCK_ENTRIES + 15)     # update_into wants a block's slack
    block = np.frombuffer(buf, dtype="<u8", count=MASK_BLOCK_ENTRIES)
    zeros = memoryview(_ZEROS)
    for start in range(0, len(target), MASK_BLOCK_ENTRIES):
        part = target[start:start + MASK_BLOCK_ENTRIES]
        stream.update_into(zeros[:8 * len(part)], buf)
        op(part, block[:len(part)], out=part)


def apply_mask_at(op: Any, target: np.ndarray, domain: bytes, seed: bytes, start: int) -> None:
    """target = op(target, entries start .. start + len(target) of the chunk-0 mask), in place, for
    any start (apply_mask wants offsets on AES blocks: an odd start takes its first entry from the
    block before), so a segment that begins mid-block is masked exactly where its owner unmasks it."""
    if len(target) == 0:
        return
    if start % 2:
        block = np.zeros(2, dtype=np.uint64)
        apply_mask(np.add, block, domain, seed, 0, start - 1)
        op(target[:1], block[1:], out=target[:1])
        target, start = target[1:], start + 1
    if len(target):
        apply_mask(op, target, domain, seed, 0, start)


_ZEROS = bytes(8 * MASK_BLOCK_ENTRIES)      # AES-CTR of zeros is the keystream
_scratch = threading.local()


def pairwise_label(plan: Any, attempt: int) -> bytes:
    """Label for ch.pairwise_seed: unique per (job, tag, mode, attempt[, era]), length-prefixed
    parts so no two different tuples give the same bytes. `plan`: job_id, tag, mode, initiator."""
    parts = [plan.job_id.encode(), plan.tag.encode(), plan.mode.encode(), str(attempt).encode()]
    if plan.initiator is not None:     # a takeover's attempts: masks no earlier initiator's attempt used
        parts.append(plan.initiator)
    return LABEL_DOMAIN + b"".join(len(p).to_bytes(2, "big") + p for p in parts)


def sparse_degree(n: int) -> int:
    """Mask neighbours each member picks in sparse mode: 2 ⌈log2 n⌉ (every other member below
    that), so a member shares masks with about twice that many (its picks and who picked it)."""
    return min(n - 1, 2 * max(1, (n - 1).bit_length()))


def mask_neighbours(label: bytes, participants: Sequence[bytes], me: bytes) -> tuple[bytes, ...]:
    """Sparse mode's mask neighbours of `me` (in participants' order): the members it picks and
    those that pick it, so the relation is symmetric and every pair's masks cancel. Public
    randomness: member i picks sparse_degree(n) others by BLAKE2b of (label, i's key, a counter),
    the same at every member whatever its Python; nobody chooses its neighbours."""
    graph = _sparse_graph(label, tuple(participants))
    return tuple(p for p in participants if p != me and (p in graph[me] or me in graph[p]))


@functools.lru_cache(maxsize=64)
def _sparse_graph(label: bytes, participants: tuple[bytes, ...]) -> dict[bytes, frozenset[bytes]]:
    """Each participant's picks (public: from the attempt's label and the participant list)."""
    n = len(participants)
    want = sparse_degree(n)
    picks: dict[bytes, frozenset[bytes]] = {}
    for i, key in enumerate(participants):
        chosen: set[int] = set()
        counter = 0
        while len(chosen) < want:
            h = hashlib.blake2b(SPARSE_DOMAIN + label + key + counter.to_bytes(4, "big"), digest_size=8).digest()
            j = int.from_bytes(h, "big") % n      # bias below 2^-50 for n under 2^14
            if j != i:
                chosen.add(j)
            counter += 1
        picks[key] = frozenset(participants[j] for j in chosen)
    return picks


class Masks:
    """One member's masks for one attempt. `ring_seed` only at the initiator; pairwise and self
    masks only in pairwise mode. `vector` and `span(k)` come from the sum's plan."""

    def __init__(self, ch: Any, plan: Any, me: bytes, initiator: bytes, participants: tuple[bytes, ...],
                 attempt: int) -> None:
        self._me, self._plan = me, plan
        pairwise = plan.mode in PAIRED_MODES
        label = pairwise_label(plan, attempt)
        peers = mask_neighbours(label, participants, me) if plan.mode == SPARSE_MODE else participants
        self.pair_seeds = {p: ch.pairwise_seed(p, label) for p in peers if pairwise and p != me}
        self.self_seed = ch.random_bytes(SEED_BYTES) if pairwise and me != initiator else None
        self.ring_seed = ch.random_bytes(SEED_BYTES) if me == initiator else None

    def contribution(self, k: int) -> np.ndarray:
        """My vector's chunk k plus my masks for chunk k (mod 2^64), in a fresh array; at the
        initiator, the ring mask too."""
        return self._masked(self._plan.vector[self._plan.span(k)].astype(np.uint64), k)   # a copy

    def added(self, data: np.ndarray, k: int) -> np.ndarray:
        """data + my contribution to chunk k (mod 2^64), in one fresh array: the add writes it
        (no copy of my chunk first), then my masks go on in place. `data` is left as it was."""
        return self._masked(np.add(data, self._plan.vector[self._plan.span(k)]), k)

    def _masked(self, part: np.ndarray, k: int) -> np.ndarray:
        """part + my masks for chunk k, in place."""
        for peer, seed in self.pair_seeds.items():
            apply_mask(np.add if self._me < peer else np.subtract, part, PAIR_DOMAIN, seed, k)
        if self.self_seed is not None:
            apply_mask(np.add, part, SELF_DOMAIN, self.self_seed, k)
        if self.ring_seed is not None:
            apply_mask(np.add, part, RING_DOMAIN, self.ring_seed, k)
        return part


def unmask_ring(data: np.ndarray, masks: Masks, k: int, out: np.ndarray) -> None:
    """The chunk k that came back, less the ring mask, into `out` (a slice of the total)."""
    assert masks.ring_seed is not None, "only the initiator draws a ring mask"
    out[:] = data
    apply_mask(np.subtract, out, RING_DOMAIN, masks.ring_seed, k)


def unmask_self(total: np.ndarray, seeds: list[bytes], k: int) -> None:
    """Remove the revealed self masks of chunk k from `total` (that chunk's slice), in place."""
    for seed in seeds:
        apply_mask(np.subtract, total, SELF_DOMAIN, seed, k)
