"""Warm memory for frames.

A MiB-sized buffer that is allocated fresh for every frame costs more than the frame's encryption:
the allocator hands out pages the kernel has to fault in and zero (py-spy at 1 MiB: a fresh
`bytearray` per frame was ~15 % of each side's busy time, the AES-GCM pass ~5 %). A frame's own
buffer — the ciphertext, sealed or received — is dead once the frame is sent or opened, so its
memory can carry the next frame: `take` a buffer at least n bytes long, `give` it back when
nothing refers to it any more. Only the ciphertext is pooled: a received message's plaintext
lives on in the message (arrays are views of it).

Buffers come in size classes (a quarter of a power of two apart), frames under POOLED_BYTES_MIN or
over POOLED_BYTES_MAX are not pooled, and at most KEEP_BYTES_MAX of idle buffers are kept. Frames
from 64 KiB on are pooled, not only MiB-sized ones: a fresh buffer of 160-256 KiB per frame made
glibc's heap grow and shrink on every frame (3 brk calls, and its pages faulted in again: 1,000
frames of 192 KiB between two processes took 3,100 brk calls and ~2x the receiver's CPU; pooled,
none), and those are a histogram all-reduce's usual segment sizes.
"""

from __future__ import annotations

import threading

POOLED_BYTES_MIN = 64 * 1024
POOLED_BYTES_MAX = 16 * 1024 * 1024
KEEP_BYTES_MAX = 48 * 1024 * 1024
SIZE_CLASS_STEP_LOG2_MIN = 16     # size classes are at least 2**16 bytes (64 KiB) apart
SIZE_CLASS_STEP_SHIFT_BITS = 3    # a step is n's next power of two over 2**3: 4 classes per doubling


def size_class(n: int) -> int:
    step = 1 << max(SIZE_CLASS_STEP_LOG2_MIN, n.bit_length() - SIZE_CLASS_STEP_SHIFT_BITS)
    return -(-n // step) * step


class FramePool:
    def __init__(self, keep_bytes_max: int = KEEP_BYTES_MAX) -> None:
        self._keep_bytes_max = keep_bytes_max
        self._free: dict[int, list[bytearray]] = {}
        self._idle_bytes = 0
        self._lock = threading.Lock()
        self.taken = self.reused = 0     # for tests and benchmarks

    def take(self, n: int) -> bytearray | None:
        """A buffer of at least `n` bytes (its contents are stale), or None for a size not pooled."""
        if not POOLED_BYTES_MIN <= n <= POOLED_BYTES_MAX:
            return None
        size = size_class(n)
        with self._lock:
            self.taken += 1
            free = self._free.get(size)
            if free:
                self.reused += 1
                self._idle_bytes -= size
                return free.pop()
        return bytearray(size)

    def give(self, buf: bytearray | None) -> None:
        """Return a buffer from `take` that nothing refers to any more (not even a memoryview)."""
        if buf is None:
            return
        with self._lock:
            if self._idle_bytes + len(buf) > self._keep_bytes_max:
                return
            self._free.setdefault(len(buf), []).append(buf)
            self._idle_bytes += len(buf)

    def idle_bytes(self) -> int:
        with self._lock:
            return self._idle_bytes
