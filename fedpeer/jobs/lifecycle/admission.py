"""Whether this site takes part in a job (docs/design.md, a job's walk): every member checks the proposal against its
policy and its data before it accepts; our own proposals pass the same kind, policy and data checks.

Rules:
- A member's key buys it bounded load here: a proposal rate (token bucket) and a number of
  pending proposals per proposer; beyond them, proposals are refused at the gate (no record, no
  task, no send). Only running jobs hold `jobs_concurrent_max` slots.
- We never send to a key that is not in peers.toml: a proposal naming one is refused, naming it.
- A proposal is checked against policy before any data is read: members known and not too many,
  the proposer allowed, the kind allowed, its parameters within this site's [policy.<kind>].
- The data check loads the site's data off the event loop; a job learns only its schema
  fingerprint and column names, and a site with fewer than [policy] rows_min rows declines
  without saying how many it has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fedpeer.errors import JobError, RemoteProtocolError
from fedpeer.identity import fingerprint
from fedpeer.jobs import capabilities
from fedpeer.jobs.kind import JobKind, dask_refusal, vertical_refusal
from fedpeer.jobs.privacy import bounds_refusal, job_cost
from fedpeer.jobs.records import JobRecord
from fedpeer.jobs.lifecycle.host import Host


# Insider load: a member's key must not fill our disk, memory or job slots.
PROPOSALS_BURST_MAX = 8         # proposals one member may send at once (token bucket size) ...
PROPOSAL_REFILL_MS = 2_000      # ... then one more per this interval: honest sites propose by hand
PENDING_PER_PROPOSER_MAX = 4    # proposed or accepted, not yet running, per proposing member
NOT_LISTED = "not in this site's peers.toml"   # a refusal's words the proposer maps to its own names


class Admission:
    """The checks a job passes on this site: a proposer's budget, policy, the kind and its
    parameters, the site's data. It reads the registry's current config and names."""

    def __init__(self, registry: Host) -> None:
        self._registry = registry
        self._buckets: dict[bytes, tuple[float, int]] = {}             # proposer -> (tokens, at_ms)

    def take_proposal_budget(self, src: bytes) -> None:
        """Bounded load per member: refused here, a proposal costs no record, no task, no send."""
        registry = self._registry
        who = registry.names.get(src, fingerprint(src))
        pending = registry.pending_of(src)
        if pending >= PENDING_PER_PROPOSER_MAX:
            raise RemoteProtocolError("job_limit", f"{who} already has {pending} pending proposals here "
                                                   "(PENDING_PER_PROPOSER_MAX)")
        now = registry.transport.now_ms()
        tokens, at_ms = self._buckets.get(src, (float(PROPOSALS_BURST_MAX), now))
        tokens = min(float(PROPOSALS_BURST_MAX), tokens + max(0, now - at_ms) / PROPOSAL_REFILL_MS)
        if tokens < 1.0:
            self._buckets[src] = (tokens, now)
            raise RemoteProtocolError("job_limit", f"{who} proposes faster than one job per "
                                                   f"{PROPOSAL_REFILL_MS} ms (PROPOSALS_BURST_MAX)")
        self._buckets[src] = (tokens - 1.0, now)

    def policy_refusal(self, record: JobRecord) -> str | None:
        """Why this site declines the proposal without looking at its data, or None."""
        registry = self._registry
        unknown = [k for k in record.members if k not in registry.names]
        if unknown:
            listed = ", ".join(fingerprint(k) for k in unknown[:4])
            return (f"member(s) {listed} {NOT_LISTED}; add them there (and on every member) "
                    "before proposing a job with them")
        problem = registry.records.disk_problem()
        if problem is not None:
            return f"{problem}: this site takes no new job until its state dir takes writes again"
        if len(record.members) > registry.config.policy.members_max:
            return f"{len(record.members)} members exceed this site's [policy] members_max"
        proposer = registry.names[record.proposer]    # a member: checked above
        if not registry.config.policy.may_propose(proposer):
            return f"proposer {proposer!r} is not in this site's [policy] proposers"
        try:
            kind = self.kind_allowed(record.kind)
            record.params = self.checked_params(kind, capabilities.filled(kind, record.params))
        except JobError as exc:
            return str(exc)
        return None

    def kind_allowed(self, kind_name: str) -> JobKind:
        registry = self._registry
        kind = registry.kinds.get(kind_name)
        if kind is None:
            raise JobError(f"unknown job kind {kind_name!r}; known: {', '.join(sorted(registry.kinds))}")
        if not registry.config.policy.allows(kind_name):
            raise JobError(f"job kind {kind_name!r} is not in this site's [policy] allowed_jobs")
        if registry.running() >= registry.config.jobs.jobs_concurrent_max:
            raise JobError(f"{registry.running()} jobs already running ([jobs] jobs_concurrent_max)")
        return kind

    def checked_params(self, kind: JobKind, params: Mapping[str, Any]) -> dict[str, Any]:
        """The kind's own parameter checks, then this site's [policy.<kind>] limits; JobError
        naming the parameter or the limit."""
        checked = kind.check_params(params)
        kind.check_policy(checked, self._registry.config.policy.limits.get(kind.name, {}))
        return checked

    async def check_data(self, record: JobRecord, kind: JobKind) -> tuple[bytes, tuple[str, ...]]:
        """Load this site's data for the job into `record`: its schema fingerprint and columns."""
        if not kind.needs_data:
            return b"", ()
        from fedpeer.data.site import load_site  # the loading `fedpeer data check` does too

        config = self._registry.config
        data = config.data
        if data is None:
            raise JobError("this site has no [data] section in peers.toml")
        vertical = data.partition == "vertical"
        if vertical and not kind.vertical:
            raise JobError(vertical_refusal(kind, self._registry.kinds))
        if kind.needs_label and not data.label and not vertical:
            raise JobError(f"[data] label is not set in peers.toml; a {kind.name} job needs the label column")
        if data.engine == "dask":
            refusal = dask_refusal(kind, record.params, self._registry.kinds)
            if refusal is not None:      # before any cluster is asked: nothing loaded, nothing to release
                raise JobError(refusal)
        # Off the event loop: parsing (and missing = "impute") takes seconds on a large file.
        load = asyncio.ensure_future(asyncio.to_thread(load_site, data, config.jobs,
                                                       needs_label=kind.needs_label, binary=kind.binary_label,
                                                       rows_min=config.policy.rows_min,
                                                       ids_max=config.policy.ids_max))
        try:
            dataset, test = await asyncio.shield(load)
        except asyncio.CancelledError:   # the thread still ends: a Dask site it opens is released then
            load.add_done_callback(lambda f: f.cancelled() or f.exception() or release_data(f.result()[0]))
            raise
        rows_min = self._registry.config.policy.rows_min   # the config now: it may have been reloaded
        if dataset.rows < rows_min:   # without the count, and without rows_min: above the count, it bounds it
            release_data(dataset)
            raise JobError("local data has fewer rows than this site's policy allows")
        refusal = bounds_refusal(record.params, data.bounds, dataset.features)
        if refusal is not None:          # a DP job's public bounds must be this site's own
            release_data(dataset)
            raise JobError(refusal)     # decline() names this site, as for every refusal
        refusal = self.privacy_refusal(record, dataset.fingerprint.hex())
        if refusal is not None:          # before any sum: the rows were read, never used
            release_data(dataset)
            raise JobError(refusal)
        record.data, record.test_data, record.rows = dataset, test, int(dataset.rows)
        record.data_fingerprint = dataset.fingerprint.hex()
        return dataset.fingerprint, dataset.features

    def privacy_refusal(self, record: JobRecord, dataset: str) -> str | None:
        """A DP job beyond what [privacy] has left for this dataset: the line it is refused with."""
        epsilon, delta = job_cost(record.params)
        if epsilon <= 0:
            return None
        config, ledger = self._registry.config, self._registry.privacy
        ledger.set_budget(config.privacy.epsilon_budget, config.privacy.delta_budget)
        return ledger.refusal(config.node.name, dataset, epsilon, delta, record.id)


def release_data(data: Any) -> None:
    """A job's site data is done with: a Dask site's partitions and client are released (in a
    background thread, fedpeer/data/dask.py); a Dataset is left to the garbage collector."""
    if getattr(data, "engine", "memory") == "dask":
        data.close()


