"""A member restarted mid-job (docs/design.md, a job's walk): its record keeps where the job
stopped, and the site asks the other members to take it back (fedpeer/protocols/epochs.py,
"Rejoins").

Rules:
- A running job whose daemon stops (TERM) or dies (-9) is "interrupted" at the restart, its one
  line saying at which phase and step (records.py: the progress is on disk to within a second).
- At start-up, an interrupted job that cannot come back fails at once, saying why in the same
  line: its kind takes no member back, its parameters do not (kind.rejoin_refused), or this site
  asked to rejoin it before (REJOINS_MAX).
- The others are asked when the first of them is heard alive: this site's data is loaded and
  must be the data the job started on (schema and rows), its record runs again ("rejoining"), and
  the kind's `rejoin` asks them; the job's messages are taken only from then on (before, they
  are refused as a job this site does not run, so the others lose it as before). The record
  counts the request (on disk before the first ask): a site that restarts again does not ask
  again. A rejoin that fails fails this site's record only, with its reason; the others are not
  told (the job goes on without it).
- An interrupted job none of whose members is ever heard stays interrupted: nothing waits for it.
"""

from __future__ import annotations

import logging

from fedpeer.base.logs import fields
from fedpeer.errors import DataError, JobError, public_reason
from fedpeer.jobs.lifecycle.host import Host
from fedpeer.jobs.lifecycle.runner import REJOINING_PHASE, SiteFailure
from fedpeer.jobs.records import JobRecord
from fedpeer.protocols.epochs import REJOINS_MAX

log = logging.getLogger("fedpeer.jobs")
__all__ = ["REJOINING_PHASE", "RejoinSide"]


class RejoinSide:
    """This site's interrupted jobs, and its requests to come back into them."""

    def __init__(self, registry: Host) -> None:
        self._registry = registry

    def interrupted(self) -> list[JobRecord]:
        return [r for r in self._registry.jobs.values() if r.state == "interrupted"]

    def refusal(self, record: JobRecord) -> str | None:
        """Why this site will not ask to come back into `record`'s job, or None."""
        kind = self._registry.kinds.get(record.kind)
        if kind is None:
            return f"this build has no job kind {record.kind!r}"
        if kind.rejoin is None:
            return f"a {kind.name} job does not take a restarted member back"
        refused = kind.rejoin_refused(record.params) if kind.rejoin_refused is not None else None
        if refused is not None:
            return refused
        if record.rejoins >= REJOINS_MAX:
            return f"this site asked to rejoin the job {record.rejoins} time(s) already"
        if kind.needs_data and record.data_fingerprint is None:
            return "the record does not say which data the job ran on"
        return None

    def settle_loaded(self) -> None:
        """At start-up: every interrupted job that will not come back fails now, saying why."""
        for record in self.interrupted():
            why = self.refusal(record)
            if why is not None:
                self._registry.finish(record, "failed", f"{self._registry.config.node.name}: {self._line(record)}; "
                                                        f"it does not rejoin: {why}")

    def on_peer_alive(self, peer: bytes) -> None:
        """A member is heard alive: ask to come back into every interrupted job it is a member of."""
        registry = self._registry
        for record in self.interrupted():
            if peer not in record.members or record.task is not None:
                continue
            try:
                record.task = registry.spawn(registry.runner.guard(record, self._attempt(record)))
            except JobError:    # the daemon is stopping
                return

    async def _attempt(self, record: JobRecord) -> None:
        registry = self._registry
        me = registry.transport.me
        line = self._line(record)
        why = self.refusal(record)       # (settled at start-up; a reload may have changed the kinds)
        if why is not None:
            raise SiteFailure(me, f"{line}; it does not rejoin: {why}")
        kind = registry.kinds[record.kind]
        fingerprint, rows = record.data_fingerprint, record.rows
        try:
            await registry.admission.check_data(record, kind)
        except (JobError, DataError) as exc:
            raise SiteFailure(me, f"{line}; it does not rejoin: {exc}", shared=public_reason(exc)) from None
        if record.data_fingerprint != fingerprint or record.rows != rows:
            raise SiteFailure(me, f"{line}; it does not rejoin: this site's data changed since the job started")
        record.rejoins += 1
        registry.records.save(record)
        if not await registry.records.on_disk(record):     # counted before asking: a second restart asks no more
            raise SiteFailure(me, f"{line}; it does not rejoin: {registry.records.write_problem()}")
        log.info("job_rejoining", extra=fields(job=record.id, kind=record.kind, stopped=line))
        try:
            await registry.runner.execute(record, kind, rejoin=True)
        except SiteFailure as exc:
            if exc.site != me:
                raise
            raise SiteFailure(me, f"{line}; rejoining: {exc.reason}", everywhere=exc.everywhere,
                              shared=exc.shared) from None

    @staticmethod
    def _line(record: JobRecord) -> str:
        return record.error or "the daemon restarted mid-job"
