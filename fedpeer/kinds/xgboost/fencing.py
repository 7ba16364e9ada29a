"""Which leader's directives a bagging member obeys: the fencing rules as a pure state object (like
fedpeer/core/election/): no channel, no clock, no logging. The member passes its election's
(term, leader) and the time; the fence answers what to do and keeps what fencing must remember.

A directive of term T from sender S, judged against the highest term this member has obeyed
(`seen_term`) and its election's (term, leader):

| T and S                                                   | verdict     | the member                    |
|-----------------------------------------------------------|-------------|-------------------------------|
| T below `seen_term` or below the election's term          | stale       | answers "stale_term"          |
| T is the election's term and S its leader                 | obey        | follows it; seen_term = T     |
| T is the election's term and another member leads it      | not_leader  | refuses: "not_leader"         |
| anything else (T ahead of the election, its leader unseen)| unconfirmed | parks it (one per sender)     |

A parked directive is judged again each time the member looks (`unpark`): once its verdict is
no longer "unconfirmed" the member follows it (and the table applies again); after `park_ms`
still unconfirmed it is refused "unconfirmed_leader". An honest new leader's heartbeat confirms
it within a heartbeat interval. Neither a refused nor a parked directive raises `seen_term`, so
a forged term 2**62 cannot make the honest leader stale. Refusals are counted per sender and
reason; the caller logs the first of each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OBEY, STALE, NOT_LEADER, UNCONFIRMED = "obey", "stale", "not_leader", "unconfirmed"

# verdict -> (what the member does, the error its answer carries)
ACTIONS = {
    STALE: ("answer", "stale_term"),
    OBEY: ("follow", ""),
    NOT_LEADER: ("refuse", "not_leader"),
    UNCONFIRMED: ("park", ""),
}
PARK_EXPIRED = ("refuse", "unconfirmed_leader")
STILL_PARKED = ("wait", "")


@dataclass
class Fence:
    park_ms: int                                      # how long a directive may wait for its term's leader
    seen_term: int = 0                                # highest term whose leader this member obeyed
    parked: dict = field(default_factory=dict)        # sender -> (parked at ms, directive)
    refused: dict = field(default_factory=dict)       # sender -> {reason: count}

    def verdict(self, src: bytes, term: int, leadership: tuple[int, bytes | None]) -> str:
        el_term, el_leader = leadership
        if term < self.seen_term or term < el_term:
            return STALE
        if term == el_term and el_leader == src:
            return OBEY
        return NOT_LEADER if term == el_term and el_leader is not None else UNCONFIRMED

    def stale(self, term: int, leadership: tuple[int, bytes | None]) -> bool:
        return term < self.seen_term or term < leadership[0]

    def judge(self, src: bytes, msg: Any, leadership: tuple[int, bytes | None], now_ms: int) -> tuple[str, str]:
        """(action, error) for directive `msg` (its `.term`) from `src`: "follow", "answer" (with
        the error), "refuse" (with the reason) or "park". Parks and obeys as it says."""
        action, error = ACTIONS[self.verdict(src, msg.term, leadership)]
        if action == "park":
            self.parked[src] = (now_ms, msg)       # a newer directive of the same sender replaces it
        elif action == "follow":
            self.seen_term = msg.term
        return action, error

    def unpark(self, src: bytes, leadership: tuple[int, bytes | None], now_ms: int) -> tuple[str, str]:
        """What to do now with `src`'s parked directive: ("wait", "") while its term is still
        unconfirmed and it is younger than park_ms; else it leaves the park, to be judged again
        ("judge", "") or refused ("refuse", "unconfirmed_leader")."""
        at_ms, msg = self.parked[src]
        verdict = self.verdict(src, msg.term, leadership)
        if verdict == UNCONFIRMED and now_ms - at_ms < self.park_ms:
            return STILL_PARKED
        del self.parked[src]
        return PARK_EXPIRED if verdict == UNCONFIRMED else ("judge", "")

    def count_refusal(self, src: bytes, reason: str) -> bool:
        """Count a refusal; whether it is the first of this sender and reason (to log once)."""
        counts = self.refused.setdefault(src, {})
        counts[reason] = counts.get(reason, 0) + 1
        return counts[reason] == 1
