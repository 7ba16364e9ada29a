"""The daemon's side of versions: telling peers what this build runs, and hearing what they run
(the message and the book are fedpeer/jobs/versions.py's).

When: a peer membership has heard from, alive, that has not said what it runs is sent our
SiteInfo asking for theirs, at most once per SITE_INFO_RETRY_MS while it stays silent; a SiteInfo
asking for ours is answered. A peer whose incarnation moved on since it told us may have restarted
on another build; a restarted build of this release tells every peer itself at once (its book is
empty), and a move is far more often a refutation of a suspicion (the same process). So a move
while we never held the peer dead is taken as a refutation (what it told us still holds), and a
move after we held it dead is asked about only if it has said nothing for SITE_INFO_MOVED_WAIT_MS
(asking at once made every refutation cost 2(n - 1) messages at the member that was just too busy
to answer a probe: 70 sites starting together refuted up to 8 times each). A peer restarted onto
a build without SiteInfo within its suspicion timeout goes unnoticed here; its refusals of what it
cannot run still name it. A reload tells every
peer again; a proposal asks the members it waits for. Every send is best effort, on the node's
own send path, bounded by SITE_INFO_SEND_TIMEOUT_MS; a peer that proves it refused the kind
(`unknown_kind`: a build before SiteInfo) is written down as the previous release, and told
nothing more until its incarnation moves on (and it stays silent).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fedpeer.base import build
from fedpeer.base.logs import fields
from fedpeer.core.membership import swim as mb
from fedpeer.errors import JobError
from fedpeer.jobs import capabilities
from fedpeer.jobs.kind import JobKind
from fedpeer.jobs.versions import REFUSED, UNKNOWN_KIND_REFUSAL, PeerInfo, PeerVersions, SiteInfo, negotiate
from fedpeer.kinds import releases
from fedpeer.net.transport import SendError, SendRefused
from fedpeer.wire import frame as wire

log = logging.getLogger("fedpeer.node")
SITE_INFO_SEND_TIMEOUT_MS = 5_000   # one SiteInfo's delivery, the transport's retries included
SITE_INFO_RETRY_MS = 10_000         # a peer that has not said what it runs is told again this often
SITE_INFO_MOVED_WAIT_MS = 30_000    # a peer's incarnation moved: how long we wait for its own word first


def own_info(kinds: Iterable[JobKind]) -> PeerInfo:
    """What this build runs."""
    return PeerInfo(build.SOFTWARE_VERSION, build.commit(), (wire.PROTOCOL_MIN, wire.PROTOCOL_MAX),
                    capabilities.provided(kinds))


def baseline_info() -> PeerInfo:
    """What a peer that has not said is taken to run: release 0.1.0."""
    return PeerInfo(releases.RELEASE_0_1_0, releases.COMMIT_0_1_0, releases.PROTOCOL_0_1_0,
                    releases.BASELINE_CAPABILITIES)


class VersionExchange:
    """Sends and hears SiteInfo for the node; `book` is what the job lifecycle reads."""

    def __init__(self, kinds: Iterable[JobKind], *, send: Callable[[bytes, str, object], Awaitable[None]],
                 keys: wire.PairKeys, address_of: Callable[[bytes], str | None], spawn: Callable[[Any], Any],
                 now_ms: Callable[[], int], name_of: Callable[[bytes], str | None]) -> None:
        self.book = PeerVersions(own_info(kinds), baseline_info())
        self.book.ask = lambda peer: self._send(peer, reply=True)
        self._send_reliable, self._keys, self._address_of = send, keys, address_of
        self._spawn, self._now_ms, self._name_of = spawn, now_ms, name_of
        self._incarnation: dict[bytes, int] = {}    # each peer's incarnation, as membership last showed it
        self._sent_ms: dict[bytes, int] = {}        # when we last told it, unanswered
        self._moved_ms: dict[bytes, int] = {}       # when we saw its incarnation move past the one we learnt at
        self._holds_to: dict[bytes, int] = {}       # incarnations it refuted up to: what it told us still holds
        self._died: set[bytes] = set()              # held dead since it last told us
        self._in_flight: set[bytes] = set()

    def on_view(self, view: mb.MemberView) -> None:
        """Membership's view of a peer after one of its steps."""
        peer = view.node
        self._incarnation[peer] = view.incarnation
        if view.state is mb.MemberState.DEAD:
            self._died.add(peer)
        if view.state is not mb.MemberState.ALIVE or view.last_seen_ms is None or peer in self._in_flight:
            return
        learnt = self.book.learnt_at(peer)
        if learnt is not None:
            if view.incarnation <= max(learnt, self._holds_to.get(peer, learnt)):
                return
            if peer not in self._died:      # a refutation by the same process (a restart tells us itself)
                self._holds_to[peer] = view.incarnation
                return
            moved_ms = self._moved_ms.setdefault(peer, self._now_ms())
            if self._now_ms() - moved_ms < SITE_INFO_MOVED_WAIT_MS:
                return
        last = self._sent_ms.get(peer)
        if last is not None and self._now_ms() - last < SITE_INFO_RETRY_MS:
            return
        self._send(peer, reply=True)

    def on_info(self, peer: bytes, msg: SiteInfo) -> None:
        """A peer's SiteInfo passed the gate."""
        self._sent_ms.pop(peer, None)
        self._forget_moves(peer)
        if self.book.told(peer, msg, self._incarnation.get(peer, 0)):
            self._log_learnt(peer)
        if msg.reply and peer not in self._in_flight:
            self._send(peer, reply=False)

    def on_reload(self, allowed: frozenset[bytes]) -> None:
        """peers.toml was reloaded: forget removed peers, tell the others again."""
        for peer in [p for p in self._incarnation if p not in allowed]:
            self.book.forget(peer)
            self._incarnation.pop(peer, None)
            self._sent_ms.pop(peer, None)
            self._forget_moves(peer)
        for peer in list(self._incarnation):
            if peer not in self._in_flight:
                self._send(peer, reply=self.book.known(peer) is None)

    def own_status(self) -> dict[str, Any]:
        own = self.book.own
        return {"software": own.software, "commit": own.commit, "protocol": list(own.protocol),
                "capabilities": sorted(own.caps)}

    def status_of(self, peer: bytes) -> dict[str, Any]:
        return self.book.status_of(peer)

    def _send(self, peer: bytes, reply: bool) -> None:
        address = self._address_of(peer)
        if address is None:
            return
        self._in_flight.add(peer)
        self._sent_ms[peer] = self._now_ms()
        try:
            self._spawn(self._deliver(peer, address, self.book.own.message(reply)))
        except JobError:   # the daemon is stopping
            self._in_flight.discard(peer)

    async def _deliver(self, peer: bytes, address: str, msg: SiteInfo) -> None:
        incarnation = self._incarnation.get(peer, 0)
        try:
            await asyncio.wait_for(self._send_reliable(peer, address, msg), SITE_INFO_SEND_TIMEOUT_MS / 1000)
        except SendRefused as exc:
            self._forget_moves(peer)
            if (exc.reason == UNKNOWN_KIND_REFUSAL and exc.frame is not None
                    and wire.refusal_verified(self._keys, peer, exc.frame, exc.reason, exc.tag)
                    and self.book.refused(peer, incarnation)):
                self._log_learnt(peer)
        except (SendError, TimeoutError):
            pass   # best effort: told again after SITE_INFO_RETRY_MS, or asked at a proposal
        finally:
            self._in_flight.discard(peer)

    def _forget_moves(self, peer: bytes) -> None:
        """It told us (or refused to) again: its moves so far are accounted for."""
        self._moved_ms.pop(peer, None)
        self._holds_to.pop(peer, None)
        self._died.discard(peer)

    def _log_learnt(self, peer: bytes) -> None:
        info = self.book.info(peer)
        speaks = negotiate(self.book.own.protocol, info.protocol)
        log.info("peer_version", extra=fields(
            peer=self._name_of(peer), software=info.software, commit=info.commit,
            protocol=f"{info.protocol[0]}-{info.protocol[1]}", speaks=speaks if speaks is not None else "none",
            capabilities=len(info.caps), missing=",".join(sorted(self.book.own.caps - info.caps)) or "-",
            how="refused site_info" if info.how == REFUSED else "told"))
        if speaks is None:
            log.warning("no_common_protocol", extra=fields(
                peer=self._name_of(peer), theirs=f"{info.protocol[0]}-{info.protocol[1]}",
                ours=f"{self.book.own.protocol[0]}-{self.book.own.protocol[1]}"))
