"""What each site runs: the SiteInfo message, this site's book of its peers' versions, the
protocol a pair speaks, and the line that refuses a job a member cannot run.

A build says what it runs in a message of its own kind, `site_info` (the previous release's hello
is fixed bytes and its bodies exact-key maps, so nothing can be added to them):

    SiteInfo {proto_min, proto_max, software, commit, caps, reply}

`proto_min..proto_max`: the envelope versions the sender accepts (fedpeer/wire/frame.py); a pair
speaks the highest version both accept (`negotiate`). `software`: its version ("0.2.0"); `commit`:
12 hex digits or "unknown"; `caps`: its capabilities (fedpeer/jobs/capabilities.py), sorted;
`reply`: the sender asks for the receiver's SiteInfo in return (a reply never asks again, so an
exchange ends). Every field is bounded and checked (CAPS_MAX names of at most
capabilities.CAPABILITY_BYTES_MAX bytes, SOFTWARE_BYTES_MAX, COMMIT_BYTES_MAX); a SiteInfo that
fails is refused by the gate like any malformed message and changes nothing here.

A release that does not know `site_info` refuses it: 0.1.0 answers 400 `unknown_kind`
(fedpeer/wire/frame.py's gate, before any handler), authenticated by the pair's refusal tag. Such a
peer, like one that has not said anything yet, is taken as that release (`baseline`:
fedpeer/kinds/releases.py). Everything here is pure bookkeeping: the daemon sends and receives
(fedpeer/daemon/versions.py); time is given, never read.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fedpeer.jobs.capabilities import CAPABILITY_BYTES_MAX, CAPABILITY_RE
from fedpeer.wire import frame as wire
from fedpeer.wire.frame import v_bool, v_int, v_list, v_str

CAPS_MAX = 512                  # capability names one SiteInfo may carry
SOFTWARE_BYTES_MAX = 32
COMMIT_BYTES_MAX = 40
PROTOCOL_FIELD_MAX = 65_535
SOFTWARE_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+-]{0,31}")
COMMIT_RE = re.compile(r"[0-9a-f]{7,40}|unknown")
KIND = "site_info"
UNKNOWN_KIND_REFUSAL = "unknown_kind"    # how a build without SiteInfo refuses it (its gate's reason)
TOLD, REFUSED, ASSUMED = "told", "refused", "assumed"   # how this site knows a peer's PeerInfo


@dataclass(frozen=True)
class SiteInfo:
    proto_min: int
    proto_max: int
    software: str
    commit: str
    caps: list
    reply: bool


def _checked(body: dict) -> SiteInfo:
    """The body past its field validators: the values' own rules (ValueError: refused as schema)."""
    if body["proto_min"] > body["proto_max"]:
        raise ValueError("proto_min above proto_max")
    if not SOFTWARE_RE.fullmatch(body["software"]) or not COMMIT_RE.fullmatch(body["commit"]):
        raise ValueError("software or commit not in their forms")
    caps = body["caps"]
    if any(not CAPABILITY_RE.fullmatch(c) for c in caps) or len(set(caps)) != len(caps):
        raise ValueError("capability names malformed or repeated")
    return SiteInfo(**body)


wire.register(KIND, SiteInfo, {
    "proto_min": v_int(0, PROTOCOL_FIELD_MAX), "proto_max": v_int(0, PROTOCOL_FIELD_MAX),
    "software": v_str(SOFTWARE_BYTES_MAX), "commit": v_str(COMMIT_BYTES_MAX),
    "caps": v_list(v_str(CAPABILITY_BYTES_MAX), CAPS_MAX), "reply": v_bool}, from_body=_checked)


@dataclass(frozen=True)
class PeerInfo:
    """What a site runs, as this site knows it, and how it knows (`how`: TOLD, REFUSED, ASSUMED)."""

    software: str
    commit: str
    protocol: tuple[int, int]
    caps: frozenset[str]
    how: str = TOLD

    @classmethod
    def of(cls, msg: SiteInfo) -> PeerInfo:
        return cls(msg.software, msg.commit, (msg.proto_min, msg.proto_max), frozenset(msg.caps))

    def message(self, reply: bool) -> SiteInfo:
        return SiteInfo(self.protocol[0], self.protocol[1], self.software, self.commit, sorted(self.caps), reply)

    def release(self) -> str:
        """ "fedpeer 0.1.0 (protocol 2–2)" """
        return f"fedpeer {self.software} (protocol {self.protocol[0]}–{self.protocol[1]})"


def negotiate(mine: tuple[int, int], theirs: tuple[int, int]) -> int | None:
    """The envelope version a pair speaks: the highest both accept (None: no common version)."""
    top = min(mine[1], theirs[1])
    return top if top >= max(mine[0], theirs[0]) else None


def refusal_line(site: str, info: PeerInfo, missing: str, me: str, mine: PeerInfo) -> str:
    """The one line that refuses a job at once: the site, both versions, the capability."""
    said = "" if info.how != ASSUMED else " (taken as such: it has not said what it runs)"
    return (f"{site} runs {info.release()}{said} without '{missing}' ({me} runs {mine.release()}); "
            f"upgrade {site} or leave it out")


class PeerVersions:
    """This site's book: what each peer runs (as told, or taken as `baseline`), and waits for a
    peer to say. Keys are allow-listed peers only (the gate admits no others), so it is bounded
    by peers.toml."""

    def __init__(self, own: PeerInfo, baseline: PeerInfo) -> None:
        self.own = own
        self.baseline = baseline
        self._known: dict[bytes, tuple[PeerInfo, int]] = {}      # peer -> (info, incarnation learnt at)
        self._waiting: dict[bytes, list[asyncio.Future]] = {}
        self.ask: Callable[[bytes], None] | None = None   # the daemon's: send ours, asking for theirs

    def told(self, peer: bytes, msg: SiteInfo, incarnation: int) -> bool:
        """The peer's SiteInfo arrived: whether it says something new."""
        return self._learn(peer, PeerInfo.of(msg), incarnation)

    def refused(self, peer: bytes, incarnation: int) -> bool:
        """The peer proved it refused our SiteInfo as an unknown kind: it runs the baseline."""
        return self._learn(peer, _as(self.baseline, REFUSED), incarnation)

    def _learn(self, peer: bytes, info: PeerInfo, incarnation: int) -> bool:
        old = self._known.get(peer)
        self._known[peer] = (info, incarnation)
        for future in self._waiting.pop(peer, []):
            if not future.done():
                future.set_result(None)
        return old is None or old[0] != info

    def forget(self, peer: bytes) -> None:
        self._known.pop(peer, None)

    def known(self, peer: bytes) -> PeerInfo | None:
        entry = self._known.get(peer)
        return None if entry is None else entry[0]

    def learnt_at(self, peer: bytes) -> int | None:
        """The peer's incarnation when we learnt what it runs (a later one: it may have restarted)."""
        entry = self._known.get(peer)
        return None if entry is None else entry[1]

    def info(self, peer: bytes) -> PeerInfo:
        """What the peer runs: as known, else the baseline (ASSUMED)."""
        return self.known(peer) or _as(self.baseline, ASSUMED)

    def unknown(self, peers: Iterable[bytes]) -> list[bytes]:
        return [p for p in peers if p not in self._known]

    async def wait_known(self, peers: Iterable[bytes], timeout_ms: int) -> None:
        """Until every one of `peers` has said what it runs, or `timeout_ms` passed."""
        loop = asyncio.get_running_loop()
        futures = []
        for peer in self.unknown(peers):
            if self.ask is not None:
                self.ask(peer)
            future = loop.create_future()
            self._waiting.setdefault(peer, []).append(future)
            futures.append(future)
        if futures:
            await asyncio.wait(futures, timeout=timeout_ms / 1000)
        for peer in list(self._waiting):   # the futures of this wait, answered or not, go
            left = [f for f in self._waiting[peer] if f not in futures]
            if left:
                self._waiting[peer] = left
            else:
                del self._waiting[peer]

    def status_of(self, peer: bytes) -> dict[str, Any]:
        """The peer's entry in `status`: its version, protocols, what we both speak, what it lacks."""
        info = self.info(peer)
        return {"software": info.software, "commit": info.commit, "protocol": list(info.protocol),
                "speaks": negotiate(self.own.protocol, info.protocol), "known": info.how,
                "capabilities": len(info.caps), "missing": sorted(self.own.caps - info.caps)}


def _as(info: PeerInfo, how: str) -> PeerInfo:
    return PeerInfo(info.software, info.commit, info.protocol, info.caps, how)
