"""A restarted member comes back into a running job (fedpeer/protocols/epochs.py, "Rejoins";
issue 41): the seeded simulation of a leaderless job with members killed and restarted at random
moments, each restarted member asking back in (fedpeer/testing/epochsim.py; thousands of seeds:
benchmarks/bench_epoch_splits.py --rejoin), and what a member makes of what others send it."""

from __future__ import annotations

import hashlib
from collections import Counter

import looptime
import numpy as np
import pytest

from fedpeer.errors import JobError, RemoteProtocolError
from fedpeer.identity import Identity
from fedpeer.kinds.xgboost.hist_rejoin import decode_state, encode_state
from fedpeer.ml.xgb.histboost import HistParams
from fedpeer.ml.xgb.sketch import Cuts
from fedpeer.protocols.epochs import EpochView, Epochs, RejoinAsk, RejoinRefused, RejoinState
from fedpeer.testing import frames
from fedpeer.testing.epochsim import simulate_random
from fedpeer.testing.members import close_loop
from fedpeer.testing.memory import MemoryNetwork
from fedpeer.testing.sumsim import SteadyChannel, sim_keys
from fedpeer.wire import frame as wire
from fedpeer.wire.session import Sessions

SEEDS_PER_TEST = 12


@pytest.mark.parametrize("block", range(2))
def test_survivors_never_split_and_a_member_back_rejoins_or_says_why(block: int) -> None:
    rejoined, reasons = 0, Counter()
    for seed in range(block * SEEDS_PER_TEST, (block + 1) * SEEDS_PER_TEST):
        run = simulate_random(seed, rejoin=True)
        assert run.end in ("done", "done-without"), run
        rejoined += run.rejoined
        reasons.update(reason.split(":")[0] for reason in run.left_out)
    # both ends happen in every block: members back in time rejoin, the others are told why
    assert rejoined >= 3 and reasons, (rejoined, reasons)


def _run(go):
    loop = looptime.new_event_loop(start=0, noop_cycles=1)
    try:
        return loop.run_until_complete(go())
    finally:
        close_loop(loop)


def test_a_current_member_that_asks_to_rejoin_restarted_and_is_lost_after_a_failed_sum() -> None:
    keys = sim_keys(4)

    async def go() -> tuple[bytes, ...]:
        net = MemoryNetwork(keys, seed=1)
        ep = Epochs(SteadyChannel(net.channel(keys[0], "j")), "j", "allreduce", 1_000, views=True, rejoin=True)
        net.mailbox("j", keys[0]).put(keys[2], RejoinAsk("j/rejoin"))
        return await ep.declared_dead()

    assert _run(go) == (keys[2],)


def _back_in(states: dict[int, RejoinState]) -> bytes:
    """Member 3, back in (its count 2), receives the state so far from members 0-2 (never left)."""
    keys = sim_keys(4)

    async def go() -> bytes:
        net = MemoryNetwork(keys, seed=1)
        ep = Epochs(SteadyChannel(net.channel(keys[3], "j")), "j", "allreduce", 1_000, views=True, rejoin=True)
        ep._adopt(Counter({keys[3]: 2}))
        for i, msg in states.items():
            net.mailbox("j", keys[3]).put(keys[i], RejoinState(ep.tag("state"), msg.digest, msg.state))
        return await ep.receive_state()

    return _run(go)


def test_a_member_back_takes_the_state_only_when_every_member_that_never_left_vouches_for_it() -> None:
    state = b"the model so far"
    good = hashlib.sha256(state).digest()
    assert _back_in({0: RejoinState("", good, state), 1: RejoinState("", good, b""),
                     2: RejoinState("", good, b"")}) == state
    with pytest.raises(JobError, match="different digests"):
        _back_in({0: RejoinState("", good, state), 1: RejoinState("", bytes(32), b""),
                  2: RejoinState("", good, b"")})
    with pytest.raises(JobError, match="does not match"):
        _back_in({0: RejoinState("", good, b"another model"), 1: RejoinState("", good, b""),
                  2: RejoinState("", good, b"")})
    with pytest.raises(JobError, match="did not arrive"):        # one member never vouched
        _back_in({0: RejoinState("", good, state), 1: RejoinState("", good, b"")})


def test_views_that_name_a_stranger_or_move_a_member_too_often_are_ignored() -> None:
    keys = sim_keys(4)
    stranger = b"\x07" * 32

    async def go() -> tuple[bytes, ...]:
        net = MemoryNetwork(keys, seed=1)
        ep = Epochs(SteadyChannel(net.channel(keys[0], "j")), "j", "allreduce", 1_000, views=True, rejoin=True)
        box = net.mailbox("j", keys[0])
        box.put(keys[1], EpochView("j/view", (stranger,)))              # a stranger: never a member
        box.put(keys[1], EpochView("j/view", (keys[2],) * 4))           # out and back twice: past REJOINS_MAX
        box.put(keys[1], EpochView("j/view", (keys[2],) * 2))           # keys[2] back in, yet never out here
        return await ep._viewed()

    assert _run(go) == (keys[2],)      # taken: a merge makes keys[2] out and back in, a member still


def test_the_state_so_far_round_trips_and_bad_bytes_fail_only_the_rejoin() -> None:
    p = HistParams.from_mapping({"objective": "binary:logistic", "num_round": 4, "max_depth": 2, "max_bin": 4})
    cuts = Cuts(values=np.array([0.5, 1.5, 2.5], dtype=np.float32), ptr=np.array([0, 2, 3]), max_bin=4)
    data = encode_state(100, [0.25], np.array([60, 40, 7]), cuts, [])
    got = decode_state(data, p, 2, 0)
    assert got.rows == 100 and got.base == (0.25,) and got.trees == [] and np.array_equal(got.cuts.ptr, [0, 2, 3])
    for bad in (b"", b"\xc1", data[:-3], encode_state(100, [0.25], np.array([1]), cuts, [])[:10]):
        with pytest.raises(JobError, match="failed its checks"):
            decode_state(bad, p, 2, 0)
    with pytest.raises(JobError, match="failed its checks"):      # not the trees the resume point says
        decode_state(data, p, 2, 1)
    with pytest.raises(JobError, match="failed its checks"):      # another job's features
        decode_state(data, p, 3, 0)


def test_rejoin_messages_round_trip_through_the_gate_and_bad_ones_are_refused() -> None:
    alice, bob = Identity.generate(), Identity.generate()
    gate = wire.Gate(bob, {alice.public_key}.__contains__, Sessions(), message_bytes_max=1 << 20)
    forger = frames.Forger(alice)
    forger.pair(gate, bob.public_key, 0)
    for msg in (RejoinAsk("j/rejoin"), RejoinRefused("j/rejoin", "the job is too near its end"),
                RejoinState("j/e2-ab/state", bytes(32), b"state"), EpochView("j/view", (bytes(32),) * 3)):
        assert gate.open(forger.seal(bob.public_key, msg), 0).msg == msg
    for bad in (RejoinState("j/s", b"short", b""), RejoinRefused("j/rejoin", "x" * 10_000)):
        with pytest.raises(RemoteProtocolError):
            gate.open(forger.seal(bob.public_key, bad), 0)
