"""A peer whose incarnation moves on (fedpeer/daemon/versions.py): a move while it was never dead
at us is a refutation (not asked again); after it was dead, asked only after SITE_INFO_MOVED_WAIT_MS
of its own silence, since a restarted build tells us itself."""

from __future__ import annotations

from fedpeer.core.membership import swim as mb
from fedpeer.daemon.versions import SITE_INFO_MOVED_WAIT_MS, VersionExchange
from fedpeer.kinds.catalog import job_kinds

PEER = b"\x01" * 32


class _Clock:
    now = 1_000


def _exchange(clock: _Clock, sent: list[bool]) -> VersionExchange:
    def spawn(coro: object) -> None:
        sent.append(True)
        coro.close()   # type: ignore[attr-defined]

    async def send(peer: bytes, address: str, msg: object) -> None:
        return None

    return VersionExchange(job_kinds().values(), send=send, keys=None, address_of=lambda p: "127.0.0.1:1",  # type: ignore[arg-type]
                           spawn=spawn, now_ms=lambda: clock.now, name_of=lambda p: "peer")


def _view(incarnation: int, state: mb.MemberState = mb.MemberState.ALIVE) -> mb.MemberView:
    return mb.MemberView(PEER, state, incarnation, "127.0.0.1:1", last_seen_ms=0, rtt_ms=None)


def test_a_moved_incarnation_waits_for_the_peers_own_word() -> None:
    clock, sent = _Clock(), []
    ex = _exchange(clock, sent)
    ex.on_view(_view(1))
    assert sent == [True]                                 # first heard: asked at once
    ex._in_flight.clear()
    ex.on_info(PEER, ex.book.own.message(reply=False))    # it told us, at incarnation 1
    for incarnation in (2, 3, 4):                         # it refuted suspicions: never dead at us
        ex.on_view(_view(incarnation))
        clock.now += SITE_INFO_MOVED_WAIT_MS
        ex.on_view(_view(incarnation))
    assert sent == [True], "a refutation is the same process: what it told us holds"
    ex.on_view(_view(4, mb.MemberState.DEAD))             # it died, and came back at 5
    ex.on_view(_view(5))
    clock.now += SITE_INFO_MOVED_WAIT_MS - 1
    ex.on_view(_view(5))
    assert sent == [True], "not asked while it may still tell us itself"
    ex.on_info(PEER, ex.book.own.message(reply=False))    # a restarted build tells us itself
    ex.on_view(_view(5))
    assert sent == [True] and ex.book.learnt_at(PEER) == 5
    ex.on_view(_view(5, mb.MemberState.DEAD))             # dead again, back at 6, and silent this time
    ex.on_view(_view(6))
    clock.now += SITE_INFO_MOVED_WAIT_MS
    ex.on_view(_view(6))
    assert sent == [True, True]
