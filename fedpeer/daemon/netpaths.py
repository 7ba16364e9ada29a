"""How this site and each peer reach each other: the links an outbound-only site dials for its
peers to send on (fedpeer/net/reverse.py), the members that relay between sites that cannot
connect (fedpeer/net/relay.py), and whether this site can be dialed (fedpeer/daemon/reach.py).
The node wires these here and shows, per peer, the path its last request took."""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from fedpeer.config.network import REVERSE_LINKS_MAX
from fedpeer.core.membership import swim as mb
from fedpeer.daemon.reach import DialBackAsk, DialBackAnswer, Reach
from fedpeer.errors import RemoteProtocolError
from fedpeer.jobs.capabilities import RELAY
from fedpeer.net.dial import Route
from fedpeer.net.links import OFF_LOOP_BYTES_MIN
from fedpeer.net.relay import RelayRequest, Relayer
from fedpeer.net.reverse import ReverseDialer, ReverseOffer
from fedpeer.net.transport import SendError
from fedpeer.wire import frame as wire

OFFER_BYTES_MAX = 4 * 1024     # a sealed ReverseOffer is ~150 bytes: a larger frame at its path is refused unread


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class NetPaths:
    def __init__(self, node: Any, route: Route) -> None:   # the Node (fedpeer/daemon/node.py) that owns it
        self._node = node
        network, policy = node.config.network, lambda: node.config.policy
        self.relayer = Relayer(node._client, lambda: (policy().relay, policy().relay_requests_max,
                                                      policy().relay_bytes_max), self._member_address)
        self.reach = Reach(network.reachable, str(node.config.node.advertise), route, self._send,
                           _monotonic_ms, self._name)
        self.dialer = ReverseDialer(route, network.reverse_links, self._members,
                                    lambda peer, address: node._links.offer(peer, address, self.reach.state),
                                    lambda sock, peer: node._server.serve_dialed(sock, peer),
                                    lambda: self.reach.wants_reverse_links, self._name, node._rng)

    def start(self, tg: asyncio.TaskGroup) -> None:
        tg.create_task(self.dialer.run())
        tg.create_task(self.reach.run(self._askable))

    def _askable(self) -> list[bytes]:
        """Whom a dial-back may be asked of: while this site keeps links, the peers it has links to
        (their answer comes back on them); once dialable, any alive member (it reaches us)."""
        if self.reach.wants_reverse_links:
            return sorted(p for p, n in self.dialer.up.items() if n > 0)
        return sorted(v.node for v in self._node.membership.view() if v.state == mb.MemberState.ALIVE)

    def _name(self, key: bytes) -> str:
        return self._node._name(key) or "?"

    def _member_address(self, key: bytes) -> str | None:
        return self._node._address(key) if key in self._node._allowed else None

    def _members(self) -> dict[bytes, str]:
        return {k: a for k in self._node._allowed if (a := self._node._address(k)) is not None}

    async def _send(self, dst: bytes, msg: object) -> None:
        address = self._member_address(dst)
        if address is None:
            raise SendError("not a member")
        await self._node.send_reliable(dst, address, msg)

    def receive(self, src: bytes, msg: object) -> None:
        if isinstance(msg, DialBackAsk):   # only to the address in our peers.toml: a member's own word
            entry = self._node.config.peer_by_key(src)   # (its gossip) could aim us at any host and port
            self._node._spawn(self.reach.on_ask(src, msg, str(entry.address) if entry is not None else None))
        elif isinstance(msg, DialBackAnswer):
            self.reach.on_answer(src, msg)

    def forget(self, peer: bytes) -> None:
        self._node._client.forget(peer)

    # -- the peer port's two paths ------------------------------------------------------------

    async def on_reverse(self, frame: bytes | memoryview, header: wire.FrameHeader, peer_ip: str) -> Any:
        """A peer offers a connection it dialed for us to send on: verified like any frame."""
        if len(frame) > OFFER_BYTES_MAX:
            raise wire.refused_from(header.sender, RemoteProtocolError("oversize", "a reverse offer is small"))
        envelope = self._node._gate.open(frame, _monotonic_ms(), header)
        if not isinstance(envelope.msg, ReverseOffer):
            raise wire.refused_from(envelope.src, RemoteProtocolError("unexpected_kind", "not a reverse offer"))
        held = self._node._client.adopted(envelope.src)
        if held is not None and held[0] >= REVERSE_LINKS_MAX:
            raise wire.refused_from(envelope.src, RemoteProtocolError("reverse_links_max", "enough links from you"))
        return functools.partial(self._node._client.adopt, envelope.src, reach=envelope.msg.reach)

    async def on_relay(self, frame: bytes | memoryview, header: wire.FrameHeader, peer_ip: str) -> Any:
        """A member asks us to forward a frame to another: verified like any frame, then budgeted."""
        if len(frame) > OFF_LOOP_BYTES_MIN:     # decrypting MiBs would stall the loop
            envelope = await asyncio.to_thread(self._node._gate.open, frame, _monotonic_ms(), header)
        else:
            envelope = self._node._gate.open(frame, _monotonic_ms(), header)
        if not isinstance(envelope.msg, RelayRequest):
            raise wire.refused_from(envelope.src, RemoteProtocolError("unexpected_kind", "not a relay request"))
        try:
            return self.relayer.take(envelope.src, self._node.me, envelope.msg)
        except RemoteProtocolError as exc:
            raise wire.refused_from(envelope.src, exc) from None

    def relays_for(self, dst: bytes) -> list[tuple[bytes, str]]:
        """Members that may relay to `dst`, best first: alive, reached without a relay, by RTT."""
        views = {v.node: v for v in self._node.membership.view()}
        target = views.get(dst)
        if target is None:
            return []
        ranked = []
        for key in self._node._allowed:
            view = views.get(key)
            if key == dst or view is None or view.state != mb.MemberState.ALIVE:
                continue
            if self._node._client.routes.get(key, "direct").startswith("relay"):
                continue
            known = self._node.versions.book.known(key)
            if known is not None and RELAY not in known.caps:     # an older build: it would answer 404
                continue
            ranked.append((view.rtt_ms if view.rtt_ms is not None else float("inf"), key.hex(), key, view.address))
        chosen = [(key, address) for *_, key, address in sorted(ranked)]
        # a site held dead gets one relay a try (its probes come every dead_probe_interval_ms): never
        # none, or two sites cut from each other that each hold the other dead would stay apart
        return chosen[:1] if target.state == mb.MemberState.DEAD else chosen

    # -- status ---------------------------------------------------------------------------------

    def path(self, peer: bytes) -> dict[str, Any]:
        """How this site reaches `peer` (the last request's path) and the links between them."""
        client = self._node._client
        route = client.routes.get(peer)
        adopted = client.adopted(peer)
        if adopted is not None:
            route = "inbound"      # on links the peer dialed to us
        elif route is not None and route.startswith("relay:"):
            route = f"relayed by {self._name(bytes.fromhex(route[6:]))}"
        out: dict[str, Any] = {"to": route or "not used yet"}
        if adopted is not None:
            out["links_it_dialed"], out["its_reach"] = adopted
        if self.dialer.up[peer]:
            out["links_we_dialed"] = self.dialer.up[peer]
        if peer in self.dialer.last_error:
            out["link_error"] = self.dialer.last_error[peer]
        return out

    def status(self) -> dict[str, Any]:
        return {"reach": {**self.reach.summary(), "links_dialed_for_peers": sum(self.dialer.up.values()),
                          "links_opened": self.dialer.opened,
                          "proxy": str(self._node._client.route.proxy) if self._node._client.route.proxy else None},
                "relayed": dict(self.relayer.counts)}
