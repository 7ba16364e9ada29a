"""SWIM dissemination (Das et al., DSN 2002, §4.1): the buffer of updates that membership messages
carry piggybacked. fedpeer/core/membership/swim.py decides what goes in (only verdicts it reached
itself, and its own word) and puts the recipient's own bad news first on every message; this
buffer chooses the rest: fewest-sent first, each update on at most
MembershipConfig.retransmit_limit messages."""

from __future__ import annotations

from dataclasses import dataclass

from fedpeer.core.membership.wire import NodeId, Update


@dataclass(slots=True)
class _Gossip:
    update: Update
    sent: int = 0


class GossipBuffer:
    """Updates waiting to be piggybacked, one per member, with how often each went out."""

    def __init__(self) -> None:
        self._entries: dict[NodeId, _Gossip] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def enqueue(self, u: Update) -> None:
        # One entry per member: a newer update replaces (and resets) an older one, so the buffer
        # is bounded by the member count and never carries contradictory news.
        self._entries.pop(u.node, None)
        self._entries[u.node] = _Gossip(u)

    def discard(self, node: NodeId) -> None:
        self._entries.pop(node, None)

    def take(self, dst: NodeId, room: int, limit: int) -> list[Update]:
        """Up to `room` updates to carry on a message to dst (none about dst itself); each one
        counts as sent, and leaves the buffer once sent `limit` times."""
        out = []
        chosen = sorted((g for node, g in self._entries.items() if node != dst),
                        key=lambda g: g.sent)[:room]  # fewest-sent first (stable: oldest first)
        for g in chosen:
            out.append(g.update)
            g.sent += 1
            if g.sent >= limit:
                del self._entries[g.update.node]
        return out
