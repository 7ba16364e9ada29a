"""A peer whose incarnation moves on (fedpeer/daemon/versions.py): asked again what it runs only
after SITE_INFO_MOVED_WAIT_MS of its own silence, since a restarted build tells us itself and a
move is most often a refutation by the same process."""

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


def _view(incarnation: int) -> mb.MemberView:
    return mb.MemberView(PEER, mb.MemberState.ALIVE, incarnation, "127.0.0.1:1", last_seen_ms=0, rtt_ms=None)


def test_a_moved_incarnation_waits_for_the_peers_own_word() -> None:
    clock, sent = _Clock(), []
    ex = _exchange(clock, sent)
    ex.on_view(_view(1))
    assert sent == [True]                                 # first heard: asked at once
    ex._in_flight.clear()
    ex.on_info(PEER, ex.book.own.message(reply=False))    # it told us, at incarnation 1
    ex.on_view(_view(2))                                  # it refuted a suspicion (or restarted)
    clock.now += SITE_INFO_MOVED_WAIT_MS - 1
    ex.on_view(_view(2))
    assert sent == [True], "not asked while it may still tell us itself"
    ex.on_info(PEER, ex.book.own.message(reply=False))    # a restarted build tells us itself
    ex.on_view(_view(2))
    assert sent == [True] and ex.book.learnt_at(PEER) == 2
    ex.on_view(_view(3))                                  # moved again, and silent this time
    clock.now += SITE_INFO_MOVED_WAIT_MS
    ex.on_view(_view(3))
    assert sent == [True, True]
