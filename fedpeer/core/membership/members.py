"""What one member holds of each other member (`_Member`, and the `MemberView` it shows), and the
bounds of an incarnation: the records of the state machine in swim.py, whose docstring has the rules."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedpeer.core.membership.wire import MemberState, NodeId

# The highest incarnation anyone may use (inclusive); fedpeer/base/store.py keeps persisted values
# below 2**62, and int64 on the wire leaves room for peers that still send more (ignored).
INCARNATION_MAX = 2**62 - 1
# How far above X's known incarnation a report about X may be and still count: an honest reporter
# may have heard X's latest refutations before us (X refutes at most once per refute_interval_ms),
# never 2**63 - 1 ahead.
INCARNATION_STEP_MAX = 32


def start_incarnation(persisted: int | None) -> int:
    """This boot's incarnation given the last one persisted (None: first boot, or unreadable).

    One above the last, so peers see a new life; a value out of range (>= INCARNATION_MAX, left
    by the bug that let a peer's gossip raise it) restarts at 1, which every peer holding this
    node SUSPECT/DEAD accepts as its own word."""
    if persisted is None or not 0 <= persisted < INCARNATION_MAX:
        return 1
    return persisted + 1


@dataclass(frozen=True)
class MemberView:
    node: NodeId
    state: MemberState
    incarnation: int
    address: str
    last_seen_ms: int | None
    rtt_ms: float | None
    duplicate_count: int = 0              # returns of X's own word to a second address (see rules)
    duplicate_address: str | None = None  # the last such other address
    duplicate_ms: int | None = None       # when it was last heard


@dataclass(slots=True)
class _Member:
    state: MemberState
    incarnation: int                # X's own word (or 0 before we heard it)
    address: str                    # X's own word, or peers.toml
    state_since_ms: int             # suspect timer base while SUSPECT
    heard: bool = False             # False: config placeholder, no information yet
    last_seen_ms: int | None = None
    rtt_ms: float | None = None
    next_ping_ms: int = 0           # next verify (SUSPECT) or dead (DEAD) ping
    reports: dict[NodeId, int] = field(default_factory=dict)  # reporter -> when, at `incarnation`
    duplicate_count: int = 0                # returns of X's own word to a second address (module rules)
    duplicate_address: str | None = None    # that second address, once heard
    duplicate_ms: int | None = None
    last_word_address: str = ""             # the address X's latest own word named
    late_probe: tuple[int, int] | None = None   # (probe id, sent ms) of our last unanswered probe of X
