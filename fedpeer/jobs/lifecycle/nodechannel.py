"""A job's messages over the daemon: the Channel (fedpeer/runtime/channel.py) a job member runs over
it (`NodeChannel`), and the watch that ends a send to a member as soon as membership declares it
dead (`DeathWatch`). What the node gives the registry is `Transport` (fedpeer/jobs/lifecycle/host.py).

- A send to a member declared dead fails at once (PeerUnreachable), in flight or not, instead of
  retrying for a whole hop timeout; the registry hears the declaration (`on_peer_state`).
- A running job's phase and step are written when they change, at most once a second
  (records.py save_progress), so a site restarted after a crash says where its job was.
- The secure sum's own progress (its chunks) is a detail of the kind's phase, never in its place:
  "histogram mode: round 3 of 20 (secure sum: chunk 2 of 8)", and nothing for a one-chunk sum, so
  `job show` and `run --wait` keep the phase and round that matter.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

from fedpeer.jobs.records import JobRecord
from fedpeer.protocols.securesum.core import PHASE as SECURE_SUM_PHASE
from fedpeer.runtime.channel import PeerUnreachable
from fedpeer.jobs.lifecycle.host import Host


DEAD_DETAIL = "declared dead by membership"
HISTORY_POINTS_MAX = 10_000          # a running job's live history keeps the newest this many points


class DeathWatch:
    """The peers membership declared dead, and the sends in flight to each, which end when it is.

    A send is watched in the task that sends (no task of its own, no asyncio.wait: those were a
    quarter of a job message's loop work): its watch is an `asyncio.timeout` with no deadline,
    moved to now when its peer is declared dead, which cancels the send where it waits."""

    def __init__(self) -> None:
        self.dead: set[bytes] = set()                                  # peers membership declared dead
        self._watches: dict[bytes, set[asyncio.Timeout]] = {}          # peer -> sends to it in flight

    def declare_dead(self, peer: bytes) -> bool:
        """`peer` was declared dead: its sends in flight end. Whether that is news."""
        if peer in self.dead:
            return False
        self.dead.add(peer)
        watches = self._watches.pop(peer, set())
        if watches:
            now = asyncio.get_running_loop().time()
            for watch in watches:
                if watch.when() is None:          # not expired yet (nor ended by an earlier death)
                    watch.reschedule(now)
        return True

    def declare_alive(self, peer: bytes) -> bool:
        """`peer` is alive again: whether it was declared dead."""
        if peer not in self.dead:
            return False
        self.dead.discard(peer)
        return True

    async def unless_dead(self, peer: bytes, work: Any) -> Any:
        """Await `work` (a send to `peer`), but raise PeerUnreachable at once if membership has
        declared `peer` dead, or as soon as it does: a send to a dead peer would retry for a
        whole hop timeout. A send that ended before the declaration took effect keeps its result."""
        if peer in self.dead:
            work.close()
            raise PeerUnreachable(peer, DEAD_DETAIL)
        watches = self._watches.setdefault(peer, set())
        watch = asyncio.timeout(None)
        try:
            async with watch:
                watches.add(watch)
                return await work
        except TimeoutError:
            if watch.expired():               # the declaration cancelled the send
                raise PeerUnreachable(peer, DEAD_DETAIL) from None
            raise
        finally:
            watches.discard(watch)
            if not watches and self._watches.get(peer) is watches:
                del self._watches[peer]


class NodeChannel:
    """The Channel (fedpeer/runtime/channel.py) of one job member, over the daemon's transport."""

    def __init__(self, registry: Host, record: JobRecord) -> None:
        self._registry, self._record = registry, record
        self.me = registry.transport.me
        self.members = record.members
        self.job_id = record.id
        self.metrics = getattr(registry.transport, "metrics", None)   # fedpeer/daemon/metrics.py observe_*
        self._phase = record.phase                    # the kind's own phase (a secure sum's chunks aside)

    def now_ms(self) -> int:
        return self._registry.transport.now_ms()

    def random_bytes(self, n: int) -> bytes:
        return os.urandom(n)

    def pairwise_seed(self, peer: bytes, label: bytes) -> bytes:
        return self._registry.transport.pairwise_seed(peer, label)

    def alive(self, peer: bytes) -> bool:
        return peer == self.me or self._registry.transport.alive(peer)

    def leadership(self) -> tuple[int, bytes | None]:
        return self._registry.transport.leadership()

    async def sleep_ms(self, ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    def progress(self, phase: str, step: int, total: int, point: Mapping[str, Any] | None = None) -> None:
        """Where the job is; `point` (a round's metrics: numbers under short names) joins the
        record's live history, the newest HISTORY_POINTS_MAX kept, for `job show` and the console."""
        record = self._record
        if point is not None:
            record.history.append({str(k): v for k, v in point.items()})
            del record.history[:-HISTORY_POINTS_MAX]
        if phase == SECURE_SUM_PHASE:                 # a secure sum's chunks, within the kind's phase
            if total <= 1:
                return
            phase, step, total = f"{self._phase} (secure sum: chunk {step} of {total})", record.step, record.total
        else:
            self._phase = phase
        changed = (phase, step) != (record.phase, record.step)
        record.phase, record.step, record.total = phase, step, total
        if changed and record.state == "running":    # on disk within a second (not every round: an fsync
            self._registry.records.save_progress(record)     # each was 20 % of a logreg job)

    async def send(self, dst: bytes, msg: object) -> None:
        assert dst in self.members and dst != self.me, "send to a non-member or to self"
        sending = self._registry.transport.send(dst, msg, self.job_id, self._registry.config.jobs.hop_timeout_ms)
        await self._registry.deaths.unless_dead(dst, sending)

    async def recv(self, kind: type, tag: str, src: bytes | None = None, timeout_ms: int = 30_000) -> tuple[bytes, Any]:
        return await self._record.mailbox.get(kind, tag, src, timeout_ms)

    def discard(self, tag_prefix: str) -> None:
        self._record.mailbox.discard(tag_prefix)
