"""The election's messages (fedpeer/core/election/raft.py): Raft's RequestVote and heartbeat (Ongaro and
Ousterhout 2014, §5.2) and the PreVote of Ongaro's thesis §9.6, with their well-formedness checks,
and the `Send` effect that hands one of them to the shell.

Plain int/bool fields; the sender of every message is the authenticated transport src.
fedpeer/wire/schema.py gives them their wire schemas; `_well_formed` guards, on receipt, the
invariants the election's arithmetic relies on (terms in 0..TERM_MAX, booleans that are bools,
bounded signatures and certificates)."""

from __future__ import annotations

from dataclasses import dataclass, fields

NodeId = bytes  # a member's 32-byte Ed25519 public key; the canonical id on the wire

MEMBERS_MAX = 100  # cross-silo federations: 2..100 sites (1 is allowed for a lone site and tests)
TERM_MAX = 2**63 - 1  # terms travel as msgpack int64; a larger one is a malformed message
SIGNATURE_BYTES_MAX = 64  # an Ed25519 signature; a vote signature longer than this is malformed


@dataclass(frozen=True)
class PreVote:  # "would you vote for me at `term`?" (term = sender's term + 1; nobody adopts it)
    term: int
    commit_term: int
    commit_index: int


@dataclass(frozen=True)
class PreVoteReply:  # granted: term echoes the PreVote's term; refused: the replier's own term
    term: int
    granted: bool


@dataclass(frozen=True)
class RequestVote:
    term: int
    commit_term: int
    commit_index: int


@dataclass(frozen=True)
class RequestVoteReply:
    term: int
    granted: bool
    sig: bytes = b""  # granted: the voter's signature over vote_statement(term, candidate)


@dataclass(frozen=True)
class VoteSig:  # one entry of a leader certificate
    voter: NodeId
    sig: bytes


@dataclass(frozen=True)
class Heartbeat:  # leader -> follower; carries the leader's last committed round
    term: int
    commit_term: int
    commit_index: int
    # The votes that elected the sender (itself excluded), until the follower says it follows.
    certificate: tuple[VoteSig, ...] = ()


@dataclass(frozen=True)
class HeartbeatReply:  # also the answer to a stale heartbeat, carrying the higher term
    term: int
    follows: bool = False  # the replier takes the sender as leader of `term` (certificate seen)


Message = PreVote | PreVoteReply | RequestVote | RequestVoteReply | Heartbeat | HeartbeatReply
MESSAGE_TYPES: tuple[type, ...] = (PreVote, PreVoteReply, RequestVote, RequestVoteReply,
                                   Heartbeat, HeartbeatReply)


@dataclass(frozen=True)
class Send:  # effect: the shell sends msg to dst (it knows dst's address from membership)
    dst: NodeId
    msg: Message


def _well_formed_certificate(value: object) -> bool:
    return (isinstance(value, tuple) and len(value) <= MEMBERS_MAX
            and all(isinstance(v, VoteSig) and isinstance(v.voter, bytes) and isinstance(v.sig, bytes)
                    for v in value))


def _well_formed(msg: Message) -> bool:
    # The wire codec validates types; this guards the invariants our arithmetic relies on.
    for f in fields(msg):
        value = getattr(msg, f.name)
        if f.name in ("granted", "follows"):
            if not isinstance(value, bool):
                return False
        elif f.name == "sig":
            if not (isinstance(value, bytes) and len(value) <= SIGNATURE_BYTES_MAX):
                return False
        elif f.name == "certificate":
            if not _well_formed_certificate(value):
                return False
        elif not (isinstance(value, int) and not isinstance(value, bool)
                  and 0 <= value <= TERM_MAX):
            return False
    return True
