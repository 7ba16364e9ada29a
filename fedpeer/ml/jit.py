"""numba's njit as fedpeer's compiled loops use it: nogil (a member's event loop goes on while its
worker thread runs them), no fastmath (IEEE order, so results are the numpy forms' to the bit where
the order is the same), and `cache=True` — the machine code beside the module or in numba's user
cache directory; where neither is writable, each process compiles on first use (the daemon's ML
preload warms every kernel, daemon/warmup.py)."""

from __future__ import annotations

from typing import Any

import numba

__all__ = ["jit"]


def jit(fn: Any) -> Any:
    try:
        return numba.njit(nogil=True, cache=True)(fn)
    except RuntimeError:                 # no writable cache location: compile per process
        return numba.njit(nogil=True)(fn)
