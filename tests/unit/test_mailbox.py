"""The job mailbox: concurrent receivers never lose a message to each other."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from fedpeer.runtime.channel import Mailbox, RecvTimeout


@dataclass(frozen=True)
class Msg:
    tag: str


@pytest.mark.looptime
async def test_concurrent_receivers_each_get_their_message_at_once() -> None:
    """Regression: with one shared Event, a receiver whose wait had not started could miss the
    wake-up another receiver cleared, and sat until its timeout (secure sums stalled 30 s)."""
    box = Mailbox()
    loop = asyncio.get_running_loop()
    started = loop.time()
    receivers = [asyncio.create_task(box.get(Msg, f"t{i}", None, 60_000)) for i in range(20)]
    await asyncio.sleep(0)
    for i in reversed(range(20)):
        box.put(b"a" * 32, Msg(f"t{i}"))
    results = await asyncio.gather(*receivers)
    assert [m.tag for _, m in results] == [f"t{i}" for i in range(20)]
    assert loop.time() - started < 0.001, "every receiver must be woken by its own message"


@pytest.mark.looptime
@pytest.mark.parametrize("seed", range(5))
async def test_no_lost_wakeups_under_random_interleavings(seed: int) -> None:
    """Receivers start and messages arrive at random loop iterations (seeded): every receiver
    must get its message without waiting for its timeout."""
    import random
    rng = random.Random(seed)
    box = Mailbox()
    loop = asyncio.get_running_loop()
    started = loop.time()
    tasks = []
    for i in range(60):
        tasks.append(asyncio.create_task(box.get(Msg, f"m{i}", None, 60_000)))
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
        loop.call_soon(box.put, b"a" * 32, Msg(f"m{rng.randrange(i + 1) if rng.random() < 0.0 else i}"))
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert loop.time() - started < 0.001, f"seed={seed}: a receiver waited for its timeout"


@pytest.mark.looptime
async def test_buffered_before_receive_and_timeout_and_source_filter() -> None:
    box = Mailbox(limit=2)
    box.put(b"a" * 32, Msg("x"))
    assert (await box.get(Msg, "x", None, 10))[1] == Msg("x")
    box.put(b"a" * 32, Msg("y"))
    with pytest.raises(RecvTimeout):
        await box.get(Msg, "y", b"b" * 32, 50)      # wrong sender
    assert (await box.get(Msg, "y", b"a" * 32, 10))[1] == Msg("y")
    for tag in ("1", "2", "3"):
        box.put(b"a" * 32, Msg(tag))
    assert box.dropped == 1
    box.discard("2")
    with pytest.raises(RecvTimeout):
        await box.get(Msg, "2", None, 10)


def test_a_flooding_sender_drops_its_own_messages_not_the_leaders() -> None:
    box = Mailbox(limit=8, per_sender=4)
    box.put(b"L" * 32, Msg("round-1"))
    for i in range(100):
        box.put(b"M" * 32, Msg(f"junk-{i}"))
    held = [src for src, _ in box._items]
    assert held.count(b"L" * 32) == 1 and held.count(b"M" * 32) == 4
    assert box.dropped == 96


async def test_a_full_box_drops_from_the_sender_holding_most() -> None:
    box = Mailbox(limit=6, per_sender=6)
    for i in range(3):
        box.put(b"A" * 32, Msg(f"a{i}"))
    for i in range(5):
        box.put(b"B" * 32, Msg(f"b{i}"))
    assert [m.tag for _, m in box._items] == ["a0", "a1", "a2", "b2", "b3", "b4"]
    assert (await box.get(Msg, "a1", None, 10))[1].tag == "a1"
    box.discard("b")
    box.put(b"C" * 32, Msg("c"))
    assert [m.tag for _, m in box._items] == ["a0", "a2", "c"]


async def test_a_message_handed_over_as_the_time_runs_out_is_not_lost() -> None:
    """The receive's time runs out (a 0 ms timeout) around the moment a message is handed over:
    either the receive returns it, or it stays in the box for the next receive; it is never taken
    from the box and dropped."""
    box = Mailbox()
    receiving = asyncio.ensure_future(box.get(Msg, "t", None, 0))
    asyncio.get_running_loop().call_soon(box.put, b"a" * 32, Msg("t"))   # after the receive's first step
    try:
        got = await receiving
    except RecvTimeout:
        got = await box.get(Msg, "t", None, 1_000)
    assert got == (b"a" * 32, Msg("t"))
    with pytest.raises(RecvTimeout):                 # and with nothing handed over, the time runs out
        await box.get(Msg, "t", None, 0)


async def test_a_receive_cancelled_after_its_message_was_handed_over_still_returns_it() -> None:
    """A receive whose message was handed over and which is then cancelled (the caller's
    asyncio.wait picked another receive in the same pass) returns the message rather than drop it
    (asyncio.wait_for's rule; under a bare asyncio.timeout a secure sum lost chunks so and hung)."""
    box = Mailbox()
    receiving = asyncio.ensure_future(box.get(Msg, "t", None, 10_000))
    await asyncio.sleep(0)                            # the receive waits
    box.put(b"a" * 32, Msg("t"))
    receiving.cancel()
    assert await receiving == (b"a" * 32, Msg("t"))
