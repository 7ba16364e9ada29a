"""What peers' answers to this site's sends tell its operator (`fedpeer status`, per peer): the
last refusal of our frames and what to do about it, and evidence of a second process with a
peer's key. A peer that does not list us, or holds another key for us (or another key answers at
its address), refuses everything we send: that is the news."""

from __future__ import annotations

import logging
import time
from typing import Any

from fedpeer.base.logs import fields
from fedpeer.core.membership import swim as mb

__all__ = ["DUPLICATE_RECENT_MS", "PeerNews", "iso", "refusal_hint"]

log = logging.getLogger("fedpeer.node")
DUPLICATE_RECENT_MS = 60_000      # a second process with a peer's key, heard this recently, is shown as a hint


class PeerNews:
    """Per peer: its last refusal of our sends (reason, wall ms)."""

    def __init__(self) -> None:
        self.refusals: dict[bytes, tuple[str, int]] = {}

    def note(self, peer: bytes, name: str, reason: str | None, listed: bool, now_ms: int) -> None:
        """A peer's answer to one of our sends: a 400 `reason`, or None for a delivery; `listed`:
        the peer is still in peers.toml (not removed while the send was in flight)."""
        if reason is None:
            self.refusals.pop(peer, None)
            return
        if not listed:
            return
        if self.refusals.get(peer, ("",))[0] != reason:
            log.warning("peer_refuses_us", extra=fields(peer=name, reason=reason, hint=refusal_hint(name, reason)))
        self.refusals[peer] = (reason, now_ms)

    def forget(self, peer: bytes) -> None:
        self.refusals.pop(peer, None)

    def of(self, view: mb.MemberView, name: str, now_monotonic_ms: int) -> dict[str, Any]:
        """The peer's entry in status: its last refusal of our sends, evidence of a second process
        with its key (heard at membership's monotonic ms), and a one-line hint for the operator (or None)."""
        refused = self.refusals.get(view.node)
        duplicate = None if not view.duplicate_count else {
            "count": view.duplicate_count, "other_address": view.duplicate_address,
            "last_s_ago": round((now_monotonic_ms - view.duplicate_ms) / 1000, 1)}
        hint = None
        if duplicate is not None and duplicate["last_s_ago"] * 1000 < DUPLICATE_RECENT_MS:
            hint = (f"two processes use {name}'s key: one at {view.address}, one at {view.duplicate_address}; "
                    "stop one (a copied site directory?)")
        elif refused is not None:
            hint = refusal_hint(name, refused[0])
        return {"refused": None if refused is None else {"reason": refused[0], "at": iso(refused[1])},
                "duplicate": duplicate, "hint": hint}


def refusal_hint(name: str, reason: str) -> str:
    """What an operator does about a peer that refuses our frames for `reason`."""
    if reason == "unknown_sender":
        return (f"{name} does not list this site: run `fedpeer peer add` there with this site's key "
                "(`fedpeer key show`)")
    if reason == "header":
        return (f"{name}'s address answers with another key, or {name} holds another key for this site: "
                "compare `fedpeer key show` on both sites with both peers.toml")
    return f"{name} refuses this site's frames ({reason})"


def iso(wall_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall_ms / 1000))
