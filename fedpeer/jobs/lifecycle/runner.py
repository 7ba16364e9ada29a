"""Running a job on this site, and ending it (docs/design.md, a job's walk): each member runs the kind's coroutine
over its Channel, within [jobs] limits, and persists its own record and result.

Rules:
- A job runs only if it gets a `jobs_concurrent_max` slot and its record is on disk; it must
  finish within job_timeout_ms. Its model is stored before its record says done.
- A failure names the site it is about: this one, or the member that sent a malformed message
  or was declared dead. A secure sum's total that fails its check (ImplausibleTotal), and any
  other failure of the whole job (JobFailsEverywhere without `here`), names no site: every member
  meets the same condition, and whichever noticed first is not to blame.
- A member whose job fails tells the other members (JobAbort), so nobody waits for it in vain;
  the first reason a member hears is the one it keeps. A member that refuses a proposal after
  looking at its data tells only the proposer (one JobReject).
- Supervision: every job task runs under `guard`, and nothing in it — its error handling
  included — propagates to the node's task group: a failure ends that job only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Any

from fedpeer.base.logs import fields
from fedpeer.errors import DataError, JobError, public_reason
from fedpeer.identity import fingerprint
from fedpeer.jobs import messages as m
from fedpeer.jobs.privacy import job_cost
from fedpeer.jobs.kind import ImplausibleTotal, JobContext, JobFailsEverywhere, JobKind
from fedpeer.jobs.lifecycle.admission import release_data
from fedpeer.jobs.lifecycle.nodechannel import DEAD_DETAIL, NodeChannel
from fedpeer.jobs.records import TERMINAL, JobRecord, advance
from fedpeer.runtime.channel import MalformedFrom, PeerDead, PeerUnreachable, RecvTimeout
from fedpeer.jobs.lifecycle.host import Host


log = logging.getLogger("fedpeer.jobs")
ABORT_SEND_TIMEOUT_MS = 5_000
ABORT_GRACE_MS = 1_000          # a local failure waits this long for a peer's abort with the cause
NO_SITE = b""                   # a failure about no site (JobAbort.site empty): ImplausibleTotal
REJOINING_PHASE = "rejoining: asking the other members to take this site back"   # (rejoin.py)


class Refused(Exception):
    """This site declines a peer's proposal (its data does not fit): only the proposer is told,
    `shared` (no private detail: errors.public_reason); this site's record keeps `reason`."""

    def __init__(self, reason: str, shared: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.shared = reason, shared if shared is not None else reason


class SiteFailure(Exception):
    """A job ended because of `site` (this one or a member; NO_SITE: none is to blame), for
    `reason`; the other members are told `shared` (no private detail of this site's data:
    errors.public_reason)."""

    def __init__(self, site: bytes, reason: str, everywhere: bool = False, shared: str | None = None) -> None:
        super().__init__(reason)
        self.site, self.reason, self.everywhere = site, reason, everywhere
        self.shared = shared if shared is not None else reason

    @classmethod
    def here(cls, me: bytes, exc: BaseException, everywhere: bool = False) -> SiteFailure:
        """This site failed with `exc`: its full words here, their public text for the others."""
        return cls(me, str(exc), everywhere=everywhere, shared=public_reason(exc))


class JobRunner:
    """Runs this site's part of a started job, supervises every job task, and tells the other
    members how a job ended."""

    def __init__(self, registry: Host) -> None:
        self._registry = registry

    async def execute(self, record: JobRecord, kind: JobKind, rejoin: bool = False) -> None:
        """Run the kind (`rejoin`: a member restarted mid-job asks to come back, rejoin.py)."""
        registry = self._registry
        me = registry.transport.me
        limit = registry.config.jobs.jobs_concurrent_max
        if registry.running() >= limit:   # pending proposals hold no slot: the check that counts is here
            raise SiteFailure(me, f"{registry.running()} jobs already running ([jobs] jobs_concurrent_max)")
        advance(record, "running")
        if rejoin:
            record.phase, record.error = REJOINING_PHASE, None
            record.started_ms = record.started_ms or registry.transport.now_ms()
        else:
            record.phase, record.started_ms = "starting", registry.transport.now_ms()
        record.stored = True          # a job that runs is worth a record on disk
        registry.records.save(record)
        # the disk filled since the proposal: do not start what we cannot record
        if not await registry.records.on_disk(record):
            raise SiteFailure(me, f"{registry.records.write_problem()}: this site cannot record the job; "
                                  "free space in its state dir")
        self._charge(record)
        log.info("job_started", extra=fields(job=record.id, kind=record.kind, members=len(record.members)))
        ctx = JobContext(site_name=registry.config.node.name, names=registry.names,
                         hop_timeout_ms=registry.config.jobs.hop_timeout_ms, data=record.data,
                         test_data=record.test_data, workdir=registry.root / record.id)
        channel = NodeChannel(registry, record)
        for peer in registry.deaths.dead.intersection(record.members):   # died before the start: no wait for them
            record.mailbox.member_dead(peer)
        run = kind.rejoin if rejoin and kind.rejoin is not None else kind.run
        try:
            result = await asyncio.wait_for(run(channel, record.params, ctx),
                                            registry.config.jobs.job_timeout_ms / 1000)
        except TimeoutError:
            raise SiteFailure(me, f"did not finish within {registry.config.jobs.job_timeout_ms} ms") from None
        except MalformedFrom as exc:    # evidence against that member, not against this site
            raise SiteFailure(exc.peer, f"sent a malformed message ({exc.reason})") from None
        except PeerDead as exc:         # the job could not go on without it
            raise SiteFailure(exc.peer, DEAD_DETAIL) from None
        except ImplausibleTotal as exc:  # every member checked the same total: not this site's fault
            raise SiteFailure(NO_SITE, str(exc), everywhere=True) from None
        except JobFailsEverywhere as exc:   # job-wide: this site only if its own data or state is the cause
            raise SiteFailure(me if exc.here else NO_SITE, str(exc), everywhere=True, shared=public_reason(exc)) \
                from None
        except (JobError, DataError, RecvTimeout) as exc:
            raise SiteFailure.here(me, exc, everywhere=isinstance(exc, JobFailsEverywhere)) from None
        release_data(record.data)
        record.data = record.test_data = None
        self._settle(record, result)
        model = result.pop("_model", None)
        if model is not None and kind.save_model is not None:   # stored before the record says done
            path = registry.root / record.id / kind.model_file
            try:
                await asyncio.to_thread(kind.save_model, path, model)
            except OSError as exc:
                raise SiteFailure(me, f"cannot store the model at {path}: "
                                      f"{exc.strerror or exc}; free space in the state dir") from None
            result["model_file"] = str(path)
            # what `fedpeer predict` checks the file against, for every kind (xgboost also has its own)
            result["model_file_sha256"] = await asyncio.to_thread(_file_sha256, path)
        lost = result.get("lost") or []
        if lost:      # the job went on without them: the operator reads who, here and in `job show`
            log.warning("job_members_lost", extra=fields(job=record.id, kind=record.kind,
                                                         lost=", ".join(str(name) for name in lost)))
        registry.finish(record, "done", None, result)

    def _charge(self, record: JobRecord) -> None:
        """A DP job's declared (ε, δ) charged to this dataset's ledger before its first sum, durably:
        a job that fails or whose daemon is killed stays charged. Re-checked here, since another
        DP job may have spent the budget since this one was accepted (fedpeer/jobs/privacy.py)."""
        epsilon, delta = job_cost(record.params)
        if epsilon <= 0:
            return
        registry, me = self._registry, self._registry.transport.me
        dataset = record.data_fingerprint or ""
        refusal = registry.admission.privacy_refusal(record, dataset)
        if refusal is not None:
            raise SiteFailure(me, refusal)
        try:
            registry.privacy.reserve(dataset, record.id, record.kind, epsilon, delta, registry.transport.now_ms())
        except OSError as exc:
            raise SiteFailure(me, f"cannot charge the privacy ledger ({exc.strerror or exc}); "
                                  "free space in the state dir") from None

    def _settle(self, record: JobRecord, result: dict) -> None:
        """What the job's own accountant counted, if more than declared (a retried release)."""
        counted = result.get("privacy") if isinstance(result, dict) else None
        if job_cost(record.params)[0] > 0 and isinstance(counted, dict):
            registry = self._registry
            try:
                registry.privacy.settle(record.data_fingerprint or "", record.id, float(counted["epsilon"]),
                                        float(counted["delta"]))
            except OSError as exc:
                raise SiteFailure(registry.transport.me, f"cannot charge the privacy ledger "
                                                         f"({exc.strerror or exc})") from None

    async def guard(self, record: JobRecord, work: Any) -> None:
        """Runs a job task: every failure ends the record with a reason and tells whom it must.
        Nothing but cancellation leaves this coroutine, not even a failure of the failure handling:
        a job task's exception would take the node's task group, and the daemon, down."""
        registry = self._registry
        try:
            await work
        except asyncio.CancelledError:
            # an operator's cancel or a peer's abort finished the record first; what is left is
            # the daemon stopping: a running job is interrupted where it was (the restarted
            # daemon may bring it back, rejoin.py), any other cancelled
            if record.state == "running":
                registry.interrupt(record)
            elif record.state not in TERMINAL:
                registry.finish(record, "cancelled", f"{registry.config.node.name}: the daemon was stopped "
                                                     f"while the job ran (phase: {record.phase})")
            raise
        except Exception as exc:
            try:
                await self._fail(record, exc)
            except asyncio.CancelledError:
                raise
            except Exception as inner:   # noqa: BLE001  (supervision: this job only, never the node)
                log.exception("job_failure_handling_failed", extra=fields(job=record.id))
                registry.finish(record, "failed", f"{registry.config.node.name}: internal error while ending "
                                                  f"the job: {type(inner).__name__}: {inner}")
        finally:
            registry.as_proposer.forget(record.id)
            if record.state in TERMINAL:   # a Dask site loaded for a record already ended elsewhere
                release_data(record.data)
                record.data = record.test_data = None

    async def _fail(self, record: JobRecord, exc: Exception) -> None:
        registry = self._registry
        if isinstance(exc, Refused):       # declined after looking at our data: tell the proposer only
            reject = registry.as_member.decline(record, exc.reason, exc.shared)
            await self.send_quietly(record.proposer, reject, record.id)
        elif isinstance(exc, SiteFailure):
            await self._site_failed(record, exc)
        else:                              # a bug: keep the daemon alive, fail the job loudly
            log.error("job_crashed", exc_info=exc, extra=fields(job=record.id))
            registry.finish(record, "failed",
                            f"{registry.config.node.name}: internal error: {type(exc).__name__}: {exc}")
            if record.announced:
                await self.broadcast_abort(record, registry.transport.me, f"internal error: {type(exc).__name__}")

    async def _site_failed(self, record: JobRecord, exc: SiteFailure) -> None:
        registry = self._registry
        if record.announced and record.state not in TERMINAL:
            # a failure here is often the echo of another member ending the job (it then
            # refuses our frames as unknown_job): give its JobAbort, which carries the real
            # reason, a moment to arrive and win (on_abort cancels this wait)
            await asyncio.sleep(ABORT_GRACE_MS / 1000)
        first = record.state not in TERMINAL
        registry.finish(record, "failed", about_site(registry.names, exc.site, exc.reason))
        kind = registry.kinds.get(record.kind)
        leaves_alone = record.state == "failed" and kind is not None and not kind.member_failure_aborts \
            and record.started_ms is not None and not exc.everywhere
        if first and record.announced and not leaves_alone:
            await self.broadcast_abort(record, exc.site, exc.shared)

    async def broadcast_abort(self, record: JobRecord, site: bytes, reason: str) -> None:
        await self._tell_others(record, m.JobAbort(job_id=record.id, site=site, reason=reason))

    async def broadcast_cancel(self, record: JobRecord, reason: str) -> None:
        await self._tell_others(record, m.JobCancel(job_id=record.id, reason=reason))

    async def _tell_others(self, record: JobRecord, msg: object) -> None:
        registry = self._registry
        await registry.records.on_disk(record)     # how it ended, on disk before the others hear it
        others = [k for k in record.members if k != registry.transport.me]
        await asyncio.gather(*(self.send_quietly(p, msg, record.id) for p in others))

    async def send_quietly(self, peer: bytes, msg: object, job_id: str) -> None:
        """Best effort, never raises: used while a job ends, where nothing may fail any more."""
        registry = self._registry
        if peer not in registry.names:   # never address a key this site does not know
            return
        try:
            await registry.transport.send(peer, msg, job_id, ABORT_SEND_TIMEOUT_MS)
        except PeerUnreachable:
            pass
        except Exception as exc:   # noqa: BLE001  (a bug in the transport must not end the daemon)
            log.warning("job_send_failed", extra=fields(job=job_id, peer=registry.names.get(peer, "?"),
                                                        error=f"{type(exc).__name__}: {exc}"))


def about_site(names: dict[bytes, str], site: bytes, reason: str) -> str:
    """A failure's words for a job record: the site it is about first (a name, else its key's
    fingerprint); a failure about no site (NO_SITE) is its reason alone."""
    if site == NO_SITE:
        return reason
    return f"{names.get(site, fingerprint(site))}: {reason}"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
