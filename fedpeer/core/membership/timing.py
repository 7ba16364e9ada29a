"""Membership's timings (fedpeer/core/membership/swim.py): its configuration (MembershipConfig, every
timeout and limit with its unit in the name; the node builds it from peers.toml's [membership]),
and how long it waits for a member's answer.

Slow is not dead (Lifeguard §4.1, and RTT-aware timeouts): every wait for X's answer — the
direct ack before ping-reqs, the probe's whole window, a tracked ping's life, the time between
verifications — is the configured one or RTT_TIMEOUT_MULT times X's smoothed round-trip time,
whichever is longer, and X's suspicion lasts suspect_timeout_ms plus SUSPECT_RTT_MULT RTTs. An
answer that comes after its probe was judged still proves X up and is an RTT sample, so a
site behind a slow link teaches us its RTT with its first late answers. Our own health scales
every wait too: a local health multiplier (0..LHM_MAX) rises when our probes fail or we must
refute a suspicion of ourselves and falls when a probe succeeds; waits are multiplied by
1 + multiplier, so a node that is itself slow (overloaded, behind a slow link) blames others
later. Every wait is capped at PROBE_WAIT_MS_MAX.

Suspicion grows with the federation (Lifeguard §5; memberlist's suspicion timeout,
mult x max(1, log10 n) x probe interval): a suspicion must reach, through gossip, the one member
that can refute it, and in a larger federation that takes more protocol periods (SWIM §4.1:
O(log n) of them). suspect_timeout_ms is the timeout up to SUSPECT_SCALE_FROM_MEMBERS members;
with n members it is multiplied by log10(n) / log10(SUSPECT_SCALE_FROM_MEMBERS): 4 s at 10,
6.4 s at 40, 8 s at 100.

However many members we hold suspect or dead, we verify at most VERIFY_PER_PERIOD_MAX of them a
probe period (the longest due first; each costs a ping and a relayed ping): a node starved of CPU
suspects many members at once, and verifying each of them every period multiplied the messages
every other node had to answer, made them late in turn, and spiralled (70 sites on 2 cores:
4,048 suspicions and 204 s to converge).

Members never heard from (a federation starting: most members are not up yet) are pinged with a
backoff: every probe period at first, then as long again as we have been waiting, up to
dead_probe_interval_ms (verify_interval_ms below). Their own join ping reaches us when they
start, so pinging n - 1 silent members every period would only add a storm of pings, relays and
handshakes to a machine already busy starting up.

References: Dadgar, Phillips, Currey, "Lifeguard: Local Health Awareness for More Accurate
Failure Detection" (2018). The functions below are pure; membership.py keeps each member's
smoothed RTT and the local health multiplier."""

from __future__ import annotations

import math
from dataclasses import dataclass

_RTT_EWMA_ALPHA = 0.2
RTT_TIMEOUT_MULT = 3          # a ping to X may take this many of X's smoothed RTTs before it counts as lost
SUSPECT_RTT_MULT = 4          # X's suspicion lasts suspect_timeout_ms plus this many of its RTTs
LHM_MAX = 2                   # local health multiplier: waits x (1 + LHM); small, so an isolated node
                              # still detects in time
PROBE_WAIT_MS_MAX = 10_000    # no single wait for an answer exceeds this, however slow the link
SUSPECT_SCALE_FROM_MEMBERS = 10   # members (me included) above which the suspicion timeout grows with log n
VERIFY_PER_PERIOD_MAX = 4     # suspect or dead members we verify (a ping, a relayed ping) per probe period


@dataclass(frozen=True)
class MembershipConfig:
    probe_interval_ms: int = 500        # one probe per protocol period
    probe_timeout_ms: int = 300         # direct ack wait before indirect probes
    indirect_probes: int = 3            # k members asked to ping-req
    suspect_timeout_ms: int = 4000      # suspect -> dead
    dead_probe_interval_ms: int = 2000  # how often to ping a dead member at its last address
    piggyback_max: int = 8              # updates carried per message
    retransmit_mult: int = 3            # lambda: each update sent lambda*ceil(log2(n+1)) times
    pending_probes_per_member_max: int = 4  # relayed/join/verify/dead pings awaiting an ack, per member
    suspect_reporters_min: int = 2      # distinct members whose reports start our suspicion
    refute_interval_ms: int = 500       # at most one refutation of a suspicion of me per interval

    def __post_init__(self) -> None:
        if not 0 < self.probe_timeout_ms < self.probe_interval_ms:
            raise ValueError("need 0 < probe_timeout_ms < probe_interval_ms")
        for name in ("suspect_timeout_ms", "dead_probe_interval_ms", "piggyback_max",
                     "retransmit_mult", "pending_probes_per_member_max", "suspect_reporters_min",
                     "refute_interval_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.indirect_probes < 0:
            raise ValueError("indirect_probes must be >= 0")

    def retransmit_limit(self, n_members: int) -> int:
        """SWIM §4.1: lambda*ceil(log2(n+1)) sends reach everyone w.h.p."""
        return self.retransmit_mult * max(1, math.ceil(math.log2(n_members + 1)))


def wait_ms(base_ms: int, rtt_ms: float | None, lhm: int) -> int:
    """How long an answer may take: `base_ms` or RTT_TIMEOUT_MULT of the smoothed RTT `rtt_ms`
    (None: no sample yet), whichever is longer, times 1 + our local health multiplier `lhm`, at
    most PROBE_WAIT_MS_MAX."""
    factor = 1 + lhm
    return min(PROBE_WAIT_MS_MAX, int(max(base_ms, RTT_TIMEOUT_MULT * (rtt_ms or 0.0)) * factor))


def suspicion_scale(n_members: int) -> float:
    """The factor on suspect_timeout_ms for a federation of `n_members` (me included): 1 up to
    SUSPECT_SCALE_FROM_MEMBERS, then log10(n) / log10(SUSPECT_SCALE_FROM_MEMBERS)."""
    return max(1.0, math.log10(max(1, n_members)) / math.log10(SUSPECT_SCALE_FROM_MEMBERS))


def suspect_timeout_ms(base_ms: int, rtt_ms: float | None, n_members: int = 1) -> int:
    """How long a suspicion lasts in a federation of `n_members` (me included): `base_ms`
    (suspect_timeout_ms) times suspicion_scale(n_members), plus SUSPECT_RTT_MULT RTTs."""
    return (int(base_ms * suspicion_scale(n_members))
            + min(PROBE_WAIT_MS_MAX, int(SUSPECT_RTT_MULT * (rtt_ms or 0.0))))


def verify_interval_ms(interval_ms: int, waited_ms: int, cap_ms: int) -> int:
    """When to ping a member we have never heard from again, after waiting `waited_ms` for it:
    `interval_ms` (a probe period) at first, then as long as we have waited, at most `cap_ms`
    (dead_probe_interval_ms): pings at 0, 1, 2, 4, 8, ... periods until the cap."""
    return min(max(interval_ms, cap_ms), max(interval_ms, waited_ms))


def smoothed_rtt_ms(rtt_ms: float | None, sample_ms: int) -> float:
    """The smoothed RTT after one more sample (an exponentially weighted moving average)."""
    return float(sample_ms) if rtt_ms is None else (
        (1 - _RTT_EWMA_ALPHA) * rtt_ms + _RTT_EWMA_ALPHA * sample_ms)


class VerifyBudget:
    """VERIFY_PER_PERIOD_MAX verifications a probe period, refilled continuously (a token bucket
    in the node's own clock): `take` says whether one more may be sent now."""

    def __init__(self, now_ms: int) -> None:
        self._tokens, self._at_ms = float(VERIFY_PER_PERIOD_MAX), now_ms

    def refill(self, now_ms: int, period_ms: int) -> None:
        self._tokens = min(float(VERIFY_PER_PERIOD_MAX),
                           self._tokens + VERIFY_PER_PERIOD_MAX * (now_ms - self._at_ms) / period_ms)
        self._at_ms = now_ms

    def take(self) -> bool:
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True
