"""The bagging member's fencing table (fedpeer/kinds/xgboost/fencing.py), pure: every row of the
table, a parked directive's two ends, and the forged-term rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fedpeer.kinds.xgboost.fencing import Fence

A, B = b"a" * 32, b"b" * 32


def directive(term: int) -> SimpleNamespace:
    return SimpleNamespace(term=term)


@pytest.mark.parametrize("seen,leadership,src,term,want", [
    (3, (3, A), A, 2, ("answer", "stale_term")),      # below the highest term obeyed
    (0, (4, A), A, 3, ("answer", "stale_term")),      # below the election's term
    (0, (4, A), A, 4, ("follow", "")),                # the election's term, its leader
    (0, (4, A), B, 4, ("refuse", "not_leader")),      # the election's term, another leader
    (0, (4, None), A, 4, ("park", "")),               # the election has not seen term 4's leader
    (0, (4, A), A, 5, ("park", "")),                  # ahead of the election
])
def test_each_row_of_the_table(seen, leadership, src, term, want) -> None:
    fence = Fence(park_ms=1000, seen_term=seen)
    assert fence.judge(src, directive(term), leadership, now_ms=0) == want
    assert fence.seen_term == (term if want[0] == "follow" else seen)
    assert (src in fence.parked) == (want[0] == "park")


def test_a_parked_directive_is_followed_once_confirmed_or_refused_after_park_ms() -> None:
    fence = Fence(park_ms=1000)
    fence.judge(A, directive(6), (5, B), now_ms=0)
    assert fence.unpark(A, (5, B), now_ms=999) == ("wait", "") and A in fence.parked
    assert fence.unpark(A, (6, A), now_ms=999) == ("judge", "") and A not in fence.parked
    fence.judge(A, directive(7), (6, A), now_ms=0)
    assert fence.unpark(A, (6, A), now_ms=1000) == ("refuse", "unconfirmed_leader") and not fence.parked


def test_a_forged_term_never_raises_seen_term_and_a_newer_directive_replaces_the_parked_one() -> None:
    fence = Fence(park_ms=1000, seen_term=4)
    fence.judge(B, directive(2**62), (4, A), now_ms=0)
    fence.judge(B, directive(2**62 + 1), (4, A), now_ms=5)
    assert fence.seen_term == 4 and fence.parked[B][1].term == 2**62 + 1 and len(fence.parked) == 1
    assert fence.judge(A, directive(4), (4, A), now_ms=6) == ("follow", ""), "the real leader is not stale"


def test_refusals_are_counted_per_sender_and_reason_and_the_first_is_told() -> None:
    fence = Fence(park_ms=1)
    assert fence.count_refusal(B, "not_leader") and not fence.count_refusal(B, "not_leader")
    assert fence.count_refusal(B, "unconfirmed_leader")
    assert fence.refused == {B: {"not_leader": 2, "unconfirmed_leader": 1}}
