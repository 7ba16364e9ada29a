"""Timings for many sites sharing one machine's cores (`fedpeer harness`, benchmarks/bench_hundred.py).

A site's background work — a membership probe and its ack every probe period, the leader's
heartbeat to every follower and their replies — is a constant rate per site: on its own machine it
costs a fraction of a percent of a core. n sites on c cores add that up n times, and above some
SITES_PER_CORE_AT_DEFAULTS per core the machine no longer keeps up: probes are answered late, late
answers start suspicions, suspicions start refutations and gossip, leaders miss their quorum and
followers start elections, and each of those is more work for the same cores (measured: 40 sites
on 2 cores converged in 18 s with ~17 suspicions; 70 on 2 cores suspected peers ~3,600 times and
took 181 s; 100 never converged in 12 minutes).

So the harness gives co-located sites the periods a machine can carry: the [membership] and
[election] timings of peers.toml (fedpeer/config/load.py), and [jobs] hop_timeout_ms (a job's wait
for one delivery; at 100 sites with it at 20 s one member was given up as lost in the middle of a
histogram job, though no member held it dead), multiplied by
n / (c x SITES_PER_CORE_AT_DEFAULTS) when that is above 1, which keeps the machine's background
frames per second at what SITES_PER_CORE_AT_DEFAULTS sites a core send with the defaults. Each
daemon is still a real, separately configured daemon: this only writes its peers.toml. Failure
detection and failover are slower by the same factor (a site on its own machine keeps the defaults).
"""

from __future__ import annotations

import math
import os
from typing import Any

from fedpeer.config.load import SITE_ELECTION, JobLimits, MembershipTiming

SITES_PER_CORE_AT_DEFAULTS = 20    # sites a core carries with the default timings (40 on 2 cores: converged in 18 s)

# [membership] keys that are periods or waits (scaled); the others are counts
_MEMBERSHIP_MS = ("tick_ms", "probe_interval_ms", "probe_timeout_ms", "suspect_timeout_ms", "dead_probe_interval_ms")
_ELECTION_MS = ("heartbeat_interval_ms", "election_timeout_min_ms", "election_timeout_max_ms")
_JOBS_MS = ("hop_timeout_ms",)    # a job's wait for one delivery: a full machine answers late, not never


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def slowdown(sites: int, n_cores: int) -> float:
    """The factor on every period for `sites` daemons on `n_cores` cores: 1 up to
    SITES_PER_CORE_AT_DEFAULTS a core, then in proportion to the sites per core."""
    return max(1.0, sites / (max(1, n_cores) * SITES_PER_CORE_AT_DEFAULTS))


def colocated_settings(sites: int, n_cores: int) -> dict[str, dict[str, Any]]:
    """peers.toml [membership] and [election] for `sites` daemons sharing `n_cores` cores; {} when
    the defaults fit."""
    factor = slowdown(sites, n_cores)
    if factor == 1.0:
        return {}
    membership, election, jobs = MembershipTiming(), SITE_ELECTION, JobLimits()
    return {"membership": {key: math.ceil(getattr(membership, key) * factor) for key in _MEMBERSHIP_MS},
            "election": {key: math.ceil(getattr(election, key) * factor) for key in _ELECTION_MS},
            "jobs": {key: math.ceil(getattr(jobs, key) * factor) for key in _JOBS_MS}}
