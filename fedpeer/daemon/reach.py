"""Whether peers can open connections to this site, learned from them, never guessed.

With `[network] reachable = "auto"` a site starts as "unknown" and keeps links open to its peers
for them to send on (fedpeer/net/reverse.py), so it takes part from its first second whatever its
firewall does. Then it asks up to DIALBACK_PEERS peers to dial it back at the address they have
for it (DialBackAsk); each tries to open a TCP connection there within DIALBACK_CONNECT_MS and says
how it went (DialBackAnswer, over those links). One success: "dialable", the links are closed.
Every asked peer failed: "outbound-only", the links stay, and one warning line says what to open
(or to set `reachable = "no"`). No answer: asked again after ASK_RETRY_MS. The answer is checked
again every RECHECK_MS (a firewall may change). "yes" and "no" skip the check.

A peer runs at most one dial-back per asking member per DIALBACK_INTERVAL_MS, and only to the
address its own peers.toml has for that member (never the address the member gossips of itself):
a member cannot aim us at another host or port. A dialable site checks again every RECHECK_MS
with any alive member; when none answers (its firewall closed), it is "unknown" again and opens
its links. The check is a TCP connect: it proves the port opens, not that this site answers there.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fedpeer.base.logs import fields
from fedpeer.net.dial import Route, dial
from fedpeer.wire.schema import register, v_bool, v_bytes, v_str

DIALBACK_PEERS = 2                 # peers asked at once
DIALBACK_CONNECT_MS = 3_000        # a peer's TCP connect to us
DIALBACK_WAIT_MS = 10_000          # how long we wait for the answers
DIALBACK_INTERVAL_MS = 5_000       # a peer dials one member back at most this often
ASK_RETRY_MS = 5_000               # no answer: ask again after this
RECHECK_MS = 600_000               # a known answer is checked again this often
NONCE_BYTES = 16
WHY_BYTES_MAX = 200
log = logging.getLogger("fedpeer.node")


@dataclass(frozen=True)
class DialBackAsk:
    nonce: bytes


@dataclass(frozen=True)
class DialBackAnswer:
    nonce: bytes
    ok: bool
    why: str          # the error class when not ok ("TimeoutError", "ConnectionRefusedError"): no detail


register("dialback_ask", DialBackAsk, {"nonce": v_bytes(NONCE_BYTES)})
register("dialback_answer", DialBackAnswer, {"nonce": v_bytes(NONCE_BYTES), "ok": v_bool,
                                             "why": v_str(WHY_BYTES_MAX)})
MESSAGES = (DialBackAsk, DialBackAnswer)


class Reach:
    """This site's reachability, and its side of other sites' dial-backs."""

    def __init__(self, setting: str, advertise: str, route: Route,
                 send: Callable[[bytes, object], Awaitable[None]],
                 now_ms: Callable[[], int], names: Callable[[bytes], str]) -> None:
        self.setting = setting
        self.state = {"yes": "dialable", "no": "outbound-only"}.get(setting, "unknown")
        self.detail = {"yes": "[network] reachable = \"yes\"",
                       "no": "[network] reachable = \"no\""}.get(setting, "not checked yet")
        self._advertise = advertise
        self._route = route
        self._send = send                 # a reliable send to a peer (raises on failure)
        self._now_ms = now_ms
        self._names = names
        self._asked: dict[bytes, bytes] = {}              # nonce -> peer asked
        self._answers: dict[bytes, DialBackAnswer] = {}   # peer -> its answer to the current round
        self._answered = asyncio.Event()
        self._served_ms: dict[bytes, int] = {}            # member -> when we last dialed it back
        self.checked_ms: int | None = None

    @property
    def wants_reverse_links(self) -> bool:
        return self.state != "dialable"

    async def run(self, askable: Callable[[], list[bytes]]) -> None:
        """Check now and then (`askable()`: peers whose answer can reach us). A dialable site that
        no peer answers any more (its firewall closed) is "unknown" again: it opens its links."""
        if self.setting != "auto":
            return
        while True:
            peers = askable()[:DIALBACK_PEERS]
            done = bool(peers) and await self._check(peers)
            if not done and self.state == "dialable" and self.checked_ms is not None:
                self.state, self.detail = "unknown", "no peer answered a dial-back: links open again until one does"
                log.warning("reachability", extra=fields(state=self.state, detail=self.detail))
            await asyncio.sleep((RECHECK_MS if done else ASK_RETRY_MS) / 1000)

    async def _check(self, peers: list[bytes]) -> bool:
        self._asked, self._answers = {}, {}
        self._answered.clear()
        for peer in peers:
            nonce = os.urandom(NONCE_BYTES)
            self._asked[nonce] = peer
            try:
                await self._send(peer, DialBackAsk(nonce))
            except Exception:    # the peer will be asked again at the next round
                continue
        try:
            async with asyncio.timeout(DIALBACK_WAIT_MS / 1000):
                while not any(a.ok for a in self._answers.values()) and len(self._answers) < len(self._asked):
                    self._answered.clear()
                    await self._answered.wait()
        except TimeoutError:
            pass
        if not self._answers:
            return False
        self.checked_ms = self._now_ms()
        ok = [p for p, a in self._answers.items() if a.ok]
        was = self.state
        if ok:
            self.state, self.detail = "dialable", f"{self._names(ok[0])} opened a connection to {self._advertise}"
        else:
            whys = ", ".join(f"{self._names(p)}: {a.why}" for p, a in self._answers.items())
            self.state = "outbound-only"
            self.detail = (f"no peer could open a connection to {self._advertise} ({whys}) — open it to the other "
                           "sites, or set [network] reachable = \"no\"; meanwhile this site keeps links open to its "
                           "peers and takes part through them")
        if self.state != was:
            (log.info if ok else log.warning)("reachability", extra=fields(state=self.state, detail=self.detail))
        return True

    def on_answer(self, peer: bytes, msg: DialBackAnswer) -> None:
        if self._asked.get(msg.nonce) == peer:
            self._answers[peer] = msg
            self._answered.set()

    async def on_ask(self, peer: bytes, msg: DialBackAsk, address: str | None) -> None:
        """Dial `peer` back at the address we have for it, and say how it went."""
        now = self._now_ms()
        if address is None or now - self._served_ms.get(peer, -DIALBACK_INTERVAL_MS) < DIALBACK_INTERVAL_MS:
            return
        self._served_ms[peer] = now
        ok, why = True, ""
        try:
            async with asyncio.timeout(DIALBACK_CONNECT_MS / 1000):
                sock, _ = await dial(address, self._route)
            sock.close()
        except (OSError, TimeoutError) as exc:
            ok, why = False, type(exc).__name__
        await self._send(peer, DialBackAnswer(msg.nonce, ok, why))

    def summary(self) -> dict[str, object]:
        ago = None if self.checked_ms is None else round((self._now_ms() - self.checked_ms) / 1000, 1)
        return {"state": self.state, "setting": self.setting, "detail": self.detail, "checked_s_ago": ago}
