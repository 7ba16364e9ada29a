"""Members lost mid-job, for the job kinds without a leader (histogram XGBoost, logreg, FedAvg /
mlp): every member runs the same deterministic sequence of secure sums, and this module keeps,
identically at every survivor, who the job's members still are.

* `Epochs.sum` runs one secure sum over a scope (default: every current member) under the tag
  `<prefix>/e<E>/<name>` and says which members of the scope it went without (`Summed.lost`).
  Every survivor of a completed sum gets the same `participants` (the secure sum's guarantee,
  fedpeer/protocols/securesum/api.py), hence the same `lost`.
* A sum that fails outright (the secure sum gives up: with three members, a crash reported by one
  member against its ring successor is a dispute no ring order can route around) waits up to
  DEAD_WAIT_MS for this member's failure detector (`ch.alive`, polled every POLL_MS): the scope's
  members it declares dead are `lost` and the sum has no total (`Summed.total` None: the caller
  redoes it over the survivors under a fresh tag); if it declares nobody dead, the sum's JobError
  stands. A failure that names a member and involves no death (Equivocation: members hold
  different copies of what it sent them; SegmentRefused: an owner refused its total) stands at
  once.
* `Epochs.new_epoch(lost)`, called by every survivor on the same `lost` of a sum over every
  member: the members without them, epoch E + 1 (so every later tag, hence every mask, is
  fresh), and `lost` extended. What a job keeps of its work across a loss is its own business
  (xgbhist.py, logreg.py, fedavg.py say what).

A member left out of a sum (slow, cut off) gets JobError from the secure sum and fails alone
(those kinds declare `member_failure_aborts=False`); the others see it lost in that sum or the next.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from fedpeer.errors import JobError
from fedpeer.protocols.securesum.api import (
    Equivocation,
    OwnerFn,
    SegmentRefused,
    secure_reduce_map,
    secure_results_check,
    secure_sum,
)
from fedpeer.runtime.channel import SubChannel

T = TypeVar("T")
DEAD_WAIT_MS = 30_000            # after a failed sum, how long to wait for the failure detector to name the dead
POLL_MS = 200                    # how often the failure detector's view is read meanwhile


class Lost(Exception):
    """A sum completed (or was given up) without some current members: the job goes on over the
    survivors, in a new epoch."""

    def __init__(self, lost: tuple[bytes, ...]) -> None:
        self.lost = lost
        super().__init__(f"{len(lost)} member(s) lost")


@dataclass(frozen=True)
class Summed:
    tag: str
    total: np.ndarray | None        # None: the sum failed and `lost` were declared dead; redo it without them
    lost: tuple[bytes, ...]         # the members of the scope it went without, in key order


@dataclass(frozen=True)
class Mapped:
    tag: str
    results: tuple[np.ndarray, ...] | None   # None: the reduce-map failed and `lost` were declared dead
    lost: tuple[bytes, ...]
    digests: tuple[bytes, ...]               # SHA-256 of each result (for a later check_results)


class Epochs:
    """A member's view of the job's current members, epoch and lost members (module docstring)."""

    def __init__(self, ch: Any, prefix: str, mode: str, hop_timeout_ms: int) -> None:
        self.ch, self.prefix, self.mode, self.hop_timeout_ms = ch, prefix, mode, hop_timeout_ms
        self.members: tuple[bytes, ...] = tuple(ch.members)
        self.epoch, self.sums = 0, 0
        self.lost: list[bytes] = []

    def tag(self, name: str) -> str:
        return f"{self.prefix}/e{self.epoch}/{name}"

    async def sum(self, name: str, vector: np.ndarray, *, scope: tuple[bytes, ...] | None = None,
                  hop_timeout_ms: int | None = None) -> Summed:
        """One secure sum over `scope` (default: every current member); JobError when it fails
        and the failure detector declares none of the scope dead within DEAD_WAIT_MS."""
        scope = scope or self.members
        tag = self.tag(name)
        out, dead = await self._or_dead(scope, secure_sum(SubChannel(self.ch, scope), tag, vector, mode=self.mode,
                                                          hop_timeout_ms=hop_timeout_ms or self.hop_timeout_ms))
        if dead:
            return Summed(tag, None, dead)     # the sum gave up on a member that has since died
        assert out is not None
        self.sums += 1
        return Summed(tag, out.total, tuple(m for m in scope if m not in out.participants))

    async def reduce_map(self, name: str, vector: np.ndarray, bounds: Sequence[int], owner_fn: OwnerFn, *,
                         hop_timeout_ms: int | None = None, check: bool = True) -> Mapped:
        """`sum`'s twin for a secure reduce-map over every current member (securesum/reducemap.py):
        each owner's result, or the members it went without. An owner's refusal (SegmentRefused)
        ends it at once: nobody died."""
        tag = self.tag(name)
        out, dead = await self._or_dead(self.members, secure_reduce_map(
            SubChannel(self.ch, self.members), tag, vector, bounds, owner_fn,
            hop_timeout_ms=hop_timeout_ms or self.hop_timeout_ms, check=check))
        if dead:
            return Mapped(tag, None, dead, ())
        assert out is not None
        self.sums += 1
        return Mapped(tag, out.results, (), out.digests)

    async def check_results(self, name: str, digests: Sequence[bytes]) -> tuple[bytes, ...]:
        """securesum's results check over every current member: the members it went without
        (declared dead after it failed), or (); JobError when it failed otherwise."""
        _, dead = await self._or_dead(self.members, secure_results_check(
            SubChannel(self.ch, self.members), self.tag(name), digests, hop_timeout_ms=self.hop_timeout_ms))
        return dead

    async def _or_dead(self, scope: tuple[bytes, ...], run: Awaitable[T]) -> tuple[T | None, tuple[bytes, ...]]:
        """(run's outcome, ()), or, when it fails with a JobError, (None, the members of `scope`
        the failure detector then declares dead); the JobError stands if it declares none, and at
        once when it names a member and involves no death (module docstring)."""
        try:
            return await run, ()
        except (SegmentRefused, Equivocation):
            raise
        except JobError:
            dead = await self.declared_dead(scope)
            if not dead:
                raise
            return None, dead

    def new_epoch(self, lost: tuple[bytes, ...]) -> None:
        """Every survivor, on the same `lost`: go on over the others, under fresh tags."""
        self.members, self.epoch = tuple(m for m in self.members if m not in lost), self.epoch + 1
        self.lost.extend(m for m in lost if m not in self.lost)

    async def declared_dead(self, scope: tuple[bytes, ...] | None = None) -> tuple[bytes, ...]:
        """After a failed sum: the members of `scope` (default: every current member) the failure
        detector declares dead within DEAD_WAIT_MS (polled every POLL_MS). If a crashed member
        made the sum give up, every survivor sees it declared dead soon after and goes on without
        it, as if the sum had completed without it; if nobody is declared dead, the failure stands."""
        scope = scope or self.members
        waited = 0
        while True:
            dead = tuple(m for m in scope if m != self.ch.me and not self.ch.alive(m))
            if dead or waited >= DEAD_WAIT_MS:
                return dead
            await self.ch.sleep_ms(POLL_MS)
            waited += POLL_MS
