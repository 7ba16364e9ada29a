"""The membership protocol's messages (fedpeer/core/membership/swim.py): SWIM's ping, ack, ping-req and
its answer (Das et al., DSN 2002, §3.1), each carrying piggybacked gossip (§4.1), and the `Send`
effect that hands one of them to the shell.

Plain frozen dataclasses; fedpeer/wire/schema.py gives them their wire schemas and checks their
fields. The sender of every message is the transport's authenticated src; what a message says
about anyone but its sender is only a report (membership.py's rules)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

NodeId = bytes  # a member's 32-byte Ed25519 public key; the canonical id on the wire


class MemberState(enum.StrEnum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


@dataclass(frozen=True)
class Update:  # gossip about one member; about anyone but its sender, only a report (membership.py)
    node: NodeId
    state: MemberState
    incarnation: int
    address: str  # "host:port"; kept for the wire's shape, never adopted from a third party


@dataclass(frozen=True)
class Ping:
    probe_id: int
    incarnation: int
    address: str
    updates: tuple[Update, ...]


@dataclass(frozen=True)
class Ack:
    probe_id: int
    incarnation: int
    address: str
    updates: tuple[Update, ...]


@dataclass(frozen=True)
class PingReq:  # "please probe target for me"
    probe_id: int
    target: NodeId
    updates: tuple[Update, ...]


@dataclass(frozen=True)
class IndirectAck:  # intermediary -> requester: target answered
    probe_id: int
    target: NodeId
    updates: tuple[Update, ...]


Message = Ping | Ack | PingReq | IndirectAck
# incarnation/address in Ping/Ack are the SENDER's own (authenticated by the transport's signature).


@dataclass(frozen=True)
class Send:  # effect: the shell sends msg to dst at address
    dst: NodeId
    address: str
    msg: Message
