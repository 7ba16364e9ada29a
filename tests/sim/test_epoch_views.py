"""Survivors never split (fedpeer/protocols/epochs.py, "Views"; issue 41): the seeded simulation of
a leaderless job with members killed and restarted at random moments (fedpeer/testing/epochsim.py;
benchmarks/bench_epoch_splits.py runs thousands of seeds), and what a member makes of a view."""

from __future__ import annotations

import looptime
import pytest

from fedpeer.errors import JobError, RemoteProtocolError
from fedpeer.identity import Identity
from fedpeer.protocols.epochs import EpochDone, EpochView, Epochs
from fedpeer.testing import frames
from fedpeer.testing.epochsim import simulate_random
from fedpeer.testing.memory import MemoryNetwork
from fedpeer.testing.members import close_loop
from fedpeer.testing.sumsim import SteadyChannel, sim_keys
from fedpeer.wire import frame as wire
from fedpeer.wire.session import Sessions

SEEDS_PER_TEST = 25


@pytest.mark.parametrize("block", range(4))
def test_survivors_never_split_with_views(block: int) -> None:
    for seed in range(block * SEEDS_PER_TEST, (block + 1) * SEEDS_PER_TEST):
        run = simulate_random(seed)
        assert run.end in ("done", "done-without"), run


def test_without_views_the_simulation_finds_the_split() -> None:
    """Seed 9: a sum completes at one survivor and fails at the others, which move to epoch 1 and
    wait for it in their resume sum while it waits for them in epoch 0."""
    assert simulate_random(9, views=False).end == "split"
    assert simulate_random(9).end == "done"


def _declared(view_from: int, lost: list[int]) -> tuple[bytes, ...]:
    """Member 0's declared_dead after a failed sum, with one view in its mailbox; every member alive."""
    keys = sim_keys(4)

    async def go() -> tuple[bytes, ...]:
        net = MemoryNetwork(keys, seed=1)
        ep = Epochs(SteadyChannel(net.channel(keys[0], "j")), "j", "allreduce", 1_000, views=True)
        net.mailbox("j", keys[0]).put(keys[view_from], EpochView("j/view", tuple(keys[i] for i in lost)))
        return await ep.declared_dead()

    loop = looptime.new_event_loop(start=0, noop_cycles=1)
    try:
        return loop.run_until_complete(go())
    finally:
        close_loop(loop)


def test_a_view_from_a_member_is_taken_over_this_members_detector() -> None:
    keys = sim_keys(4)
    assert _declared(1, [2, 3]) == (keys[2], keys[3])


def test_a_view_naming_its_sender_is_ignored_and_nobody_is_declared() -> None:
    assert _declared(1, [1, 2]) == ()          # DEAD_WAIT_MS of virtual time, then nobody


def test_a_view_naming_this_member_means_it_was_left_behind() -> None:
    with pytest.raises(JobError, match="went on without this site"):
        _declared(1, [0, 2])


def test_views_and_words_round_trip_through_the_gate_and_a_bad_view_is_refused() -> None:
    alice, bob = Identity.generate(), Identity.generate()
    gate = wire.Gate(bob, {alice.public_key}.__contains__, Sessions(), message_bytes_max=1 << 20)
    forger = frames.Forger(alice)
    forger.pair(gate, bob.public_key, 0)
    for msg in (EpochView("j/view", (bytes(32), b"\x01" * 32)), EpochView("j/view", ()), EpochDone("j/e1-ab/end")):
        assert gate.open(forger.seal(bob.public_key, msg), 0).msg == msg
    with pytest.raises(RemoteProtocolError):
        gate.open(forger.seal(bob.public_key, EpochView("j/view", (b"short",))), 0)
