"""Membership's timings at a hundred members (fedpeer/core/membership/timing.py): the suspicion
timeout grows with log n, and members never heard from are pinged with a backoff, not every
period (a federation starting all at once)."""

from __future__ import annotations

import random

import pytest

from fedpeer.core.membership.swim import Membership, MembershipConfig, MemberState, Ping, PingReq, Update
from fedpeer.core.membership.timing import (
    SUSPECT_SCALE_FROM_MEMBERS,
    suspect_timeout_ms,
    suspicion_scale,
    verify_interval_ms,
)

CFG = MembershipConfig()
IDS = [i.to_bytes(2, "big") * 16 for i in range(1, 101)]
ADDRS = [f"10.0.{i // 250}.{i % 250 + 1}:7000" for i in range(100)]
STEP_MS = 50


def make(n: int) -> Membership:
    return Membership(me=IDS[0], address=ADDRS[0], incarnation=1,
                      peers={IDS[j]: ADDRS[j] for j in range(1, n)}, config=CFG, rng=random.Random(0), now_ms=0)


def test_the_suspicion_timeout_grows_with_log_n_above_ten_members() -> None:
    assert SUSPECT_SCALE_FROM_MEMBERS == 10
    assert [suspicion_scale(n) for n in (1, 2, 5, 10)] == [1.0] * 4
    assert suspicion_scale(100) == pytest.approx(2.0) and suspicion_scale(1000) == pytest.approx(3.0)
    assert suspect_timeout_ms(4_000, None, 10) == 4_000
    assert suspect_timeout_ms(4_000, None, 40) == 6_408            # 4 s x log10(40)
    assert suspect_timeout_ms(4_000, None, 100) == 8_000
    assert suspect_timeout_ms(4_000, 100.0, 100) == 8_400          # plus SUSPECT_RTT_MULT RTTs, as before
    grown = [suspect_timeout_ms(4_000, None, n) for n in range(1, 200)]
    assert grown == sorted(grown)


@pytest.mark.parametrize(("n", "timeout_ms"), [(3, 4_000), (40, 6_408), (100, 8_000)])
def test_a_suspected_member_is_declared_dead_after_the_timeout_for_n(n: int, timeout_ms: int) -> None:
    m = make(n)
    for j in (1, 2, 3 % n or 1):   # X (1) and two reporters heard: their own word
        m.receive(IDS[j], Ping(1, 1, ADDRS[j], ()), 0)
    for src in (2, 3) if n > 3 else (2,):
        m.receive(IDS[src], Ping(2, 1, ADDRS[src], (Update(IDS[1], MemberState.SUSPECT, 1, ADDRS[1]),)), 0)
    if n == 3:   # one reporter is too few there: our own failed probe starts the suspicion instead
        m._set(IDS[1], m._members[IDS[1]], MemberState.SUSPECT, 0)
    assert m.states()[IDS[1]] is MemberState.SUSPECT
    now = 0
    while m.states()[IDS[1]] is MemberState.SUSPECT:
        now += STEP_MS
        m.tick(now)   # X never answers
    assert m.states()[IDS[1]] is MemberState.DEAD
    assert timeout_ms <= now < timeout_ms + STEP_MS


def test_the_backoff_for_a_member_never_heard_from() -> None:
    period, cap = CFG.probe_interval_ms, CFG.dead_probe_interval_ms
    waits = [0]
    while waits[-1] < 8_000:
        waits.append(waits[-1] + verify_interval_ms(period, waits[-1], cap))
    assert waits == [0, 500, 1_000, 2_000, 4_000, 6_000, 8_000]
    assert verify_interval_ms(2_500, 0, cap) == 2_500   # a slow link's own wait is never shortened


def test_a_federation_starting_does_not_ping_its_silent_members_every_period() -> None:
    m = make(100)       # 99 members, none of them up yet
    pings = relays = 0
    for now in range(0, 8_000, STEP_MS):
        for send in m.tick(now):
            pings += isinstance(send.msg, Ping)
            relays += isinstance(send.msg, PingReq)
    # the join ping to each, then at 0.5, 1, 2, 4 and 6 s; plus one round-robin probe per
    # 0.5 s period (16). Every period, as before: 99 x 16 = 1,584. No member we never heard
    # from is asked to relay (before: the round robin's 3 and one per verification).
    assert pings <= 99 * 6 + 16 and relays == 0
    assert all(s is MemberState.SUSPECT for s in m.states().values())   # 8 s: not dead yet at n = 100
    m.tick(8_000)
    assert all(s is MemberState.DEAD for s in m.states().values())


def test_changes_moves_with_what_the_view_says_and_not_with_every_message() -> None:
    m = make(3)
    before = m.changes
    m.receive(IDS[1], Ping(1, 1, ADDRS[1], ()), 10)           # first contact: heard, ALIVE
    assert m.changes > before
    seen = m.changes
    for t in range(20, 200, 10):                              # the same member, the same word
        m.receive(IDS[1], Ping(t, 1, ADDRS[1], ()), t)
    assert m.changes == seen
    m.receive(IDS[1], Ping(2, 2, ADDRS[1], ()), 300)          # a new incarnation (it restarted)
    assert m.changes > seen
    seen = m.changes
    m.set_members({IDS[1]: ADDRS[1]}, 400)                    # node 2 removed
    assert m.changes > seen


def test_verifications_are_bounded_however_many_members_we_suspect() -> None:
    from fedpeer.core.membership.timing import VERIFY_PER_PERIOD_MAX

    m = make(40)
    for j in range(1, 40):
        m.receive(IDS[j], Ping(1, 1, ADDRS[j], ()), 0)          # all heard, ALIVE
    m.tick(0)
    suspects = set(IDS[1:31])
    for node in suspects:                                     # a starved node suspects 30 at once
        m._set(node, m._members[node], MemberState.SUSPECT, 0)
    pings = []
    for now in range(STEP_MS, 2_000 + STEP_MS, STEP_MS):
        pings += [(now, s.dst) for s in m.tick(now) if isinstance(s.msg, Ping) and s.dst in suspects]
    periods = 2_000 // CFG.probe_interval_ms
    # the burst of VERIFY_PER_PERIOD_MAX, then that many a period, plus the round robin's probe;
    # before: all 30 every period (120)
    assert len(pings) <= VERIFY_PER_PERIOD_MAX * (periods + 1) + periods
    assert len({dst for _, dst in pings}) >= VERIFY_PER_PERIOD_MAX * periods   # the longest due first: a turn each


def _probed_and_silent(late_ms: int) -> tuple[Membership, bytes, int]:
    """Two heard members, one probe; the target never answers. Ticks every STEP_MS, each one
    `late_ms` late (our own loop was busy): returns the membership, the target and the time
    the target first became SUSPECT (0: never within 2 s)."""
    m = make(3)
    for j in (1, 2):
        m.receive(IDS[j], Ping(1, 1, ADDRS[j], ()), 0)
    m.tick(0)
    target = next(s.dst for s in m.tick(CFG.probe_interval_ms) if isinstance(s.msg, Ping))
    now = CFG.probe_interval_ms
    while now < 2_500:
        now += STEP_MS + late_ms
        m.tick(now, late_ms)
        if m.states()[target] is MemberState.SUSPECT:
            return m, target, now
    return m, target, 0


def test_our_own_loop_being_late_counts_against_no_one() -> None:
    _, _, on_time = _probed_and_silent(0)
    assert 0 < on_time <= 2 * CFG.probe_interval_ms + STEP_MS       # a failed probe: suspect after its period
    _, _, late = _probed_and_silent(STEP_MS)   # every wake-up a tick late: half the time was ours
    # the same period, counted in time we ran on schedule: about twice as long in wall time
    assert late >= on_time + CFG.probe_interval_ms - 2 * STEP_MS
    m, target, _ = _probed_and_silent(10 * STEP_MS)   # a loop far behind: no verdict within 2 s at all
    assert m.states()[target] is MemberState.ALIVE
