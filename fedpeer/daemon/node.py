"""The daemon: wires config, identity, the wire gate, transport, membership and the admin API.

Rules: every task lives in one TaskGroup owned by `Node.run`; nothing is fire-and-forget. Only the
node's own loops may end the group; everything else it runs (jobs, sends) is supervised: a failure
there, even inside its own error handling, is logged and ends that task alone. A loop step that
fails (a state write on a full disk) is logged and retried at the next step. The node is the only
place that reads the real clock and hands time to the pure cores. State that must survive a crash
(the election's vote) is persisted before the messages that depend on it are sent; when it cannot
be, those messages are not sent (as if lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import random
import resource
import socket
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from fedpeer.base.logs import fields
from fedpeer.base.store import StateDir
from fedpeer.config import load as cfg
from fedpeer.config import locate
from fedpeer.config.load import Config
from fedpeer.core.election import raft as el
from fedpeer.core.membership import swim as mb
from fedpeer.daemon import reload as reloading
from fedpeer.daemon.admin import AdminServer
from fedpeer.daemon.admin_routes import AdminRoutes
from fedpeer.daemon.metrics import PATH as METRICS_PATH
from fedpeer.daemon.metrics import MetricsListener, NodeMetrics
from fedpeer.daemon.peernews import PeerNews, iso
from fedpeer.daemon.netpaths import NetPaths
from fedpeer.daemon.reach import MESSAGES as REACH_MESSAGES
from fedpeer.daemon.tracking import MlflowTracker
from fedpeer.daemon.tracking import check as check_tracking
from fedpeer.daemon.versions import VersionExchange
from fedpeer.jobs.versions import SiteInfo
from fedpeer.daemon.warmup import preload_ml
from fedpeer.errors import ConfigError, FedpeerError, JobError, RemoteProtocolError
from fedpeer.identity import Identity, encode_public_key, fingerprint
from fedpeer.jobs.lifecycle.registry import JobRegistry
from fedpeer.kinds.catalog import job_kinds, load_config
from fedpeer.net.dial import route_from
from fedpeer.net.links import OFF_LOOP_BYTES_MIN, Links
from fedpeer.net.looplag import LoopLag
from fedpeer.net.streams import InboundStreams, StreamChunk, StreamOpen
from fedpeer.net.transport import PeerClient, PeerServer, SendError, SendRefused, raise_open_files_limit
from fedpeer.runtime.channel import PeerRefused, PeerUnreachable
from fedpeer.wire import frame as wire
from fedpeer.wire.session import Sessions

log = logging.getLogger("fedpeer.node")
SESSION_PRUNE_MS = 1_000          # forget expired sessions this often
REJECT_LOG_INTERVAL_MS = 5_000    # per reason: log the first rejection, then at most this often
LOOP_ERROR_LOG_INTERVAL_MS = 5_000   # a failing loop step logs once per interval (with a count)
STATUS_JOBS_MAX = 20               # most recent jobs listed in `status`
# Membership's view of every peer is walked (state-change log, SiteInfo) after a membership step
# that changed it (Membership.changes), else at most this often (SiteInfo's retries): walking 99
# peers after every ping and ack was ~0.3 ms a message at 100 sites
PEER_VIEW_RECHECK_MS = 1_000


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Node:
    def __init__(self, config: Config, identity: Identity) -> None:
        check_tracking(config.tracking.mlflow_uri, config.path)   # before anything is written
        self.config = config
        self.identity = identity
        self.state = StateDir(config.node.state_dir)
        self._names = {p.public_key: p.name for p in config.peers}
        self._allowed = frozenset(self._names)
        self.rejected: Counter[str] = Counter()
        self.accepted: Counter[tuple[bytes, str]] = Counter()        # (sender, message kind) -> frames
        self.received_bytes: Counter[tuple[bytes, str]] = Counter()  # (sender, message kind) -> bytes
        self._reject_logged_ms: dict[str, int] = {}
        self._started_ms = _monotonic_ms()
        self._keys = wire.PairKeys(identity)
        # read per frame, so a reload that removes a peer refuses its next frame
        self._gate = wire.Gate(identity, lambda key: key in self._allowed, Sessions(),
                               message_bytes_max=config.limits.message_bytes_max, keys=self._keys)
        self._rng = random.Random(os.urandom(16))
        try:
            route = route_from(config.network)
        except ValueError as exc:
            raise ConfigError(config.path, "network.proxy", str(exc)) from None
        self._client = PeerClient(config.limits, self._rng, route)
        self.paths = NetPaths(self, route)   # reverse links, relays, reachability (fedpeer/daemon/netpaths.py)
        self._links = Links(identity, self._client, self._gate, _monotonic_ms, self.paths.relays_for)
        self._streams = InboundStreams(config.limits.payload_bytes_max)
        self._server = PeerServer(config.node.listen, config.limits,
                                  lambda head: self._gate.open_header(head, _monotonic_ms()), self._on_frame,
                                  self._on_reject, self._gate.refusal_tag, self._on_hello,
                                  on_reverse=self.paths.on_reverse, on_relay=self.paths.on_relay)
        self._server.fit_members(len(config.peers))
        self._loop_errors: Counter[str] = Counter()
        self._loop_error_logged_ms: dict[str, int] = {}
        self.metrics = NodeMetrics(self, round_kinds=[k.name for k in job_kinds().values() if k.rounds_metric])
        # read at scrape time: status() and jobs.list()
        self._metrics_listener = (MetricsListener(self.metrics, config.node.metrics, config.path)
                                  if config.node.metrics is not None else None)
        self._admin = AdminServer(config, {**AdminRoutes(self).table(), ("GET", METRICS_PATH): self.metrics.handle})
        t = config.membership
        self.membership = mb.Membership(
            me=identity.public_key, address=str(config.node.advertise),
            incarnation=self.state.next_incarnation(),
            peers={p.public_key: str(p.address) for p in config.peers},
            config=mb.MembershipConfig(
                probe_interval_ms=t.probe_interval_ms, probe_timeout_ms=t.probe_timeout_ms,
                indirect_probes=t.indirect_probes, suspect_timeout_ms=t.suspect_timeout_ms,
                dead_probe_interval_ms=t.dead_probe_interval_ms, piggyback_max=t.piggyback_max,
                retransmit_mult=t.retransmit_mult),
            rng=self._rng, now_ms=_monotonic_ms())
        self._saved_incarnation = self.membership.incarnation
        self.me = identity.public_key
        self.jobs = JobRegistry(config, self, {**self._names, self.me: config.node.name}, job_kinds(),
                                self._spawn, state=self.state)
        # [tracking]: each job that ran here, as an MLflow run once it ends (written off the loop)
        self.tracker = (MlflowTracker(config.tracking.mlflow_uri, config.node.name, config.path)
                        if config.tracking.mlflow_uri else None)
        if self.tracker is not None:
            tracker = self.tracker
            self.jobs.on_end = lambda record: tracker.job_ended(record.to_json(self.jobs.names, self.now_ms()))
        self._peer_states = {v.node: v.state for v in self.membership.view()}
        self._view_walked: tuple[int, int] | None = None    # (Membership.changes, monotonic ms) of the last walk
        self.versions = VersionExchange(job_kinds().values(), send=self.send_reliable, keys=self._keys,
                                        address_of=self._address, spawn=self._spawn, now_ms=_monotonic_ms,
                                        name_of=self._name)   # what each peer runs (fedpeer/daemon/versions.py)
        self.jobs.versions = self.versions.book
        term, voted_for = self.state.load_vote()
        self.election = el.Election(
            me=self.me, members=sorted([self.me, *self._names]), config=config.election,
            rng=self._rng, hard_state=el.HardState(term=term, voted_for=voted_for), now_ms=_monotonic_ms(),
            # Votes are signed and a leader proves its election with them; wire.verify is
            # identity.verify (Ed25519 under SIGN_DOMAIN), the check the wire gate uses too.
            sign=self.identity.sign, verify=wire.verify)
        self._leader: bytes | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._pruned_ms = _monotonic_ms()
        self._news = PeerNews()             # what peers' refusals of our sends tell the operator
        self._duplicates_logged: dict[bytes, int] = {}       # peer -> duplicate_count last logged
        self._config_loaded_ms = self.now_ms()
        self._last_reload: dict[str, Any] | None = None
        self.loop_lag = LoopLag()

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set. Raises ConfigError if the listen or admin address is unusable."""
        raise_open_files_limit()
        await self._start_servers()
        log.info("started", extra=fields(name=self.config.node.name, fingerprint=self.identity.fingerprint,
                                         listen=str(self.config.node.listen), peers=len(self.config.peers),
                                         incarnation=self.membership.incarnation))
        if self.config.ignored:
            log.warning("config_keys_ignored", extra=fields(
                keys=",".join(self.config.ignored), path=str(self.config.path),
                why="replay protection is per session now (no timestamps, no replay marks): delete these lines"))
        _sd_notify(b"READY=1")
        self._record_running()
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self._tick_loop())
                tg.create_task(self.loop_lag.run())
                self.paths.start(tg)
                if self.config.jobs.preload_ml:     # (its thread's coroutine made when the task runs:
                    tg.create_task(self._preload())   # a stop before then leaves none unawaited)
                await stop.wait()
                raise _Stopping   # the group cancels every task it owns: loops, sends, jobs
        except* _Stopping:
            pass
        finally:
            self._tg = None
            _sd_notify(b"STOPPING=1")
            await self._stop_servers()
            if self.tracker is not None:
                self.tracker.close()
            log.info("stopped", extra=fields(name=self.config.node.name))

    async def _start_servers(self) -> None:
        await self._client.start()
        try:
            await self._server.start()
        except OSError as exc:
            await self._client.stop()
            problem = "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
            where = f"cannot listen on {self.config.node.listen}: {problem}"
            raise ConfigError(self.config.path, "node.listen", where) from None
        try:
            await self._admin.start()
            if self._metrics_listener is not None:
                await self._metrics_listener.start()
        except BaseException:
            await self._admin.stop()
            await self._server.stop()
            await self._client.stop()
            raise

    async def _stop_servers(self) -> None:
        if self._metrics_listener is not None:
            await self._metrics_listener.stop()
        await self._admin.stop()
        await self._server.stop()
        self._links.close()
        await self._client.stop()

    # -- membership ----------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        due_ms: int | None = None    # when this turn's wake-up was due
        while True:
            # read each turn: a reload may change the timings
            tick_ms = min(self.config.membership.tick_ms, self.config.election.heartbeat_interval_ms // 2)
            now = _monotonic_ms()
            # how late our own loop woke us: time in which no ack could be read counts against no peer
            late_ms = 0 if due_ms is None else max(0, now - due_ms)
            with self._step("state_probe"):   # notices freed space with nothing else writing
                if self.state.probe():
                    self.jobs.retry_unsaved()
            with self._step("membership_tick"):
                self._apply(self.membership.tick(now, late_ms))
            with self._step("election_tick"):
                self._apply_election(self.election.tick(now))
            if now - self._pruned_ms >= SESSION_PRUNE_MS:
                self._pruned_ms = now
                with self._step("session_prune"):
                    self._gate.sessions.prune(now)
                    self._streams.prune(now)
            due_ms = _monotonic_ms() + tick_ms
            await asyncio.sleep(tick_ms / 1000)

    @contextlib.contextmanager
    def _step(self, what: str) -> Iterator[None]:
        """One step of a node loop: an error (a full disk, EMFILE, a bug) is logged, rate-limited,
        and the loop goes on to retry at its next step; it never ends the daemon."""
        try:
            yield
        except Exception as exc:
            self._log_loop_error(what, exc)

    def _log_loop_error(self, what: str, exc: BaseException) -> None:
        self._loop_errors[what] += 1
        now = _monotonic_ms()
        if now - self._loop_error_logged_ms.get(what, -LOOP_ERROR_LOG_INTERVAL_MS) < LOOP_ERROR_LOG_INTERVAL_MS:
            return
        self._loop_error_logged_ms[what] = now
        log.error("loop_step_failed", extra=fields(step=what, error=f"{type(exc).__name__}: {exc}",
                                                   count=self._loop_errors[what]),
                  exc_info=not isinstance(exc, (OSError, FedpeerError)))

    def _apply_election(self, ready: el.Ready) -> None:
        """Persist the term and vote before any message that depends on them leaves (Raft): if the
        write fails, the sends are dropped (as if lost) and the error goes to the caller's step."""
        if ready.persist is not None:
            self.state.save_vote(ready.persist.term, ready.persist.voted_for)
        if self.election.leader != self._leader:
            self._leader = self.election.leader
            log.info("leader", extra=fields(leader=self._name(self._leader), term=self.election.term))
        if self._tg is None:
            return
        timeout_ms = self.config.election.heartbeat_interval_ms * 2
        for send in ready.sends:
            address = self._address(send.dst)
            if address is not None:
                self._tg.create_task(self._links.send_best_effort(
                    send.dst, address, send.msg, timeout_ms, term=self.election.term,
                    on_refused=functools.partial(self._note_refusal, send.dst)))

    def _address(self, peer: bytes) -> str | None:
        try:
            return self.membership.address_of(peer)
        except KeyError:   # not (or no longer) a member: nothing to send to
            return None

    def _name(self, key: bytes | None) -> str | None:
        if key is None:
            return None
        return self.config.node.name if key == self.me else self._names.get(key, fingerprint(key))

    def _apply(self, sends: list[mb.Send]) -> None:
        """Send membership's messages. A raised incarnation is persisted first when the disk lets
        us; when it does not, the messages go anyway (a site that cannot refute a suspicion is
        declared dead) and the write is retried at the next step."""
        self._log_state_changes()
        if self._tg is not None:
            timeout_ms = 2 * self.config.membership.probe_interval_ms
            for send in sends:
                self._tg.create_task(self._links.send_best_effort(
                    send.dst, send.address, send.msg, timeout_ms,
                    on_refused=functools.partial(self._note_refusal, send.dst)))
        if self.membership.incarnation != self._saved_incarnation:
            self.state.save_incarnation(self.membership.incarnation)
            self._saved_incarnation = self.membership.incarnation

    def _log_state_changes(self) -> None:
        changes, now = self.membership.changes, _monotonic_ms()
        if self._view_walked is not None and self._view_walked[0] == changes \
                and now - self._view_walked[1] < PEER_VIEW_RECHECK_MS:
            return
        self._view_walked = (changes, now)
        for view in self.membership.view():
            self.versions.on_view(view)
            old = self._peer_states.get(view.node)
            if old != view.state:
                self._peer_states[view.node] = view.state
                log.info("peer_state", extra=fields(peer=self._names.get(view.node, "?"), state=view.state.value,
                                                    was=old.value if old else "-", incarnation=view.incarnation,
                                                    address=view.address))
                self.jobs.on_peer_state(view.node, view.state.value)   # a dead member's jobs stop waiting for it
            logged = self._duplicates_logged.get(view.node, 0)
            if view.duplicate_count > logged and (logged == 0 or view.duplicate_count >= 2 * logged):
                self._duplicates_logged[view.node] = view.duplicate_count   # 1, 2, 4, 8, ...: not a flood
                log.warning("duplicate_identity", extra=fields(
                    peer=self._names.get(view.node, "?"), fingerprint=fingerprint(view.node), address=view.address,
                    other_address=view.duplicate_address, count=view.duplicate_count))

    # -- inbound ----------------------------------------------------------------------------

    async def _on_frame(self, frame: bytes | bytearray, header: wire.FrameHeader, peer_ip: str) -> None:
        """A whole frame whose header verified. Raises RemoteProtocolError to refuse it; a refused
        frame that belongs to a job is also reported to that job (its member sent bad data)."""
        now_ms = _monotonic_ms()
        try:
            if len(frame) > OFF_LOOP_BYTES_MIN:   # decrypting and decoding MiBs would stall the loop
                envelope = await asyncio.to_thread(self._gate.open, frame, now_ms, header)
            else:
                envelope = self._gate.open(frame, now_ms, header)
            if isinstance(envelope.msg, (StreamOpen, StreamChunk)):
                envelope = await self._stream_frame(envelope)
                if envelope is None:
                    self.received_bytes[header.sender, "stream"] += len(frame)
                    return
            kind = self._dispatch(envelope)
            self.accepted[envelope.src, kind] += 1
            self.received_bytes[envelope.src, kind] += len(frame)
        except RemoteProtocolError as exc:
            sender, job = getattr(exc, "sender", None), getattr(exc, "job", "")
            if sender is not None and job and exc.reason not in ("replay", "unknown_job"):
                self.jobs.on_refused(sender, job, f"{exc.reason}: {exc.detail}")
            raise
        except Exception as exc:   # a local failure (a bug, a full disk): refuse this frame, keep serving
            self._log_loop_error("frame_handler", exc)
            raise wire.refused_from(header.sender, RemoteProtocolError("internal_error", type(exc).__name__)) from None

    async def _stream_frame(self, envelope: wire.Envelope) -> wire.Envelope | None:
        """A frame of a stream (fedpeer/net/streams.py): the whole message once its last chunk is in."""
        src, msg = envelope.src, envelope.msg
        try:
            if isinstance(msg, StreamOpen):
                self._streams.payload_bytes_max = self.config.limits.payload_bytes_max   # a reload applies
                self._streams.open(src, msg, _monotonic_ms())
                return None
            whole = await asyncio.to_thread(self._streams.chunk, src, msg, _monotonic_ms())
        except RemoteProtocolError as exc:
            raise wire.refused_from(src, exc, envelope.job) from None
        if whole is None:
            return None
        return await asyncio.to_thread(self._gate.open_plaintext, src, whole, envelope.seq, len(whole))

    def _on_hello(self, hello: bytes, peer_ip: str) -> bytes:
        """A peer opens a session to send to us: its welcome (or RemoteProtocolError)."""
        now_ms = _monotonic_ms()   # the sender key's budget is asked once its tag verified (net/admission.py)
        return self._gate.hello(hello, now_ms, lambda key: self._server.hello_rate.allow_key(key, now_ms / 1000))

    def _dispatch(self, envelope: wire.Envelope) -> str:
        """Hand the message to its owner; returns its kind for the per-peer counts."""
        if isinstance(envelope.msg, (mb.Ping, mb.Ack, mb.PingReq, mb.IndirectAck)):
            self._apply(self.membership.receive(envelope.src, envelope.msg, _monotonic_ms()))
            return "membership"
        if isinstance(envelope.msg, el.MESSAGE_TYPES):
            self._apply_election(self.election.receive(envelope.src, envelope.msg, _monotonic_ms()))
            return "election"
        if isinstance(envelope.msg, wire.DiagProbe):
            return "diag"   # delivered through the whole gate: that is all a probe is for
        if isinstance(envelope.msg, REACH_MESSAGES):
            self.paths.receive(envelope.src, envelope.msg)
            return "reach"
        if isinstance(envelope.msg, SiteInfo):
            self.versions.on_info(envelope.src, envelope.msg)
            return "site_info"
        if envelope.job:
            self.jobs.on_message(envelope.src, envelope.job, envelope.msg)
            return "job"
        raise RemoteProtocolError("unexpected_kind", f"no handler for {envelope.kind}")

    def _on_reject(self, exc: RemoteProtocolError, peer_ip: str) -> None:
        """Count every refusal; log the first of each reason, then at most once per interval. The
        log names a sender only when its frame header verified: a claim is not a sender."""
        self.rejected[exc.reason] += 1
        now = _monotonic_ms()
        if now - self._reject_logged_ms.get(exc.reason, -REJECT_LOG_INTERVAL_MS) < REJECT_LOG_INTERVAL_MS:
            return
        self._reject_logged_ms[exc.reason] = now
        sender = getattr(exc, "sender", None)
        log.warning("rejected", extra=fields(
            reason=exc.reason, detail=exc.detail, from_ip=peer_ip,
            sender=fingerprint(sender) if sender else "unverified claim",
            sender_name=self._name(sender) if sender else "-",
            count=self.rejected[exc.reason]))

    # -- reload (fedpeer/daemon/reload.py) and onboarding hints -----------------------------------------

    def reload(self) -> dict[str, str]:
        """Re-read peers.toml and apply it; returns what changed per area. A file that does not
        validate raises ConfigError (the one line `start` prints) and nothing changes: the checks
        all run before the first change is made."""
        try:
            new = load_config(self.config.path)
            cfg.check_own_key_not_peer(new, self.me)
            cfg.check_secret_files(new)
            reloading.check_data(self.config, new)   # a changed [data]: its file and columns, as init checks
        except ConfigError as exc:
            self._last_reload = {"at_ms": self.now_ms(), "error": f"configuration error: {exc}"}
            log.error("reload_refused", extra=fields(error=str(exc), running="the previous configuration"))
            raise
        changes = reloading.compare(self.config, new)
        new = reloading.applicable(self.config, new)
        now = _monotonic_ms()
        self.membership.set_config(new.membership.swim())
        self.election.set_config(new.election)
        self._client.use_limits(new.limits)
        self._server.use_limits(new.limits)
        self._server.fit_members(len(new.peers))
        self.config = new
        self._names = {p.public_key: p.name for p in new.peers}
        self._allowed = frozenset(self._names)   # the gate's next frame from a removed peer is refused
        self.jobs.reconfigure(new, {**self._names, self.me: new.node.name})   # fails a removed member's jobs
        self.versions.on_reload(self._allowed)
        with self._step("reload_membership"):
            self._apply(self.membership.set_members({p.public_key: str(p.address) for p in new.peers}, now))
        with self._step("reload_election"):
            self._apply_election(self.election.set_members(sorted([self.me, *self._names]), now))
        for key in [k for k in self._peer_states if k not in self._allowed]:
            self._peer_states.pop(key, None)
            self._news.forget(key)
            self._gate.sessions.drop_peer(key)   # its sessions end: a frame still in flight is refused
            self._streams.drop_peer(key)
            self._links.forget(key)
            self.paths.forget(key)
        summary = changes.summary()
        self._config_loaded_ms = self.now_ms()
        self._last_reload = {"at_ms": self._config_loaded_ms, "changes": summary}
        log.info("reloaded", extra=fields(path=str(new.path), changes=reloading.one_line(summary)))
        self._record_running()
        return summary

    def _record_running(self) -> None:
        """state_dir/running.json: where `status` finds this daemon once peers.toml is broken."""
        try:
            locate.write_running(self.config.path, self.config.node.admin, self.config.node.state_dir,
                                 iso(self._config_loaded_ms))
        except OSError as exc:
            log.warning("running_record_not_written", extra=fields(error=str(exc)))

    def reload_on_signal(self) -> None:
        """SIGHUP: like `fedpeer reload`; a refused file is logged (reload_refused) and status shows it."""
        with self._step("reload"), contextlib.suppress(ConfigError):
            self.reload()

    def _config_status(self) -> dict[str, Any]:
        return {"path": str(self.config.path),
                "loaded_at": iso(self._config_loaded_ms),
                "loaded_s_ago": round((self.now_ms() - self._config_loaded_ms) / 1000, 1),
                "last_reload": None if self._last_reload is None else {
                    **{k: v for k, v in self._last_reload.items() if k != "at_ms"},
                    "at": iso(self._last_reload["at_ms"])}}

    def _note_refusal(self, peer: bytes, reason: str | None) -> None:
        """A peer's answer to one of our sends: a 400 `reason`, or None for a delivery."""
        self._news.note(peer, self._names.get(peer, "?"), reason, peer in self._allowed, self.now_ms())

    # -- status -----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = _monotonic_ms()
        received, accepted = _by_peer(self.received_bytes), _by_peer(self.accepted)   # one pass, not one per peer
        peers = []
        for view in self.membership.view():
            peers.append({
                "name": self._names.get(view.node, "?"),
                "public_key": encode_public_key(view.node),
                "address": view.address,
                "state": view.state.value,
                "incarnation": view.incarnation,
                "last_seen_s": None if view.last_seen_ms is None else round((now - view.last_seen_ms) / 1000, 3),
                "rtt_ms": None if view.rtt_ms is None else round(view.rtt_ms, 3),
                "path": self.paths.path(view.node),
                "sent_bytes": {c: self._client.sent_bytes_by_peer[view.node, c] for c in ("reliable", "best_effort")},
                "received_bytes": received.get(view.node, {}),
                "frames_accepted": accepted.get(view.node, {}),
                **self._news.of(view, self._names.get(view.node, "?"), _monotonic_ms()),
                "version": self.versions.status_of(view.node),
            })
        peers.sort(key=lambda p: p["name"])
        return {
            "node": {"name": self.config.node.name, "public_key": encode_public_key(self.identity.public_key),
                     "fingerprint": self.identity.fingerprint, "address": str(self.config.node.advertise),
                     "uptime_s": round((now - self._started_ms) / 1000, 3),
                     "incarnation": self.membership.incarnation, "pid": os.getpid(),
                     "version": self.versions.own_status()},
            "peers": peers,
            "leader": self._name(self.election.leader),
            "term": self.election.term,
            "role": self.election.role.value,
            "term_jumps_ignored": self.election.stats.term_jumps_ignored,   # forged or wild election terms
            "election_refused": {   # claims of leadership or votes that did not prove themselves
                "uncertified_heartbeats": self.election.stats.uncertified_heartbeats,
                "bad_vote_signatures": self.election.stats.bad_vote_signatures},
            "jobs": [{k: j[k] for k in ("id", "kind", "state", "phase", "progress", "error", "privacy_spent")}
                     for j in self.jobs.list()[:STATUS_JOBS_MAX]],
            "rejected": dict(sorted(self.rejected.items())),
            "dropped_sends": self._client.dropped_best_effort,
            "sessions": {**self._gate.sessions.counts(), "opened": self._links.handshakes,   # fedpeer/wire/session.py
                         "failed": self._links.handshakes_failed, "failed_by": dict(self._links.handshake_errors)},
            "streams": {"receiving_bytes": self._streams.held_bytes(), "received": self._streams.completed},
            "connections": {**self._server.connections(), "shed": dict(self._server.shed),
                            # read live: an operator (prlimit) may change it while the daemon runs
                            "open_files_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]},
            "loop_errors": dict(self._loop_errors),
            "loop_lag_ms": self.loop_lag.summary(),     # how long the loop made messages and status wait
            "state_dir": {"path": str(self.config.node.state_dir), **self.state.health()},
            "sent_bytes": dict(self._client.sent_bytes),   # reliable: jobs; best_effort: membership, election
            **self.paths.status(),
            "config": self._config_status(),
        }

    async def ping(self, peer_name: str, count: int, payload_bytes: int) -> list[float]:
        """Reliable sealed sends of `count` probes; returns each one's delivery time in ms."""
        peer = next((p for p in self.config.peers if p.name == peer_name), None)
        if peer is None:
            raise ConfigError(self.config.path, "peer", f"no peer named {peer_name!r}")
        address = self.membership.address_of(peer.public_key)
        payload = os.urandom(payload_bytes)
        times_ms = []
        for _ in range(count):
            started = time.perf_counter()
            await self.send_reliable(peer.public_key, address, wire.DiagProbe(payload),
                                     large=payload_bytes > OFF_LOOP_BYTES_MIN)
            times_ms.append((time.perf_counter() - started) * 1000)
        return times_ms

    # -- the jobs' transport (fedpeer/jobs/lifecycle/nodechannel.py Transport) --------------------------

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def alive(self, peer: bytes) -> bool:
        return self._peer_states.get(peer) == mb.MemberState.ALIVE

    def leadership(self) -> tuple[int, bytes | None]:
        return self.election.term, self.election.leader

    def pairwise_seed(self, peer: bytes, label: bytes) -> bytes:
        return self.identity.pairwise_seed(peer, label)

    async def send(self, dst: bytes, msg: object, job_id: str, timeout_ms: int) -> None:
        """Deliver within timeout_ms (the transport's retries included) or raise PeerUnreachable;
        PeerRefused when the peer proved that it refused the message."""
        address = self._address(dst)
        if address is None:
            raise PeerUnreachable(dst, "not a member in this site's peers.toml")
        try:
            async with asyncio.timeout(timeout_ms / 1000):   # in this task (wait_for's own task: ~60 calls a message)
                await self.send_reliable(dst, address, msg, job=job_id, large=_payload_bytes(msg) > OFF_LOOP_BYTES_MIN)
        except SendRefused as exc:
            self._note_refusal(dst, exc.reason)
            if exc.frame is not None and wire.refusal_verified(self._keys, dst, exc.frame, exc.reason, exc.tag):
                raise PeerRefused(dst, exc.reason) from None
            raise PeerUnreachable(dst, str(exc)) from None   # an unproven 400: from anyone on the path
        except SendError as exc:
            raise PeerUnreachable(dst, str(exc)) from None
        except TimeoutError:
            raise PeerUnreachable(dst, f"not delivered within {timeout_ms} ms") from None

    def _spawn(self, coro: Any) -> asyncio.Task:
        if self._tg is None:
            coro.close()
            raise JobError("the daemon is shutting down")
        supervised = self._supervised(coro)
        try:
            return self._tg.create_task(supervised)
        except RuntimeError:      # the group is shutting down: neither coroutine will ever run
            supervised.close()
            coro.close()
            raise JobError("the daemon is shutting down") from None

    async def _preload(self) -> None:
        await self._supervised(asyncio.to_thread(preload_ml))

    async def _supervised(self, coro: Any) -> None:
        """A job's task: whatever it raises (its own error handling included) ends it alone."""
        try:
            await coro
        except Exception as exc:
            self._log_loop_error("job_task", exc)

    async def send_reliable(self, dst: bytes, address: str, msg: object, *, job: str = "", term: int = 0,
                            large: bool = False) -> None:
        """Seal and deliver with retries under the session to `dst`; raises SendError. `large`
        messages (over OFF_LOOP_BYTES_MIN) are sealed in a worker thread so the loop keeps serving."""
        await self._links.send_reliable(dst, address, msg, job=job, term=term, large=large)

class _Stopping(Exception):
    """Raised inside the TaskGroup on SIGTERM/SIGINT so that it cancels all its tasks."""


def _by_peer(counts: Counter[tuple[bytes, str]]) -> dict[bytes, dict[str, int]]:
    """{peer: {kind: count}} from a Counter keyed by (peer, kind)."""
    out: dict[bytes, dict[str, int]] = {}
    for (peer, kind), n in counts.items():
        out.setdefault(peer, {})[kind] = n
    return out


def _payload_bytes(msg: object) -> int:
    """Rough size of a message's arrays and byte strings, to decide where to seal it."""
    total = 0
    for value in getattr(msg, "__dict__", {}).values():
        total += getattr(value, "nbytes", 0) if not isinstance(value, (bytes, bytearray)) else len(value)
    return total


def _sd_notify(message: bytes) -> None:
    """systemd's readiness protocol (Type=notify): one datagram to $NOTIFY_SOCKET, if set."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]   # abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(address)
            sock.sendall(message)
        except OSError as exc:
            log.warning("sd_notify_failed", extra=fields(error=str(exc)))
